#include "runtime/routing_trace.h"

#include <algorithm>
#include <sstream>
#include <stdexcept>

namespace redwing {

RoutingTrace::RoutingTrace(const std::string& spec, const std::string& record_path) {
  if (spec.rfind("synthetic:", 0) == 0 || spec == "synthetic") {
    kind_ = Kind::synthetic;
    uint64_t seed = 1;
    std::stringstream ss(spec.size() > 10 ? spec.substr(10) : "");
    std::string kv;
    while (std::getline(ss, kv, ',')) {
      const auto eq = kv.find('=');
      const std::string k = kv.substr(0, eq);
      const std::string v = eq == std::string::npos ? "" : kv.substr(eq + 1);
      try {
        if (k == "reuse")
          reuse_ = std::stod(v);
        else if (k == "seed")
          seed = std::stoull(v);
        else
          throw std::invalid_argument("");
      } catch (const std::exception&) {
        throw std::invalid_argument("routing trace \"" + spec + "\": bad setting \"" + kv +
                                    "\" (reuse=0..1, seed=N)");
      }
    }
    if (!(reuse_ >= 0 && reuse_ <= 1))
      throw std::invalid_argument("routing trace \"" + spec + "\": reuse must be in [0, 1]");
    rng_.seed(seed);
  } else if (spec.rfind("file:", 0) == 0) {
    kind_ = Kind::file;
    path_ = spec.substr(5);
    std::ifstream in(path_);
    if (!in) throw std::runtime_error("cannot read routing trace " + path_);
    std::string line;
    while (std::getline(in, line)) {
      std::stringstream ls(line);
      int layer;
      if (!(ls >> layer)) continue;
      std::vector<int32_t> row;
      int32_t e;
      while (ls >> e) row.push_back(e);
      rows_[layer].push_back(std::move(row));
    }
    if (rows_.empty()) throw std::runtime_error("routing trace " + path_ + " holds no rows");
  } else if (!spec.empty()) {
    throw std::invalid_argument(
        "routing trace must be synthetic:reuse=R,seed=S or file:PATH, not \"" + spec + "\"");
  }
  if (!record_path.empty()) {
    record_.open(record_path, std::ios::trunc);
    if (!record_) throw std::runtime_error("cannot write routing record " + record_path);
  }
}

void RoutingTrace::apply(int layer, int64_t rows, int top_k, int num_experts, int32_t* idx) {
  for (int64_t t = 0; t < rows; ++t) {
    int32_t* row = idx + t * top_k;
    if (kind_ == Kind::synthetic) {
      std::vector<int32_t>& prev = previous_[layer];
      std::vector<int32_t> chosen;
      std::uniform_real_distribution<double> coin(0.0, 1.0);
      std::uniform_int_distribution<int32_t> any(0, num_experts - 1);
      for (int j = 0; j < top_k; ++j) {
        int32_t e = -1;
        if (!prev.empty() && coin(rng_) < reuse_) {
          std::vector<int32_t> left;
          for (int32_t p : prev)
            if (std::find(chosen.begin(), chosen.end(), p) == chosen.end()) left.push_back(p);
          if (!left.empty())
            e = left[std::uniform_int_distribution<size_t>(0, left.size() - 1)(rng_)];
        }
        while (e < 0 || std::find(chosen.begin(), chosen.end(), e) != chosen.end()) e = any(rng_);
        chosen.push_back(e);
      }
      std::copy(chosen.begin(), chosen.end(), row);
      prev = chosen;
    } else if (kind_ == Kind::file) {
      auto it = rows_.find(layer);
      if (it == rows_.end())
        throw std::runtime_error("routing trace " + path_ + " has no rows for layer " +
                                 std::to_string(layer));
      size_t& c = cursor_[layer];
      const std::vector<int32_t>& rec = it->second[c % it->second.size()];
      ++c;
      if (static_cast<int>(rec.size()) != top_k)
        throw std::runtime_error("routing trace " + path_ + ": a row of layer " +
                                 std::to_string(layer) + " has " + std::to_string(rec.size()) +
                                 " experts, the model routes to " + std::to_string(top_k));
      for (int32_t e : rec)
        if (e < 0 || e >= num_experts)
          throw std::runtime_error("routing trace " + path_ + ": expert " + std::to_string(e) +
                                   " out of range");
      std::copy(rec.begin(), rec.end(), row);
    }
    if (record_.is_open()) {
      record_ << layer;
      for (int j = 0; j < top_k; ++j) record_ << ' ' << row[j];
      record_ << '\n';
    }
  }
  if (record_.is_open()) record_.flush();
}

}  // namespace redwing
