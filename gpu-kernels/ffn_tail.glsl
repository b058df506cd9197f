// The end of a Gemma 4 MoE layer's feed-forward for one row: the body of ffn_tail.comp (which
// says what it computes and in which order) and of moe_matvec_down_tail.comp (the experts' down
// product whose last workgroup per token ends the feed-forward).
//
// The including kernel declares THREADS (constant_id 0, its local_size_x_id), the buffers m (the
// dense MLP's output), x (the residual, read and written), w1, w2, w3 and w4 (the norms'
// weights), ids and weights (the routes), h (the next layer's input), and FT_E(i): element i of
// the experts' sum (top_k = 0) or of their products (one row per routed slot). The row is held in
// registers (NORM_HELD columns per thread). A kernel whose push constants hold FfnTailParams
// before those declarations exist includes this file first with FFN_TAIL_PARAMS_ONLY defined
// (the struct alone), then again without it (the rest).

#ifndef FFN_TAIL_PARAMS_DECLARED
#define FFN_TAIL_PARAMS_DECLARED
struct FfnTailParams {
  uint rows;
  uint cols;
  uint m_offset;
  uint m_stride;
  uint e_offset;
  uint e_stride;
  uint x_offset;
  uint x_stride;
  float weight_offset;
  float eps;
  float layer_scalar;
  uint top_k;  // 0: e holds the experts' sum; else e's rows are the routed slots' products
  uint has_next;
  uint h_offset;
  uint h_stride;
};
#endif

#ifndef FFN_TAIL_PARAMS_ONLY

const uint NORM_HELD = 16u;
const uint MAX_TOP_K = 32u;
shared vec2 ft_partial[256];  // THREADS at most
shared uint ft_order[MAX_TOP_K];  // the row's slots by ascending expert id

// The workgroup's sums of v.x and v.y (every thread gets them).
vec2 ft_workgroup_sum(vec2 v) {
  const uint tid = gl_LocalInvocationID.x;
  barrier();  // the previous reduction's readers are done
  ft_partial[tid] = v;
  barrier();
  for (uint s = THREADS / 2u; s > 0u; s >>= 1u) {
    if (tid < s) ft_partial[tid] += ft_partial[tid + s];
    barrier();
  }
  return ft_partial[0];
}

// Row r's end of the feed-forward. Every thread of the workgroup calls it (barriers inside).
void ffn_tail_row(FfnTailParams ft, uint r) {
  const uint tid = gl_LocalInvocationID.x;
  const uint last = ft.cols - 1u;
  const uint mb = ft.m_offset + r * ft.m_stride;
  const uint eb = ft.e_offset + r * ft.e_stride;
  const uint xb = ft.x_offset + r * ft.x_stride;
  float hm[NORM_HELD];
  float he[NORM_HELD];
  vec2 ss = vec2(0.0);
  [[unroll]] for (uint i = 0u; i < NORM_HELD; ++i) {
    const uint c = tid + i * THREADS;
    const float a = m[mb + min(c, last)];  // clamped, not guarded: the loads issue together
    hm[i] = c < ft.cols ? a : 0.0;
  }
  if (ft.top_k == 0u) {
    [[unroll]] for (uint i = 0u; i < NORM_HELD; ++i) {
      const uint c = tid + i * THREADS;
      const float b = FT_E(eb + min(c, last));
      he[i] = c < ft.cols ? b : 0.0;
    }
  } else {
    // The slots in ascending expert id, ties in slot order (moe_combine.comp's insertion sort):
    // slot j's rank is the number of slots before it in that order.
    const uint first = r * ft.top_k;
    if (tid < ft.top_k) {
      const int id = ids[first + tid];
      uint rank = 0u;
      for (uint j = 0u; j < ft.top_k; ++j) {
        const int other = ids[first + j];
        rank += (other < id || (other == id && j < tid)) ? 1u : 0u;
      }
      ft_order[rank] = tid;
    }
    barrier();
    // moe_combine's sum per column: from zero, acc += weight * y, slots in that order.
    [[unroll]] for (uint i = 0u; i < NORM_HELD; ++i) he[i] = 0.0;
    for (uint j = 0u; j < ft.top_k; ++j) {
      const uint slot = first + ft_order[j];
      const float wgt = weights[slot];
      const uint yb = ft.e_offset + slot * ft.e_stride;
      [[unroll]] for (uint i = 0u; i < NORM_HELD; ++i)
        he[i] += wgt * FT_E(yb + min(tid + i * THREADS, last));
    }
    [[unroll]] for (uint i = 0u; i < NORM_HELD; ++i)
      he[i] = tid + i * THREADS < ft.cols ? he[i] : 0.0;
  }
  [[unroll]] for (uint i = 0u; i < NORM_HELD; ++i) ss += vec2(hm[i] * hm[i], he[i] * he[i]);
  const vec2 sums = ft_workgroup_sum(ss);
  const float inv_m = 1.0 / sqrt(sums.x / float(ft.cols) + ft.eps);
  const float inv_e = 1.0 / sqrt(sums.y / float(ft.cols) + ft.eps);
  float t[NORM_HELD];
  float st = 0.0;
  [[unroll]] for (uint i = 0u; i < NORM_HELD; ++i) {
    const uint c = min(tid + i * THREADS, last);
    const float a = hm[i] * inv_m * (ft.weight_offset + w1[c]);
    const float b = he[i] * inv_e * (ft.weight_offset + w2[c]);
    t[i] = tid + i * THREADS < ft.cols ? a + b : 0.0;
    st += t[i] * t[i];
  }
  const float inv_t = 1.0 / sqrt(ft_workgroup_sum(vec2(st, 0.0)).x / float(ft.cols) + ft.eps);
  float xo[NORM_HELD];
  float w3c[NORM_HELD];
  [[unroll]] for (uint i = 0u; i < NORM_HELD; ++i) {
    const uint c = min(tid + i * THREADS, last);
    xo[i] = x[xb + c];
    w3c[i] = w3[c];
  }
  float xn[NORM_HELD];
  float sn = 0.0;
  [[unroll]] for (uint i = 0u; i < NORM_HELD; ++i) {
    const float v = t[i] * inv_t * (ft.weight_offset + w3c[i]);
    // (x + v) * layer_scalar, as add then scale (a scalar of 1 is exact).
    xn[i] = tid + i * THREADS < ft.cols ? (xo[i] + v) * ft.layer_scalar : 0.0;
    sn += xn[i] * xn[i];
  }
  [[unroll]] for (uint i = 0u; i < NORM_HELD; ++i) {
    const uint c = tid + i * THREADS;
    if (c < ft.cols) x[xb + c] = xn[i];
  }
  if (ft.has_next == 0u) return;  // uniform over the workgroup
  // The next layer's input norm of the new x (rms_norm.comp's sum: the thread's held columns in
  // order, then the same tree).
  const float inv_n = 1.0 / sqrt(ft_workgroup_sum(vec2(sn, 0.0)).x / float(ft.cols) + ft.eps);
  const uint hb = ft.h_offset + r * ft.h_stride;
  float w4c[NORM_HELD];
  [[unroll]] for (uint i = 0u; i < NORM_HELD; ++i) w4c[i] = w4[min(tid + i * THREADS, last)];
  [[unroll]] for (uint i = 0u; i < NORM_HELD; ++i) {
    const uint c = tid + i * THREADS;
    if (c < ft.cols) h[hb + c] = xn[i] * inv_n * (ft.weight_offset + w4c[i]);
  }
}
#endif  // FFN_TAIL_PARAMS_ONLY
