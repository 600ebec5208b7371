/*
 * ops.c - shared forward-pass operations (ops.h).
 */
#include "model/ops.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "kernels/kernels.h"
#include "tensor/types.h"

#define ATTN_BLOCK 64 /* keys scored per step of the online softmax */
#define ATTN_HEADS 16 /* query heads that share one pass over a KV head's keys */
/* Key ranges of decode attention (flash-decoding): a token's keys are computed in ranges
 * of ATTN_RANGE positions, each with its own online softmax, folded in key order. Key
 * ranges go to different threads when a batch has few (token, KV head) units: at most
 * ATTN_SPLIT_TOK tokens and ATTN_SPLIT_UNITS units. */
#define ATTN_RANGE 512
#define ATTN_SPLIT_TOK 8
#define ATTN_SPLIT_UNITS 64

/* ---- embeddings, norms, elementwise ---- */

static void weight_row(const model_weight *w, int64_t row, float *out) {
    const size_t bytes = hl_row_size(w->type, w->n_cols);
    const uint8_t *src = (const uint8_t *)w->data + (size_t)row * bytes;
    if (w->type == HL_TYPE_F32) memcpy(out, src, bytes);
    else hl_dequantize_row((hl_type)w->type, src, out, w->n_cols);
}

void op_embed(model_ctx *c, const model_weight *w, int32_t n_tok, float scale, float *out) {
    const int64_t E = w->n_cols;
    for (int32_t t = 0; t < n_tok; t++) {
        weight_row(w, c->tok_id[t], out + t * E);
        if (scale != 0.0f)
            for (int64_t i = 0; i < E; i++) out[t * E + i] *= scale;
    }
}

/* out[t] += w[row(t)], through c->proj as the dequantized row (any weight type). */
static void add_rows(model_ctx *c, const model_weight *w, int32_t n_tok, const int32_t *rows,
                     int64_t row, float *out) {
    const int64_t E = w->n_cols;
    for (int32_t t = 0; t < n_tok; t++) {
        float *r = c->proj + t * E;
        weight_row(w, rows ? rows[t] : row, r);
        op_add(out + t * E, r, E);
    }
}

void op_add_rows_by_pos(model_ctx *c, const model_weight *w, int32_t n_tok, float *out) {
    add_rows(c, w, n_tok, c->tok_pos, 0, out);
}

void op_add_row(model_ctx *c, const model_weight *w, int64_t row, int32_t n_tok, float *out) {
    add_rows(c, w, n_tok, NULL, row, out);
}

void op_rmsnorm(float *out, const float *x, const float *w, int32_t n_tok, int64_t n,
                float eps) {
    for (int32_t t = 0; t < n_tok; t++) kern_rmsnorm(out + t * n, x + t * n, w, n, eps);
}

void op_layernorm(float *out, const float *x, const float *w, const float *b, int32_t n_tok,
                  int64_t n, float eps) {
    for (int32_t t = 0; t < n_tok; t++) {
        const float *xi = x + t * n;
        float *o = out + t * n;
        float mean = 0.0f;
        for (int64_t i = 0; i < n; i++) mean += xi[i];
        mean /= (float)n;
        float var = 0.0f;
        for (int64_t i = 0; i < n; i++) var += (xi[i] - mean) * (xi[i] - mean);
        var /= (float)n;
        const float inv = 1.0f / sqrtf(var + eps);
        for (int64_t i = 0; i < n; i++) {
            float y = (xi[i] - mean) * inv;
            if (w) y *= w[i];
            if (b) y += b[i];
            o[i] = y;
        }
    }
}

void op_head_norm(model_ctx *c, float *x, const float *w, int32_t n_tok, int32_t n_heads,
                  int32_t head_dim, float eps) {
    for (int64_t i = 0; i < (int64_t)n_tok * n_heads; i++) {
        float *h = x + i * head_dim;
        kern_rmsnorm(c->head_tmp, h, w, head_dim, eps);
        memcpy(h, c->head_tmp, (size_t)head_dim * sizeof *h);
    }
}

void op_linear(model_ctx *c, const model_weight *w, const float *bias, const float *x,
               int32_t n_tok, float *out) {
    kern_matmul(c->pool, (hl_type)w->type, w->data, w->n_rows, w->n_cols, x, n_tok, out,
                c->mm_scratch);
    op_add_bias(out, bias, n_tok, w->n_rows);
}

void op_linear_many(model_ctx *c, const model_weight *w1, float *out1, const model_weight *w2,
                    float *out2, const model_weight *w3, float *out3, const float *x,
                    int32_t n_tok) {
    const kern_matmul_item items[3] = {{(hl_type)w1->type, w1->data, w1->n_rows, out1},
                                       {(hl_type)w2->type, w2->data, w2->n_rows, out2},
                                       {w3 ? (hl_type)w3->type : HL_TYPE_F32,
                                        w3 ? w3->data : NULL, w3 ? w3->n_rows : 0, out3}};
    kern_matmul_many(c->pool, items, w3 ? 3 : 2, w1->n_cols, x, n_tok, c->mm_scratch);
}

void op_add_bias(float *x, const float *bias, int32_t n_tok, int64_t n) {
    if (!bias) return;
    for (int32_t t = 0; t < n_tok; t++)
        for (int64_t i = 0; i < n; i++) x[t * n + i] += bias[i];
}

void op_add(float *x, const float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] += y[i];
}

void op_scale(float *x, float s, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] *= s;
}

void op_split(const float *src, int32_t n_tok, float *a, int64_t n_a, float *b, int64_t n_b,
              float *cc, int64_t n_c) {
    const int64_t w = n_a + n_b + n_c;
    for (int32_t t = 0; t < n_tok; t++) {
        const float *s = src + t * w;
        memcpy(a + t * n_a, s, (size_t)n_a * sizeof *s);
        memcpy(b + t * n_b, s + n_a, (size_t)n_b * sizeof *s);
        if (n_c) memcpy(cc + t * n_c, s + n_a + n_b, (size_t)n_c * sizeof *s);
    }
}

static float gelu_tanh(float x) {
    const float k = 0.7978845608028654f; /* sqrt(2/pi) */
    return 0.5f * x * (1.0f + tanhf(k * x * (1.0f + 0.044715f * x * x)));
}

void op_act_apply(float *x, int64_t n, op_act act) {
    for (int64_t i = 0; i < n; i++) {
        const float v = x[i];
        switch (act) {
        case OP_SILU: x[i] = v / (1.0f + expf(-v)); break;
        case OP_GELU_TANH: x[i] = gelu_tanh(v); break;
        case OP_GELU_ERF: x[i] = 0.5f * v * (1.0f + erff(v * 0.70710678118654752f)); break;
        }
    }
}

void op_glu(float *gate, const float *up, int64_t n, op_act act) {
    if (act == OP_SILU) {
        kern_swiglu(gate, gate, up, n); /* the vectorised path llama models always used */
        return;
    }
    op_act_apply(gate, n, act);
    for (int64_t i = 0; i < n; i++) gate[i] *= up[i];
}

void op_ffn_glu(model_ctx *c, const model_weight *gate, const model_weight *up,
                const model_weight *down, int64_t n_ff, op_act act, const float *x,
                int32_t n_tok, float *out) {
    op_linear_many(c, gate, c->gate, up, c->up, NULL, NULL, x, n_tok);
    op_glu(c->gate, c->up, (int64_t)n_tok * n_ff, act);
    op_linear(c, down, NULL, c->gate, n_tok, out);
}

void op_softcap(float *x, int64_t n, float cap) {
    if (cap == 0.0f) return;
    for (int64_t i = 0; i < n; i++) x[i] = cap * tanhf(x[i] / cap);
}

/* ---- RoPE ---- */

/* llama.cpp's YaRN ramp between the extrapolated and interpolated angle (ggml rope). */
static void yarn_corr_dims(int32_t n_rot, int32_t n_ctx_orig, float base, float beta_fast,
                           float beta_slow, float dims[2]) {
    const double two_pi = 6.283185307179586;
#define CORR_DIM(beta) \
    ((double)n_rot * log((double)n_ctx_orig / ((beta) * two_pi)) / (2.0 * log((double)base)))
    double lo = floor(CORR_DIM(beta_fast)), hi = ceil(CORR_DIM(beta_slow));
#undef CORR_DIM
    dims[0] = (float)(lo > 0 ? lo : 0);
    dims[1] = (float)(hi < n_rot - 1 ? hi : n_rot - 1);
}

static void rope_fill(const model_ctx *c, model_rope_table *tb, int32_t n_tok) {
    const model *m = c->m;
    const int32_t half = tb->n_rot / 2;
    const bool yarn = m->x.rope_scaling == MODEL_ROPE_SCALING_YARN;
    float corr[2] = {0, 0};
    float mscale = tb->attn_factor;
    const float ext = yarn ? m->x.yarn_ext_factor : 0.0f;
    if (yarn) {
        yarn_corr_dims(tb->n_rot, m->x.n_ctx_orig, tb->base, m->x.yarn_beta_fast,
                       m->x.yarn_beta_slow, corr);
        if (ext != 0.0f) mscale *= 1.0f + 0.1f * logf(1.0f / tb->scale);
    }
    for (int32_t i = 0; i < half; i++) {
        /* theta_i = pos * scale * base^(-2i/n_rot) / factor_i, in double so large
         * positions keep their angle; YaRN mixes in the unscaled angle per frequency */
        double f = pow((double)tb->base, -2.0 * i / tb->n_rot);
        double inv = f * tb->scale;
        if (tb->factors && tb->factors[i] != 0.0f) {
            inv /= tb->factors[i];
            f /= tb->factors[i];
        }
        double ramp = 0.0;
        if (ext != 0.0f) {
            double y = ((double)i - corr[0]) / fmax(0.001, (double)corr[1] - corr[0]);
            ramp = (1.0 - fmin(1.0, fmax(0.0, y))) * ext;
        }
        for (int32_t t = 0; t < n_tok; t++) {
            double theta = (double)c->tok_pos[t] * inv;
            if (ramp != 0.0) theta = theta * (1.0 - ramp) + (double)c->tok_pos[t] * f * ramp;
            float cs = (float)cos(theta), sn = (float)sin(theta);
            if (mscale != 1.0f) {
                cs *= mscale;
                sn *= mscale;
            }
            tb->cos[t * half + i] = cs;
            tb->sin[t * half + i] = sn;
        }
    }
    tb->valid = true;
}

/* The batch's table for this configuration, computed on first use in a batch. */
static const model_rope_table *rope_table(model_ctx *c, const model_layer_hp *h, int32_t n_tok) {
    const float attn_factor = c->m->x.rope_attn_factor;
    model_rope_table *free_slot = NULL;
    for (int i = 0; i < MODEL_ROPE_TABLES; i++) {
        model_rope_table *tb = &c->rope[i];
        if (!tb->valid) {
            if (!free_slot) free_slot = tb;
            continue;
        }
        if (tb->n_rot == h->n_rot && tb->base == h->rope_base && tb->scale == h->rope_scale &&
            tb->factors == h->rope_factors && tb->attn_factor == attn_factor)
            return tb;
    }
    if (!free_slot) free_slot = &c->rope[0]; /* more kinds than slots: recompute */
    free_slot->n_rot = h->n_rot;
    free_slot->base = h->rope_base;
    free_slot->scale = h->rope_scale;
    free_slot->factors = h->rope_factors;
    free_slot->attn_factor = attn_factor;
    rope_fill(c, free_slot, n_tok);
    return free_slot;
}

void op_rope(model_ctx *c, const model_layer_hp *h, bool neox, float *x, int32_t n_tok,
             int32_t n_heads, int32_t head_dim) {
    const model_rope_table *tb = rope_table(c, h, n_tok);
    const int32_t half = h->n_rot / 2;
    for (int32_t t = 0; t < n_tok; t++) {
        const float *cs = tb->cos + t * half, *sn = tb->sin + t * half;
        for (int32_t hd = 0; hd < n_heads; hd++) {
            float *v = x + ((int64_t)t * n_heads + hd) * head_dim;
            for (int32_t i = 0; i < half; i++) {
                const int32_t a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
                const float x0 = v[a], x1 = v[b];
                v[a] = x0 * cs[i] - x1 * sn[i];
                v[b] = x0 * sn[i] + x1 * cs[i];
            }
        }
    }
}

/* ---- attention ---- */

static uint8_t *kv_k(const model_seq_kv *kv, int32_t layer, int32_t head, int32_t pos) {
    return kv_geom_k(kv->geom, kv->blocks[pos / kv->B], kv->B, layer, head, pos % kv->B);
}

static uint8_t *kv_v(const model_seq_kv *kv, int32_t layer, int32_t head, int32_t pos) {
    return kv_geom_v(kv->geom, kv->blocks[pos / kv->B], kv->B, layer, head, pos % kv->B);
}

/* Writes the batch's (already rotated) keys and values into each token's sequence at its
 * position, converted to the cache's element types (f32 copied, f16, q8_0). */
static void kv_store(const model_ctx *c, const op_attn *a, int32_t n_tok) {
    const int32_t hdk = a->head_dim_k, hdv = a->head_dim_v;
    for (int32_t t = 0; t < n_tok; t++) {
        const model_seq_kv *kv = &c->seq_kv[c->tok_seq[t]].slot[c->m->layer_slot[a->layer]];
        const int32_t pos = c->tok_pos[t];
        for (int32_t h = 0; h < a->n_head_kv; h++) {
            kern_kv_store_key(kv->geom->k_type, c->k + ((int64_t)t * a->n_head_kv + h) * hdk,
                              kv_k(kv, a->layer, h, pos), hdk,
                              kv_geom_k_stride(kv->geom, kv->B, pos % kv->B));
            kern_kv_store_row(kv->geom->v_type, c->v + ((int64_t)t * a->n_head_kv + h) * hdv,
                              kv_v(kv, a->layer, h, pos), hdv);
        }
    }
}

typedef struct attn_job {
    const model_ctx *c;
    const op_attn *a;
    int32_t n_tok;
    int32_t group, n_sub, sub_heads; /* query heads per KV head; units per KV head, each
                                        of at most sub_heads (ATTN_HEADS) heads */
    int64_t n_units;                 /* n_tok * n_head_kv * n_sub */
    _Atomic int64_t next_chunk;      /* perf: see attn_worker */
    /* split mode (op_attention): chunks are (unit, key range) */
    bool split;
    int64_t n_chunks;
    int32_t tok_chunk0[ATTN_SPLIT_TOK + 1]; /* first chunk of each token's units */
    _Atomic int32_t unit_done[ATTN_SPLIT_UNITS];
    size_t slot_floats;
} attn_job;

/* The keys token t attends to, [*k_begin, *k_end). */
static void attn_keys(const attn_job *j, int32_t t, int32_t *k_begin, int32_t *k_end) {
    const op_attn *a = j->a;
    const int32_t seq = j->c->tok_seq[t], pos = j->c->tok_pos[t];
    *k_end = a->causal ? pos + 1 : j->c->seq_end[seq];
    *k_begin = a->causal && a->window > 0 && pos - a->window + 1 > 0 ? pos - a->window + 1 : 0;
}

/* Key ranges: the keys are cut at multiples of ATTN_RANGE (absolute positions), so a
 * token's ranges depend only on its own keys, never on the batch or the threads. */
static int32_t attn_n_ranges(int32_t k_begin, int32_t k_end) {
    if (k_end <= k_begin) return 1;
    return (k_end - 1) / ATTN_RANGE - k_begin / ATTN_RANGE + 1;
}

static void attn_range_keys(int32_t k_begin, int32_t k_end, int32_t r, int32_t *r0, int32_t *r1) {
    const int32_t first = k_begin / ATTN_RANGE;
    *r0 = r == 0 ? k_begin : (first + r) * ATTN_RANGE;
    *r1 = (first + r + 1) * ATTN_RANGE < k_end ? (first + r + 1) * ATTN_RANGE : k_end;
    if (*r1 < *r0) *r1 = *r0;
}

/* The keys from k0 scored in one step of the online softmax: up to ATTN_BLOCK, before r1,
 * as runs of contiguous rows, one per cache block touched (KERN_ATTN_RUNS at most: the
 * runner's 32-position blocks give two per step); keys by columns, one per tile of
 * KV_K_TILE positions. Returns the step's keys (0 from r1 on).
 * So the steps, and the bits, are those of one big block whenever a step spans at most two
 * blocks: blocks of 64 positions or more, or of 32 from a block boundary (all but sliding
 * windows). perf: with 2 threads 4-9% less time than a step per 32-position block, with 1
 * the same (bench_attn at 4096, f16, in-process alternation); what is left of the small
 * blocks' cost is their memory layout, not the calls. */
static int32_t attn_step(const model_seq_kv *kv, int32_t layer, int32_t kvh, int32_t k0,
                         int32_t r1, kern_attn_run run[KERN_ATTN_RUNS]) {
    int32_t n = 0;
    for (int r = 0; r < KERN_ATTN_RUNS; r++) {
        const int32_t k = k0 + n;
        int32_t len = r1 - k < ATTN_BLOCK - n ? r1 - k : ATTN_BLOCK - n;
        if (len > kv->B - k % kv->B) len = kv->B - k % kv->B;
        if (kv_geom_k_cols(kv->geom) && len > KV_K_TILE - k % kv->B % KV_K_TILE)
            len = KV_K_TILE - k % kv->B % KV_K_TILE;
        if (len <= 0) {
            run[r] = (kern_attn_run){NULL, NULL, 0, 0};
            continue;
        }
        run[r] = (kern_attn_run){kv_k(kv, layer, kvh, k), kv_v(kv, layer, kvh, k), len,
                                 kv_geom_k_stride(kv->geom, kv->B, k % kv->B)};
        n += len;
    }
    return n;
}

/* Query heads [h0, h0 + nh) of token t, all of one KV head, nh <= ATTN_HEADS, over the
 * keys [r0, r1): the unnormalised output into out ([nh][hdv]), the running max and sum
 * into run_max / run_sum; first: the token's first range, which starts from the sinks.
 * Keys are scored a step (attn_step) at a time; the softmax is computed online (running
 * max and sum), so no buffer the size of the context is needed. perf: the heads walk the
 * keys together, so each block of K and V comes from memory once for the group instead
 * of once per head (GQA: 4-8 query heads per KV head). f16 rows are converted as they
 * load (F16C), once per head pair: converting a block once into an f32 buffer for the
 * group was measured slower (bench_attn, bench/README.md). Per head the operations and
 * their order are exactly those of a head computed alone. */
static void attn_range(const attn_job *j, int32_t t, int32_t h0, int32_t nh, int32_t r0,
                       int32_t r1, bool first, float *out, float *run_max, float *run_sum) {
    const op_attn *a = j->a;
    const model_ctx *c = j->c;
    const int32_t hdk = a->head_dim_k, hdv = a->head_dim_v;
    const int32_t kvh = h0 / j->group;
    const int32_t seq = c->tok_seq[t];
    /* the token's own sequence, in the slot of the layer's cache */
    const model_seq_kv *kv = &c->seq_kv[seq].slot[c->m->layer_slot[a->layer]];
    float score[8 * ATTN_BLOCK]; /* kern_attn_block's scratch: eight heads' scores */
    const float *q = c->q + ((int64_t)t * a->n_head + h0) * hdk;
    const hl_type kt = kv->geom->k_type, vt = kv->geom->v_type;
    const size_t ldk = kv->geom->k_row[a->layer], ldv = kv->geom->v_row[a->layer];
    /* q8_0 keys are scored against q in q8_0 (the integer dot): quantized once here */
    block_q8_0 q8[ATTN_HEADS * (MODEL_KV_Q8_MAX_HEAD_DIM / QK8_0)];
    const void *qk = q;
    size_t q_stride = (size_t)hdk * sizeof(float);
    if (kt == HL_TYPE_Q8_0) {
        q_stride = (size_t)(hdk / QK8_0) * sizeof(block_q8_0);
        for (int32_t i = 0; i < nh; i++)
            kern_kv_store_row(HL_TYPE_Q8_0, q + (int64_t)i * hdk, (uint8_t *)q8 + i * q_stride,
                              hdk);
        qk = q8;
    }
    for (int32_t i = 0; i < nh; i++) {
        /* a sink is one more logit in the denominator: exp(sink - max) starts the sum */
        run_max[i] = first && a->sinks ? a->sinks[h0 + i] : -INFINITY;
        run_sum[i] = first && a->sinks ? 1.0f : 0.0f;
    }
    memset(out, 0, (size_t)nh * (size_t)hdv * sizeof *out);
    /* f32 and f16 rows without a softcap: a step of all nh heads in one kernel call
     * (kern_attn_run_block: f16 heads in pairs), the same bits as the per-head steps below */
    const bool fused = a->softcap == 0.0f && kt == vt && (kt == HL_TYPE_F32 || kt == HL_TYPE_F16);
    const size_t esz = kt == HL_TYPE_F16 ? sizeof(hl_fp16) : sizeof(float);
    kern_attn_run run[KERN_ATTN_RUNS], next[KERN_ATTN_RUNS];
    for (int32_t k0 = r0, nb = attn_step(kv, a->layer, kvh, r0, r1, run); nb > 0;) {
        const int32_t nb1 = attn_step(kv, a->layer, kvh, k0 + nb, r1, next);
        if (fused) {
            const kern_attn_block b = {.nh = nh, .q = q, .ldq = hdk, .run = {run[0], run[1]},
                                       .ldk = (int64_t)(ldk / esz), .ldv = (int64_t)(ldv / esz),
                                       .k_cols = kv_geom_k_cols(kv->geom),
                                       .dk = hdk, .dv = hdv, .scale = a->scale, .o = out,
                                       .m = run_max, .s = run_sum, .score = score,
                                       .next = {next[0], next[1]}};
            kern_attn_run_block(kt, &b);
        } else {
            for (int32_t i = 0; i < nh; i++) {
                float *o = out + (int64_t)i * hdv;
                const void *qi = (const uint8_t *)qk + i * q_stride;
                for (int r = 0, at = 0; r < KERN_ATTN_RUNS; at += (int)run[r].n, r++) {
                    if (kv_geom_k_cols(kv->geom))
                        kern_dot_cols_f16(score + at, qi, run[r].k, run[r].kld, run[r].n, hdk,
                                          a->scale);
                    else
                        kern_dot_rows_kv(kt, score + at, qi, run[r].k, ldk, run[r].n, hdk,
                                         a->scale);
                }
                if (a->softcap != 0.0f) op_softcap(score, nb, a->softcap);
                const float block_max = kern_max(score, nb);
                if (block_max > run_max[i]) {
                    const float r = expf(run_max[i] - block_max); /* 0 on the first block */
                    run_sum[i] *= r;
                    kern_scale(o, r, hdv);
                    run_max[i] = block_max;
                }
                /* perf: vector exp over the step; the value sum with o held in registers */
                run_sum[i] += kern_exp_shift_sum(score, nb, run_max[i]);
                for (int r = 0, at = 0; r < KERN_ATTN_RUNS; at += (int)run[r].n, r++)
                    kern_axpy_rows_kv(vt, o, score + at, run[r].v, ldv, run[r].n, hdv);
            }
        }
        k0 += nb;
        nb = nb1;
        memcpy(run, next, sizeof run);
    }
}

/* Folds a later range's partial (o2, m2, s2) into the running one (o, m, s), nh heads:
 * both rescaled to the larger max. Ranges are always folded in key order, whether one
 * thread computed them all or several did, so both give the same bits. */
static void attn_merge(int32_t nh, int32_t hdv, float *o, float *m, float *s, const float *o2,
                       const float *m2, const float *s2) {
    for (int32_t i = 0; i < nh; i++) {
        const float mx = m2[i] > m[i] ? m2[i] : m[i];
        if (mx == -INFINITY) continue; /* both empty */
        const float a = expf(m[i] - mx), b = expf(m2[i] - mx);
        s[i] = s[i] * a + s2[i] * b;
        m[i] = mx;
        float *oi = o + (int64_t)i * hdv;
        const float *o2i = o2 + (int64_t)i * hdv;
        for (int32_t d = 0; d < hdv; d++) oi[d] = oi[d] * a + o2i[d] * b;
    }
}

static void attn_normalize(int32_t nh, int32_t hdv, float *out, const float *run_sum) {
    for (int32_t i = 0; i < nh; i++) {
        const float inv = run_sum[i] > 0.0f ? 1.0f / run_sum[i] : 0.0f;
        for (int32_t d = 0; d < hdv; d++) out[(int64_t)i * hdv + d] *= inv;
    }
}

/* Unit u: token t, query heads [h0, h0 + nh). */
static void attn_unit(const attn_job *j, int64_t u, int32_t *t, int32_t *h0, int32_t *nh) {
    const int64_t per_tok = (int64_t)j->a->n_head_kv * j->n_sub;
    *t = (int32_t)(u / per_tok);
    const int32_t w = (int32_t)(u % per_tok), kvh = w / j->n_sub, sub = w % j->n_sub;
    *h0 = kvh * j->group + sub * j->sub_heads;
    *nh = j->group - sub * j->sub_heads < j->sub_heads ? j->group - sub * j->sub_heads
                                                        : j->sub_heads;
}

/* One unit by one thread: its ranges in key order, each folded into c->att. */
static void attn_unit_all(const attn_job *j, int64_t u, float *tmp) {
    int32_t t, h0, nh, k_begin, k_end;
    attn_unit(j, u, &t, &h0, &nh);
    attn_keys(j, t, &k_begin, &k_end);
    const int32_t hdv = j->a->head_dim_v, n_r = attn_n_ranges(k_begin, k_end);
    float *out = j->c->att + ((int64_t)t * j->a->n_head + h0) * hdv;
    float m[ATTN_HEADS], s[ATTN_HEADS], m2[ATTN_HEADS], s2[ATTN_HEADS];
    float *o2 = tmp;
    for (int32_t r = 0; r < n_r; r++) {
        int32_t r0, r1;
        attn_range_keys(k_begin, k_end, r, &r0, &r1);
        if (r == 0) {
            attn_range(j, t, h0, nh, r0, r1, true, out, m, s);
        } else {
            attn_range(j, t, h0, nh, r0, r1, false, o2, m2, s2);
            attn_merge(nh, hdv, out, m, s, o2, m2, s2);
        }
    }
    attn_normalize(nh, hdv, out, s);
}

/* Split mode: chunk ci is one key range of one unit; its partial goes to slot ci (the
 * slots of a unit are consecutive, in range order). The thread that finishes a unit's
 * last range folds them all, in order, into c->att. */
static void attn_chunk_split(attn_job *j, int64_t ci) {
    int32_t t = 0;
    while (j->tok_chunk0[t + 1] <= ci) t++;
    int32_t k_begin, k_end;
    attn_keys(j, t, &k_begin, &k_end);
    const int32_t n_r = attn_n_ranges(k_begin, k_end);
    const int64_t per_tok = (int64_t)j->a->n_head_kv * j->n_sub;
    const int64_t in_tok = ci - j->tok_chunk0[t], u = (int64_t)t * per_tok + in_tok / n_r;
    const int32_t r = (int32_t)(in_tok % n_r);
    int32_t h0, nh, r0, r1;
    attn_unit(j, u, &t, &h0, &nh);
    attn_range_keys(k_begin, k_end, r, &r0, &r1);
    const int32_t hdv = j->a->head_dim_v;
    float *part = j->c->attn_part;
    float *slot = part + (size_t)ci * j->slot_floats;
    float *sm = slot + (size_t)nh * hdv, *ss = sm + nh;
    attn_range(j, t, h0, nh, r0, r1, r == 0, slot, sm, ss);
    if (atomic_fetch_add_explicit(&j->unit_done[u], 1, memory_order_acq_rel) != n_r - 1) return;
    /* the last range of the unit: fold them all in key order */
    const int64_t c0 = ci - r;
    float *out = j->c->att + ((int64_t)t * j->a->n_head + h0) * hdv;
    const float *s0 = part + (size_t)c0 * j->slot_floats;
    float m[ATTN_HEADS], s[ATTN_HEADS];
    memcpy(out, s0, (size_t)nh * hdv * sizeof *out);
    memcpy(m, s0 + (size_t)nh * hdv, (size_t)nh * sizeof *m);
    memcpy(s, s0 + (size_t)nh * hdv + nh, (size_t)nh * sizeof *s);
    for (int32_t k = 1; k < n_r; k++) {
        const float *sk = part + (size_t)(c0 + k) * j->slot_floats;
        attn_merge(nh, hdv, out, m, s, sk, sk + (size_t)nh * hdv, sk + (size_t)nh * hdv + nh);
    }
    attn_normalize(nh, hdv, out, s);
}

/* perf: threads claim chunks from a counter. Without split, a chunk is one unit (one
 * token x up to ATTN_HEADS query heads of one KV head), latest token first: causal rows
 * grow with the position, so a static split gave the thread with the late tokens 3/4
 * of a prefill's work, and a descheduled thread no longer holds up the others. With
 * split (decode: fewer units than the threads could share), a chunk is one key range
 * of a unit (flash-decoding), so two threads share even a single KV head's keys. Each
 * chunk is computed alike in any order. */
static void attn_worker(void *ctx, int ith, int nth) {
    attn_job *j = ctx;
    (void)nth;
    float *tmp = j->c->attn_tmp + (size_t)ith * j->c->attn_tmp_floats;
    const int64_t n_chunks = j->split ? j->n_chunks : j->n_units;
    for (;;) {
        const int64_t ci = atomic_fetch_add_explicit(&j->next_chunk, 1, memory_order_relaxed);
        if (ci >= n_chunks) break;
        if (j->split) attn_chunk_split(j, ci);
        else attn_unit_all(j, n_chunks - 1 - ci, tmp);
    }
}

int64_t op_attn_tmp_floats(int64_t max_head_dim) {
    return ATTN_HEADS * max_head_dim;
}

void op_attention(model_ctx *c, const op_attn *a, int32_t n_tok) {
    if (a->store) kv_store(c, a, n_tok);
    attn_job job = {.c = c, .a = a, .n_tok = n_tok, .next_chunk = 0};
    job.group = a->n_head / a->n_head_kv;
    job.n_sub = (job.group + ATTN_HEADS - 1) / ATTN_HEADS;
    job.sub_heads = job.group < ATTN_HEADS ? job.group : ATTN_HEADS;
    job.n_units = (int64_t)n_tok * a->n_head_kv * job.n_sub;
    job.slot_floats = (size_t)job.sub_heads * ((size_t)a->head_dim_v + 2);
    /* split by key ranges when the units alone cannot give every thread four (up to
     * 4 KV heads on 2 threads: TinyLlama, gemma3 1B, qwen2.5 0.5B), and the partials fit
     * in c->attn_part. perf: with two units per thread, a worker that wakes late (the
     * pool's run_any) left the caller three of four, and a 4096-position step took the
     * time of three units; 32 ranges balance (bench_attn f16, 2 threads: 16.5 -> 14.3 ms
     * median of 6 alternated runs). With more units the split only adds work. */
    const int nth = hl_pool_n_threads(c->pool);
    if (nth > 1 && n_tok <= ATTN_SPLIT_TOK && job.n_units <= ATTN_SPLIT_UNITS &&
        job.n_units < 4 * (int64_t)nth) {
        int64_t chunks = 0, multi = 0;
        const int64_t per_tok = job.n_units / n_tok;
        for (int32_t t = 0; t < n_tok; t++) {
            int32_t k_begin, k_end;
            attn_keys(&job, t, &k_begin, &k_end);
            const int32_t n_r = attn_n_ranges(k_begin, k_end);
            job.tok_chunk0[t] = (int32_t)chunks;
            chunks += per_tok * n_r;
            multi += n_r > 1;
        }
        job.tok_chunk0[n_tok] = (int32_t)chunks;
        if (multi > 0 && (size_t)chunks * job.slot_floats <= c->attn_part_floats) {
            job.split = true;
            job.n_chunks = chunks;
            for (int64_t u = 0; u < job.n_units; u++) atomic_init(&job.unit_done[u], 0);
        }
    }
    hl_pool_run_any(c->pool, attn_worker, &job); /* perf: chunks claimed dynamically */
}

/* ---- mixture of experts ---- */

int64_t op_moe_scratch_floats(int64_t n_embd, int32_t n_expert, int64_t n_ff_exp) {
    /* per token: router probabilities / chosen weights, a token index, the gathered
     * input, gate and up, an expert's output */
    return n_expert + 1 + 2 * n_embd + 2 * n_ff_exp;
}

/* gpt-oss's clamped SwiGLU (llama.cpp swiglu_oai: alpha 1.702, limit 7), into g. */
static void swiglu_oai(float *g, const float *u, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        const float x = g[i] < 7.0f ? g[i] : 7.0f;
        const float y = u[i] < -7.0f ? -7.0f : u[i] > 7.0f ? 7.0f : u[i];
        g[i] = x / (1.0f + expf(-1.702f * x)) * (y + 1.0f);
    }
}

void op_moe(model_ctx *c, const model_weight *router, const model_weight *gate,
            const model_weight *up, const model_weight *down, int32_t n_used, const float *x,
            int32_t n_tok, float *out, float *scratch) {
    const op_moe_args a = {.router = router, .gate = gate, .up = up, .down = down,
                           .n_used = n_used};
    op_moe_ex(c, &a, x, n_tok, out, scratch);
}

static void moe_experts(model_ctx *c, const op_moe_args *a, int32_t n_exp, const float *x,
                        int32_t n_tok, float *out, float *scratch);

void op_moe_ex(model_ctx *c, const op_moe_args *a, const float *x, int32_t n_tok, float *out,
               float *scratch) {
    const int32_t n_used = a->n_used;
    const int32_t n_exp = (int32_t)a->router->n_rows;
    float *prob = scratch; /* [n_tok][n_exp]; -1: not chosen */

    op_linear(c, a->router, a->router_b, x, n_tok, prob);
    for (int32_t t = 0; t < n_tok; t++) {
        float *p = prob + (size_t)t * n_exp;
        float mx = p[0], sum = 0.0f;
        for (int32_t e = 1; e < n_exp; e++) mx = p[e] > mx ? p[e] : mx;
        for (int32_t e = 0; e < n_exp; e++) sum += p[e] = expf(p[e] - mx);
        /* top-k-then-softmax: exp(l - max) ranks as the logits do, and the max is always
         * chosen, so normalising the chosen ones below is the softmax over the k */
        if (a->routing == OP_MOE_SOFTMAX_NORM)
            for (int32_t e = 0; e < n_exp; e++) p[e] /= sum;
        /* top k by repeated argmax; chosen ones are marked by a weight >= 2 meanwhile */
        float wsum = 0.0f;
        for (int32_t j = 0; j < n_used; j++) {
            int32_t best = -1;
            for (int32_t e = 0; e < n_exp; e++)
                if (p[e] < 2.0f && (best < 0 || p[e] > p[best])) best = e;
            wsum += p[best];
            p[best] += 2.0f;
        }
        for (int32_t e = 0; e < n_exp; e++) p[e] = p[e] >= 2.0f ? (p[e] - 2.0f) / wsum : -1.0f;
    }
    moe_experts(c, a, n_exp, x, n_tok, out, scratch);
}

/* The chosen experts over their tokens (a's gate, up, down, biases and activation; the
 * router is not read): scratch as op_moe's, its first n_tok * n_exp floats the routing
 * (the weight of each chosen expert, -1 for the others). */
static void moe_experts(model_ctx *c, const op_moe_args *a, int32_t n_exp, const float *x,
                        int32_t n_tok, float *out, float *scratch) {
    const model_weight *gate = a->gate, *up = a->up, *down = a->down;
    const int64_t E = down->ne[1], F = gate->ne[1];
    float *prob = scratch;
    int32_t *idx = (int32_t *)(void *)(prob + (size_t)n_tok * n_exp); /* [n_tok] */
    float *xin = (float *)(void *)(idx + n_tok); /* [n_tok][E] */
    float *g = xin + (size_t)n_tok * E;          /* [n_tok][F] */
    float *u = g + (size_t)n_tok * F;            /* [n_tok][F] */
    float *y = u + (size_t)n_tok * F;            /* [n_tok][E] */
    memset(out, 0, (size_t)n_tok * (size_t)E * sizeof *out);
    const size_t gate_row = hl_row_size(gate->type, gate->n_cols);
    const size_t up_row = hl_row_size(up->type, up->n_cols);
    const size_t down_row = hl_row_size(down->type, down->n_cols);
    for (int32_t e = 0; e < n_exp; e++) {
        int32_t n = 0;
        for (int32_t t = 0; t < n_tok; t++)
            if (prob[(size_t)t * n_exp + e] >= 0.0f) {
                idx[n] = t;
                memcpy(xin + (size_t)n * E, x + (size_t)t * E, (size_t)E * sizeof *x);
                n++;
            }
        if (n == 0) continue;
        const kern_matmul_item items[2] = {
            {(hl_type)gate->type, (const uint8_t *)gate->data + (size_t)e * F * gate_row, F, g},
            {(hl_type)up->type, (const uint8_t *)up->data + (size_t)e * F * up_row, F, u}};
        kern_matmul_many(c->pool, items, 2, E, xin, n, c->mm_scratch);
        op_add_bias(g, a->b_gate ? a->b_gate + (size_t)e * F : NULL, n, F);
        op_add_bias(u, a->b_up ? a->b_up + (size_t)e * F : NULL, n, F);
        if (a->act == OP_MOE_SWIGLU_OAI) swiglu_oai(g, u, (int64_t)n * F);
        else op_glu(g, u, (int64_t)n * F, OP_SILU);
        kern_matmul(c->pool, (hl_type)down->type,
                    (const uint8_t *)down->data + (size_t)e * E * down_row, E, F, g, n, y,
                    c->mm_scratch);
        op_add_bias(y, a->b_down ? a->b_down + (size_t)e * E : NULL, n, E);
        for (int32_t i = 0; i < n; i++) {
            const int32_t t = idx[i];
            const float w = prob[(size_t)t * n_exp + e];
            float *o = out + (size_t)t * E;
            const float *yi = y + (size_t)i * E;
            for (int64_t d = 0; d < E; d++) o[d] += w * yi[d];
        }
    }
}

int64_t op_moe_gated_scratch_floats(int64_t n_embd, int32_t n_expert, int64_t n_ff_exp) {
    return op_moe_scratch_floats(n_embd, n_expert, n_ff_exp) + n_expert; /* + selection */
}

/* The best of v[0..n) not yet taken (ties: the lower index). */
static int32_t argmax_free(const float *v, const uint8_t *taken, int32_t n) {
    int32_t best = -1;
    for (int32_t i = 0; i < n; i++)
        if (!taken[i] && (best < 0 || v[i] > v[best])) best = i;
    return best;
}

void op_moe_gated(model_ctx *c, const op_moe_gating *gt, const model_weight *router,
                  const model_weight *gate, const model_weight *up, const model_weight *down,
                  int32_t n_used, const float *x, int32_t n_tok, float *out, float *scratch) {
    const int32_t n_exp = (int32_t)router->n_rows;
    const int64_t E = router->n_cols, F = gate->ne[1];
    float *prob = scratch; /* [n_tok][n_exp] as moe_experts reads it */
    /* the selection scores [n_exp], past op_moe's scratch */
    float *sel = scratch + (size_t)n_tok * op_moe_scratch_floats(E, n_exp, F);
    uint8_t taken[OP_MOE_MAX_EXPERTS], gtaken[OP_MOE_MAX_GROUPS];
    float gscore[OP_MOE_MAX_GROUPS];
    const int32_t n_group = gt->n_group > 1 ? gt->n_group : 1;
    const int32_t per_group = n_exp / n_group;
    op_linear(c, router, NULL, x, n_tok, prob);
    for (int32_t t = 0; t < n_tok; t++) {
        float *p = prob + (size_t)t * n_exp;
        if (gt->sigmoid) {
            for (int32_t e = 0; e < n_exp; e++) p[e] = 1.0f / (1.0f + expf(-p[e]));
        } else {
            float mx = p[0], sum = 0.0f;
            for (int32_t e = 1; e < n_exp; e++) mx = p[e] > mx ? p[e] : mx;
            for (int32_t e = 0; e < n_exp; e++) sum += p[e] = expf(p[e] - mx);
            for (int32_t e = 0; e < n_exp; e++) p[e] /= sum;
        }
        for (int32_t e = 0; e < n_exp; e++)
            sel[e] = p[e] + (gt->sel_bias ? gt->sel_bias[e] : 0.0f);
        if (n_group > 1) {
            /* a group's score: the sum of its two best; the n_group_used best groups stay */
            for (int32_t gi = 0; gi < n_group; gi++) {
                const float *s = sel + (size_t)gi * per_group;
                float a = -INFINITY, b = -INFINITY;
                for (int32_t i = 0; i < per_group; i++) {
                    if (s[i] > a) b = a, a = s[i];
                    else if (s[i] > b) b = s[i];
                }
                gscore[gi] = per_group > 1 ? a + b : a;
            }
            memset(gtaken, 0, (size_t)n_group);
            for (int32_t j = 0; j < gt->n_group_used; j++)
                gtaken[argmax_free(gscore, gtaken, n_group)] = 1;
            for (int32_t gi = 0; gi < n_group; gi++)
                if (!gtaken[gi])
                    for (int32_t i = 0; i < per_group; i++)
                        sel[(size_t)gi * per_group + i] = -INFINITY;
        }
        memset(taken, 0, (size_t)n_exp);
        float wsum = 0.0f;
        for (int32_t j = 0; j < n_used; j++) {
            const int32_t best = argmax_free(sel, taken, n_exp);
            taken[best] = 1;
            wsum += p[best];
        }
        float mul = gt->scale != 0.0f ? gt->scale : 1.0f;
        if (gt->norm) mul /= wsum > 6.103515625e-5f ? wsum : 6.103515625e-5f;
        for (int32_t e = 0; e < n_exp; e++) p[e] = taken[e] ? p[e] * mul : -1.0f;
    }
    const op_moe_args a = {.gate = gate, .up = up, .down = down, .n_used = n_used};
    moe_experts(c, &a, n_exp, x, n_tok, out, scratch);
}
