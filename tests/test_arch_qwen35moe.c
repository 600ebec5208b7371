/*
 * test_arch_qwen35moe.c - qwen35moe (qwen35's Gated DeltaNet hybrid with a mixture-of-experts
 * feed-forward and a sigmoid-gated shared expert) against llama.cpp's goldens
 * (tests/arch_golden.h: logits, greedy and the golden's state_check), F32 and Q8_0; the
 * model through the runner continues a conversation from the prefix cache with the tokens
 * of a cold run (tests/arch_recurrent.h).
 */
#include "arch_golden.h"
#include "arch_recurrent.h"
#include "test.h"

TEST(arch_qwen35moe) { arch_golden_check("qwen35moe"); }
TEST(arch_qwen35moe_q8_0) { arch_golden_check("qwen35moe-q8_0"); }
TEST(arch_qwen35moe_runner_continues_from_the_cache) {
    arch_recurrent_runner_check("qwen35moe");
}
