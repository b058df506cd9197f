#include "backend/rope_tables.h"

#include <algorithm>

namespace redwing {

std::span<const float> RopeTables::get(int64_t rows, int head_dim, const RopeParams& rp,
                                       int64_t pos0) {
  const Key key = RopeTables::key(rows, head_dim, rp, pos0);
  ++calls_;
  for (Entry& e : entries_)
    if (e.key == key) {
      e.used = calls_;
      return e.table;
    }
  Entry* slot = nullptr;
  if (entries_.size() < kCapacity) {
    slot = &entries_.emplace_back();
  } else {
    slot = &*std::ranges::min_element(entries_, {}, &Entry::used);
  }
  slot->key = key;
  slot->used = calls_;
  const int half = head_dim / 2;
  const std::vector<float> inv_freq = rope_inv_freq(rp, head_dim);
  slot->table.resize(static_cast<size_t>(rows) * 2 * static_cast<size_t>(half));
  for (int64_t r = 0; r < rows; ++r) {
    float* c = slot->table.data() + r * 2 * half;
    rope_cos_sin(inv_freq, pos0 + r, c, c + half);
  }
  return slot->table;
}

}  // namespace redwing
