#pragma once

#include <memory>

#include "models/model.h"

namespace redwing {

// Gemma 4 text decoder (dense and MoE). Use load_model() rather than calling this directly.
// `host`: load_model's CPU backend for hybrid experts, or null.
std::unique_ptr<Model> make_gemma4(const ModelDir& dir, Backend& backend, ExpertSource* experts,
                                   Backend* host = nullptr);

}  // namespace redwing
