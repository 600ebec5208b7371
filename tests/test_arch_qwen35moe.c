/*
 * test_arch_qwen35moe.c - qwen35moe (qwen35's Gated DeltaNet hybrid with a mixture-of-experts
 * feed-forward and a sigmoid-gated shared expert) against llama.cpp's goldens
 * (tests/arch_golden.h), F32 and Q8_0; the golden's state_check and the prefix cache through
 * the runner (tests/arch_state.h).
 */
#include "arch_golden.h"
#include "arch_state.h"
#include "test.h"

TEST(arch_qwen35moe) { arch_golden_check("qwen35moe"); }
TEST(arch_qwen35moe_q8_0) { arch_golden_check("qwen35moe-q8_0"); }
TEST(arch_qwen35moe_state_save_restore_is_exact) { arch_state_check("qwen35moe"); }
TEST(arch_qwen35moe_runner_continues_from_the_cache) {
    arch_runner_continue_check("qwen35moe");
}
