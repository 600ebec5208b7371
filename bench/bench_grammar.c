/*
 * bench_grammar.c - constrained decoding (src/grammar): the cost of one token mask in
 * microseconds at 32k and 152k vocabularies, next to one decode forward pass of a small
 * model with the same vocabulary (Qwen2.5-0.5B's shape, 2 of its 24 layers, Q8_0) for
 * scale.
 *
 *   build/bench/bench_grammar [--threads 2] [--tokens 400] [--no-forward]
 *
 * Vocabularies: synthetic SentencePiece-style ones (256 byte tokens, words with and
 * without a leading space, digit runs, JSON punctuation clusters, whitespace runs, CJK
 * characters) of 32000 and 151936 tokens; when $HEARTH_SHARED (or ../shared) holds
 * them, also the real llama SPM vocabulary (32000) and Qwen3's (151669 + added).
 * Per vocabulary: the mask at fixed states (after '{', inside a free string: the whole
 * trie passes, the worst case; inside a number; in the free text of a request with
 * tools, before any <tool_call>), and the mean and max over the tokens of
 * walks through a schema (each token drawn uniformly from those the mask allows), the
 * per-token figure that matters. Times are thread CPU time, median of runs.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/pool.h"
#include "common/synth.h"
#include "gguf/gguf.h"
#include "grammar/grammar.h"
#include "model/model.h"
#include "tok/tok.h"

static uint64_t cpu_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}
static uint64_t wall_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint64_t g_rng = 0x9e3779b97f4a7c15ULL;
static uint64_t rnd(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}

static void add(tok_vocab *v, const char *s, size_t n, tok_token_type t) {
    tok_vocab_add_token(v, s, n, 0, t);
}

/* A SentencePiece-style vocabulary of n tokens, every piece distinct. */
static tok_vocab *synth_vocab(int n) {
    tok_vocab *v = tok_vocab_create(TOK_MODEL_SPM, NULL);
    add(v, "<unk>", 5, TOK_TYPE_UNKNOWN);
    add(v, "<s>", 3, TOK_TYPE_CONTROL);
    add(v, "</s>", 4, TOK_TYPE_CONTROL);
    char buf[64];
    for (int b = 0; b < 256; b++) {
        snprintf(buf, sizeof buf, "<0x%02X>", b);
        add(v, buf, strlen(buf), TOK_TYPE_BYTE);
    }
    static const char *const punct[] = {"{\"", "\":", "\",", "\"}", "},", "[", "],", "\":\"", "\",\"",
                                        "\":[", "\":{", "}}", "]}", ",\"", "\"", ":", ",", "{", "}",
                                        "\\n", "\\\"", "().", "...", "--", "!=", "==", "->", "//"};
    const int np = (int)(sizeof punct / sizeof *punct);
    static const char sp[] = "\xe2\x96\x81"; /* U+2581 */
    for (int i = 0, id = 259; id < n; i++, id++) {
        int kind = (int)(rnd() % 100);
        size_t len = 0;
        if (kind < 70) { /* a word, 60% with a leading space */
            if (rnd() % 10 < 6) memcpy(buf, sp, 3), len = 3;
            int k = i;
            do {
                buf[len++] = (char)('a' + k % 26);
                k /= 26;
            } while (k && len < 40);
        } else if (kind < 78) { /* digits */
            int k = i;
            do {
                buf[len++] = (char)('0' + k % 10);
                k /= 10;
            } while (k && len < 40);
            buf[len++] = 'x'; /* distinct from the words */
        } else if (kind < 88) { /* punctuation, then a distinct tail */
            const char *p = punct[i % np];
            memcpy(buf, p, strlen(p));
            len = strlen(p);
            int k = i / np;
            while (k && len < 40) {
                buf[len++] = (char)('A' + k % 26);
                k /= 26;
            }
        } else if (kind < 92) { /* whitespace runs */
            int k = i;
            buf[len++] = '\n';
            while (len < 2 + (size_t)(k % 16)) memcpy(buf + len, sp, 3), len += 3;
            buf[len++] = (char)('a' + (k / 16) % 26);
            k /= 16 * 26;
            while (k && len < 50) {
                buf[len++] = (char)('a' + k % 26);
                k /= 26;
            }
        } else { /* CJK */
            int k = i;
            do {
                int c = 0x4E00 + k % 20000;
                buf[len++] = (char)(0xE0 | c >> 12);
                buf[len++] = (char)(0x80 | (c >> 6 & 63));
                buf[len++] = (char)(0x80 | (c & 63));
                k /= 20000;
            } while (k && len < 40);
        }
        add(v, buf, len, TOK_TYPE_NORMAL);
    }
    tok_vocab_set_special(v, TOK_SPECIAL_BOS, 1);
    tok_vocab_set_special(v, TOK_SPECIAL_EOS, 2);
    tok_vocab_set_special(v, TOK_SPECIAL_UNK, 0);
    hl_err err;
    if (tok_vocab_finish(v, &err) != HL_OK) {
        fprintf(stderr, "synthetic vocabulary: %s\n", err.msg);
        tok_vocab_destroy(v);
        return NULL;
    }
    return v;
}

static const char *k_schema =
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":40},\"age\":"
    "{\"type\":\"integer\",\"minimum\":0,\"maximum\":150},\"tags\":{\"type\":\"array\",\"items\":"
    "{\"type\":\"string\",\"maxLength\":12},\"maxItems\":4},\"kind\":{\"enum\":[\"cat\",\"dog\","
    "\"bird\"]},\"home\":{\"anyOf\":[{\"type\":\"null\"},{\"type\":\"object\",\"properties\":"
    "{\"city\":{\"type\":\"string\",\"maxLength\":20},\"zip\":{\"type\":\"integer\"}},\"required\":"
    "[\"city\"],\"additionalProperties\":false}]}},\"required\":[\"name\",\"age\",\"tags\",\"kind\","
    "\"home\"],\"additionalProperties\":false}";

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Median mask time (us) at the state reached by prefix. */
static double mask_at(const gram_schema *s, const gram_vocab *gv, const gram_think *th,
                      const char *prefix, float *logits, int32_t nv) {
    gram_matcher *m;
    hl_err err;
    if (gram_matcher_create(s, gv, th, &m, &err) != HL_OK) return -1;
    if (!gram_matcher_feed(m, prefix, strlen(prefix))) {
        gram_matcher_free(m);
        return -1;
    }
    uint64_t t[15];
    for (int r = 0; r < 15; r++) {
        memset(logits, 0, (size_t)nv * sizeof *logits);
        uint64_t t0 = cpu_ns();
        gram_matcher_mask(m, logits, nv);
        t[r] = cpu_ns() - t0;
    }
    gram_matcher_free(m);
    qsort(t, 15, sizeof *t, cmp_u64);
    return (double)t[7] / 1e3;
}

/* Walks through the schema, drawing each token uniformly among the allowed ones. */
static void walk(const gram_schema *s, const gram_vocab *gv, const tok_vocab *v, float *logits,
                 int32_t nv, int max_tokens, double *mean_us, double *max_us, int *n_tok) {
    int32_t *ok = malloc((size_t)nv * sizeof *ok);
    uint64_t total = 0, worst = 0;
    int n = 0;
    gram_matcher *m = NULL;
    hl_err err;
    while (n < max_tokens) {
        if (!m && gram_matcher_create(s, gv, NULL, &m, &err) != HL_OK) break;
        memset(logits, 0, (size_t)nv * sizeof *logits);
        uint64_t t0 = cpu_ns();
        gram_matcher_mask(m, logits, nv);
        uint64_t dt = cpu_ns() - t0;
        total += dt;
        if (dt > worst) worst = dt;
        n++;
        int32_t k = 0;
        for (int32_t i = 0; i < nv; i++)
            if (logits[i] == 0) ok[k++] = i;
        int32_t t = k ? ok[rnd() % (uint64_t)k] : 0;
        gram_matcher_accept(m, t);
        if (tok_is_eog(v, t) || gram_matcher_complete(m)) { /* start another object */
            gram_matcher_free(m);
            m = NULL;
        }
    }
    gram_matcher_free(m);
    free(ok);
    *mean_us = n ? (double)total / n / 1e3 : 0;
    *max_us = (double)worst / 1e3;
    *n_tok = n;
}

/* One decode step (ms, median of 7 after a warm-up) of Qwen2.5-0.5B's shape cut to 2
 * layers, with this vocabulary size; the output matmul dominates at large vocabularies. */
static double forward_ms(int n_vocab, int threads) {
    bench_llama c = {.n_vocab = n_vocab, .n_embd = 896, .n_layer = 2, .n_ff = 4864, .n_head = 14,
                     .n_head_kv = 2, .n_ctx = 256};
    model *m = bench_synth_llama(&c);
    if (!m) return -1;
    model_kv *kv = NULL;
    model_ctx *ctx = NULL;
    hl_err err;
    double ms = -1;
    if (model_kv_create(m, 64, &kv, &err) == HL_OK && model_ctx_create(m, threads, 8, &ctx, &err) == HL_OK) {
        uint64_t t[8];
        int32_t tok = 5;
        for (int r = 0; r < 8; r++) {
            uint64_t t0 = wall_ns();
            if (model_eval(ctx, kv, &tok, 1, NULL, &err) != HL_OK) break;
            t[r] = wall_ns() - t0;
        }
        qsort(t + 1, 7, sizeof *t, cmp_u64);
        ms = (double)t[4] / 1e6;
    }
    model_ctx_free(ctx);
    model_kv_free(kv);
    model_free(m);
    return ms;
}

static void run(const char *name, tok_vocab *v, int threads, int walk_tokens, bool fwd) {
    hl_err err;
    gram_vocab *gv = NULL;
    uint64_t t0 = wall_ns();
    if (gram_vocab_create(v, &gv, &err) != HL_OK) {
        fprintf(stderr, "%s: %s\n", name, err.msg);
        return;
    }
    double build_ms = (double)(wall_ns() - t0) / 1e6;
    gram_schema *s = NULL;
    if (gram_compile(k_schema, strlen(k_schema), &s, &err) != HL_OK) {
        fprintf(stderr, "schema: %s\n", err.msg);
        gram_vocab_free(gv);
        return;
    }
    int32_t nv = tok_vocab_n_tokens(v);
    float *logits = malloc((size_t)nv * sizeof *logits);
    double at_open = mask_at(s, gv, NULL, "{", logits, nv);
    double in_str = mask_at(s, gv, NULL, "{\"name\":\"ab", logits, nv);
    double in_num = mask_at(s, gv, NULL, "{\"name\":\"x\",\"age\":1", logits, nv);
    /* a request with tools: free text before any <tool_call> (a lazy grammar) */
    gram_think lazy = {.trigger = "<tool_call>", .trigger_end = "</tool_call>"};
    double in_free = mask_at(s, gv, &lazy, "Let me look that up", logits, nv);
    double mean, worst;
    int n;
    walk(s, gv, v, logits, nv, walk_tokens, &mean, &worst, &n);
    double f = fwd ? forward_ms(nv, threads) : -1;
    printf("%-22s %7d  trie %6.1f ms | after '{' %7.1f  in string %7.1f  in number %7.1f  "
           "tools' free text %7.1f | walk mean %7.1f max %7.1f us (%d tok)",
           name, nv, build_ms, at_open, in_str, in_num, in_free, mean, worst, n);
    if (f > 0) printf(" | forward %6.2f ms (mask = %.1f%%)", f, mean / 10.0 / f);
    printf("\n");
    free(logits);
    gram_schema_free(s);
    gram_vocab_free(gv);
}

static tok_vocab *shared_vocab(const char *rel, bool hf) {
    const char *root = getenv("HEARTH_SHARED");
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", root && *root ? root : "../shared", rel);
    tok_vocab *v = NULL;
    hl_err err;
    if (hf) {
        if (tok_vocab_load_hf(path, &v, &err) != HL_OK) return NULL;
        return v;
    }
    gguf_file *f = NULL;
    if (gguf_open(path, &f, &err) != HL_OK) return NULL;
    if (tok_vocab_load_gguf(f, &v, &err) != HL_OK) v = NULL;
    gguf_close(f); /* the vocabulary copies what it keeps */
    return v;
}

int main(int argc, char **argv) {
    int threads = 2, walk_tokens = 400;
    bool fwd = true;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--tokens") && i + 1 < argc) walk_tokens = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--no-forward")) fwd = false;
        else {
            fprintf(stderr, "usage: bench_grammar [--threads N] [--tokens N] [--no-forward]\n");
            return 2;
        }
    }
    printf("mask cost per token (us, thread CPU time); forward: one decode step of a 2-layer "
           "Qwen2.5-0.5B-shaped model, %d threads\n", threads);
    const int sizes[] = {32000, 151936};
    for (int i = 0; i < 2; i++) {
        tok_vocab *v = synth_vocab(sizes[i]);
        if (!v) return 1;
        char name[64];
        snprintf(name, sizeof name, "synthetic-%dk", sizes[i] / 1000);
        run(name, v, threads, walk_tokens, fwd);
        tok_vocab_destroy(v);
    }
    tok_vocab *v = shared_vocab("models/ggml-vocab/ggml-vocab-llama-spm.gguf", false);
    if (v) run("llama-spm (real)", v, threads, walk_tokens, false), tok_vocab_destroy(v);
    v = shared_vocab("models/hf-tokenizers/qwen3/tokenizer.json.gz", true);
    if (v) run("qwen3 (real)", v, threads, walk_tokens, false), tok_vocab_destroy(v);
    return 0;
}
