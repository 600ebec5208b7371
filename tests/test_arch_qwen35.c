/*
 * test_arch_qwen35.c - qwen35 (Gated DeltaNet + gated full attention) against llama.cpp's
 * goldens (tests/arch_golden.h), F32 and Q8_0.
 */
#include "arch_golden.h"
#include "test.h"

TEST(arch_qwen35) { arch_golden_check("qwen35"); }
TEST(arch_qwen35_q8_0) { arch_golden_check("qwen35-q8_0"); }
