/*
 * test_arch_deepseek2.c - deepseek2 (multi-head latent attention, leading dense layers,
 * DeepSeek-routed experts with shared experts) against llama.cpp's goldens
 * (tests/arch_golden.h): the GLM-4.7-Flash-like case in F32 and Q8_0, and expert groups
 * with YaRN.
 */
#include "arch_golden.h"
#include "test.h"

TEST(arch_deepseek2) { arch_golden_check("deepseek2"); }
TEST(arch_deepseek2_q8_0) { arch_golden_check("deepseek2-q8_0"); }
TEST(arch_deepseek2_groups_yarn) { arch_golden_check("deepseek2-groups-yarn"); }
