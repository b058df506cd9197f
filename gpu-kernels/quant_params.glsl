// The push constants of the dense quantized products, one block for every kernel that takes
// them, as the host has one struct (gpu_backend.cpp's QuantParams): qmatmul.comp,
// qmatmul_tiled*.comp (qmatmul_tiled_kernel.glsl), qmatvec.comp, router.comp,
// qmatvec_norms.comp and qmatvec_heads.comp (qmatvec.glsl). Each kernel reads the fields it
// needs. An including kernel may define QMATVEC_EXTRA_PARAMS: its own push constants after these,
// and QMATVEC_CHAIN: chain.glsl's fields at the block's end.
layout(push_constant) uniform Params {
  uint rows;        // rows in this chunk (the bindings start at its first row)
  uint cols;        // a multiple of the group size, so of 32
  uint bits;
  uint group_size;
  uint scale_type;
  uint scale0;      // index of the chunk's first scale inside the scale/bias bindings
  uint x_offset;
  uint x_stride;
  uint y_offset;    // element of y for token 0, row 0 of the chunk
  uint y_stride;
  uint tokens;      // the prefill products' tokens
  // qmatvec: an RMSNorm of x folded into the product (backend.h's qmatmul_normed): 0 none; 1: x
  // is normed with the weight factor (norm_offset + norm_weight[c]); 2: x * norm_weight[c] *
  // col_scale (rms_norm_mul_cols); 3: normed without a weight.
  uint norm_mode;
  float norm_offset;
  float norm_eps;
  float col_scale;
  uint geglu_half;  // qmatvec: 0, or x's element i is gelu_tanh(x[i]) * x[i + geglu_half] (a
                    // gated MLP's GeGLU computed while staging the down product's input)
  uint tile_rows;   // qmatmul_tiled: BM, a power of two, BM / TILE_RM <= THREADS,
                    // BM + BN <= 5120 / TILE_SLAB
  uint top_k;       // router.comp: experts picked per token
  uint loop_groups; // qmatvec.comp: 0, or workgroups per token that loop over blocks
                    // (qmatvec_blocks)
#ifdef QMATVEC_EXTRA_PARAMS
  QMATVEC_EXTRA_PARAMS
#endif
#ifdef QMATVEC_CHAIN
  CHAIN_PARAMS  // chain.glsl: at byte 112, after every kernel's own fields
#endif
} p;
