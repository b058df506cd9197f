#pragma once

#include <memory>

#include "models/model.h"

namespace redwing {

// Gemma 3 text decoder. Use load_model() rather than calling this directly.
std::unique_ptr<Model> make_gemma3(const ModelDir& dir, Backend& backend);

}  // namespace redwing
