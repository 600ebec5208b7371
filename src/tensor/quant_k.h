/*
 * quant_k.h - reference quantizers for the K-quant formats (Q2_K..Q6_K), internal
 * to src/tensor: hl_quantize_row() dispatches to them. They reproduce ggml's
 * non-imatrix reference quantizers (the per-sub-block scale searches of
 * make_qx_quants, make_q3_quants and make_qkx2_quants, then 6/4/8-bit super-block
 * scale quantization) so a model quantized by hearth has the blocks llama.cpp
 * would write. n is a multiple of QK_K; dst holds n/QK_K blocks. Buffers are the
 * caller's; nothing allocates.
 */
#ifndef HL_TENSOR_QUANT_K_H
#define HL_TENSOR_QUANT_K_H

#include <stdint.h>

#include "tensor/types.h"

void hl_quant_q2_K(const float *x, block_q2_K *y, int64_t nb);
void hl_quant_q3_K(const float *x, block_q3_K *y, int64_t nb);
void hl_quant_q4_K(const float *x, block_q4_K *y, int64_t nb);
void hl_quant_q5_K(const float *x, block_q5_K *y, int64_t nb);
void hl_quant_q6_K(const float *x, block_q6_K *y, int64_t nb);

#endif
