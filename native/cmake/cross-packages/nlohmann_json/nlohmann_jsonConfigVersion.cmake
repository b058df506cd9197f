# The host's nlohmann-json version check (the package is header-only, so it applies as is).
include(/usr/share/cmake/nlohmann_json/nlohmann_jsonConfigVersion.cmake)
