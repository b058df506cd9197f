// Reading the KV caches, shared by attention_partial.comp and attention_tiled.comp. The including
// kernel declares the caches as uint words (k_cache, v_cache) and push constants p with f16 (1:
// the caches hold IEEE halves, two per word) and window (0: full attention).

// Element e of a cache as float32.
float cache_value(uint e, bool is_k) {
  if (p.f16 != 0u) {
    const uint w = is_k ? k_cache[e >> 1u] : v_cache[e >> 1u];
    return unpackHalf2x16(w >> ((e & 1u) * 16u)).x;
  }
  return uintBitsToFloat(is_k ? k_cache[e] : v_cache[e]);
}

// The first key position `pos` sees (backend.h's KvLayerView::first_visible).
uint first_visible(uint pos) {
  return (p.window > 0u && pos >= p.window) ? pos - p.window + 1u : 0u;
}
