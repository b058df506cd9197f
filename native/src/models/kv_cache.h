// The key/value cache of one sequence: per layer, K and V in f16 (default) or f32, kept in
// backend buffers.
//
// Full-attention layers keep every position up to the context size. Sliding layers keep a ring
// of window + max_chunk rows: a prefill chunk stores all its keys before attending, and its
// first query still needs the window - 1 keys before it, so the ring must hold both at once.
// Running past the context size is an error (ContextOverflow), never a silent truncation.
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "format/model_dir.h"

namespace redwing {

class ContextOverflow : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct KvCacheOptions {
  // No defaults here: the engine fills these from runtime/defaults.h (0 is refused).
  int64_t context = 0;    // the most positions the sequence may reach
  int64_t max_chunk = 0;  // the most positions one forward call may add
  KvDType dtype = KvDType::f16;
  // Extra ring rows for sliding layers, so a session can back up this many more positions and
  // reuse a prefix (see Session in runtime/engine.h). 0 for one-shot runs.
  int64_t ring_slack = 0;
};

// Rows a layer's cache needs: min(context, window + max_chunk + ring_slack) for sliding layers,
// context for full ones.
int64_t kv_rows_needed(const LayerConfig& layer, const KvCacheOptions& options);

KvDType parse_kv_dtype(const std::string& s);  // "f16" | "f32"; throws std::invalid_argument

class KvCache {
 public:
  KvCache(Backend& backend, const Architecture& arch, const KvCacheOptions& options);

  const KvCacheOptions& options() const { return options_; }
  // Positions stored so far; the next token sits at position length().
  int64_t length() const { return length_; }
  // Throws ContextOverflow if n more positions (in one call) do not fit.
  void check_room(int64_t n) const;
  // Marks n more positions as stored (after every layer has stored them).
  void advance(int64_t n);
  // Forgets every position (the buffers are reused).
  void clear() { length_ = 0; }
  // Whether the sequence can continue at position n (n <= length()), keeping positions < n.
  // Full layers keep every position. A sliding layer's ring holds only the last `capacity`
  // positions, from max(0, length() - capacity); continuing at n needs the window - 1 keys
  // before n, i.e. positions from max(0, n - window + 1). Writing positions >= n later only
  // overwrites slots of positions older than that (capacity = window + max_chunk).
  bool can_truncate(int64_t n) const;
  // Forgets positions >= n; throws std::invalid_argument unless can_truncate(n).
  void truncate(int64_t n);

  const KvLayerView& layer(int i) const { return views_[static_cast<size_t>(i)]; }
  // Bytes of backend memory held.
  uint64_t bytes() const { return bytes_; }

 private:
  KvCacheOptions options_;
  int64_t length_ = 0;
  uint64_t bytes_ = 0;
  std::vector<std::unique_ptr<Buffer>> buffers_;
  std::vector<KvLayerView> views_;
};

}  // namespace redwing
