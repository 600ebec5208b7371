/*
 * test_kv_type.c - KV caches of f16 and q8_0 elements: the attention kernels against the
 * reference, the forward pass over converted caches against f32 (stories260K greedy, a
 * synthetic model with 64-wide heads), the cache sizes, and the geometry checks.
 */
#include "test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kern_internal.h"
#include "kernels/kernels.h"
#include "kv/block.h"
#include "kv/layout.h"
#include "model/model.h"
#include "model_synth.h"
#include "tok/tok.h"

static float frand(uint32_t *s) {
    *s = *s * 1664525u + 1013904223u;
    return (float)((*s >> 8) & 0xffff) / 32768.0f - 1.0f;
}

static int32_t argmax(const float *x, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* ---- kernels: every variant against the reference ---- */

TEST(kv_type_kernels_match_reference) {
    enum { NK = 13, DMAX = 128 };
    const kern_table *ref = kern_table_ref(), *act = kern_table_active();
    static float x[NK * DMAX], q[DMAX];
    static hl_fp16 kh[NK * DMAX], kh_ref[NK * DMAX];
    static block_q8_0 k8[NK * DMAX / QK8_0], k8_ref[NK * DMAX / QK8_0], q8[DMAX / QK8_0];
    uint32_t seed = 7;
    for (int i = 0; i < NK * DMAX; i++) x[i] = 3.0f * frand(&seed);
    for (int i = 0; i < DMAX; i++) q[i] = frand(&seed);
    const int dims[] = {8, 24, 32, 40, 64, 80, 96, 128};
    for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
        const int d = dims[di];
        /* store: f16 round to nearest even, q8_0 as hl_quantize_row, bit for bit */
        for (int j = 0; j < NK; j++) {
            kern_kv_store_row(HL_TYPE_F16, x + j * d, kh + j * d, d);
            ref->to_f16(x + j * d, kh_ref + j * d, d);
            for (int i = 0; i < d; i++)
                CHECK_MSG(kh[j * d + i] == hl_fp32_to_fp16(x[j * d + i]), "f16 d=%d %d", d, i);
        }
        CHECK(memcmp(kh, kh_ref, sizeof(hl_fp16) * NK * (size_t)d) == 0);
        const bool is_q8 = d % QK8_0 == 0;
        const size_t row8 = (size_t)(d / QK8_0) * sizeof(block_q8_0);
        if (is_q8) {
            for (int j = 0; j < NK; j++) {
                kern_kv_store_row(HL_TYPE_Q8_0, x + j * d, (uint8_t *)k8 + j * row8, d);
                hl_quantize_row(HL_TYPE_Q8_0, x + j * d, (uint8_t *)k8_ref + j * row8, d);
            }
            CHECK(memcmp(k8, k8_ref, row8 * NK) == 0);
            kern_kv_store_row(HL_TYPE_Q8_0, q, q8, d);
        }
        /* scores: f16 keys against the reference dot within float rounding; every nk */
        for (int nk = 1; nk <= NK; nk++) {
            float got[NK], want[NK], exact[NK];
            kern_dot_rows_kv(HL_TYPE_F16, got, q, kh, (size_t)d * sizeof(hl_fp16), nk, d, 0.5f);
            ref->dot_rows_f16(want, q, kh, d, nk, d, 0.5f);
            for (int j = 0; j < nk; j++) {
                double e = 0;
                for (int i = 0; i < d; i++) e += (double)q[i] * hl_fp16_to_fp32(kh[j * d + i]);
                exact[j] = (float)(0.5 * e);
                CHECK_NEAR(got[j], want[j], 1e-5 * d);
                CHECK_NEAR(want[j], exact[j], 1e-5 * d);
            }
            if (is_q8) {
                kern_dot_rows_kv(HL_TYPE_Q8_0, got, q8, k8, row8, nk, d, 0.5f);
                for (int j = 0; j < nk; j++) {
                    /* the same integer dot as the reference kernel; close to q . k */
                    want[j] = 0.5f * ref->vec_dot[HL_TYPE_Q8_0](d, (uint8_t *)k8 + j * row8, q8);
                    CHECK_NEAR(got[j], want[j], 1e-5 * d);
                    double e = 0;
                    for (int i = 0; i < d; i++) e += (double)q[i] * x[j * d + i];
                    CHECK_NEAR(got[j], 0.5 * e, 0.02 * d);
                }
            }
        }
        /* value sums: bit for bit the reference's (one fmaf per key and element, in order) */
        float p[NK], y0[DMAX], y1[DMAX], y2[DMAX];
        for (int j = 0; j < NK; j++) p[j] = 0.1f + 0.05f * (float)j;
        for (int nk = 1; nk <= NK; nk += 4) {
            for (int i = 0; i < d; i++) y0[i] = y1[i] = y2[i] = frand(&seed);
            kern_axpy_rows_kv(HL_TYPE_F16, y0, p, kh, (size_t)d * sizeof(hl_fp16), nk, d);
            ref->axpy_rows_f16(y1, p, kh, d, nk, d);
            CHECK(memcmp(y0, y1, sizeof(float) * (size_t)d) == 0);
            if (is_q8) {
                for (int i = 0; i < d; i++) y1[i] = y2[i];
                kern_axpy_rows_kv(HL_TYPE_Q8_0, y2, p, k8, row8, nk, d);
                ref->axpy_rows_q8_0(y1, p, k8, row8, nk, d);
                CHECK(memcmp(y1, y2, sizeof(float) * (size_t)d) == 0);
            }
        }
    }
    (void)act;
}

/* ---- the forward pass over converted caches ---- */

static model *load_stories(void) {
    const char *p = test_shared_path("models/stories260K/stories260K.gguf");
    if (!p) return NULL;
    model *m = NULL;
    hl_err err;
    if (model_load(p, NULL, &m, &err)) fprintf(stderr, "%s\n", err.msg);
    return m;
}

/* Greedy tokens from BOS with a cache of `t` keys and values: a 16-token prefill, then
 * token by token. */
static int greedy(const model *m, hl_type t, int n, int32_t *out, hl_err *err) {
    model_kv *kv = NULL;
    model_ctx *c = NULL;
    int got = -1;
    if (model_kv_create_ex(m, 256, t, t, &kv, err) || model_ctx_create(m, 1, 0, &c, err))
        goto done;
    const int32_t V = model_get_hparams(m)->n_vocab;
    int32_t tok = tok_vocab_special(model_vocab(m), TOK_SPECIAL_BOS);
    if (model_eval(c, kv, &tok, 1, NULL, err)) goto done;
    for (got = 0; got < n; got++) {
        tok = argmax(model_ctx_logits(c), V);
        out[got] = tok;
        if (got + 1 < n && model_eval(c, kv, &tok, 1, NULL, err)) {
            got = -1;
            break;
        }
    }
done:
    model_ctx_free(c);
    model_kv_free(kv);
    return got;
}

TEST(kv_type_f16_stories260K_greedy_equals_f32) {
    model *m = load_stories();
    if (!m) SKIP("stories260K.gguf not found");
    hl_err err = {0};
    enum { N = 128 };
    int32_t a[N], b[N];
    CHECK_EQ_INT(greedy(m, HL_TYPE_F32, N, a, &err), N);
    CHECK_EQ_INT(greedy(m, HL_TYPE_F16, N, b, &err), N);
    for (int i = 0; i < N; i++) CHECK_MSG(a[i] == b[i], "token %d: f16 %d, f32 %d", i, b[i], a[i]);
    /* q8_0 needs heads of a multiple of 32 elements: stories260K's are 8 */
    model_kv *kv = NULL;
    CHECK(model_kv_create_ex(m, 16, HL_TYPE_Q8_0, HL_TYPE_Q8_0, &kv, &err) != HL_OK);
    CHECK(strstr(err.msg, "q8_0") != NULL);
    CHECK(kv == NULL);
    CHECK(model_kv_create_ex(m, 16, HL_TYPE_Q4_0, HL_TYPE_F16, &kv, &err) != HL_OK);
    model_free(m);
}

/* A prefill then decode over f16 / q8_0 caches against the same over f32 (synthetic
 * llama with 64-wide heads): logits close, and the same top token wherever f32's margin
 * is clear. A cache written in one type but read as another would be far off. */
TEST(kv_type_synth_f16_q8_0_close_to_f32) {
    char path[512];
    snprintf(path, sizeof path, "%s/synth_kv.gguf", test_tmpdir());
    synth_cfg cfg = {.arch = "llama", .n_vocab = 64, .n_embd = 128, .n_layer = 2, .n_ff = 96,
                     .n_head = 4, .n_head_kv = 2, .head_dim = 64, .rope_base = 10000.0f,
                     .wtype = HL_TYPE_F32, .seed = 11};
    synth_model *s = synth_build(&cfg, path);
    CHECK(s != NULL);
    synth_free(s);
    hl_err err = {0};
    model *m;
    CHECK_OK(model_load(path, NULL, &m, &err), &err);
    enum { N = 40, V = 64 };
    int32_t toks[N];
    for (int i = 0; i < N; i++) toks[i] = (int32_t)((i * 37 + 5) % (V - 3)) + 3;
    static float lg[3][N * V];
    const hl_type types[3] = {HL_TYPE_F32, HL_TYPE_F16, HL_TYPE_Q8_0};
    size_t bytes[3];
    for (int r = 0; r < 3; r++) {
        model_kv *kv;
        model_ctx *c;
        CHECK_OK(model_kv_create_ex(m, 64, types[r], types[r], &kv, &err), &err);
        CHECK_OK(model_ctx_create(m, 2, 0, &c, &err), &err);
        CHECK_OK(model_eval(c, kv, toks, 24, lg[r], &err), &err);
        for (int i = 24; i < N; i++)
            CHECK_OK(model_eval(c, kv, &toks[i], 1, lg[r] + i * V, &err), &err);
        bytes[r] = model_kv_bytes(kv);
        model_ctx_free(c);
        model_kv_free(kv);
    }
    /* 2 layers x 2 heads x 64 x (K + V) x 64 positions */
    CHECK_EQ_INT((int)bytes[0], 2 * 2 * 64 * 2 * 4 * 64);
    CHECK_EQ_INT((int)bytes[1] * 2, (int)bytes[0]);
    CHECK_EQ_INT((int)bytes[2], 2 * 2 * 2 * 2 * 34 * 64);
    float scale = 0;
    for (int i = 0; i < N * V; i++) scale = fmaxf(scale, fabsf(lg[0][i]));
    CHECK(scale > 0.5f);
    int clear = 0;
    for (int r = 1; r < 3; r++) {
        float d = 0;
        for (int i = 0; i < N * V; i++) d = fmaxf(d, fabsf(lg[r][i] - lg[0][i]));
        CHECK_MSG(d <= (r == 1 ? 2e-3f : 3e-2f) * scale, "%s: max |diff| %g of %g",
                  hl_type_name(types[r]), d, scale);
        CHECK(d > 0); /* the cache really holds converted rows */
        for (int t = 0; t < N; t++) {
            const float *l = lg[0] + t * V;
            const int32_t top = argmax(l, V);
            float second = -INFINITY;
            for (int i = 0; i < V; i++)
                if (i != top && l[i] > second) second = l[i];
            if (l[top] - second < 0.05f * scale) continue;
            clear++;
            CHECK_MSG(argmax(lg[r] + t * V, V) == top, "%s token %d", hl_type_name(types[r]), t);
        }
    }
    CHECK(clear > N / 2);
    model_free(m);
}

/* Bytes per token: f16 half of f32, q8_0 34/32 bytes per element (3.76x smaller). */
TEST(kv_type_block_bytes) {
    kv_layer_dims dims[2] = {{8, 128, 128}, {8, 128, 128}};
    size_t b[3];
    const hl_type types[3] = {HL_TYPE_F32, HL_TYPE_F16, HL_TYPE_Q8_0};
    for (int r = 0; r < 3; r++) {
        kv_layout l = {.n_layer = 2, .n_head_kv = 8, .head_dim_k = 128, .head_dim_v = 128,
                       .block_tokens = 32, .layers = dims, .k_type = types[r],
                       .v_type = types[r]};
        b[r] = kv_layout_block_bytes(&l);
    }
    CHECK_EQ_INT((int)b[0], 2 * 8 * 128 * 2 * 4 * 32);
    CHECK_EQ_INT((int)(b[1] * 2), (int)b[0]);
    CHECK_NEAR((double)b[0] / (double)b[2], 128.0 / 34.0, 1e-9);
}

/* f16 keys by columns (kv/layout.h): for any block size (partial tiles too) the keys of
 * a head exactly tile the bytes of its rows, each element where kv_geom_k and
 * kv_geom_k_stride say, with the value kern_kv_store_key wrote; kern_dot_cols_f16 scores
 * them as one fmaf chain per key in every table; kv_block_copy_rows keeps the first rows
 * of a block and zeroes the rest, tile by tile. */
TEST(kv_type_f16_keys_by_columns) {
    enum { NL = 2, NH = 2, DK = 12, DV = 5, MAXB = 100 };
    kv_layer_dims dims[NL] = {{NH, DK, DV}, {NH, DK, DV}};
    kv_geom g;
    CHECK(kv_geom_init(&g, NL, dims, HL_TYPE_F16, HL_TYPE_F32, NULL) == HL_OK);
    CHECK(kv_geom_k_cols(&g));
    static const int32_t sizes[] = {1, 5, 32, 40, 64, 100};
    uint32_t seed = 7;
    static float x[MAXB][DK];
    for (int si = 0; si < 6; si++) {
        const int32_t B = sizes[si];
        uint8_t *base = calloc((size_t)B, g.bytes_per_pos);
        uint8_t *seen = calloc((size_t)B, g.bytes_per_pos);
        CHECK(base && seen);
        for (int32_t p = 0; p < B; p++)
            for (int i = 0; i < DK; i++) x[p][i] = frand(&seed);
        for (int l = 0; l < NL; l++)
            for (int h = 0; h < NH; h++) {
                for (int32_t p = 0; p < B; p++)
                    kern_kv_store_key(HL_TYPE_F16, x[p], kv_geom_k(&g, base, B, l, h, p), DK,
                                      kv_geom_k_stride(&g, B, p));
                const uint8_t *lo = base + (size_t)B * g.k_off[l] + (size_t)h * B * g.k_row[l];
                for (int32_t p = 0; p < B; p++) {
                    const int32_t w = kv_geom_k_stride(&g, B, p);
                    CHECK(w == (B - p / 32 * 32 < 32 ? B - p / 32 * 32 : 32));
                    const hl_fp16 *k = (const hl_fp16 *)kv_geom_k(&g, base, B, l, h, p);
                    for (int i = 0; i < DK; i++) {
                        const uint8_t *at = (const uint8_t *)(k + (int64_t)i * w);
                        CHECK(at >= lo && at + 2 <= lo + (size_t)B * g.k_row[l]);
                        seen[at - base]++;
                        CHECK(k[(int64_t)i * w] == hl_fp32_to_fp16(x[p][i]));
                    }
                }
            }
        size_t covered = 0, twice = 0;
        for (size_t i = 0; i < (size_t)B * g.bytes_per_pos; i++) {
            covered += seen[i] == 1;
            twice += seen[i] > 1;
        }
        CHECK(twice == 0);
        CHECK(covered * 2 == (size_t)B * g.v_off[0]); /* every key byte pair, once */
        /* scores straight from the cache's tiles, all keys of a tile at once */
        float q[DK], got[32], want[32];
        for (int i = 0; i < DK; i++) q[i] = frand(&seed);
        for (int32_t t0 = 0; t0 < B; t0 += 32) {
            const int32_t w = kv_geom_k_stride(&g, B, t0);
            const hl_fp16 *k = (const hl_fp16 *)kv_geom_k(&g, base, B, 1, 1, t0);
            kern_dot_cols_f16(got, q, k, w, w, DK, 0.25f);
            kern_table_ref()->dot_cols_f16(want, q, k, w, w, DK, 0.25f);
            for (int32_t j = 0; j < w; j++) {
                float acc = 0.0f;
                for (int i = 0; i < DK; i++) acc = fmaf(q[i], hl_fp16_to_fp32(k[i * w + j]), acc);
                CHECK(got[j] == 0.25f * acc && want[j] == got[j]);
            }
        }
        free(base);
        free(seen);
    }
    kv_geom_free(&g);

    /* a pool's block: the first rows copied, the rest zeroed, in both key layouts */
    for (int f16 = 0; f16 < 2; f16++) {
        kv_layout lay = {.n_layer = NL, .n_head_kv = NH, .head_dim_k = DK, .head_dim_v = DV,
                         .block_tokens = 40, .k_type = f16 ? HL_TYPE_F16 : HL_TYPE_F32};
        kv_pool_config cfg = {.layout = lay, .budget_bytes = 1 << 20};
        kv_pool *pool = NULL;
        CHECK(kv_pool_create(&cfg, &pool, NULL) == HL_OK);
        kv_geom pg;
        CHECK(kv_layout_geom(&lay, &pg, NULL) == HL_OK);
        const size_t bb = kv_layout_block_bytes(&lay);
        uint8_t *src = malloc(bb), *dst = malloc(bb);
        CHECK(src && dst);
        for (size_t i = 0; i < bb; i++) src[i] = (uint8_t)(i * 7 + 1);
        memset(dst, 0xee, bb);
        const int32_t rows = 35; /* into the second, partial tile (positions 32..39) */
        kv_block_copy_rows(pool, dst, src, rows);
        const size_t esz = f16 ? 2 : 4;
        for (int l = 0; l < NL; l++)
            for (int h = 0; h < NH; h++)
                for (int32_t p = 0; p < 40; p++) {
                    const int64_t w = kv_geom_k_stride(&pg, 40, p);
                    const uint8_t *a = kv_block_k_row(pool, src, l, h, p);
                    const uint8_t *b = kv_block_k_row(pool, dst, l, h, p);
                    for (int i = 0; i < DK; i++) {
                        const size_t at = (size_t)i * (size_t)w * esz;
                        static const uint8_t zero[4];
                        CHECK(memcmp(b + at, p < rows ? a + at : zero, esz) == 0);
                    }
                }
        free(src);
        free(dst);
        kv_geom_free(&pg);
        kv_pool_destroy(pool);
    }
}

/* ---- the runner: the pool's type from its config, through the prefix cache ---- */

#include <sys/wait.h>

#include "base/file.h"
#include "kv/trie.h"
#include "runner/runner.h"

typedef struct rcap {
    int32_t toks[64];
    int n;
} rcap;

static bool rcap_emit(void *user, const runner_event *ev) {
    rcap *c = user;
    if (ev->kind == RUNNER_EV_TOKEN && c->n < 64) c->toks[c->n++] = ev->token;
    return true;
}

static hl_status rrun(runner *r, const int32_t *p, int n, int num_predict, rcap *c,
                      runner_stats *st) {
    c->n = 0;
    runner_request req = {.tokens = p, .n_tokens = n, .num_predict = num_predict,
                          .emit = rcap_emit, .user = c};
    req.sampling = (sampler_opts){.temperature = 0, .repeat_last_n = 0};
    return runner_generate(r, &req, st, NULL);
}

static model *load_synth64(void) {
    char path[512];
    snprintf(path, sizeof path, "%s/runner_kv.gguf", test_tmpdir());
    synth_cfg cfg = {.arch = "llama", .n_vocab = 64, .n_embd = 128, .n_layer = 2, .n_ff = 96,
                     .n_head = 4, .n_head_kv = 2, .head_dim = 64, .rope_base = 10000.0f,
                     .wtype = HL_TYPE_F32, .seed = 3};
    return synth_load(&cfg, path);
}

TEST(kv_type_runner_cache_hit_equals_cold_and_block_bytes) {
    model *m = load_synth64();
    CHECK(m != NULL);
    const char *names[3] = {"f32", NULL /* the default: f16 */, "q8_0"};
    const hl_type want[3] = {HL_TYPE_F32, HL_TYPE_F16, HL_TYPE_Q8_0};
    size_t block_bytes[3];
    int32_t prompt[80];
    for (int i = 0; i < 80; i++) prompt[i] = 3 + (int32_t)((i * 29 + 7) % 61);
    for (int k = 0; k < 3; k++) {
        runner_config cfg = {.n_threads = 1, .block_tokens = 8, .prefill_chunk = 16,
                             .kv_budget_bytes = (size_t)16 << 20, .kv_type = names[k]};
        runner *r = NULL, *cold = NULL;
        CHECK_OK(runner_create(m, &cfg, &r, NULL), NULL);
        CHECK_OK(runner_create(m, &cfg, &cold, NULL), NULL);
        CHECK_EQ_INT(runner_kv_type(r), want[k]);
        block_bytes[k] = kv_pool_get_stats(runner_kv_pool(r)).block_bytes;
        rcap c = {0};
        runner_stats st;
        /* turn 1, then turn 2 extending it: a cache hit */
        CHECK_OK(rrun(r, prompt, 60, 6, &c, &st), NULL);
        int32_t turn2[80];
        memcpy(turn2, prompt, 60 * sizeof *turn2);
        memcpy(turn2 + 60, c.toks, 6 * sizeof *turn2);
        memcpy(turn2 + 66, prompt + 66, 14 * sizeof *turn2);
        CHECK_OK(rrun(r, turn2, 80, 12, &c, &st), NULL);
        CHECK_EQ_INT(st.cached_tokens, 65);
        rcap hot = c;
        CHECK_OK(rrun(cold, turn2, 80, 12, &c, &st), NULL);
        CHECK_EQ_INT(st.cached_tokens, 0);
        CHECK_EQ_INT(hot.n, 12);
        for (int i = 0; i < 12; i++) CHECK_EQ_INT(hot.toks[i], c.toks[i]);
        CHECK(runner_get_memory(r).kv >= block_bytes[k]);
        CHECK_OK(kv_trie_check(runner_prefix_cache(r), NULL), NULL);
        runner_destroy(r);
        runner_destroy(cold);
    }
    CHECK_EQ_INT((int)(block_bytes[1] * 2), (int)block_bytes[0]);
    CHECK_NEAR((double)block_bytes[0] / (double)block_bytes[2], 128.0 / 34.0, 1e-9);
    /* an unknown type is an error */
    runner_config bad = {.n_threads = 1, .kv_type = "q4_0"};
    runner *r = NULL;
    hl_err err = {0};
    CHECK(runner_create(m, &bad, &r, &err) == HL_ERR_INVALID);
    CHECK(strstr(err.msg, "q4_0") != NULL);
    model_free(m);
}

/* q8_0 on heads of 8 elements (stories260K): the runner falls back to f16. */
TEST(kv_type_runner_q8_0_falls_back_to_f16) {
    model *m = load_stories();
    if (!m) SKIP("stories260K.gguf not found");
    runner_config cfg = {.n_threads = 1, .n_ctx = 64, .kv_type = "q8_0",
                         .kv_budget_bytes = (size_t)4 << 20};
    runner *r = NULL;
    CHECK_OK(runner_create(m, &cfg, &r, NULL), NULL);
    CHECK_EQ_INT(runner_kv_type(r), HL_TYPE_F16);
    runner_destroy(r);
    model_free(m);
}

/* `hearth generate --kv-type`: f32, f16 and q8_0 (f16 here: heads of 8) give the same
 * greedy text on stories260K; q8_0's fallback is said on stderr. */
TEST(kv_type_cli_generate) {
    const char *bin = getenv("HEARTH_BIN");
    const char *p = test_shared_path("models/stories260K/stories260K.gguf");
    if (!bin || !*bin) SKIP("HEARTH_BIN not set (run via make test)");
    if (!p) SKIP("stories260K not found");
    static char out[3][8192];
    const char *types[3] = {"f32", "f16", "q8_0"};
    for (int k = 0; k < 3; k++) {
        char cmd[2048], po[512], pe[512];
        snprintf(po, sizeof po, "%s/kv_out.txt", test_tmpdir());
        snprintf(pe, sizeof pe, "%s/kv_err.txt", test_tmpdir());
        snprintf(cmd, sizeof cmd, "%s generate -m %s -n 80 --temp 0 -t 1 --kv-type %s >%s 2>%s",
                 bin, p, types[k], po, pe);
        int st = system(cmd);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
        char *b;
        size_t n;
        CHECK_OK(hl_file_read(po, &b, &n, NULL), NULL);
        snprintf(out[k], sizeof out[k], "%s", b);
        free(b);
        CHECK_OK(hl_file_read(pe, &b, &n, NULL), NULL);
        if (k == 2) CHECK_MSG(strstr(b, "using f16") != NULL, "stderr: %s", b);
        free(b);
    }
    CHECK(strncmp(out[0], "Once upon a time", 16) == 0);
    CHECK_STR(out[1], out[0]);
    CHECK_STR(out[2], out[0]);
}

/* ---- the server: $OLLAMA_KV_CACHE_TYPE / $HEARTH_KV_CACHE_TYPE reach the runner ---- */

#include "srvproc.h"

static char g_srv_text[2][4096];
static int g_srv_i;

static void kv_srv_body(srv_proc *p) {
    const char *gg = test_shared_path("models/stories260K/stories260K.gguf");
    CHECK(sp_create_model(p, "s", gg, ""));
    json_t *j = NULL;
    CHECK_EQ_INT(sp_req(p, "POST", "/api/generate",
                        "{\"model\":\"s\",\"prompt\":\"Once upon\",\"stream\":false,"
                        "\"options\":{\"temperature\":0,\"num_predict\":48}}",
                        &j),
                 200);
    const char *r = json_string_value(json_object_get(j, "response"));
    CHECK(r && strlen(r) > 40);
    snprintf(g_srv_text[g_srv_i], sizeof g_srv_text[0], "%s", r ? r : "");
    json_decref(j);
    /* the runner's startup line names the cache type it uses */
    char *log;
    size_t n;
    CHECK_OK(hl_file_read(p->log, &log, &n, NULL), NULL);
    if (g_srv_i == 0) {
        CHECK_MSG(strstr(log, "f32 KV cache") != NULL, "%s", log);
    } else {
        CHECK_MSG(strstr(log, "is not a KV cache type") != NULL, "%s", log);
        CHECK_MSG(strstr(log, "f16 KV cache") != NULL, "%s", log);
    }
    free(log);
}

TEST(kv_type_server_env_reaches_the_runner) {
    if (!test_shared_path("models/stories260K/stories260K.gguf")) SKIP("stories260K missing");
    static const char *const env_f32[] = {"OLLAMA_KV_CACHE_TYPE=f32", NULL};
    static const char *const env_bad[] = {"HEARTH_KV_CACHE_TYPE=q3", NULL};
    g_srv_i = 0;
    SP_WITH_SERVER("kvf32", env_f32, NULL, kv_srv_body);
    g_srv_i = 1;
    SP_WITH_SERVER("kvbad", env_bad, NULL, kv_srv_body);
    /* f16 (the fallback) and f32 caches: the same greedy text on stories260K */
    CHECK_STR(g_srv_text[1], g_srv_text[0]);
}
