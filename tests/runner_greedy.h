/*
 * runner_greedy.h - a greedy generation through a runner for tests: the tokens it
 * streamed and its stats (prefix-cache hits, counts). No EOS stop beyond the vocabulary's;
 * at most RUNNER_GREEDY_MAX tokens are kept.
 */
#ifndef HL_TEST_RUNNER_GREEDY_H
#define HL_TEST_RUNNER_GREEDY_H

#include "runner/runner.h"

#define RUNNER_GREEDY_MAX 256

typedef struct collect {
    int32_t toks[RUNNER_GREEDY_MAX];
    int n;
} collect;

/* Temperature 0, no repeat penalty: prompt[0..n), then up to n_predict tokens into out. */
hl_status runner_greedy(runner *r, const int32_t *prompt, int n, int n_predict, collect *out,
                        runner_stats *stats);

#endif
