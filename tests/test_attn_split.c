/*
 * test_attn_split.c - decode attention split across threads by key ranges (op_attention,
 * flash-decoding): over f32, f16 and q8_0 caches in blocks that do not line up with the
 * key ranges, with a sliding window, sinks and a softcap, the split result (2 threads, one
 * token, one KV head of 18 query heads: two units of 16 and 2) equals bit for bit the
 * unsplit one (1 thread; and the same token inside a batch too large to split), and both
 * match a plain double-precision softmax.
 */
#include "test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "kv/layout.h"
#include "model/internal.h"
#include "model/model.h"
#include "model/ops.h"
#include "model_synth.h"

enum { HD = 64, NH = 18, NKV = 1, NPOS = 1200, BLK = 96, NBLK = (NPOS + BLK - 1) / BLK, NQ = 9 };

static float frand(uint32_t *s) {
    *s = *s * 1664525u + 1013904223u;
    return (float)((*s >> 8) & 0xffff) / 32768.0f - 1.0f;
}

/* The cache's original f32 rows: [pos][kv head][HD]. */
static float g_k[NPOS][NKV][HD], g_v[NPOS][NKV][HD];

/* Plain softmax attention of one query head over keys [k0, k1) of the original rows. */
static void ref_head(const float *q, int kvh, int k0, int k1, const op_attn *a, float sink,
                     double *out) {
    static double sc[NPOS];
    double mx = a->sinks ? sink : -INFINITY;
    for (int p = k0; p < k1; p++) {
        double d = 0;
        for (int i = 0; i < HD; i++) d += (double)q[i] * g_k[p][kvh][i];
        d *= a->scale;
        if (a->softcap != 0.0f) d = a->softcap * tanh(d / a->softcap);
        sc[p] = d;
        if (d > mx) mx = d;
    }
    double sum = a->sinks ? exp(sink - mx) : 0;
    for (int i = 0; i < HD; i++) out[i] = 0;
    for (int p = k0; p < k1; p++) {
        const double e = exp(sc[p] - mx);
        sum += e;
        for (int i = 0; i < HD; i++) out[i] += e * g_v[p][kvh][i];
    }
    for (int i = 0; i < HD; i++) out[i] /= sum;
}

/* Points token rows [0, n) of c at positions pos[t] of the one sequence held in blocks. */
static void set_batch(model_ctx *c, const model_seq_kv *view, const int32_t *pos, int n) {
    c->seq_kv[0] = (model_seq_views){{*view, *view}, NULL};
    c->seq_end[0] = pos[n - 1] + 1;
    c->n_seq = 1;
    c->seq_first[0] = 0;
    c->seq_first[1] = n;
    for (int t = 0; t < n; t++) {
        c->tok_pos[t] = pos[t];
        c->tok_seq[t] = 0;
        c->tok_id[t] = 3;
    }
}

/* A one-layer synthetic llama with this file's attention shape, written to the test
 * directory as `file` and loaded (op_attention reads only its shape); NULL on failure,
 * with err filled when the load failed. */
static model *attn_model(const char *file, hl_err *err) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", test_tmpdir(), file);
    synth_cfg cfg = {.arch = "llama", .n_vocab = 32, .n_embd = 64, .n_layer = 1, .n_ff = 64,
                     .n_head = NH, .n_head_kv = NKV, .head_dim = HD, .rope_base = 10000.0f,
                     .wtype = HL_TYPE_F32, .seed = 5};
    synth_model *s = synth_build(&cfg, path);
    if (!s) return NULL;
    synth_free(s);
    model *m = NULL;
    return model_load(path, NULL, &m, err) == HL_OK ? m : NULL;
}

TEST(attn_split_key_ranges_equal_unsplit_and_reference) {
    hl_err err = {0};
    model *m = attn_model("synth_attn.gguf", &err);
    CHECK_MSG(m != NULL, "synthetic model: %s", err.msg);
    model_ctx *c1, *c2;
    CHECK_OK(model_ctx_create(m, 1, 64, &c1, &err), &err);
    CHECK_OK(model_ctx_create(m, 2, 64, &c2, &err), &err);
    uint32_t seed = 9;
    for (int p = 0; p < NPOS; p++)
        for (int h = 0; h < NKV; h++)
            for (int i = 0; i < HD; i++) {
                g_k[p][h][i] = frand(&seed);
                g_v[p][h][i] = frand(&seed);
            }
    static float q[NQ][NH][HD], sinks[NH];
    for (int t = 0; t < NQ; t++)
        for (int h = 0; h < NH; h++)
            for (int i = 0; i < HD; i++) q[t][h][i] = 2.0f * frand(&seed);
    for (int h = 0; h < NH; h++) sinks[h] = 1.5f * frand(&seed);
    const hl_type types[3] = {HL_TYPE_F32, HL_TYPE_F16, HL_TYPE_Q8_0};
    const float tol[3] = {1e-4f, 4e-3f, 4e-2f};
    const kv_layer_dims dims = {NKV, HD, HD};
    static float split[NH * HD], whole[NH * HD];
    int n_cases = 0;
    for (int ti = 0; ti < 3; ti++) {
        kv_geom g;
        CHECK_OK(kv_geom_init(&g, 1, &dims, types[ti], types[ti], &err), &err);
        void *blocks[NBLK];
        for (int b = 0; b < NBLK; b++) blocks[b] = calloc(BLK, g.bytes_per_pos);
        const model_seq_kv view = {.blocks = blocks, .B = BLK, .len = 0, .geom = &g};
        /* the cache rows, converted as op_attention's store does */
        for (int p = 0; p < NPOS; p++)
            for (int h = 0; h < NKV; h++) {
                kern_kv_store_key(types[ti], g_k[p][h], kv_geom_k(&g, blocks[p / BLK], BLK, 0, h, p % BLK), HD,
                                  kv_geom_k_stride(&g, BLK, p % BLK));
                kern_kv_store_row(types[ti], g_v[p][h], kv_geom_v(&g, blocks[p / BLK], BLK, 0, h, p % BLK), HD);
            }
        /* positions: three uneven key ranges (512, 512, 76), one range, 513 keys */
        static const int32_t at[] = {NPOS - 1, 300, 512};
        for (int pi = 0; pi < 3; pi++)
            for (int oi = 0; oi < 3; oi++) {
                const int32_t P = at[pi];
                op_attn a = {.layer = 0, .n_head = NH, .n_head_kv = NKV, .head_dim_k = HD,
                             .head_dim_v = HD, .scale = 0.125f, .causal = true};
                if (oi == 1) a.window = 700; /* keys P-699..P: a range cut mid-way */
                if (oi == 2) {
                    a.sinks = sinks;
                    a.softcap = 3.0f;
                }
                /* one token: unsplit (1 thread), split (2 threads) */
                model_ctx *cs[2] = {c1, c2};
                float *outs[2] = {whole, split};
                for (int k = 0; k < 2; k++) {
                    set_batch(cs[k], &view, &P, 1);
                    memcpy(cs[k]->q, q[NQ - 1], sizeof q[0]);
                    op_attention(cs[k], &a, 1);
                    memcpy(outs[k], cs[k]->att, sizeof split);
                }
                CHECK_MSG(memcmp(whole, split, sizeof split) == 0, "%s P=%d opt %d: split differs",
                          hl_type_name(types[ti]), P, oi);
                /* the same token last in a batch of NQ (> the split's limit) */
                int32_t pos[NQ];
                for (int t = 0; t < NQ; t++) pos[t] = P - (NQ - 1) + t;
                set_batch(c2, &view, pos, NQ);
                memcpy(c2->q, q, sizeof q);
                op_attention(c2, &a, NQ);
                CHECK_MSG(memcmp(c2->att + (size_t)(NQ - 1) * NH * HD, split, sizeof split) == 0,
                          "%s P=%d opt %d: batch differs", hl_type_name(types[ti]), P, oi);
                /* against the plain softmax */
                const int k0 = a.window > 0 && P - a.window + 1 > 0 ? P - a.window + 1 : 0;
                double worst = 0;
                for (int h = 0; h < NH; h++) {
                    double want[HD];
                    ref_head(q[NQ - 1][h], h / (NH / NKV), k0, P + 1, &a, sinks[h], want);
                    for (int i = 0; i < HD; i++) {
                        const double d = fabs(want[i] - split[h * HD + i]);
                        if (d > worst) worst = d;
                    }
                }
                CHECK_MSG(worst <= tol[ti], "%s P=%d opt %d: off by %g",
                          hl_type_name(types[ti]), P, oi, worst);
                n_cases++;
            }
        for (int b = 0; b < NBLK; b++) free(blocks[b]);
        kv_geom_free(&g);
    }
    CHECK_EQ_INT(n_cases, 27);
    model_ctx_free(c1);
    model_ctx_free(c2);
    model_free(m);
}

/* The online softmax's steps are 64 keys wherever the cache's blocks fall (a step spans
 * two of the runner's 32-position blocks), so decode attention over the same rows gives
 * the same bits in blocks of 32, 64 or 96 positions as in one block, for f32, f16 and
 * q8_0 rows, plain and with sinks and a softcap (the per-head path). */
TEST(attn_steps_do_not_depend_on_block_size) {
    hl_err err = {0};
    model *m = attn_model("synth_attn_blk.gguf", &err);
    CHECK_MSG(m != NULL, "synthetic model: %s", err.msg);
    model_ctx *c;
    CHECK_OK(model_ctx_create(m, 2, 64, &c, &err), &err);
    uint32_t seed = 21;
    for (int p = 0; p < NPOS; p++)
        for (int i = 0; i < HD; i++) {
            g_k[p][0][i] = frand(&seed);
            g_v[p][0][i] = frand(&seed);
        }
    static float q[NH][HD], sinks[NH], want[NH * HD];
    for (int h = 0; h < NH; h++) {
        for (int i = 0; i < HD; i++) q[h][i] = 2.0f * frand(&seed);
        sinks[h] = frand(&seed);
    }
    const hl_type types[3] = {HL_TYPE_F32, HL_TYPE_F16, HL_TYPE_Q8_0};
    const kv_layer_dims dims = {NKV, HD, HD};
    static const int32_t sizes[] = {NPOS, 32, 64, 96}; /* the first: one block, the truth */
    int n_cases = 0;
    for (int ti = 0; ti < 3; ti++)
        for (int oi = 0; oi < 2; oi++)
            for (int si = 0; si < 4; si++) {
                const int32_t B = sizes[si], nblk = (NPOS + B - 1) / B, P = NPOS - 1;
                kv_geom g;
                CHECK_OK(kv_geom_init(&g, 1, &dims, types[ti], types[ti], &err), &err);
                void **blocks = calloc((size_t)nblk, sizeof *blocks);
                for (int b = 0; b < nblk; b++) blocks[b] = calloc((size_t)B, g.bytes_per_pos);
                for (int p = 0; p < NPOS; p++) {
                    kern_kv_store_key(types[ti], g_k[p][0], kv_geom_k(&g, blocks[p / B], B, 0, 0, p % B), HD,
                                      kv_geom_k_stride(&g, B, p % B));
                    kern_kv_store_row(types[ti], g_v[p][0], kv_geom_v(&g, blocks[p / B], B, 0, 0, p % B), HD);
                }
                const model_seq_kv view = {.blocks = blocks, .B = B, .len = 0, .geom = &g};
                op_attn a = {.layer = 0, .n_head = NH, .n_head_kv = NKV, .head_dim_k = HD,
                             .head_dim_v = HD, .scale = 0.125f, .causal = true};
                if (oi == 1) {
                    a.sinks = sinks;
                    a.softcap = 3.0f;
                }
                set_batch(c, &view, &P, 1);
                memcpy(c->q, q, sizeof q);
                op_attention(c, &a, 1);
                if (si == 0) memcpy(want, c->att, sizeof want);
                else
                    CHECK_MSG(memcmp(want, c->att, sizeof want) == 0,
                              "%s opt %d: blocks of %d differ from one block",
                              hl_type_name(types[ti]), oi, B);
                n_cases++;
                for (int b = 0; b < nblk; b++) free(blocks[b]);
                free(blocks);
                kv_geom_free(&g);
            }
    CHECK_EQ_INT(n_cases, 24);
    model_ctx_free(c);
    model_free(m);
}
