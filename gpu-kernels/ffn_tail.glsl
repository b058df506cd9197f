// The end of a Gemma 4 MoE layer's feed-forward for one row, shared by ffn_tail.comp (a dispatch
// of its own, one workgroup per row) and qmatvec_tail.comp (every workgroup of the next layer's
// q/k/v products recomputes it for the row it stages). Same code, so the same bits.
//   e = sum over the row's top_k routed slots, in ascending expert id, of weight * y[slot]
//                                                (top_k > 0: moe_combine.comp's sum; with
//                                                 top_k = 0, e is read as it is)
//   t = rms_norm(m, w1) + rms_norm(e, w2)        (the dense MLP's and the experts' post-norms)
//   x = (x + rms_norm(t, w3)) * layer_scalar     (the feed-forward's post-norm, the residual add
//                                                 and the layer scalar)
//   h = rms_norm(x, w4)                          (the next layer's input norm)
// with each norm x * (mean(x^2) + eps)^-1/2 * (weight_offset + w), the arithmetic of
// rms_norm.comp in the order of the separate ops (moe_combine, rms_norm, add_rms_norm,
// add_rms_norm, rms_norm), so the result equals theirs up to the reductions' order. The row is
// held in registers: NORM_HELD columns per thread, column tid + i * THREADS (up to 4,096 columns
// with 256 threads; the host runs the separate ops on wider rows).
//
// The including kernel declares THREADS (constant_id 0) and defines the loads FT_M(i) (the dense
// MLP's output), FT_E(i) (the experts' rows, or their sum), FT_X(i) (the residual), FT_W1(i) to
// FT_W4(i) (the four norms' weights), FT_ID(i) and FT_WEIGHT(i) (the routes' ids and weights).

const uint NORM_HELD = 16u;
const uint FT_MAX_TOP_K = 32u;
// Routed slots whose rows are loaded before any of them is added: their loads are in flight
// together instead of one round trip per slot (the sum keeps its order, so its bits).
const uint FT_SLOTS_AT_ONCE = 4u;
shared vec2 ft_partial[256];         // THREADS at most
shared uint ft_order[FT_MAX_TOP_K];  // the row's slots by ascending expert id
shared int ft_ids[FT_MAX_TOP_K];     // the row's routes, loaded once
shared float ft_weights[FT_MAX_TOP_K];

// One row's tail: where its inputs are and its scalars.
struct FfnTailRow {
  uint cols;
  uint mb;        // the row's first element of m
  uint eb;        // of e (top_k = 0), else of the first slot's row of y
  uint e_stride;  // between the slots' rows of y
  uint xb;        // of the residual
  uint first;     // the row's first route (row * top_k)
  uint top_k;
  float weight_offset;
  float eps;
  float layer_scalar;
};

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

// The row's new residual x in xn (the thread's held columns; 0 past cols); returns the thread's
// sum of their squares, in column order (rms_norm.comp's per-thread sum). Every thread of the
// workgroup must call it (barriers inside).
float ffn_tail_residual(FfnTailRow q, out float xn[NORM_HELD]) {
  const uint tid = gl_LocalInvocationID.x;
  const uint last = q.cols - 1u;
  float hm[NORM_HELD];
  float he[NORM_HELD];
  vec2 ss = vec2(0.0);
  [[unroll]] for (uint i = 0u; i < NORM_HELD; ++i) {
    const uint c = tid + i * THREADS;
    const float a = FT_M(q.mb + min(c, last));  // clamped, not guarded: the loads issue together
    hm[i] = c < q.cols ? a : 0.0;
  }
  if (q.top_k == 0u) {
    [[unroll]] for (uint i = 0u; i < NORM_HELD; ++i) {
      const uint c = tid + i * THREADS;
      const float b = FT_E(q.eb + min(c, last));
      he[i] = c < q.cols ? b : 0.0;
    }
  } else {
    // The slots in ascending expert id, ties in slot order (moe_combine.comp's insertion sort):
    // slot j's rank is the number of slots before it in that order. The routes come into shared
    // memory in one round trip first (loaded inside the count, they were a round trip per slot).
    barrier();  // an earlier row's readers of ft_ids, ft_weights and ft_order are done
    if (tid < q.top_k) {
      ft_ids[tid] = FT_ID(q.first + tid);
      ft_weights[tid] = FT_WEIGHT(q.first + tid);
    }
    barrier();
    if (tid < q.top_k) {
      const int id = ft_ids[tid];
      uint rank = 0u;
      for (uint j = 0u; j < q.top_k; ++j) {
        const int other = ft_ids[j];
        rank += (other < id || (other == id && j < tid)) ? 1u : 0u;
      }
      ft_order[rank] = tid;
    }
    barrier();
    // moe_combine's sum per column: from zero, acc += weight * y, slots in that order.
    [[unroll]] for (uint i = 0u; i < NORM_HELD; ++i) he[i] = 0.0;
    for (uint j0 = 0u; j0 < q.top_k; j0 += FT_SLOTS_AT_ONCE) {
      float v[FT_SLOTS_AT_ONCE][NORM_HELD];
      float wgt[FT_SLOTS_AT_ONCE];
      [[unroll]] for (uint u = 0u; u < FT_SLOTS_AT_ONCE; ++u) {
        const uint slot = ft_order[min(j0 + u, q.top_k - 1u)];  // past top_k: loaded, not added
        wgt[u] = ft_weights[slot];
        const uint yb = q.eb + slot * q.e_stride;
        [[unroll]] for (uint i = 0u; i < NORM_HELD; ++i)
          v[u][i] = FT_E(yb + min(tid + i * THREADS, last));
      }
      [[unroll]] for (uint u = 0u; u < FT_SLOTS_AT_ONCE; ++u) {
        if (j0 + u < q.top_k) {
          [[unroll]] for (uint i = 0u; i < NORM_HELD; ++i) he[i] += wgt[u] * v[u][i];
        }
      }
    }
    [[unroll]] for (uint i = 0u; i < NORM_HELD; ++i)
      he[i] = tid + i * THREADS < q.cols ? he[i] : 0.0;
  }
  [[unroll]] for (uint i = 0u; i < NORM_HELD; ++i) ss += vec2(hm[i] * hm[i], he[i] * he[i]);
  const vec2 sums = ft_workgroup_sum(ss);
  const float inv_m = inv_rms(sums.x, q.cols, q.eps);
  const float inv_e = inv_rms(sums.y, q.cols, q.eps);
  float t[NORM_HELD];
  float st = 0.0;
  [[unroll]] for (uint i = 0u; i < NORM_HELD; ++i) {
    const uint c = min(tid + i * THREADS, last);
    const float a = hm[i] * inv_m * (q.weight_offset + FT_W1(c));
    const float b = he[i] * inv_e * (q.weight_offset + FT_W2(c));
    t[i] = tid + i * THREADS < q.cols ? a + b : 0.0;
    st += t[i] * t[i];
  }
  const float inv_t = inv_rms(ft_workgroup_sum(vec2(st, 0.0)).x, q.cols, q.eps);
  float xo[NORM_HELD];
  float w3c[NORM_HELD];
  [[unroll]] for (uint i = 0u; i < NORM_HELD; ++i) {
    const uint c = min(tid + i * THREADS, last);
    xo[i] = FT_X(q.xb + c);
    w3c[i] = FT_W3(c);
  }
  float sn = 0.0;
  [[unroll]] for (uint i = 0u; i < NORM_HELD; ++i) {
    const float v = t[i] * inv_t * (q.weight_offset + w3c[i]);
    // (x + v) * layer_scalar, as add then scale (a scalar of 1 is exact).
    xn[i] = tid + i * THREADS < q.cols ? (xo[i] + v) * q.layer_scalar : 0.0;
    sn += xn[i] * xn[i];
  }
  return sn;
}

// h = rms_norm(xn, w4) for the thread's held columns, from every thread's sn (ffn_tail_residual's
// return): rms_norm.comp's sum, the thread's held columns in order, then the same tree. Every
// thread of the workgroup must call it (barriers inside).
void ffn_tail_next_norm(FfnTailRow q, const float xn[NORM_HELD], float sn,
                        out float hn[NORM_HELD]) {
  const uint tid = gl_LocalInvocationID.x;
  const float inv_n = inv_rms(ft_workgroup_sum(vec2(sn, 0.0)).x, q.cols, q.eps);
  float w4c[NORM_HELD];
  [[unroll]] for (uint i = 0u; i < NORM_HELD; ++i)
    w4c[i] = FT_W4(min(tid + i * THREADS, q.cols - 1u));
  [[unroll]] for (uint i = 0u; i < NORM_HELD; ++i)
    hn[i] = xn[i] * inv_n * (q.weight_offset + w4c[i]);
}
