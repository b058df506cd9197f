# Cross-compiles the native engine for macOS on Apple silicon from Linux with Zig's bundled clang,
# libc++ and macOS libc headers (no Apple SDK): scripts/macos-cross.mjs sets it up and runs it on
# every `npm test`, so platform code and NEON kernels written for the Mac compile and link here.
# The compilers are small wrapper scripts (`zig c++ -target aarch64-macos.13.0 "$@"`) that the
# script writes and passes as CMAKE_C_COMPILER / CMAKE_CXX_COMPILER / CMAKE_AR / CMAKE_RANLIB.
#
# Without Apple's SDK there are no frameworks, so this build has neither Metal nor Vulkan: the
# Mac-only sources it leaves out are listed in scripts/macos-cross.mjs (docs/macos.md).
#
# nlohmann-json and doctest are header-only: REDWING_CROSS_INCLUDE is a directory holding links
# to the host's nlohmann/ and doctest/ only, so no Linux C library header can stand in for a
# missing macOS one; cross-packages/ holds minimal package configs for find_package.
set(CMAKE_SYSTEM_NAME Darwin)
set(CMAKE_SYSTEM_PROCESSOR arm64)
set(CMAKE_OSX_SYSROOT "" CACHE PATH "")
set(CMAKE_OSX_ARCHITECTURES "" CACHE STRING "")
set(CMAKE_CXX_FLAGS_INIT "-isystem ${REDWING_CROSS_INCLUDE}")
set(CMAKE_TRY_COMPILE_PLATFORM_VARIABLES REDWING_CROSS_INCLUDE)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
set(nlohmann_json_DIR ${CMAKE_CURRENT_LIST_DIR}/cross-packages/nlohmann_json CACHE PATH "")
set(doctest_DIR ${CMAKE_CURRENT_LIST_DIR}/cross-packages/doctest CACHE PATH "")
