/*
 * arch_golden.h - checks the engine against the architecture goldens in
 * ../shared/testdata/arch (a GGUF and a JSON of llama.cpp's outputs per case; see the
 * README there for the fields).
 *
 *   TEST(arch_gemma3) { arch_golden_check("gemma3"); }
 *
 * arch_golden_check() finds testdata/arch/<case>.gguf and .json with test_shared_path(),
 * SKIPs when either is absent, runs arch_golden_run() with the tolerances the JSON's
 * weight type and noise floor call for (arch_golden_tol_for), prints the summary to
 * stderr, and fails the current test (test_fail_at, at the caller's line) with the first
 * mismatch and the number of mismatches.
 *
 * What is checked (causal LM cases, a JSON with prompt_ids):
 *   - prompt_ids evaluated in one batch from position 0, every position's logits kept,
 *     with the per-sequence context size llama.cpp ran with (harness.n_ctx_seq) set on
 *     the context (phi3's longrope chooses its factors by it).
 *     At each position i the argmax must be the golden top-1 wherever the golden margin
 *     (top-1 minus top-2 logit of prompt_top10[i]) exceeds tol.margin, and every golden
 *     top-10 [id, logit] pair must be within tol.logit of ours (when tol.logit > 0).
 *   - greedy: from the last prompt position, take the argmax and feed it back one token
 *     at a time for len(greedy_ids) tokens. Step k must give greedy_ids[k] unless the
 *     golden margin of greedy_top10[k] is at most tol.margin (a near-tie, where either
 *     choice is right): there the sequences may part, and comparing stops at the first
 *     such parting. While they agree the greedy_top10 logits are checked like the
 *     prompt's.
 *   - state_check (a JSON that records one, a model with a recurrent state): the state
 *     after the prompt is saved, n_tokens_after_snapshot greedy tokens fed; a second
 *     sequence that ran the same prompt gets the saved state restored (over a later one)
 *     and the same tokens: its logits must be bitwise those of the first pass.
 * Embedding cases (a JSON with embeddings: [{prompt_ids, embedding}]): model_embed (pooled
 * as the GGUF declares, L2-normalised) must have cosine similarity > tol.cos_min with
 * each golden vector.
 *
 * arch_golden_run() is the checker without the harness: it returns whether everything
 * held and writes a one-paragraph report (the first mismatch with position, ids, logits
 * and margin, and the number of mismatches; or a summary of what was checked) to msg.
 * Tests of the checker itself call it directly with doctored goldens.
 */
#ifndef HL_TEST_ARCH_GOLDEN_H
#define HL_TEST_ARCH_GOLDEN_H

#include <stdbool.h>
#include <stddef.h>

typedef struct arch_golden_tol {
    double logit;   /* max |ours - golden| per golden top-10 logit; <= 0: not checked */
    double margin;  /* top-1 must agree where the golden top1 - top2 margin exceeds this */
    double cos_min; /* embeddings: cosine similarity must exceed this */
} arch_golden_tol;

/* The tolerances for a golden whose weights are of type weights ("f32", "f16", "q8_0",
 * "mxfp4"; NULL or anything else: f32), given llama.cpp's own noise floor (max |logit
 * diff| between its batched and one-token runs, 0 if unknown) and, for quantised files,
 * the max |logit diff| between llama.cpp's run and the same weights dequantised to F32
 * (dequant_diff, 0 if unknown). The reasoning is in arch_golden.c. */
arch_golden_tol arch_golden_tol_for(const char *weights, double noise_floor, double dequant_diff);

/* Checks gguf_path against json_path. tol NULL: arch_golden_tol_for() from the JSON's
 * weights, noise floor and dequant_f32_reference. n_threads <= 0: 2. */
bool arch_golden_run(const char *gguf_path, const char *json_path, const arch_golden_tol *tol,
                     int n_threads, char *msg, size_t cap);

/* The TEST body for one case (see the top of this file). */
#define arch_golden_check(case_name) arch_golden_check_at((case_name), __FILE__, __LINE__)
void arch_golden_check_at(const char *case_name, const char *file, int line);

#endif
