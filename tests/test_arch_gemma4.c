/*
 * test_arch_gemma4.c - gemma4 against llama.cpp's goldens (tests/arch_golden.h): per-layer
 * token inputs, KV sharing, local and global layers of different head sizes and KV heads,
 * proportional rope (rope_freqs), V norm, V = K on a layer without attn_v, layer output
 * scale, final softcap; F32, F16 and Q8_0 weights.
 */
#include "arch_golden.h"
#include "test.h"

TEST(arch_gemma4) { arch_golden_check("gemma4"); }
TEST(arch_gemma4_f16) { arch_golden_check("gemma4-f16"); }
TEST(arch_gemma4_q8_0) { arch_golden_check("gemma4-q8_0"); }
TEST(arch_gemma4_keqv) { arch_golden_check("gemma4-keqv"); }
TEST(arch_gemma4_keqv_f16) { arch_golden_check("gemma4-keqv-f16"); }
TEST(arch_gemma4_keqv_q8_0) { arch_golden_check("gemma4-keqv-q8_0"); }
