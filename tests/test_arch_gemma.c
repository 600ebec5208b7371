/*
 * test_arch_gemma.c - gemma2 and gemma3 against llama.cpp's goldens (tests/arch_golden.h):
 * sliding-window layers, softcaps, sandwich norms, GELU, local/global rope bases, linear
 * rope scaling on global layers; F32, F16 and Q8_0 weights.
 */
#include "arch_golden.h"
#include "test.h"

TEST(arch_gemma2) { arch_golden_check("gemma2"); }
TEST(arch_gemma2_f16) { arch_golden_check("gemma2-f16"); }
TEST(arch_gemma2_q8_0) { arch_golden_check("gemma2-q8_0"); }
TEST(arch_gemma3) { arch_golden_check("gemma3"); }
TEST(arch_gemma3_f16) { arch_golden_check("gemma3-f16"); }
TEST(arch_gemma3_q8_0) { arch_golden_check("gemma3-q8_0"); }
TEST(arch_gemma3_linrope8) { arch_golden_check("gemma3-linrope8"); }
TEST(arch_gemma3_linrope8_f16) { arch_golden_check("gemma3-linrope8-f16"); }
TEST(arch_gemma3_linrope8_q8_0) { arch_golden_check("gemma3-linrope8-q8_0"); }
