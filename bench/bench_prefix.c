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
#include "gguf/gguf.h"
#include "kv/trie.h"
#include "runner/runner.h"
#include "tensor/types.h"

enum {
    N_VOCAB = 1024, N_EMBD = 512, N_LAYER = 6, N_FF = 1408, N_HEAD = 8, N_HEAD_KV = 4,
    SYS_LEN = 2000, USER_LEN = 40, N_GEN = 8, ROUNDS = 3,
};

static uint64_t rng = 0x2545f4914f6cdd1dULL;
static float frand(void) { /* uniform in [-1, 1) */
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 11) * 0x1.0p-52) - 1.0f;
}

static int add_tensor(gguf_writer *w, const char *name, int64_t rows, int64_t cols, hl_type t,
                      float scale) {
    float *x = malloc(sizeof(float) * (size_t)(rows * cols));
    for (int64_t i = 0; i < rows * cols; i++) x[i] = frand() * scale;
    size_t row_bytes = hl_row_size(t, cols);
    uint8_t *q = malloc(row_bytes * (size_t)rows);
    if (t == HL_TYPE_F32) memcpy(q, x, row_bytes * (size_t)rows);
    else
        for (int64_t r = 0; r < rows; r++) hl_quantize_row(t, x + r * cols, q + r * row_bytes, cols);
    int64_t ne[2] = {cols, rows};
    hl_err err;
    int rc = gguf_writer_add_tensor(w, name, t, rows == 1 ? 1 : 2, ne, q, row_bytes * (size_t)rows,
                                    &err);
    if (rc) fprintf(stderr, "%s: %s\n", name, err.msg);
    free(x);
    free(q);
    return rc;
}

static int write_model(const char *path) {
    gguf_writer *w = gguf_writer_create();
    gguf_writer_set_str(w, "general.architecture", "llama");
    gguf_writer_set_u32(w, "llama.context_length", 4096);
    gguf_writer_set_u32(w, "llama.embedding_length", N_EMBD);
    gguf_writer_set_u32(w, "llama.block_count", N_LAYER);
    gguf_writer_set_u32(w, "llama.feed_forward_length", N_FF);
    gguf_writer_set_u32(w, "llama.attention.head_count", N_HEAD);
    gguf_writer_set_u32(w, "llama.attention.head_count_kv", N_HEAD_KV);
    gguf_writer_set_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
    gguf_writer_set_f32(w, "llama.rope.freq_base", 10000.0f);
    /* a minimal SPM vocabulary: <unk> <s> </s> and word pieces */
    char **toks = malloc(sizeof(char *) * N_VOCAB);
    float *scores = malloc(sizeof(float) * N_VOCAB);
    int32_t *types = malloc(sizeof(int32_t) * N_VOCAB);
    for (int i = 0; i < N_VOCAB; i++) {
        toks[i] = malloc(16);
        snprintf(toks[i], 16, i == 0 ? "<unk>" : i == 1 ? "<s>" : i == 2 ? "</s>" : "\xe2\x96\x81w%d", i);
        scores[i] = (float)-i;
        types[i] = i == 0 ? 2 : i < 3 ? 3 : 1;
    }
    gguf_writer_set_str(w, "tokenizer.ggml.model", "llama");
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)toks, N_VOCAB);
    gguf_writer_set_arr(w, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, scores, N_VOCAB);
    gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, types, N_VOCAB);
    gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 1);
    gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 2);
    for (int i = 0; i < N_VOCAB; i++) free(toks[i]);
    free(toks);
    free(scores);
    free(types);

    const int hd = N_EMBD / N_HEAD, kd = N_HEAD_KV * hd;
    const float ws = 0.05f;
    int rc = add_tensor(w, "token_embd.weight", N_VOCAB, N_EMBD, HL_TYPE_Q8_0, 1.0f);
    rc |= add_tensor(w, "output_norm.weight", 1, N_EMBD, HL_TYPE_F32, 1.0f);
    rc |= add_tensor(w, "output.weight", N_VOCAB, N_EMBD, HL_TYPE_Q8_0, ws);
    for (int l = 0; l < N_LAYER && !rc; l++) {
        char n[64];
#define T(name, rows, cols, type, s) \
    (snprintf(n, sizeof n, "blk.%d.%s", l, name), add_tensor(w, n, rows, cols, type, s))
        rc |= T("attn_norm.weight", 1, N_EMBD, HL_TYPE_F32, 1.0f);
        rc |= T("attn_q.weight", N_EMBD, N_EMBD, HL_TYPE_Q8_0, ws);
        rc |= T("attn_k.weight", kd, N_EMBD, HL_TYPE_Q8_0, ws);
        rc |= T("attn_v.weight", kd, N_EMBD, HL_TYPE_Q8_0, ws);
        rc |= T("attn_output.weight", N_EMBD, N_EMBD, HL_TYPE_Q8_0, ws);
        rc |= T("ffn_norm.weight", 1, N_EMBD, HL_TYPE_F32, 1.0f);
        rc |= T("ffn_gate.weight", N_FF, N_EMBD, HL_TYPE_Q8_0, ws);
        rc |= T("ffn_up.weight", N_FF, N_EMBD, HL_TYPE_Q8_0, ws);
        rc |= T("ffn_down.weight", N_EMBD, N_FF, HL_TYPE_Q8_0, ws);
#undef T
    }
    hl_err err;
    if (!rc && gguf_writer_write_file(w, path, &err)) {
        fprintf(stderr, "write %s: %s\n", path, err.msg);
        rc = 1;
    }
    gguf_writer_destroy(w);
    return rc;
}

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
    for (int i = 0; i < n; i++) c->toks[c->n++] = 3 + (int32_t)((frand() + 1.0f) * 0.5f * (N_VOCAB - 4));
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
    char path[] = "/tmp/hearth-bench-prefix-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) {
        perror("mkstemp");
        return 1;
    }
    close(fd);
    if (write_model(path)) return 1;
    hl_err err;
    model *m;
    if (model_load(path, NULL, &m, &err)) {
        fprintf(stderr, "load: %s\n", err.msg);
        return 1;
    }
    unlink(path);

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
