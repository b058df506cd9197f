// The cos/sin tables RoPE rotates by (backend.h's rope_cos_sin bits), kept for the other layers
// that rotate the same positions the same way.
//
// Why: every layer of one kind (Gemma's sliding or global layers) rotates a chunk's rows by the
// same table, and computing it takes two float transcendentals per pair and row: on the H200 a
// 4,096-token prefill spent about 0.3 s of host time on 240 such tables (30 layers, 8 chunks),
// a ninth of the prompt's time, while the GPU waited (docs/gpu.md, "Seventeenth round").
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "backend/backend.h"

namespace redwing {

class RopeTables {
 public:
  // The table of `rows` positions from pos0 for head_dim / 2 pairs: per row, cos of every pair
  // then sin of every pair (rows * head_dim floats). Valid until the next call.
  std::span<const float> get(int64_t rows, int head_dim, const RopeParams& rp, int64_t pos0);

  // Tables kept: Gemma's two layer kinds, each for q and k (the same table) and the previous
  // chunk's while the next one starts.
  static constexpr size_t kCapacity = 4;

  // What makes one table differ from another.
  struct Key {
    int64_t rows;
    int head_dim;
    double theta;
    int rotary_pairs, freq_dim;
    double scale;
    int64_t pos0;
    bool operator==(const Key&) const = default;
  };
  static Key key(int64_t rows, int head_dim, const RopeParams& rp, int64_t pos0) {
    return {rows, head_dim, rp.theta, rp.rotary_pairs, rp.freq_dim, rp.scale, pos0};
  }

 private:
  struct Entry {
    Key key;
    std::vector<float> table;
    uint64_t used = 0;  // the call that last returned it (the least recent is replaced)
  };
  std::vector<Entry> entries_;
  uint64_t calls_ = 0;
};

}  // namespace redwing
