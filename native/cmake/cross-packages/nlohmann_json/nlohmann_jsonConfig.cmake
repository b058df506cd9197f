# Header-only nlohmann-json for cross builds: the headers come from the host's /usr/include
# (see ../../aarch64-linux-gnu.cmake), so the target needs no include directory of its own.
if(NOT TARGET nlohmann_json::nlohmann_json)
  add_library(nlohmann_json::nlohmann_json INTERFACE IMPORTED)
endif()
