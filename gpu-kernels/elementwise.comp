// The element-wise ops of the backend over [rows, cols] views, one thread per element:
//   0 fill_zero: out = 0            4 mul_cols: out = (a * v[c]) * s
//   1 copy:      out = a            5 gelu_tanh_mul: out = gelu_tanh(a) * b
//   2 add:       out = a + b        6 softcap: out = s * tanh(a / s)
//   3 scale:     out = a * s
// a, b and out may be views of the same buffer (each element is read before it is written by
// the same thread only).
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x = 256) in;
layout(std430, set = 0, binding = 0) readonly buffer A { float a[]; };
layout(std430, set = 0, binding = 1) readonly buffer B { float b[]; };
layout(std430, set = 0, binding = 2) buffer Out { float out_values[]; };
layout(std430, set = 0, binding = 3) readonly buffer V { float v[]; };
layout(push_constant) uniform Params {
  uint op;
  uint rows;
  uint cols;
  uint a_offset;
  uint a_stride;
  uint b_offset;
  uint b_stride;
  uint out_offset;
  uint out_stride;
  float s;
} p;

void main() {
  const uint idx = linear_group() * 256u + gl_LocalInvocationID.x;
  if (idx >= p.rows * p.cols) return;
  const uint r = idx / p.cols;
  const uint c = idx % p.cols;
  const uint o = p.out_offset + r * p.out_stride + c;
  if (p.op == 0u) {
    out_values[o] = 0.0;
    return;
  }
  const float av = a[p.a_offset + r * p.a_stride + c];
  float result;
  if (p.op == 1u) {
    result = av;
  } else if (p.op == 2u) {
    result = av + b[p.b_offset + r * p.b_stride + c];
  } else if (p.op == 3u) {
    result = av * p.s;
  } else if (p.op == 4u) {
    result = (av * v[c]) * p.s;
  } else if (p.op == 5u) {
    result = gelu_tanh_mul(av, b[p.b_offset + r * p.b_stride + c]);
  } else {
    result = p.s * safe_tanh(av * (1.0 / p.s));
  }
  out_values[o] = result;
}
