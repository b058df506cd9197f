// A test input of native/cmake/check-layers.cmake (ctest include_layers_catches_upward): a model
// header that includes the runtime above it, which the check must refuse.
#pragma once

#include "format/model_dir.h"
#include "runtime/engine.h"
