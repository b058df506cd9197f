// Mixture-of-experts routing, one workgroup of 64 threads per token row: p = softmax(logits
// row) (max, then exp(x - max) times 1 / sum, as the CPU backend), the top_k experts by p in
// descending order (ties: lower index), weights = p / sum(p_top) * per_expert_scale[expert].
// The experts are spread over the threads (the max and each pick are tree reductions); the sum
// of exp(x - max) is added by one thread in expert order, so p is the same bits as a sequential
// loop gives. One thread per row walked every expert top_k + 2 times: a chain of dependent
// loads that cost tens of microseconds on a large GPU.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x = 64) in;
layout(std430, set = 0, binding = 0) readonly buffer Logits { float logits[]; };
layout(std430, set = 0, binding = 1) readonly buffer ExpertScale { float per_expert_scale[]; };
layout(std430, set = 0, binding = 2) writeonly buffer Ids { int ids[]; };
layout(std430, set = 0, binding = 3) writeonly buffer Weights { float weights[]; };
layout(push_constant) uniform Params {
  uint rows;
  uint experts;
  uint top_k;
  uint offset;
  uint stride;
} p;

const uint THREADS = 64u;
const uint MAX_EXPERTS = 512u;  // the host checks it
const uint MAX_TOP_K = 32u;
shared float e_of[MAX_EXPERTS];  // exp(x - max) per expert
shared float best_p[THREADS];
shared int best_i[THREADS];
shared float row_inv;
shared int chosen[MAX_TOP_K];
shared float chosen_p[MAX_TOP_K];

// Whether (pa, ia) comes before (pb, ib) in the pick order: larger p, then lower index; an
// index of -1 is no candidate.
bool before(float pa, int ia, float pb, int ib) {
  if (ia < 0) return false;
  if (ib < 0) return true;
  return pa > pb || (pa == pb && ia < ib);
}

void main() {
  const uint t = linear_group();
  if (t >= p.rows) return;  // uniform over the workgroup
  const uint tid = gl_LocalInvocationID.x;
  const uint base = p.offset + t * p.stride;

  float m = -3.402823466e38;
  for (uint i = tid; i < p.experts; i += THREADS) m = max(m, logits[base + i]);
  best_p[tid] = m;
  barrier();
  for (uint s = THREADS / 2u; s > 0u; s >>= 1u) {
    if (tid < s) best_p[tid] = max(best_p[tid], best_p[tid + s]);
    barrier();
  }
  m = best_p[0];
  for (uint i = tid; i < p.experts; i += THREADS) e_of[i] = exp(logits[base + i] - m);
  barrier();
  if (tid == 0u) {
    float sum = 0.0;
    for (uint i = 0u; i < p.experts; ++i) sum += e_of[i];
    row_inv = 1.0 / sum;
  }
  barrier();
  const float inv = row_inv;

  // Selection by repeated reductions: the j-th pick is the first, in pick order, of the
  // experts strictly after the previous pick.
  float prev_p = 3.402823466e38;
  int prev_i = -1;
  for (uint j = 0u; j < p.top_k; ++j) {
    float bp = 0.0;
    int bi = -1;
    for (uint i = tid; i < p.experts; i += THREADS) {
      const float pi = e_of[i] * inv;
      const bool after_prev = pi < prev_p || (pi == prev_p && int(i) > prev_i);
      if (after_prev && before(pi, int(i), bp, bi)) {
        bp = pi;
        bi = int(i);
      }
    }
    barrier();  // the previous pick's readers of best_p/best_i are done
    best_p[tid] = bp;
    best_i[tid] = bi;
    barrier();
    for (uint s = THREADS / 2u; s > 0u; s >>= 1u) {
      if (tid < s && before(best_p[tid + s], best_i[tid + s], best_p[tid], best_i[tid])) {
        best_p[tid] = best_p[tid + s];
        best_i[tid] = best_i[tid + s];
      }
      barrier();
    }
    prev_p = best_p[0];
    prev_i = best_i[0];
    if (tid == 0u) {
      chosen[j] = prev_i;
      chosen_p[j] = prev_p;
    }
  }
  barrier();
  if (tid < p.top_k) {  // one pick per thread: the loads of its scale issue together
    float top_sum = 0.0;
    for (uint j = 0u; j < p.top_k; ++j) top_sum += chosen_p[j];
    const int id = chosen[tid];
    ids[t * p.top_k + tid] = id;
    weights[t * p.top_k + tid] = (chosen_p[tid] / top_sum) * per_expert_scale[uint(id)];
  }
}
