# Fails when a source file under SRC includes a header from a higher layer (docs/architecture.md):
#
#   platform  <  format  <  backend  <  models  <  runtime  <  service
#
# A file in native/src/<layer>/ may include headers of its own layer and of the layers below it,
# never above: the models do not know about the runtime that drives them, the backends do not know
# the models. Includes whose first path part is not a layer (system headers, generated kernel
# headers such as gpu_kernels/x.h) are not checked. Run by ctest (`include_layers`):
#
#   cmake -DSRC=native/src -P native/cmake/check-layers.cmake
if(NOT SRC)
  message(FATAL_ERROR "check-layers: pass -DSRC=<the native source directory>")
endif()
get_filename_component(SRC "${SRC}" ABSOLUTE)
set(LAYERS platform format backend models runtime service)

file(GLOB_RECURSE sources RELATIVE ${SRC} ${SRC}/*.h ${SRC}/*.cpp ${SRC}/*.mm ${SRC}/*.inc)
if(NOT sources)
  message(FATAL_ERROR "check-layers: no sources under ${SRC}")
endif()
set(violations "")
set(checked 0)
foreach(source ${sources})
  string(REGEX MATCH "^[^/]+" own_layer "${source}")
  list(FIND LAYERS "${own_layer}" own_rank)
  if(own_rank LESS 0)
    string(APPEND violations "\n  ${source}: not inside a layer folder (${LAYERS})")
    continue()
  endif()
  file(STRINGS ${SRC}/${source} includes REGEX "^[ \t]*#[ \t]*include[ \t]*\"")
  foreach(line ${includes})
    string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*\"([^\"]*)\".*$" "\\1" header "${line}")
    string(REGEX MATCH "^[^/]+" header_layer "${header}")
    list(FIND LAYERS "${header_layer}" header_rank)
    math(EXPR checked "${checked} + 1")
    if(header_rank GREATER own_rank)
      string(APPEND violations
             "\n  ${source} (${own_layer}) includes \"${header}\" (${header_layer}, a higher layer)")
    endif()
  endforeach()
endforeach()
if(violations)
  string(REPLACE ";" " < " order "${LAYERS}")
  message(FATAL_ERROR "upward includes (layers: ${order}):${violations}")
endif()
message(STATUS "check-layers: ${checked} includes in ${SRC}, none upward")
