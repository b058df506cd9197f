#include "models/model.h"

#include "models/gemma3.h"
#include "models/gemma4.h"

namespace redwing {

std::unique_ptr<Model> load_model(const ModelDir& dir, Backend& backend, ExpertSource* experts,
                                  Backend* host) {
  const std::string& family = dir.arch().family;
  if (family == "gemma4") return make_gemma4(dir, backend, experts, host);
  if (family == "gemma3") return make_gemma3(dir, backend);
  throw FormatError(dir.path() + "/manifest.json: unsupported architecture family \"" + family +
                    "\"");
}

}  // namespace redwing
