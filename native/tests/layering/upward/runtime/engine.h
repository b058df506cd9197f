// A test input of native/cmake/check-layers.cmake: a downward include, which is allowed.
#pragma once

#include "models/model.h"
