// Mixture-of-experts routing, one thread per token row: p = softmax(logits row) (max, then
// exp(x - max) times 1 / sum, as the CPU backend), the top_k experts by p in descending order
// (ties: lower index), weights = p / sum(p_top) * per_expert_scale[expert].
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

const uint MAX_TOP_K = 32u;

void main() {
  const uint t = linear_group() * 64u + gl_LocalInvocationID.x;
  if (t >= p.rows) return;
  const uint base = p.offset + t * p.stride;
  float m = logits[base];
  for (uint i = 1u; i < p.experts; ++i) m = max(m, logits[base + i]);
  float sum = 0.0;
  for (uint i = 0u; i < p.experts; ++i) sum += exp(logits[base + i] - m);
  const float inv = 1.0 / sum;
  // Selection by repeated scans: the j-th pick is the largest p strictly below the previous
  // pick, or equal to it at a higher index.
  uint chosen[MAX_TOP_K];
  float chosen_p[MAX_TOP_K];
  float prev_p = 3.402823466e38;
  int prev_i = -1;
  float top_sum = 0.0;
  for (uint j = 0u; j < p.top_k; ++j) {
    int best = -1;
    float best_p = 0.0;
    for (uint i = 0u; i < p.experts; ++i) {
      const float pi = exp(logits[base + i] - m) * inv;
      const bool after_prev = pi < prev_p || (pi == prev_p && int(i) > prev_i);
      if (after_prev && (best < 0 || pi > best_p)) {
        best = int(i);
        best_p = pi;
      }
    }
    chosen[j] = uint(best);
    chosen_p[j] = best_p;
    top_sum += best_p;
    prev_p = best_p;
    prev_i = best;
  }
  for (uint j = 0u; j < p.top_k; ++j) {
    ids[t * p.top_k + j] = int(chosen[j]);
    weights[t * p.top_k + j] = (chosen_p[j] / top_sum) * per_expert_scale[chosen[j]];
  }
}
