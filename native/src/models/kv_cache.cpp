#include "models/kv_cache.h"

#include <algorithm>
#include <string>

#include "format/checked.h"

namespace redwing {

int64_t kv_rows_needed(const LayerConfig& layer, const KvCacheOptions& options) {
  if (layer.sliding)
    return std::min<int64_t>(
        options.context,
        checked::add_i64(checked::add_i64(layer.sliding_window, options.max_chunk, "KV cache rows"),
                         options.ring_slack, "KV cache rows"));
  return options.context;
}

KvDType parse_kv_dtype(const std::string& s) {
  if (s == "f16") return KvDType::f16;
  if (s == "f32") return KvDType::f32;
  throw std::invalid_argument("unknown KV cache dtype \"" + s + "\" (f16 or f32)");
}

KvCache::KvCache(Backend& backend, const Architecture& arch, const KvCacheOptions& options)
    : options_(options) {
  if (options.context <= 0) throw std::invalid_argument("context size must be positive");
  if (options.max_chunk <= 0) throw std::invalid_argument("chunk size must be positive");
  if (options.ring_slack < 0) throw std::invalid_argument("ring slack must be >= 0");
  if (options.context > arch.max_position_embeddings)
    throw std::invalid_argument("context size " + std::to_string(options.context) +
                                " exceeds the model's max_position_embeddings " +
                                std::to_string(arch.max_position_embeddings));
  const size_t elem = options.dtype == KvDType::f16 ? 2 : 4;
  for (const LayerConfig& l : arch.layers) {
    KvLayerView view;
    view.capacity = kv_rows_needed(l, options);
    view.ring = l.sliding && view.capacity < options.context;
    view.window = l.sliding ? l.sliding_window : 0;
    view.num_kv_heads = l.num_kv_heads;
    view.head_dim = l.head_dim;
    view.dtype = options.dtype;
    const size_t bytes = checked::to_size_t(
        checked::mul(checked::mul(checked::size(view.capacity, "KV cache rows"),
                                  checked::mul(static_cast<uint64_t>(l.num_kv_heads),
                                               static_cast<uint64_t>(l.head_dim), "KV cache row"),
                                  "KV cache bytes"),
                     elem, "KV cache bytes"),
        "KV cache bytes");
    buffers_.push_back(backend.alloc(bytes));
    view.k = buffers_.back().get();
    buffers_.push_back(backend.alloc(bytes));
    view.v = buffers_.back().get();
    bytes_ += 2 * bytes;
    views_.push_back(view);
  }
}

void KvCache::check_room(int64_t n) const {
  if (n > options_.max_chunk)
    throw std::invalid_argument("a forward call of " + std::to_string(n) +
                                " tokens exceeds the KV cache's chunk size " +
                                std::to_string(options_.max_chunk));
  if (length_ + n > options_.context)
    throw ContextOverflow("context overflow: " + std::to_string(length_) + " positions stored + " +
                          std::to_string(n) + " new exceed the context size " +
                          std::to_string(options_.context));
}

bool KvCache::can_truncate(int64_t n) const {
  if (n < 0 || n > length_) return false;
  if (n == length_ || n == 0) return true;  // nothing to keep at 0
  for (const KvLayerView& v : views_) {
    if (!v.ring) continue;
    const int64_t oldest_held = std::max<int64_t>(0, length_ - v.capacity);
    const int64_t oldest_needed = std::max<int64_t>(0, n - v.window + 1);
    if (oldest_needed < oldest_held) return false;
  }
  return true;
}

void KvCache::truncate(int64_t n) {
  if (!can_truncate(n))
    throw std::invalid_argument("cannot truncate the KV cache from " + std::to_string(length_) +
                                " to " + std::to_string(n) +
                                " positions: a sliding-window ring no longer holds them");
  length_ = n;
}

void KvCache::advance(int64_t n) {
  check_room(n);
  length_ += n;
}

}  // namespace redwing
