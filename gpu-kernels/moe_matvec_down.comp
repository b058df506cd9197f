// y[s, r] = sum_c W_e[r, c] x'[s / x_div, c] for every routed slot s with e = ids[s] read from
// device memory: the routed experts' down product, whose input x' is the experts' GeGLU
// (gelu_tanh(x[c]) * x[c + geglu_half]) of the gate/up product's output, computed per load. The
// same stacked bank and push constants as moe_matvec.comp (its gate/up product), another body:
// matvec_teams.glsl (MV_ROWS rows per workgroup in teams of MV_LANES threads, x read from device
// memory, per word s * sum(x q) + b * sum(x)); docs/gpu.md's eighth round says why.
#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#include "common.glsl"

#include "moe_matvec_down.glsl"

void main() { moe_down_product(); }
