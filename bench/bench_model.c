/*
 * bench_model.c - end-to-end CPU inference speed on a TinyLlama-1.1B-shaped model
 * (22 layers, 2048 embd, 32 heads, 4 KV heads, 5632 ff, 32000 vocab) with random
 * weights: prefill tokens/s at 512 tokens, decode tokens/s over 128 tokens (from an
 * empty context, like llama-bench's pp512/tg128), the machine's streaming read
 * bandwidth, the bytes a decoded token reads (weights + KV), and decode as a
 * percentage of the bandwidth bound (bandwidth / bytes per token).
 *
 *   bench_model [--type Q8_0,Q4_K_M] [--threads 2] [--runs 5] [--model FILE.gguf]
 *               [--prefill 512] [--decode 128] [--decode-at 0] [--dir build/bench]
 *               [--kv-type f16] [--shape tinyllama] [--layers 22] [--moe] [--batch 1,2,4,8]
 * --decode-at N decodes after N positions of context (filled untimed before each decode
 * run) instead of from empty: what a long conversation costs, where the KV cache is read
 * for every token as well as the weights. --kv-type: the cache's element type (f32, f16,
 * q8_0; default f16, the server's default). --layers N keeps only the first N of the 22
 * layers (a smaller model, DIR/synth-tinyllama-TYPE-LN.gguf), so a long context fills in
 * reasonable time on a small machine.
 * --shape 8b: Llama-3-8B's proportions instead (4096 embd, 32 heads, 8 KV heads, 14336
 * ff; the 32000 vocabulary kept), 4 of its 32 layers unless --layers, about TinyLlama's
 * bytes per token: every matmul row 4096 columns or more, as in the models people run,
 * where TinyLlama has them only in its down projection. DIR/synth-8b-TYPE-LN.gguf.
 * --moe: a mixture-of-experts model instead (Mixtral-style llama GGUF, the TinyLlama
 * attention with 32 experts of 768 per layer, 4 used per token, 8 layers unless --layers:
 * the proportions of Qwen3-30B-A3B's FFN), DIR/synth-moe-TYPE-LN.gguf. For any model with
 * experts ({arch}.expert_count), the bytes per decoded token count only the
 * expert_used_count experts a token reads of each layer's expert tensors.
 * --batch N1,N2,...: batched decode instead: one forward pass (model_eval_batch) of N
 * single-token sequences, each with BATCH_CTX cached positions, what a decode step of the
 * server costs with N clients; the levels take turns within each run (N1, N2, ..., N1,
 * ...) so a shared machine's load changes all of them alike. Prints ms per step, the
 * aggregate tokens/s and the time per token relative to N = 1.
 * Environment: HEARTH_BENCH_TYPES, HEARTH_BENCH_THREADS, HEARTH_BENCH_RUNS.
 *
 * The model file is generated with hearth's GGUF writer and quantizer into
 * DIR/synth-tinyllama-TYPE.gguf (kept and reused; delete it to regenerate). Each
 * tensor's rows are drawn from a bank of 64 random rows quantized with the real
 * quantizer (types per llama.cpp's mix rules via quant_plan), so generation takes
 * seconds, not the minutes the K-quant scale search needs for 1.1B weights; speed
 * does not depend on the values. Figures are medians over --runs runs; the bandwidth
 * is the best of several passes (a stricter bound than the median). The machine is
 * shared, so CPU time per token is printed too.
 *
 * Two bounds. Strict: the best bandwidth seen at any point of the type's measurement
 * (8 passes at the start of the bench, 4 before each decode run; each pass reads with
 * one or two streams per thread in turn, readprobe.h), so a bus that got faster after
 * the start cannot push decode over 100%. Paired: before every decode run, the best of
 * 4 passes taken just then, so a run is set against what the memory bus
 * delivered at the same time; the paired figure is the median of the runs' decode /
 * bound ratios. On a shared VM the bus swings by 2x within minutes, and a bound read
 * minutes before the run measures the neighbours.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "base/pool.h"
#include "common/readprobe.h"
#include "common/stats.h"
#include "model_synth.h"
#include "gguf/gguf.h"
#include "kernels/kernels.h"
#include "kv/block.h"
#include "kv/layout.h"
#include "model/model.h"
#include "quant/quantize.h"

enum {
    N_LAYER = 32, N_VOCAB = 32000, BANK_ROWS = 64, MAX_RUNS = 32,
    MOE_EXPERTS = 32, MOE_USED = 4, MOE_FF = 768, MOE_LAYERS = 8
};

/* --shape: the dense model's proportions (the vocabulary stays 32000) */
typedef struct model_shape {
    const char *name, *desc;
    int embd, head, head_kv, ff, layers; /* layers: the default of --layers */
} model_shape;
static const model_shape g_shapes[] = {
    {"tinyllama", "TinyLlama-1.1B", 2048, 32, 4, 5632, 22},
    /* Llama-3-8B's matmuls: every row 4096 columns or more; 4 of its 32 layers by default,
     * about TinyLlama's bytes per token */
    {"8b", "Llama-3-8B", 4096, 32, 8, 14336, 4},
};
static const model_shape *g_shape = &g_shapes[0];
#define N_EMBD (g_shape->embd)
#define N_HEAD (g_shape->head)
#define N_HEAD_KV (g_shape->head_kv)
#define N_FF (g_shape->ff)
#define HEAD_DIM (g_shape->embd / g_shape->head)

static int g_layers = 22;          /* --layers */
static bool g_moe;                 /* --moe */
static hl_type g_kv_type = HL_TYPE_F16; /* --kv-type */

static double now_s(clockid_t c) {
    struct timespec ts;
    clock_gettime(c, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t g_rng = 0x2545f4914f6cdd1dull;
static uint64_t rng_next(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}
static float rng_unit(void) { return (float)(rng_next() >> 40) / 16777216.0f * 2.0f - 1.0f; }

/* ---- synthetic model ---------------------------------------------------------------- */

typedef struct tdesc {
    char name[64];
    uint32_t n_dims;
    int64_t ne0, ne1, ne2; /* ne2: experts of a 3-D tensor, else 1 */
} tdesc;

static int tinyllama_tensors(tdesc *t) {
    int n = 0;
#define T(nd, a, b, ...)                                                                  \
    do {                                                                                  \
        snprintf(t[n].name, sizeof t[n].name, __VA_ARGS__);                               \
        t[n].n_dims = nd;                                                                 \
        t[n].ne0 = a;                                                                     \
        t[n].ne1 = b;                                                                     \
        t[n].ne2 = 1;                                                                     \
        n++;                                                                              \
    } while (0)
    T(2, N_EMBD, N_VOCAB, "token_embd.weight");
    for (int l = 0; l < g_layers; l++) {
        T(1, N_EMBD, 1, "blk.%d.attn_norm.weight", l);
        T(2, N_EMBD, N_EMBD, "blk.%d.attn_q.weight", l);
        T(2, N_EMBD, N_HEAD_KV * HEAD_DIM, "blk.%d.attn_k.weight", l);
        T(2, N_EMBD, N_HEAD_KV * HEAD_DIM, "blk.%d.attn_v.weight", l);
        T(2, N_EMBD, N_EMBD, "blk.%d.attn_output.weight", l);
        T(1, N_EMBD, 1, "blk.%d.ffn_norm.weight", l);
        if (g_moe) {
            T(2, N_EMBD, MOE_EXPERTS, "blk.%d.ffn_gate_inp.weight", l);
            T(3, N_EMBD, MOE_FF, "blk.%d.ffn_gate_exps.weight", l);
            t[n - 1].ne2 = MOE_EXPERTS;
            T(3, N_EMBD, MOE_FF, "blk.%d.ffn_up_exps.weight", l);
            t[n - 1].ne2 = MOE_EXPERTS;
            T(3, MOE_FF, N_EMBD, "blk.%d.ffn_down_exps.weight", l);
            t[n - 1].ne2 = MOE_EXPERTS;
            continue;
        }
        T(2, N_EMBD, N_FF, "blk.%d.ffn_gate.weight", l);
        T(2, N_EMBD, N_FF, "blk.%d.ffn_up.weight", l);
        T(2, N_FF, N_EMBD, "blk.%d.ffn_down.weight", l);
    }
    T(1, N_EMBD, 1, "output_norm.weight");
    T(2, N_EMBD, N_VOCAB, "output.weight");
#undef T
    return n;
}

static hl_status generate_model(const char *path, quant_ftype ftype, hl_pool *pool, hl_err *err) {
    tdesc t[3 + N_LAYER * 10];
    const int n = tinyllama_tensors(t);
    quant_tensor_info info[3 + N_LAYER * 10];
    hl_type types[3 + N_LAYER * 10];
    for (int i = 0; i < n; i++)
        info[i] = (quant_tensor_info){t[i].name, t[i].n_dims,
                                      {t[i].ne0, t[i].ne1, t[i].ne2, 1}, HL_TYPE_F32};
    quant_plan(ftype, info, n, N_HEAD / N_HEAD_KV, types);

    gguf_writer *w = gguf_writer_create();
    if (!w) return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    gguf_writer_set_str(w, "general.architecture", "llama");
    char name[128];
    snprintf(name, sizeof name, "synthetic %s shape (hearth bench)", g_shape->desc);
    gguf_writer_set_str(w, "general.name",
                        g_moe ? "synthetic MoE, TinyLlama attention (hearth bench)" : name);
    gguf_writer_set_u32(w, "general.file_type", (uint32_t)ftype);
    gguf_writer_set_u32(w, "general.quantization_version", 2);
    gguf_writer_set_u32(w, "llama.context_length", 2048);
    gguf_writer_set_u32(w, "llama.embedding_length", N_EMBD);
    gguf_writer_set_u32(w, "llama.block_count", (uint32_t)g_layers);
    gguf_writer_set_u32(w, "llama.feed_forward_length", g_moe ? MOE_FF : N_FF);
    if (g_moe) {
        gguf_writer_set_u32(w, "llama.expert_count", MOE_EXPERTS);
        gguf_writer_set_u32(w, "llama.expert_used_count", MOE_USED);
    }
    gguf_writer_set_u32(w, "llama.attention.head_count", N_HEAD);
    gguf_writer_set_u32(w, "llama.attention.head_count_kv", N_HEAD_KV);
    gguf_writer_set_u32(w, "llama.rope.dimension_count", HEAD_DIM);
    gguf_writer_set_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
    gguf_writer_set_f32(w, "llama.rope.freq_base", 10000.0f);
    synth_write_vocab(w, N_VOCAB);

    float *bank_f = malloc(sizeof(float) * BANK_ROWS * N_FF);
    uint8_t *bank_q = malloc(hl_row_size(HL_TYPE_F32, N_FF) * BANK_ROWS);
    hl_status s = bank_f && bank_q ? HL_OK : hl_fail(err, HL_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n && s == HL_OK; i++) {
        const hl_type ty = types[i];
        const int64_t cols = t[i].ne0, rows = t[i].ne1 * t[i].ne2;
        const size_t row_bytes = hl_row_size(ty, cols);
        if (t[i].n_dims == 1) {
            for (int64_t c = 0; c < cols; c++) bank_f[c] = 1.0f + 0.1f * rng_unit();
            s = gguf_writer_add_tensor(w, t[i].name, HL_TYPE_F32, 1, &t[i].ne0, bank_f,
                                       (uint64_t)cols * 4, err);
            continue;
        }
        /* random rows scaled like trained weights (std ~ 1/sqrt(cols)) */
        const float scale = 1.7f / sqrtf((float)cols);
        for (int64_t k = 0; k < BANK_ROWS * cols; k++) bank_f[k] = scale * rng_unit();
        quant_rows(pool, ty, bank_f, bank_q, BANK_ROWS, cols);
        uint8_t *data = malloc(row_bytes * (size_t)rows);
        if (!data) {
            s = hl_fail(err, HL_ERR_NOMEM, "out of memory for %s", t[i].name);
            break;
        }
        for (int64_t r = 0; r < rows; r++)
            memcpy(data + (size_t)r * row_bytes, bank_q + (rng_next() % BANK_ROWS) * row_bytes,
                   row_bytes);
        const int64_t ne[3] = {cols, t[i].ne1, t[i].ne2};
        s = gguf_writer_add_tensor(w, t[i].name, ty, t[i].n_dims, ne, data,
                                   row_bytes * (uint64_t)rows, err);
        free(data);
    }
    free(bank_f);
    free(bank_q);
    if (s == HL_OK) s = gguf_writer_write_file(w, path, err);
    gguf_writer_destroy(w);
    return s;
}

/* ---- bandwidth ---------------------------------------------------------------------- */

typedef struct bw_job {
    const uint8_t *buf;
    size_t bytes;
    int streams;       /* per thread: 1 or 2 (bench_read) */
    uint64_t sink[64]; /* per thread, keeps the loads alive */
} bw_job;

/* A contiguous part of the buffer per thread, 256-byte aligned (bench_read). */
static void bw_worker(void *ctx, int ith, int nth) {
    bw_job *j = ctx;
    const size_t units = j->bytes / 256;
    const size_t lo = units * (size_t)ith / (size_t)nth * 256;
    const size_t hi = units * (size_t)(ith + 1) / (size_t)nth * 256;
    j->sink[ith & 63] = bench_read(j->buf + lo, hi - lo, j->streams);
}

/* Streaming read of a 1 GiB buffer (bw_buffer) by the pool's threads, one and two
 * streams per thread in turn; best of `passes`, bytes/s. */
#define BW_BYTES ((size_t)1 << 30)
static uint8_t *bw_buffer(void) {
    uint8_t *buf = bench_stream_alloc(BW_BYTES);
    if (buf) memset(buf, 1, BW_BYTES);
    return buf;
}

static double read_bandwidth(hl_pool *pool, const uint8_t *buf, int passes, double *median_out) {
    const size_t bytes = BW_BYTES;
    *median_out = 0;
    if (!buf) return 0;
    bw_job j = {.buf = buf, .bytes = bytes, .streams = 1};
    double best = 0, all[MAX_RUNS];
    if (passes > MAX_RUNS) passes = MAX_RUNS;
    hl_pool_run(pool, bw_worker, &j); /* warm-up */
    for (int p = 0; p < passes; p++) {
        j.streams = 1 + p % 2;
        const double t0 = now_s(CLOCK_MONOTONIC);
        hl_pool_run(pool, bw_worker, &j);
        const double bw = (double)bytes / (now_s(CLOCK_MONOTONIC) - t0);
        all[p] = bw;
        if (bw > best) best = bw;
    }
    *median_out = bench_median(all, passes);
    return best;
}

/* ---- measurement -------------------------------------------------------------------- */

/* An integer metadata key of the file's architecture ("{arch}.suffix"), or 0. */
static uint32_t arch_u32(const gguf_file *f, const char *suffix) {
    gguf_str arch;
    char key[128];
    uint32_t v = 0;
    if (!gguf_get_str(f, "general.architecture", &arch)) return 0;
    snprintf(key, sizeof key, "%.*s.%s", (int)(arch.len > 64 ? 64 : arch.len), arch.ptr, suffix);
    return gguf_get_u32(f, key, &v) ? v : 0;
}

/* Bytes one decoded token reads: every weight once (token_embd: one row; of each expert
 * tensor, "*_exps.weight", only the expert_used_count experts of expert_count the token is
 * routed to), plus K and V of every cached position, averaged over a decode of n_decode
 * tokens after `at`. *active_experts: the expert bytes counted, *all_experts: all of them. */
static void bytes_per_token(const char *path, int n_decode, int at, double *weights,
                            double *kv, double *active_experts, double *all_experts) {
    gguf_file *f;
    hl_err err;
    *weights = *active_experts = *all_experts = 0;
    if (gguf_open(path, &f, &err) != HL_OK) return;
    const uint32_t n_exp = arch_u32(f, "expert_count"), n_used = arch_u32(f, "expert_used_count");
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        const size_t nl = t->name.len;
        if (gguf_str_eq(t->name, "token_embd.weight")) {
            *weights += (double)hl_row_size(t->type, t->ne[0]);
        } else if (n_exp > 0 && n_used <= n_exp && nl > 12 &&
                   memcmp(t->name.ptr + nl - 12, "_exps.weight", 12) == 0) {
            const double active = (double)t->n_bytes * n_used / n_exp;
            *weights += active;
            *active_experts += active;
            *all_experts += (double)t->n_bytes;
        } else {
            *weights += (double)t->n_bytes;
        }
    }
    gguf_close(f);
    const double per_pos =
        (double)g_layers * N_HEAD_KV * 2 * (double)hl_row_size(g_kv_type, HEAD_DIM);
    *kv = per_pos * (at + (n_decode + 1) / 2.0);
}

typedef struct result {
    double pp, tg, pp_cpu_ms, tg_cpu_ms; /* medians; cpu ms per token */
    double tg_paired;                    /* median of decode / bound read just before */
    double bw_max;                       /* best bandwidth read before any decode run */
    double tg_min, tg_max;               /* the spread of the decode runs */
} result;

static hl_status measure(const char *path, int threads, int runs, int n_prefill, int n_decode,
                         int at, hl_pool *bw_pool, const uint8_t *bw_buf, double bytes_per_tok,
                         result *r, hl_err *err) {
    model *m = NULL;
    model_kv *kv = NULL;
    model_ctx *c = NULL;
    const int n_first = n_prefill > at ? n_prefill : at; /* decode tokens follow these */
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)(n_first + n_decode));
    hl_status s = toks ? HL_OK : hl_fail(err, HL_ERR_NOMEM, "out of memory");
    if (s == HL_OK) s = model_load(path, NULL, &m, err);
    if (s == HL_OK) s = model_kv_create_ex(m, n_first + n_decode + 8, g_kv_type, g_kv_type, &kv, err);
    if (s == HL_OK) s = model_ctx_create(m, threads, n_prefill, &c, err);
    for (int i = 0; s == HL_OK && i < n_first + n_decode; i++)
        toks[i] = 3 + (int32_t)(rng_next() % (N_VOCAB - 3));
    double pp[MAX_RUNS], tg[MAX_RUNS], ppc[MAX_RUNS], tgc[MAX_RUNS], paired[MAX_RUNS];
    /* one untimed decode step and prefill warm the page cache and the pool */
    if (s == HL_OK) s = model_eval(c, kv, toks, n_prefill < 32 ? n_prefill : 32, NULL, err);
    for (int run = 0; s == HL_OK && run < runs; run++) {
        s = model_kv_truncate(kv, 0, err);
        double t0 = now_s(CLOCK_MONOTONIC), c0 = now_s(CLOCK_PROCESS_CPUTIME_ID);
        if (s == HL_OK) s = model_eval(c, kv, toks, n_prefill, NULL, err);
        pp[run] = n_prefill / (now_s(CLOCK_MONOTONIC) - t0);
        ppc[run] = (now_s(CLOCK_PROCESS_CPUTIME_ID) - c0) * 1e3 / n_prefill;
        if (s == HL_OK) s = model_kv_truncate(kv, 0, err);
        for (int done = 0; s == HL_OK && done < at; done += n_prefill) /* context, untimed */
            s = model_eval(c, kv, toks + done, at - done < n_prefill ? at - done : n_prefill, NULL,
                           err);
        double bw_med;
        const double bw = read_bandwidth(bw_pool, bw_buf, 4, &bw_med);
        t0 = now_s(CLOCK_MONOTONIC);
        c0 = now_s(CLOCK_PROCESS_CPUTIME_ID);
        for (int i = 0; s == HL_OK && i < n_decode; i++)
            s = model_eval(c, kv, toks + n_first + i, 1, NULL, err);
        tg[run] = n_decode / (now_s(CLOCK_MONOTONIC) - t0);
        tgc[run] = (now_s(CLOCK_PROCESS_CPUTIME_ID) - c0) * 1e3 / n_decode;
        paired[run] = bw > 0 ? tg[run] / (bw / bytes_per_tok) : 0;
        if (bw > r->bw_max) r->bw_max = bw;
        fprintf(stderr,
                "  run %d: prefill %.1f tok/s, decode %.2f tok/s (%.0f%% of the bound at "
                "%.1f GB/s read just before)\n",
                run + 1, pp[run], tg[run], 100 * paired[run], bw / 1e9);
    }
    if (s == HL_OK) {
        r->pp = bench_median(pp, runs);
        r->tg_min = r->tg_max = tg[0];
        for (int i = 1; i < runs; i++) {
            if (tg[i] < r->tg_min) r->tg_min = tg[i];
            if (tg[i] > r->tg_max) r->tg_max = tg[i];
        }
        r->tg = bench_median(tg, runs);
        r->pp_cpu_ms = bench_median(ppc, runs);
        r->tg_cpu_ms = bench_median(tgc, runs);
        r->tg_paired = bench_median(paired, runs);
    }
    model_ctx_free(c);
    model_kv_free(kv);
    model_free(m);
    free(toks);
    return s;
}

/* ---- batched decode (--batch) ---------------------------------------------------------- */

enum { BATCH_MAX = 16, BATCH_CTX = 64, BATCH_STEPS = 16, BATCH_BLOCK = 32 };

/* ms per forward pass of n[k] single-token sequences, median over runs x BATCH_STEPS. */
static hl_status measure_batch(const char *path, int threads, int runs, const int *n, int n_levels,
                               double *ms_out, hl_err *err) {
    model *m = NULL;
    model_ctx *c = NULL;
    kv_pool *pool = NULL;
    kv_table t[BATCH_MAX];
    int32_t tok[BATCH_MAX];
    float *logits = NULL;
    double *ms = calloc((size_t)n_levels * (size_t)runs * BATCH_STEPS, sizeof *ms);
    int n_tables = 0;
    hl_status s = ms ? HL_OK : hl_fail(err, HL_ERR_NOMEM, "out of memory");
    if (s == HL_OK) s = model_load(path, NULL, &m, err);
    if (s == HL_OK) s = model_ctx_create(m, threads, BATCH_MAX, &c, err);
    if (s == HL_OK) {
        const model_hparams *hp = model_get_hparams(m);
        kv_pool_config pc = {.layout = {hp->n_layer, hp->n_head_kv, hp->head_dim_k,
                                        hp->head_dim_v, BATCH_BLOCK, NULL, g_kv_type, g_kv_type},
                             .budget_bytes = (size_t)1 << 30};
        s = kv_pool_create(&pc, &pool, err);
        logits = s == HL_OK ? malloc(sizeof(float) * BATCH_MAX * (size_t)hp->n_vocab) : NULL;
        if (s == HL_OK && !logits) s = hl_fail(err, HL_ERR_NOMEM, "out of memory");
    }
    for (; s == HL_OK && n_tables < BATCH_MAX; n_tables++) {
        kv_table_init(&t[n_tables], pool);
        s = kv_table_reserve(&t[n_tables], BATCH_CTX + 1, err);
        kv_table_commit(&t[n_tables], BATCH_CTX); /* the rows' values do not change the time */
        tok[n_tables] = 3 + (int32_t)(rng_next() % (N_VOCAB - 3));
    }
    model_batch_entry e[BATCH_MAX];
    for (int i = 0; s == HL_OK && i < BATCH_MAX; i++)
        e[i] = (model_batch_entry){.kv = {.blocks = t[i].data, .n_blocks = t[i].n_blocks,
                                          .block_tokens = BATCH_BLOCK, .len = t[i].len,
                                          .geom = kv_pool_geom(pool)},
                                   .tokens = &tok[i], .n_tokens = 1, .want_logits = true};
    if (s == HL_OK) s = model_eval_batch(c, e, BATCH_MAX, logits, err); /* warm */
    for (int run = 0; s == HL_OK && run < runs; run++)
        for (int k = 0; s == HL_OK && k < n_levels; k++)
            for (int step = 0; s == HL_OK && step < BATCH_STEPS; step++) {
                const double t0 = now_s(CLOCK_MONOTONIC);
                s = model_eval_batch(c, e, n[k], logits, err);
                ms[((size_t)k * runs + run) * BATCH_STEPS + step] =
                    (now_s(CLOCK_MONOTONIC) - t0) * 1e3;
            }
    for (int k = 0; s == HL_OK && k < n_levels; k++)
        ms_out[k] = bench_median(ms + (size_t)k * runs * BATCH_STEPS, runs * BATCH_STEPS);
    for (int i = 0; i < n_tables; i++) kv_table_free(&t[i]);
    kv_pool_destroy(pool);
    model_ctx_free(c);
    model_free(m);
    free(logits);
    free(ms);
    return s;
}

static const char *arg_or_env(int argc, char **argv, const char *flag, const char *env,
                              const char *dflt) {
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], flag) == 0) return argv[i + 1];
    const char *e = getenv(env);
    return e && *e ? e : dflt;
}

int main(int argc, char **argv) {
    const char *types_arg = arg_or_env(argc, argv, "--type", "HEARTH_BENCH_TYPES", "Q8_0,Q4_K_M");
    const int threads = atoi(arg_or_env(argc, argv, "--threads", "HEARTH_BENCH_THREADS", "2"));
    int runs = atoi(arg_or_env(argc, argv, "--runs", "HEARTH_BENCH_RUNS", "5"));
    const int n_prefill = atoi(arg_or_env(argc, argv, "--prefill", "HEARTH_BENCH_PREFILL", "512"));
    const int n_decode = atoi(arg_or_env(argc, argv, "--decode", "HEARTH_BENCH_DECODE", "128"));
    const int decode_at =
        atoi(arg_or_env(argc, argv, "--decode-at", "HEARTH_BENCH_DECODE_AT", "0"));
    const char *dir = arg_or_env(argc, argv, "--dir", "HEARTH_BENCH_DIR", "build/bench");
    const char *model_arg = arg_or_env(argc, argv, "--model", "HEARTH_BENCH_MODEL", NULL);
    for (int i = 1; i < argc; i++) g_moe |= strcmp(argv[i], "--moe") == 0;
    const char *batch_arg = arg_or_env(argc, argv, "--batch", "HEARTH_BENCH_BATCH", NULL);
    int batch_n[BATCH_MAX], n_levels = 0;
    for (const char *p = batch_arg; p && *p && n_levels < BATCH_MAX;) {
        char *end;
        const long v = strtol(p, &end, 10);
        if (end == p || v < 1 || v > BATCH_MAX || (*end && *end != ',')) {
            fprintf(stderr, "bench_model: bad --batch (a list of 1..%d)\n", BATCH_MAX);
            return 2;
        }
        batch_n[n_levels++] = (int)v;
        p = *end ? end + 1 : end;
    }
    const char *shape_arg = arg_or_env(argc, argv, "--shape", "HEARTH_BENCH_SHAPE", "tinyllama");
    g_shape = NULL;
    for (size_t i = 0; i < sizeof g_shapes / sizeof g_shapes[0]; i++)
        if (strcmp(shape_arg, g_shapes[i].name) == 0) g_shape = &g_shapes[i];
    if (!g_shape || (g_moe && g_shape != &g_shapes[0])) {
        fprintf(stderr, "bench_model: bad --shape (tinyllama, 8b; --moe takes tinyllama)\n");
        return 2;
    }
    char default_layers[16];
    snprintf(default_layers, sizeof default_layers, "%d", g_moe ? MOE_LAYERS : g_shape->layers);
    g_layers = atoi(arg_or_env(argc, argv, "--layers", "HEARTH_BENCH_LAYERS", default_layers));
    if (!kv_type_parse(arg_or_env(argc, argv, "--kv-type", "HEARTH_BENCH_KV_TYPE", "f16"),
                       &g_kv_type) ||
        g_layers < 1 || g_layers > N_LAYER) {
        fprintf(stderr, "bench_model: bad --kv-type (f32, f16, q8_0) or --layers (1..%d)\n",
                N_LAYER);
        return 2;
    }
    if (runs < 1) runs = 1;
    if (runs > MAX_RUNS) runs = MAX_RUNS;
    if (threads < 1 || n_prefill < 1 || n_decode < 1 || decode_at < 0) {
        fprintf(stderr, "bench_model: bad --threads/--prefill/--decode/--decode-at\n");
        return 2;
    }
    hl_pool *pool;
    hl_err err = {0};
    if (hl_pool_create(threads, &pool, &err) != HL_OK) {
        fprintf(stderr, "bench_model: %s\n", err.msg);
        return 1;
    }
    double load[3] = {0};
    FILE *la = fopen("/proc/loadavg", "r");
    if (la) {
        if (fscanf(la, "%lf %lf %lf", &load[0], &load[1], &load[2]) != 3) load[0] = -1;
        fclose(la);
    }
    double bw_median = 0;
    uint8_t *bw_buf = bw_buffer();
    if (!bw_buf) {
        fprintf(stderr, "bench_model: out of memory for the bandwidth buffer\n");
        return 1;
    }
    const double bw = read_bandwidth(pool, bw_buf, 8, &bw_median);
    printf("bench_model: kernels %s, %d threads, %d runs (medians), load average %.2f, %s KV "
           "cache, %s shape, %d layers\n",
           kern_variant(), threads, runs, load[0], hl_type_name(g_kv_type),
           g_moe ? "MoE" : g_shape->name, g_layers);
    const char *bw_name = bench_read_variant();
    printf("read bandwidth: %.2f GB/s best, %.2f GB/s median (%d threads, 1 GiB buffer, %s "
           "loads, 1 and 2 streams per thread)\n",
           bw / 1e9, bw_median / 1e9, threads, bw_name);

    char list[256];
    snprintf(list, sizeof list, "%s", types_arg);
    int rc = 0;
    for (char *save = NULL, *name = strtok_r(list, ",", &save); name;
         name = strtok_r(NULL, ",", &save)) {
        char path[1024];
        quant_ftype ft = QUANT_FTYPE_F32;
        if (model_arg) {
            snprintf(path, sizeof path, "%s", model_arg);
        } else {
            if (!quant_ftype_parse(name, &ft)) {
                fprintf(stderr, "bench_model: unknown type '%s' (%s)\n", name,
                        quant_ftype_names());
                rc = 2;
                break;
            }
            mkdir(dir, 0755);
            if (g_moe)
                snprintf(path, sizeof path, "%s/synth-moe-%s-L%d.gguf", dir,
                         quant_ftype_name(ft), g_layers);
            else if (g_shape == &g_shapes[0] && g_layers == g_shape->layers)
                snprintf(path, sizeof path, "%s/synth-tinyllama-%s.gguf", dir,
                         quant_ftype_name(ft));
            else
                snprintf(path, sizeof path, "%s/synth-%s-%s-L%d.gguf", dir, g_shape->name,
                         quant_ftype_name(ft), g_layers);
            struct stat stt;
            if (stat(path, &stt) != 0) {
                fprintf(stderr, "generating %s ...\n", path);
                const double t0 = now_s(CLOCK_MONOTONIC);
                if (generate_model(path, ft, pool, &err) != HL_OK) {
                    fprintf(stderr, "bench_model: %s\n", err.msg);
                    rc = 1;
                    break;
                }
                fprintf(stderr, "generated in %.1f s\n", now_s(CLOCK_MONOTONIC) - t0);
            }
        }
        if (n_levels > 0) {
            double ms[BATCH_MAX];
            if (measure_batch(path, threads, runs, batch_n, n_levels, ms, &err) != HL_OK) {
                fprintf(stderr, "bench_model: %s: %s\n", path, err.msg);
                rc = 1;
                break;
            }
            for (int k = 0; k < n_levels; k++)
                printf("%-8s batch %2d x 1 token at %d: %7.2f ms/step, %7.2f tok/s aggregate, "
                       "%.2f of one sequence's time per token\n",
                       model_arg ? "model" : quant_ftype_name(ft), batch_n[k], BATCH_CTX, ms[k],
                       batch_n[k] * 1e3 / ms[k], ms[k] / batch_n[k] / ms[0] * batch_n[0]);
            fflush(stdout);
            if (model_arg) break;
            continue;
        }
        result r = {0};
        double wbytes = 0, kvbytes = 0, exp_active = 0, exp_all = 0;
        bytes_per_token(path, n_decode, decode_at, &wbytes, &kvbytes, &exp_active, &exp_all);
        if (exp_all > 0)
            printf("experts: %.0f of %.0f MB read per token (the used experts only)\n",
                   exp_active / 1e6, exp_all / 1e6);
        if (measure(path, threads, runs, n_prefill, n_decode, decode_at, pool, bw_buf,
                    wbytes + kvbytes, &r, &err) != HL_OK) {
            fprintf(stderr, "bench_model: %s: %s\n", path, err.msg);
            rc = 1;
            break;
        }
        const double bound = (r.bw_max > bw ? r.bw_max : bw) / (wbytes + kvbytes);
        char at_txt[32] = "";
        if (decode_at > 0) snprintf(at_txt, sizeof at_txt, " at %d", decode_at);
        printf("%-8s prefill %4d: %7.2f tok/s (%.1f cpu-ms/tok) | decode %3d%s: %6.2f tok/s "
               "[%.2f..%.2f] (%.1f cpu-ms/tok) | %.0f MB/token (weights %.0f + KV %.1f) | "
               "bound %.2f tok/s | decode = %.0f%% of bound, %.0f%% paired\n",
               model_arg ? "model" : quant_ftype_name(ft), n_prefill, r.pp, r.pp_cpu_ms, n_decode,
               at_txt, r.tg, r.tg_min, r.tg_max, r.tg_cpu_ms, (wbytes + kvbytes) / 1e6, wbytes / 1e6, kvbytes / 1e6,
               bound, 100.0 * r.tg / bound, 100.0 * r.tg_paired);
        fflush(stdout);
        if (model_arg) break;
    }
    free(bw_buf);
    hl_pool_destroy(pool);
    return rc;
}
