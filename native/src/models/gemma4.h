#pragma once

#include <memory>

#include "models/model.h"

namespace redwing {

// Gemma 4 text decoder (dense and MoE). Use load_model() rather than calling this directly.
std::unique_ptr<Model> make_gemma4(const ModelDir& dir, Backend& backend, ExpertSource* experts);

}  // namespace redwing
