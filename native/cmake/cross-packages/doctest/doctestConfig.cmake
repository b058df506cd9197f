# Header-only doctest for cross builds (headers from the host's /usr/include, see
# ../../aarch64-linux-gnu.cmake); doctest_discover_tests comes from the host's doctest package.
if(NOT TARGET doctest::doctest)
  add_library(doctest::doctest INTERFACE IMPORTED)
  list(APPEND CMAKE_MODULE_PATH /usr/lib/cmake/doctest)
endif()
