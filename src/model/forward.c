/*
 * forward.c - the transformer forward pass of llama-family models, the KV cache, and the
 * evaluation context. Reads top to bottom like llama2.c's run.c, but every step works on a
 * batch of tokens: each weight matmul takes all the batch's activations at once.
 *
 * Per layer, for a batch of n tokens at positions p0..p0+n-1:
 *   xb = rmsnorm(x) * attn_norm
 *   q, k, v = xb Wq (+bq), xb Wk (+bk), xb Wv (+bv)
 *   q, k = rmsnorm per head (qwen3), then RoPE at each token's position
 *   the cache gets k, v; att = softmax(q k^T / sqrt(d)) v over positions <= own (causal)
 *   x += att Wo
 *   xb = rmsnorm(x) * ffn_norm;  x += (silu(xb Wgate) * xb Wup) Wdown
 * then logits = rmsnorm(x) * output_norm Woutput.
 */
#include "model/internal.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "base/pool.h"
#include "kernels/kernels.h"
#include "tensor/types.h"

#define MODEL_DEFAULT_BATCH 512
#define MODEL_MAX_BATCH 8192
#define ATTN_BLOCK 64 /* keys scored per step of the online softmax */
#define ATTN_HEADS 16 /* query heads that share one pass over a KV head's keys */

/* ---- KV cache ---- */

/* A contiguous cache is a block table with one block of n_ctx positions. */
struct model_kv {
    const model *m;
    int32_t n_ctx; /* capacity */
    int32_t len;
    float *k; /* [n_layer][n_head_kv][n_ctx][head_dim_k], followed by v in the same buffer */
    float *v; /* [n_layer][n_head_kv][n_ctx][head_dim_v] */
};

/* What the forward pass reads and writes: positions live in blocks of B (see model.h). */
typedef struct kv_blocks {
    float *const *blocks;
    int32_t B;
    int32_t len;
    size_t v_off; /* floats from a block's base to its V part */
} kv_blocks;

static size_t kv_v_offset(const model_hparams *hp, int32_t B) {
    return (size_t)hp->n_layer * (size_t)hp->n_head_kv * (size_t)B * (size_t)hp->head_dim_k;
}

/* Key row of position pos; the following rows of the same block are contiguous. */
static float *kv_k_at(const kv_blocks *kv, const model_hparams *hp, int32_t layer, int32_t head,
                      int32_t pos) {
    const int32_t b = pos / kv->B, r = pos % kv->B;
    return kv->blocks[b] + (((size_t)layer * hp->n_head_kv + head) * kv->B + r) * hp->head_dim_k;
}

static float *kv_v_at(const kv_blocks *kv, const model_hparams *hp, int32_t layer, int32_t head,
                      int32_t pos) {
    const int32_t b = pos / kv->B, r = pos % kv->B;
    return kv->blocks[b] + kv->v_off +
           (((size_t)layer * hp->n_head_kv + head) * kv->B + r) * hp->head_dim_v;
}

static float *alloc_floats(size_t a, size_t b, size_t c) {
    size_t n;
    if (__builtin_mul_overflow(a, b, &n) || __builtin_mul_overflow(n, c, &n) || n == 0)
        return NULL;
    return calloc(n, sizeof(float));
}

hl_status model_kv_create(const model *m, int32_t n_ctx, model_kv **out, hl_err *err) {
    *out = NULL;
    if (n_ctx <= 0)
        return hl_fail(err, HL_ERR_INVALID, "context size must be positive, got %d", n_ctx);
    const model_hparams *hp = &m->hp;
    model_kv *kv = calloc(1, sizeof *kv);
    if (!kv) return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    kv->m = m;
    kv->n_ctx = n_ctx;
    size_t per = (size_t)hp->n_layer * (size_t)hp->n_head_kv;
    kv->k = alloc_floats(per, (size_t)n_ctx, (size_t)hp->head_dim_k + (size_t)hp->head_dim_v);
    if (kv->k) kv->v = kv->k + kv_v_offset(hp, n_ctx);
    if (!kv->k) {
        model_kv_free(kv);
        return hl_fail(err, HL_ERR_NOMEM, "out of memory for a KV cache of %d tokens", n_ctx);
    }
    *out = kv;
    return HL_OK;
}

void model_kv_free(model_kv *kv) {
    if (!kv) return;
    free(kv->k);
    free(kv);
}

int32_t model_kv_len(const model_kv *kv) { return kv->len; }
int32_t model_kv_capacity(const model_kv *kv) { return kv->n_ctx; }

hl_status model_kv_truncate(model_kv *kv, int32_t n, hl_err *err) {
    if (n < 0 || n > kv->len)
        return hl_fail(err, HL_ERR_INVALID, "cannot truncate a KV cache of %d tokens to %d",
                       kv->len, n);
    kv->len = n; /* positions >= n are overwritten by the next eval */
    return HL_OK;
}

/* ---- context ---- */

struct model_ctx {
    const model *m;
    hl_pool *pool;
    int32_t max_batch;
    /* activations, max_batch rows each */
    float *x;    /* residual stream [B][n_embd] */
    float *xb;   /* normed input of a block [B][n_embd] */
    float *q;    /* [B][n_head * head_dim_k] */
    float *k;    /* [B][n_head_kv * head_dim_k] */
    float *v;    /* [B][n_head_kv * head_dim_v] */
    float *att;  /* attention output [B][n_head * head_dim_v] */
    float *proj; /* output of Wo / Wdown [B][n_embd] */
    float *gate; /* [B][n_ff] */
    float *up;   /* [B][n_ff] */
    float *rope_cos, *rope_sin; /* [B][n_rot/2] */
    double *inv_freq;           /* [n_rot/2]; double so large positions keep their angle */
    float *head_tmp;            /* [head_dim_k] */
    float *logits;              /* [n_vocab], the last token's */
    /* the batch being evaluated: per token its id, position and sequence; per sequence
     * its block table (a batch has at most max_batch tokens, so as many sequences) */
    int32_t *tok_id, *tok_pos, *tok_seq;
    kv_blocks *seq_kv;
    int32_t *logit_rows; /* tokens whose logits are wanted */
    void *mm_scratch;
    size_t scratch_bytes; /* everything above, as allocated */
};

static size_t weight_scratch(const model_weight *w, int32_t n_tok) {
    return kern_matmul_scratch_size((hl_type)w->type, w->n_cols, n_tok);
}

hl_status model_ctx_create(const model *m, int n_threads, int32_t max_batch, model_ctx **out,
                           hl_err *err) {
    *out = NULL;
    if (max_batch <= 0) max_batch = MODEL_DEFAULT_BATCH;
    if (max_batch > MODEL_MAX_BATCH) max_batch = MODEL_MAX_BATCH;
    const model_hparams *hp = &m->hp;
    model_ctx *c = calloc(1, sizeof *c);
    if (!c) return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    c->m = m;
    c->max_batch = max_batch;
    hl_status st = hl_pool_create(n_threads, &c->pool, err);
    if (st) {
        free(c);
        return st;
    }
    const size_t B = (size_t)max_batch;
    c->x = alloc_floats(B, (size_t)hp->n_embd, 1);
    c->xb = alloc_floats(B, (size_t)hp->n_embd, 1);
    c->q = alloc_floats(B, (size_t)hp->n_head, (size_t)hp->head_dim_k);
    c->k = alloc_floats(B, (size_t)hp->n_head_kv, (size_t)hp->head_dim_k);
    c->v = alloc_floats(B, (size_t)hp->n_head_kv, (size_t)hp->head_dim_v);
    c->att = alloc_floats(B, (size_t)hp->n_head, (size_t)hp->head_dim_v);
    c->proj = alloc_floats(B, (size_t)hp->n_embd, 1);
    c->gate = alloc_floats(B, (size_t)hp->n_ff, 1);
    c->up = alloc_floats(B, (size_t)hp->n_ff, 1);
    c->rope_cos = alloc_floats(B, (size_t)hp->n_rot / 2 + 1, 1);
    c->rope_sin = alloc_floats(B, (size_t)hp->n_rot / 2 + 1, 1);
    c->inv_freq = calloc((size_t)hp->n_rot / 2 + 1, sizeof *c->inv_freq);
    c->head_tmp = alloc_floats((size_t)hp->head_dim_k, 1, 1);
    c->logits = alloc_floats((size_t)hp->n_vocab, 1, 1);
    c->tok_id = calloc(B, sizeof *c->tok_id);
    c->tok_pos = calloc(B, sizeof *c->tok_pos);
    c->tok_seq = calloc(B, sizeof *c->tok_seq);
    c->seq_kv = calloc(B, sizeof *c->seq_kv);
    c->logit_rows = calloc(B, sizeof *c->logit_rows);
    size_t scratch = weight_scratch(&m->output, max_batch);
    for (int32_t l = 0; l < hp->n_layer; l++) {
        const model_layer *ly = &m->layers[l];
        const model_weight *ws[] = {&ly->wq, &ly->wk, &ly->wv, &ly->wo,
                                    &ly->w_gate, &ly->w_up, &ly->w_down};
        for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) {
            size_t s = weight_scratch(ws[i], max_batch);
            if (s > scratch) scratch = s;
        }
    }
    c->mm_scratch = malloc(scratch ? scratch : 1);
    {
        const size_t E = (size_t)hp->n_embd, hq = (size_t)hp->n_head, hkv = (size_t)hp->n_head_kv;
        const size_t dk = (size_t)hp->head_dim_k, dv = (size_t)hp->head_dim_v;
        size_t floats = B * (3 * E + hq * dk + hkv * dk + hkv * dv + hq * dv + 2 * (size_t)hp->n_ff +
                             2 * ((size_t)hp->n_rot / 2 + 1)) +
                        dk + (size_t)hp->n_vocab;
        c->scratch_bytes = floats * sizeof(float) + ((size_t)hp->n_rot / 2 + 1) * sizeof(double) +
                           (scratch ? scratch : 1) + B * (4 * sizeof(int32_t) + sizeof(kv_blocks));
    }
    if (!c->x || !c->xb || !c->q || !c->k || !c->v || !c->att || !c->proj || !c->gate ||
        !c->up || !c->rope_cos || !c->rope_sin || !c->inv_freq || !c->head_tmp || !c->logits ||
        !c->tok_id || !c->tok_pos || !c->tok_seq || !c->seq_kv || !c->logit_rows ||
        !c->mm_scratch) {
        model_ctx_free(c);
        return hl_fail(err, HL_ERR_NOMEM, "out of memory for a batch of %d tokens", max_batch);
    }
    /* theta_i = pos * freq_scale * base^(-2i/n_rot) / freq_factor_i */
    for (int32_t i = 0; i < hp->n_rot / 2; i++) {
        double f = pow((double)hp->rope_freq_base, -2.0 * i / hp->n_rot) * hp->rope_freq_scale;
        if (m->rope_freqs && m->rope_freqs[i] != 0.0f) f /= m->rope_freqs[i];
        c->inv_freq[i] = f;
    }
    *out = c;
    return HL_OK;
}

void model_ctx_free(model_ctx *c) {
    if (!c) return;
    hl_pool_destroy(c->pool);
    float *bufs[] = {c->x, c->xb, c->q, c->k, c->v, c->att, c->proj, c->gate, c->up,
                     c->rope_cos, c->rope_sin, c->head_tmp, c->logits};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    free(c->inv_freq);
    free(c->tok_id);
    free(c->tok_pos);
    free(c->tok_seq);
    free(c->seq_kv);
    free(c->logit_rows);
    free(c->mm_scratch);
    free(c);
}

int model_ctx_n_threads(const model_ctx *c) { return hl_pool_n_threads(c->pool); }
int32_t model_ctx_max_batch(const model_ctx *c) { return c->max_batch; }
size_t model_ctx_scratch_bytes(const model_ctx *c) { return c->scratch_bytes; }
const float *model_ctx_logits(const model_ctx *c) { return c->logits; }

/* ---- building blocks ---- */

static void matmul(model_ctx *c, const model_weight *w, const float *x, int32_t n_tok, float *out) {
    kern_matmul(c->pool, (hl_type)w->type, w->data, w->n_rows, w->n_cols, x, n_tok, out,
                c->mm_scratch);
}

/* perf: matmuls sharing their input (Wq/Wk/Wv, Wgate/Wup) in one pool run, the input
 * quantized once; outputs are exactly those of separate matmul() calls. */
static void matmul2(model_ctx *c, const model_weight *a, float *out_a, const model_weight *b,
                    float *out_b, const model_weight *w3, float *out_3, const float *x,
                    int32_t n_tok) {
    const kern_matmul_item items[3] = {{(hl_type)a->type, a->data, a->n_rows, out_a},
                                       {(hl_type)b->type, b->data, b->n_rows, out_b},
                                       {w3 ? (hl_type)w3->type : HL_TYPE_F32,
                                        w3 ? w3->data : NULL, w3 ? w3->n_rows : 0, out_3}};
    kern_matmul_many(c->pool, items, w3 ? 3 : 2, a->n_cols, x, n_tok, c->mm_scratch);
}

static void embed(const model *m, int32_t id, float *out) {
    const model_weight *w = &m->tok_embd;
    size_t row = hl_row_size(w->type, w->n_cols);
    const uint8_t *src = (const uint8_t *)w->data + (size_t)id * row;
    if (w->type == HL_TYPE_F32) memcpy(out, src, row);
    else hl_dequantize_row((hl_type)w->type, src, out, w->n_cols);
}

static void add_bias(float *x, const float *bias, int32_t n_tok, int64_t n) {
    if (!bias) return;
    for (int32_t t = 0; t < n_tok; t++)
        for (int64_t i = 0; i < n; i++) x[t * n + i] += bias[i];
}

/* qwen3: RMSNorm over each head of each token. */
static void head_norm(model_ctx *c, float *x, const float *w, int32_t n_tok, int32_t n_heads) {
    if (!w) return;
    const model_hparams *hp = &c->m->hp;
    const int32_t hd = hp->head_dim_k;
    for (int64_t i = 0; i < (int64_t)n_tok * n_heads; i++) {
        float *h = x + i * hd;
        kern_rmsnorm(c->head_tmp, h, w, hd, hp->rms_eps);
        memcpy(h, c->head_tmp, (size_t)hd * sizeof *h);
    }
}

static void rope_tables(model_ctx *c, int32_t n_tok) {
    const int32_t half = c->m->hp.n_rot / 2;
    for (int32_t t = 0; t < n_tok; t++) {
        for (int32_t i = 0; i < half; i++) {
            double theta = (double)c->tok_pos[t] * c->inv_freq[i];
            c->rope_cos[t * half + i] = (float)cos(theta);
            c->rope_sin[t * half + i] = (float)sin(theta);
        }
    }
}

static void rope(const model_ctx *c, float *x, int32_t n_tok, int32_t n_heads) {
    const model_hparams *hp = &c->m->hp;
    const int32_t half = hp->n_rot / 2, hd = hp->head_dim_k;
    const bool neox = hp->rope_kind == MODEL_ROPE_NEOX;
    for (int32_t t = 0; t < n_tok; t++) {
        const float *cs = c->rope_cos + t * half, *sn = c->rope_sin + t * half;
        for (int32_t h = 0; h < n_heads; h++) {
            float *v = x + ((int64_t)t * n_heads + h) * hd;
            for (int32_t i = 0; i < half; i++) {
                int32_t a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
                float x0 = v[a], x1 = v[b];
                v[a] = x0 * cs[i] - x1 * sn[i];
                v[b] = x0 * sn[i] + x1 * cs[i];
            }
        }
    }
}

/* Causal attention for (token, head) pairs, split across the pool. Keys are scored a block
 * at a time; the softmax is computed online (running max and sum), so no buffer the size
 * of the context is needed. */
typedef struct attn_job {
    const model_ctx *c;
    int32_t layer, n_tok;
    _Atomic int64_t next_chunk; /* perf: see attn_worker */
} attn_job;

/* Query heads [h0, h0 + nh) of token t, all of one KV head, nh <= ATTN_HEADS. perf: the
 * heads walk the keys together, a block at a time, so each block of K and V comes from
 * memory once for the group instead of once per head (GQA: 4-8 query heads per KV head;
 * at 2000 positions one KV head's K and V are 1 MB, beyond L2). Per head the operations
 * and their order are exactly those of a head computed alone. */
static void attn_heads(const attn_job *j, int32_t t, int32_t h0, int32_t nh) {
    const model_hparams *hp = &j->c->m->hp;
    const int32_t hdk = hp->head_dim_k, hdv = hp->head_dim_v;
    const int32_t kvh = h0 / (hp->n_head / hp->n_head_kv);
    const kv_blocks *kv = &j->c->seq_kv[j->c->tok_seq[t]]; /* the token's own sequence */
    const int32_t n_keys = j->c->tok_pos[t] + 1;
    const float scale = 1.0f / sqrtf((float)hdk);
    float run_max[ATTN_HEADS], run_sum[ATTN_HEADS];
    float score[ATTN_BLOCK];
    const float *q = j->c->q + ((int64_t)t * hp->n_head + h0) * hdk;
    float *out = j->c->att + ((int64_t)t * hp->n_head + h0) * hdv;
    for (int32_t i = 0; i < nh; i++) {
        run_max[i] = -INFINITY;
        run_sum[i] = 0.0f;
    }
    memset(out, 0, (size_t)nh * (size_t)hdv * sizeof *out);
    for (int32_t k0 = 0, nb; k0 < n_keys; k0 += nb) {
        /* a run of keys that is contiguous: inside one cache block */
        nb = n_keys - k0 < ATTN_BLOCK ? n_keys - k0 : ATTN_BLOCK;
        if (nb > kv->B - k0 % kv->B) nb = kv->B - k0 % kv->B;
        const float *K = kv_k_at(kv, hp, j->layer, kvh, k0);
        const float *V = kv_v_at(kv, hp, j->layer, kvh, k0);
        for (int32_t i = 0; i < nh; i++) {
            float *o = out + (int64_t)i * hdv;
            kern_dot_rows(score, q + (int64_t)i * hdk, K, hdk, nb, hdk, scale); /* 4 keys/pass */
            float block_max = -INFINITY;
            for (int32_t k = 0; k < nb; k++)
                if (score[k] > block_max) block_max = score[k];
            if (block_max > run_max[i]) {
                const float r = expf(run_max[i] - block_max); /* 0 on the first block */
                run_sum[i] *= r;
                for (int32_t d = 0; d < hdv; d++) o[d] *= r;
                run_max[i] = block_max;
            }
            /* perf: vector exp over the block; the value sum with o held in registers */
            run_sum[i] += kern_exp_shift_sum(score, nb, run_max[i]);
            kern_axpy_rows(o, score, V, hdv, nb, hdv);
        }
    }
    for (int32_t i = 0; i < nh; i++) {
        const float inv = 1.0f / run_sum[i];
        for (int32_t d = 0; d < hdv; d++) out[(int64_t)i * hdv + d] *= inv;
    }
}

/* perf: threads claim chunks (one token x the query heads of one KV head) from a counter,
 * latest token first: causal rows grow with the position, so a static split gave the
 * thread with the late tokens 3/4 of a prefill's work, and a descheduled thread no
 * longer holds up the others. Each (token, head) is computed alike in any order. */
static void attn_worker(void *ctx, int ith, int nth) {
    attn_job *j = ctx;
    (void)ith;
    (void)nth;
    const int32_t n_head = j->c->m->hp.n_head, group = n_head / j->c->m->hp.n_head_kv;
    const int64_t per_tok = n_head / group, n_chunks = (int64_t)j->n_tok * per_tok;
    for (;;) {
        const int64_t c = atomic_fetch_add_explicit(&j->next_chunk, 1, memory_order_relaxed);
        if (c >= n_chunks) break;
        const int64_t i = n_chunks - 1 - c;
        const int32_t t = (int32_t)(i / per_tok), h0 = (int32_t)(i % per_tok) * group;
        for (int32_t h = h0; h < h0 + group; h += ATTN_HEADS)
            attn_heads(j, t, h, h0 + group - h < ATTN_HEADS ? h0 + group - h : ATTN_HEADS);
    }
}

/* Writes the batch's (already rotated) keys and values into each token's sequence at its
 * position. */
static void kv_store(const model_ctx *c, int32_t layer, int32_t n_tok) {
    const model_hparams *hp = &c->m->hp;
    const int32_t hdk = hp->head_dim_k, hdv = hp->head_dim_v;
    for (int32_t t = 0; t < n_tok; t++) {
        const kv_blocks *kv = &c->seq_kv[c->tok_seq[t]];
        const int32_t pos = c->tok_pos[t];
        for (int32_t h = 0; h < hp->n_head_kv; h++) {
            memcpy(kv_k_at(kv, hp, layer, h, pos), c->k + ((int64_t)t * hp->n_head_kv + h) * hdk,
                   (size_t)hdk * sizeof(float));
            memcpy(kv_v_at(kv, hp, layer, h, pos), c->v + ((int64_t)t * hp->n_head_kv + h) * hdv,
                   (size_t)hdv * sizeof(float));
        }
    }
}

/* ---- the forward pass over one batch (n_tok <= max_batch) ----
 *
 * The batch is described by c->tok_id/tok_pos/tok_seq (per token) and c->seq_kv (per
 * sequence). Every weight matmul takes all n_tok rows; attention reads each token's own
 * sequence up to its own position. The matmul results of a row do not depend on the
 * other rows (kernels.h), so a token gets the same result in any batch. Logits: for the
 * n_rows tokens listed in c->logit_rows (NULL rows: every token), packed into out. */
static void forward_batch(model_ctx *c, int32_t n_tok, const int32_t *rows, int32_t n_rows,
                          float *out) {
    const model *m = c->m;
    const model_hparams *hp = &m->hp;
    const int64_t E = hp->n_embd;

    hl_pool_burst_begin(c->pool); /* ~5 pool runs per layer follow back to back */
    for (int32_t t = 0; t < n_tok; t++) embed(m, c->tok_id[t], c->x + t * E);
    rope_tables(c, n_tok);

    for (int32_t l = 0; l < hp->n_layer; l++) {
        const model_layer *ly = &m->layers[l];

        /* attention */
        for (int32_t t = 0; t < n_tok; t++)
            kern_rmsnorm(c->xb + t * E, c->x + t * E, ly->attn_norm, E, hp->rms_eps);
        matmul2(c, &ly->wq, c->q, &ly->wk, c->k, &ly->wv, c->v, c->xb, n_tok);
        add_bias(c->q, ly->bq, n_tok, ly->wq.n_rows);
        add_bias(c->k, ly->bk, n_tok, ly->wk.n_rows);
        add_bias(c->v, ly->bv, n_tok, ly->wv.n_rows);
        head_norm(c, c->q, ly->q_norm, n_tok, hp->n_head);
        head_norm(c, c->k, ly->k_norm, n_tok, hp->n_head_kv);
        rope(c, c->q, n_tok, hp->n_head);
        rope(c, c->k, n_tok, hp->n_head_kv);
        kv_store(c, l, n_tok);
        attn_job job = {.c = c, .layer = l, .n_tok = n_tok, .next_chunk = 0};
        hl_pool_run_any(c->pool, attn_worker, &job); /* perf: chunks claimed dynamically */
        matmul(c, &ly->wo, c->att, n_tok, c->proj);
        for (int64_t i = 0; i < n_tok * E; i++) c->x[i] += c->proj[i];

        /* feed-forward */
        for (int32_t t = 0; t < n_tok; t++)
            kern_rmsnorm(c->xb + t * E, c->x + t * E, ly->ffn_norm, E, hp->rms_eps);
        matmul2(c, &ly->w_gate, c->gate, &ly->w_up, c->up, NULL, NULL, c->xb, n_tok);
        kern_swiglu(c->gate, c->gate, c->up, (int64_t)n_tok * hp->n_ff);
        matmul(c, &ly->w_down, c->gate, n_tok, c->proj);
        for (int64_t i = 0; i < n_tok * E; i++) c->x[i] += c->proj[i];
    }

    /* logits: the wanted rows, normed and packed, through one matmul */
    if (!rows) n_rows = n_tok;
    for (int32_t i = 0; i < n_rows; i++) {
        const int32_t t = rows ? rows[i] : i;
        kern_rmsnorm(c->xb + i * E, c->x + (int64_t)t * E, m->output_norm, E, hp->rms_eps);
    }
    if (n_rows > 0) matmul(c, &m->output, c->xb, n_rows, out);
    hl_pool_burst_end(c->pool);
}

static hl_status check_tokens(const model_ctx *c, const int32_t *tokens, int32_t n, hl_err *err) {
    const model_hparams *hp = &c->m->hp;
    if (n <= 0) return hl_fail(err, HL_ERR_INVALID, "no tokens to evaluate");
    for (int32_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= hp->n_vocab)
            return hl_fail(err, HL_ERR_INVALID,
                           "token %d (at index %d) is outside the vocabulary [0, %d)", tokens[i], i,
                           hp->n_vocab);
    return HL_OK;
}

/* One sequence's tokens in chunks of max_batch; positions follow kv->len. */
static void eval_chunks(model_ctx *c, kv_blocks *kv, const int32_t *tokens, int32_t n,
                        float *all_logits) {
    const model_hparams *hp = &c->m->hp;
    c->seq_kv[0] = *kv;
    for (int32_t done = 0; done < n;) {
        int32_t chunk = n - done < c->max_batch ? n - done : c->max_batch;
        for (int32_t t = 0; t < chunk; t++) {
            c->tok_id[t] = tokens[done + t];
            c->tok_pos[t] = kv->len + done + t;
            c->tok_seq[t] = 0;
        }
        const bool last = done + chunk == n;
        if (all_logits) {
            float *out = all_logits + (size_t)done * (size_t)hp->n_vocab;
            forward_batch(c, chunk, NULL, 0, out);
            if (last)
                memcpy(c->logits, out + (size_t)(chunk - 1) * (size_t)hp->n_vocab,
                       (size_t)hp->n_vocab * sizeof(float));
        } else {
            c->logit_rows[0] = chunk - 1;
            forward_batch(c, chunk, c->logit_rows, last ? 1 : 0, c->logits);
        }
        done += chunk;
    }
    kv->len += n;
}

hl_status model_eval(model_ctx *c, model_kv *kv, const int32_t *tokens, int32_t n,
                     float *all_logits, hl_err *err) {
    if (kv->m != c->m) return hl_fail(err, HL_ERR_INVALID, "KV cache belongs to another model");
    hl_status st = check_tokens(c, tokens, n, err);
    if (st) return st;
    if (n > kv->n_ctx - kv->len)
        return hl_fail(err, HL_ERR_KV_FULL,
                       "%d tokens do not fit the context: %d of %d positions are used", n,
                       kv->len, kv->n_ctx);
    float *const blocks[1] = {kv->k};
    kv_blocks view = {.blocks = blocks, .B = kv->n_ctx, .len = kv->len,
                      .v_off = kv_v_offset(&c->m->hp, kv->n_ctx)};
    eval_chunks(c, &view, tokens, n, all_logits);
    kv->len = view.len;
    return HL_OK;
}

hl_status model_eval_view(model_ctx *c, const model_kv_view *kv, const int32_t *tokens, int32_t n,
                          float *all_logits, hl_err *err) {
    hl_status st = check_tokens(c, tokens, n, err);
    if (st) return st;
    if (kv->block_tokens <= 0 || kv->len < 0 || !kv->blocks)
        return hl_fail(err, HL_ERR_INVALID, "invalid KV block table");
    if ((int64_t)kv->len + n > (int64_t)kv->n_blocks * kv->block_tokens)
        return hl_fail(err, HL_ERR_KV_FULL,
                       "%d tokens do not fit the KV block table: %d of %lld positions are used",
                       n, kv->len, (long long)kv->n_blocks * kv->block_tokens);
    kv_blocks view = {.blocks = kv->blocks, .B = kv->block_tokens, .len = kv->len,
                      .v_off = kv_v_offset(&c->m->hp, kv->block_tokens)};
    eval_chunks(c, &view, tokens, n, all_logits);
    return HL_OK;
}

/* Built on model_eval so it works whatever KV layout the eval uses: after each chunk the
 * residual stream c->x still holds that chunk's final hidden states (the logits step only
 * writes c->xb), which are normalised here exactly as the logits step normalises them. */
hl_status model_eval_hidden(model_ctx *c, model_kv *kv, const int32_t *tokens, int32_t n,
                            float *hidden, hl_err *err) {
    const model *m = c->m;
    const int64_t E = m->hp.n_embd;
    if (n <= 0) return hl_fail(err, HL_ERR_INVALID, "no tokens to evaluate");
    for (int32_t done = 0; done < n;) {
        int32_t chunk = n - done < c->max_batch ? n - done : c->max_batch;
        hl_status st = model_eval(c, kv, tokens + done, chunk, NULL, err);
        if (st) return st;
        for (int32_t t = 0; t < chunk; t++)
            kern_rmsnorm(hidden + (int64_t)(done + t) * E, c->x + t * E, m->output_norm, E,
                         m->hp.rms_eps);
        done += chunk;
    }
    return HL_OK;
}

hl_status model_eval_batch(model_ctx *c, const model_batch_entry *entries, int32_t n_entries,
                           float *logits, hl_err *err) {
    const model_hparams *hp = &c->m->hp;
    int64_t total = 0;
    if (n_entries <= 0 || !entries) return hl_fail(err, HL_ERR_INVALID, "empty batch");
    for (int32_t e = 0; e < n_entries; e++) {
        const model_batch_entry *b = &entries[e];
        hl_status st = check_tokens(c, b->tokens, b->n_tokens, err);
        if (st) {
            hl_err_prefix(err, "batch entry %d", e);
            return st;
        }
        const model_kv_view *kv = &b->kv;
        if (kv->block_tokens <= 0 || kv->len < 0 || !kv->blocks)
            return hl_fail(err, HL_ERR_INVALID, "batch entry %d: invalid KV block table", e);
        if ((int64_t)kv->len + b->n_tokens > (int64_t)kv->n_blocks * kv->block_tokens)
            return hl_fail(err, HL_ERR_KV_FULL,
                           "batch entry %d: %d tokens do not fit the KV block table: %d of %lld "
                           "positions are used",
                           e, b->n_tokens, kv->len, (long long)kv->n_blocks * kv->block_tokens);
        for (int32_t f = 0; f < e; f++)
            if (entries[f].kv.blocks == kv->blocks)
                return hl_fail(err, HL_ERR_INVALID,
                               "batch entries %d and %d use the same block table", f, e);
        total += b->n_tokens;
    }
    if (total > c->max_batch)
        return hl_fail(err, HL_ERR_INVALID, "batch of %lld tokens exceeds the context's maximum %d",
                       (long long)total, c->max_batch);
    int32_t t = 0, n_rows = 0;
    for (int32_t e = 0; e < n_entries; e++) {
        const model_batch_entry *b = &entries[e];
        c->seq_kv[e] = (kv_blocks){.blocks = b->kv.blocks, .B = b->kv.block_tokens,
                                   .len = b->kv.len,
                                   .v_off = kv_v_offset(hp, b->kv.block_tokens)};
        for (int32_t i = 0; i < b->n_tokens; i++, t++) {
            c->tok_id[t] = b->tokens[i];
            c->tok_pos[t] = b->kv.len + i;
            c->tok_seq[t] = e;
        }
        if (b->want_logits) c->logit_rows[n_rows++] = t - 1;
    }
    forward_batch(c, t, c->logit_rows, logits ? n_rows : 0, logits);
    return HL_OK;
}

hl_status model_embed(model_ctx *c, const int32_t *tokens, int32_t n, bool normalize, float *out,
                      hl_err *err) {
    const model *m = c->m;
    const int64_t E = m->hp.n_embd;
    if (n <= 0) return hl_fail(err, HL_ERR_INVALID, "no tokens to embed");
    model_kv *kv = NULL;
    float *hidden = malloc((size_t)n * (size_t)E * sizeof *hidden);
    if (!hidden) return hl_fail(err, HL_ERR_NOMEM, "out of memory for %d hidden states", n);
    hl_status st = model_kv_create(m, n, &kv, err);
    if (!st) st = model_eval_hidden(c, kv, tokens, n, hidden, err);
    model_kv_free(kv);
    if (st) {
        free(hidden);
        return st;
    }
    switch (m->hp.pooling) {
    case MODEL_POOL_CLS: memcpy(out, hidden, (size_t)E * sizeof *out); break;
    case MODEL_POOL_LAST: memcpy(out, hidden + (size_t)(n - 1) * E, (size_t)E * sizeof *out); break;
    default:
        for (int64_t j = 0; j < E; j++) {
            double sum = 0;
            for (int32_t i = 0; i < n; i++) sum += hidden[(size_t)i * E + j];
            out[j] = (float)(sum / n);
        }
    }
    free(hidden);
    if (normalize) {
        double ss = 0;
        for (int64_t j = 0; j < E; j++) ss += (double)out[j] * out[j];
        if (ss > 0) {
            const float inv = (float)(1.0 / sqrt(ss));
            for (int64_t j = 0; j < E; j++) out[j] *= inv;
        }
    }
    return HL_OK;
}
