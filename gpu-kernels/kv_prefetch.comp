// Reads a layer's used KV cache words and keeps nothing: recorded (REDWING_GPU_PREFETCH_KV=1)
// just after the previous layer's last step, with no barrier before it, so that while that step
// runs (ffn_tail: one workgroup) the keys and values decode attention will read come from device
// memory into the L2 cache. Inside a decode step attention found them there only in the ops
// bench, which repeats one layer: 26-40 us a dispatch there, 54-58 in the engine (docs/gpu.md,
// "Twenty-seventh round"). Each thread loads one 16-byte word of every 32 bytes (the L2 cache's
// sector); the words' XOR is stored only if it equals p.never, which the compiler cannot know, so
// the loads stay and nothing is written in practice.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x = 256) in;
layout(std430, set = 0, binding = 0) readonly buffer K { uvec4 k_words[]; };
layout(std430, set = 0, binding = 1) readonly buffer V { uvec4 v_words[]; };
layout(std430, set = 0, binding = 2) writeonly buffer Sink { uint sink[]; };
layout(push_constant) uniform Params {
  uint words;  // 16-byte words of each cache to read from its start (every second one is loaded)
  uint never;
} p;

void main() {
  const uint threads = gl_NumWorkGroups.x * gl_NumWorkGroups.y * 256u;
  uint acc = 0u;
  for (uint i = 2u * (linear_group() * 256u + gl_LocalInvocationID.x); i < p.words;
       i += 2u * threads)
    acc ^= k_words[i].x ^ v_words[i].x;
  if (acc == p.never) sink[0] = acc;
}
