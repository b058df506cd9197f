# Cross-compiles the native engine for Linux on AArch64 with Debian's cross toolchain, and runs
# its tests under QEMU user emulation (apt-get install g++-aarch64-linux-gnu qemu-user):
#
#   cmake -S native -B native/build-arm -DCMAKE_TOOLCHAIN_FILE=native/cmake/aarch64-linux-gnu.cmake
#   cmake --build native/build-arm -j2 && ctest --test-dir native/build-arm
#
# nlohmann-json and doctest are header-only: the host's copies in /usr/include are used, searched
# after the cross compiler's own system headers (-idirafter) so that no host C library header
# shadows the target's; cross-packages/ holds minimal package configs for find_package.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_CXX_FLAGS_INIT "-idirafter /usr/include")
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
set(nlohmann_json_DIR ${CMAKE_CURRENT_LIST_DIR}/cross-packages/nlohmann_json CACHE PATH "")
set(doctest_DIR ${CMAKE_CURRENT_LIST_DIR}/cross-packages/doctest CACHE PATH "")
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64;-L;/usr/aarch64-linux-gnu)
