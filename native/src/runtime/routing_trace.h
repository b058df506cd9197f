// BENCHMARK ONLY: routing traces that replace (or record) the router's choice of experts, so
// the expert cache can be measured under a controlled reuse rate on random-weight models.
// Replacing the routing changes the model's output; nothing enables this by default.
//
//   synthetic:reuse=R,seed=S   each of a row's top-k experts is, with probability R, one of the
//                              experts the previous row of the same layer used, else uniform
//                              (reuse=0: uniform routing)
//   file:PATH                  replays a recording, layer by layer, row by row (wrapping)
// Recording (record_path) writes the routing actually used, one line per layer and row:
// "layer e1 e2 ... ek".
#pragma once

#include <cstdint>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "models/model.h"

namespace redwing {

class RoutingTrace final : public RoutingHook {
 public:
  // spec: "" (no replacement), "synthetic:..." or "file:PATH"; record_path: "" or a file to
  // write. Throws std::invalid_argument for a bad spec, platform-neutral std::runtime_error
  // naming the file for unreadable or unwritable files.
  RoutingTrace(const std::string& spec, const std::string& record_path);
  void apply(int layer, int64_t rows, int top_k, int num_experts, int32_t* idx) override;

 private:
  enum class Kind { none, synthetic, file } kind_ = Kind::none;
  double reuse_ = 0;
  std::mt19937_64 rng_;
  std::map<int, std::vector<int32_t>> previous_;           // synthetic: last row per layer
  std::map<int, std::vector<std::vector<int32_t>>> rows_;  // file: recorded rows per layer
  std::map<int, size_t> cursor_;
  std::string path_;
  std::ofstream record_;
};

}  // namespace redwing
