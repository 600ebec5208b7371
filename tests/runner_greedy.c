/*
 * runner_greedy.c - greedy generation through a runner for tests (runner_greedy.h).
 */
#include "runner_greedy.h"

static bool on_event(void *user, const runner_event *ev) {
    collect *c = user;
    if (ev->kind == RUNNER_EV_TOKEN && c->n < RUNNER_GREEDY_MAX) c->toks[c->n++] = ev->token;
    return true;
}

hl_status runner_greedy(runner *r, const int32_t *prompt, int n, int n_predict, collect *out,
                        runner_stats *stats) {
    out->n = 0;
    runner_request req = {.tokens = prompt, .n_tokens = n, .num_predict = n_predict,
                          .sampling = {.temperature = 0, .repeat_last_n = 0},
                          .emit = on_event, .user = out};
    return runner_generate(r, &req, stats, NULL);
}
