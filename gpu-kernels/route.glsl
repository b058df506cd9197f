// Mixture-of-experts routing of one token row by one workgroup: p = softmax(logits row) (max,
// then exp(x - max) times 1 / sum, as the CPU backend), the top_k experts by p in descending
// order (ties: lower index), weights = p / sum(p_top) * per_expert_scale[expert]. Shared by
// route.comp (a dispatch of its own) and router.comp (the router's product, whose last
// workgroup routes: one dependent step less a MoE layer).
//
// The max is a tree reduction over the workgroup; the sum of exp(x - max) is added by one thread
// in expert order, so p is the same bits as a sequential loop gives. The picks are by rank: each
// expert counts the experts that come before it in the pick order (larger p, then lower index),
// and the experts of rank < top_k write themselves into place. One barrier for every pick; the
// repeated arg-max reductions it replaces (top_k tree reductions of log2(threads) barriers each)
// were a chain of ~60 barriers per row.
//
// The including kernel declares RT_THREADS (threads in its workgroup, at most 256),
// RT_LOGIT(i) (the row's logit of expert i), RT_SCALE(i) (per_expert_scale[i]), and
// RT_WRITE(j, id, w) (stores pick j), and calls route_row() from every thread of the workgroup.

const uint RT_MAX_EXPERTS = 512u;  // the host checks it
const uint RT_MAX_TOP_K = 32u;
shared float rt_e[RT_MAX_EXPERTS];  // per expert: its logit x, then exp(x - max)
shared float rt_max[256];           // RT_THREADS at most (a shared array's size must be a literal)
shared float rt_inv;
shared int rt_chosen[RT_MAX_TOP_K];
shared float rt_chosen_p[RT_MAX_TOP_K];
shared float rt_chosen_scale[RT_MAX_TOP_K];

void route_row(uint tid, uint experts, uint top_k) {
  float m = -3.402823466e38;
  // The logits are read once (kept in rt_e until their exps replace them: a round trip less).
  for (uint i = tid; i < experts; i += RT_THREADS) {
    const float logit = RT_LOGIT(i);
    rt_e[i] = logit;
    m = max(m, logit);
  }
  rt_max[tid] = m;
  barrier();
  for (uint s = RT_THREADS / 2u; s > 0u; s >>= 1u) {
    if (tid < s) rt_max[tid] = max(rt_max[tid], rt_max[tid + s]);
    barrier();
  }
  m = rt_max[0];
  for (uint i = tid; i < experts; i += RT_THREADS) rt_e[i] = exp(rt_e[i] - m);  // its own i
  if (tid < top_k) rt_chosen[tid] = -1;  // no candidate (non-finite logits)
  barrier();
  if (tid == 0u) {
    // In expert order (a sequential loop's bits), 8 values loaded before they are added, so that
    // the shared loads are not one latency each.
    float sum = 0.0;
    uint i = 0u;
    for (; i + 8u <= experts; i += 8u) {
      float v[8];
      [[unroll]] for (uint k = 0u; k < 8u; ++k) v[k] = rt_e[i + k];
      [[unroll]] for (uint k = 0u; k < 8u; ++k) sum += v[k];
    }
    for (; i < experts; ++i) sum += rt_e[i];
    rt_inv = 1.0 / sum;
  }
  barrier();
  const float inv = rt_inv;
  for (uint i = tid; i < experts; i += RT_THREADS) {
    // The expert's scale is loaded before its rank is counted, so that the load's round trip
    // overlaps the count instead of following it (the router_route op: 16.9 -> 16.5 us on the
    // H200).
    const float scale = RT_SCALE(i);
    const float pi = rt_e[i] * inv;
    uint rank = 0u;
    for (uint j = 0u; j < experts; ++j) {
      const float pj = rt_e[j] * inv;
      rank += (pj > pi || (pj == pi && j < i)) ? 1u : 0u;
    }
    if (rank < top_k) {
      rt_chosen[rank] = int(i);
      rt_chosen_p[rank] = pi;
      rt_chosen_scale[rank] = scale;
    }
  }
  barrier();
  if (tid < top_k) {  // one pick per thread
    float top_sum = 0.0;
    for (uint j = 0u; j < top_k; ++j) top_sum += rt_chosen_p[j];
    const int id = rt_chosen[tid];
    RT_WRITE(tid, id, id < 0 ? 0.0 : (rt_chosen_p[tid] / top_sum) * rt_chosen_scale[tid]);
  }
}
