/*
 * bench_prefix.c - the prefix cache on a synthetic llama model: two conversations
 * alternating over a shared 2000-token system prompt.
 *
 * Prints the time to first token of a cold request against cache hits (the same
 * conversation continued, and the other conversation resuming over the shared system
 * prompt), and the KV memory the cache holds with block sharing against what full
 * per-conversation copies would take. The model (6 layers, 512 embedding, Q8_0 weights)
 * is written with the GGUF writer into a temporary file, removed at the end.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/file.h"
#include "common/synth.h"
#include "gguf/gguf.h"
#include "kv/trie.h"
#include "runner/runner.h"
#include "tensor/types.h"

enum {
    N_VOCAB = 1024, N_EMBD = 512, N_LAYER = 6, N_FF = 1408, N_HEAD = 8, N_HEAD_KV = 4,
    SYS_LEN = 2000, USER_LEN = 40, N_GEN = 8, ROUNDS = 3,
};

typedef struct conv {
    int32_t toks[4096];
    int32_t n;
} conv;

typedef struct ttft {
    uint64_t t0, first;
    int n;
    int32_t answer[N_GEN];
} ttft;

static bool on_event(void *user, const runner_event *ev) {
    ttft *t = user;
    if (ev->kind != RUNNER_EV_TOKEN) return true;
    if (t->n == 0) t->first = hl_time_ns();
    t->answer[t->n++] = ev->token;
    return true;
}

static void append_random(conv *c, int n) {
    for (int i = 0; i < n; i++) c->toks[c->n++] = 3 + (int32_t)((bench_frand() + 1.0f) * 0.5f * (N_VOCAB - 4));
}

/* One turn: TTFT in ms; the answer is appended to the conversation. */
static double turn(runner *r, conv *c, runner_stats *st) {
    ttft t = {.t0 = hl_time_ns()};
    runner_request req = {.tokens = c->toks, .n_tokens = c->n, .num_predict = N_GEN,
                          .emit = on_event, .user = &t};
    hl_err err;
    if (runner_generate(r, &req, st, &err)) {
        fprintf(stderr, "generate: %s\n", err.msg);
        exit(1);
    }
    memcpy(c->toks + c->n, t.answer, (size_t)t.n * sizeof *t.answer);
    c->n += t.n;
    return t.n ? (double)(t.first - t.t0) / 1e6 : -1;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(void) {
    const bench_llama shape = {.n_vocab = N_VOCAB, .n_embd = N_EMBD, .n_layer = N_LAYER, .n_ff = N_FF,
                               .n_head = N_HEAD, .n_head_kv = N_HEAD_KV, .n_ctx = 4096};
    model *m = bench_synth_llama(&shape);
    if (!m) return 1;
    hl_err err;

    runner_config cfg = {.n_threads = 2, .block_tokens = 32, .kv_budget_bytes = (size_t)1 << 30};
    runner *r;
    if (runner_create(m, &cfg, &r, &err)) {
        fprintf(stderr, "runner: %s\n", err.msg);
        return 1;
    }
    static conv a, b;
    append_random(&a, SYS_LEN);
    memcpy(&b, &a, sizeof a);
    append_random(&a, USER_LEN);
    append_random(&b, USER_LEN);

    printf("model: llama %d layers, embd %d, %d/%d heads, ff %d, Q8_0; 2 threads; KV blocks of "
           "32 tokens\n",
           N_LAYER, N_EMBD, N_HEAD, N_HEAD_KV, N_FF);
    runner_stats st;
    double cold = turn(r, &a, &st);
    printf("A turn 1 (cold):                   prompt %4d  TTFT %8.1f ms  (cached %d)\n",
           st.prompt_eval_count, cold, st.cached_tokens);
    double sys_hit = turn(r, &b, &st);
    printf("B turn 1 (system prompt cached):   prompt %4d  TTFT %8.1f ms  (cached %d)\n",
           st.prompt_eval_count, sys_hit, st.cached_tokens);
    double hits[2 * ROUNDS];
    int n_hits = 0;
    for (int round = 0; round < ROUNDS; round++) {
        conv *cs[2] = {&a, &b};
        for (int k = 0; k < 2; k++) {
            conv *c = cs[k];
            append_random(c, 12); /* the next user message after the answer */
            hits[n_hits] = turn(r, c, &st);
            printf("%c turn %d (conversation cached):    prompt %4d  TTFT %8.1f ms  (cached %d)\n",
                   k ? 'B' : 'A', round + 2, st.prompt_eval_count, hits[n_hits],
                   st.cached_tokens);
            n_hits++;
        }
    }
    qsort(hits, (size_t)n_hits, sizeof *hits, cmp_double);
    double median = (hits[n_hits / 2 - 1] + hits[n_hits / 2]) / 2;
    printf("TTFT cold %.1f ms, cache hit median %.1f ms: %.1fx faster\n", cold, median,
           cold / median);

    kv_pool_stats ps = kv_pool_get_stats(runner_kv_pool(r));
    const size_t per_token = ps.block_bytes / 32;
    size_t shared = ps.n_blocks * ps.block_bytes;
    size_t copies = ((size_t)a.n + (size_t)b.n) * per_token;
    printf("KV memory: %zu blocks shared = %.1f MiB; full copies per conversation = %.1f MiB "
           "(%.2fx)\n",
           ps.n_blocks, shared / 1048576.0, copies / 1048576.0, (double)copies / (double)shared);
    runner_memory mem = runner_get_memory(r);
    printf("memory: weights %.1f MiB + KV %.1f MiB + scratch %.1f MiB = %.1f MiB\n",
           mem.weights / 1048576.0, mem.kv / 1048576.0, mem.scratch / 1048576.0,
           mem.total / 1048576.0);
    runner_destroy(r);
    model_free(m);
    return 0;
}
