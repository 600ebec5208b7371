/*
 * mamba2.c - Mamba-2 (mamba2: every layer a Mamba-2 mixer) and Nemotron-H (nemotron_h: a
 * per-layer mix of Mamba-2, attention-only and MLP-only layers), sharing one Mamba-2
 * layer. Semantics as llama.cpp implements them.
 *
 * Every layer: x += block(rmsnorm(x) * attn_norm) (a single norm per layer); then the
 * output norm and output matmul (forward.c).
 *
 * Mamba-2 mixer (d_inner, n_group groups of d_state, n_head = ssm.time_step_rank heads of
 * hd = d_inner / n_head, conv kernel K, ch = d_inner + 2 n_group d_state):
 *   [z (d_inner) | xBC (ch) | dt (n_head)] = xb ssm_in
 *   xBC = silu(causal depthwise conv over the sequence (kernel K) + conv bias)
 *   [x (d_inner) | B (n_group d_state) | C (n_group d_state)] = xBC
 *   per head h (B, C of group h / (n_head / n_group)):
 *       dt = softplus(dt_h + dt_bias_h), dA = exp(dt A_h)   (ssm_a holds A = -exp(A_log))
 *       S = dA S + dt x B^T;  y = S C + D_h x                (S: hd x d_state)
 *   y = y * silu(z); RMS norm over each of the n_group groups of d_inner / n_group, times
 *   ssm_norm; out = y ssm_out.
 * State per Mamba-2 layer and sequence (lhp state_floats): the conv's last K-1 inputs
 * [K-1][ch] (oldest first), then S [n_head][hd][d_state]. The scan walks each sequence's
 * tokens in order (prefill too), so a prefill leaves exactly the state token-by-token
 * decoding would.
 *
 * Nemotron-H layer kinds, from the per-layer arrays: head_count_kv == 0 and
 * feed_forward_length == 0: Mamba-2; feed_forward_length == 0: attention (no RoPE, no
 * biases, scale 1/sqrt(head_dim)); else an MLP down(relu(up x)^2).
 */
#include "model/ops.h"

#include <math.h>
#include <string.h>

#define M2_MAX_CONV 16

typedef struct m2_dims {
    int64_t K, inner, ng, ds, nh, hd, ch, nin;
} m2_dims;

static m2_dims m2_dims_of(const model *m) {
    const model_hp_ext *x = &m->x;
    m2_dims d = {.K = x->ssm_d_conv, .inner = x->ssm_d_inner, .ng = x->ssm_n_group,
                 .ds = x->ssm_d_state, .nh = x->ssm_dt_rank};
    d.hd = d.nh ? d.inner / d.nh : 0;
    d.ch = d.inner + 2 * d.ng * d.ds;
    d.nin = d.inner + d.ch + d.nh;
    return d;
}

/* Per-token scratch in c->extra, as planes of max_batch rows: the in_proj output, the
 * conv output, y. */
static int64_t m2_extra_floats(const model *m) {
    const m2_dims d = m2_dims_of(m);
    return d.nin + d.ch + d.inner;
}

static inline float silu(float x) { return x / (1.0f + expf(-x)); }
/* as ggml's ssm_scan: the identity above 20 */
static inline float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/* The scan of one sequence's rows over the heads (split across threads). */
typedef struct m2_job {
    m2_dims d;
    const float *xbc; /* row 0's conv output (rows of ch) */
    const float *dt;  /* row 0's softplus'd dt (rows of nin, at offset 0) */
    int64_t dt_stride;
    const float *A, *D;
    float *S;         /* [nh][hd][ds] */
    float *y;         /* row 0's y (rows of inner) */
    int32_t n;
} m2_job;

static void m2_scan(void *ctx, int ith, int nth) {
    const m2_job *jb = ctx;
    const m2_dims *d = &jb->d;
    const int64_t heads_per_group = d->nh / d->ng;
    for (int64_t h = ith; h < d->nh; h += nth) {
        const int64_t g = h / heads_per_group;
        float *S = jb->S + h * d->hd * d->ds;
        for (int32_t t = 0; t < jb->n; t++) {
            const float *row = jb->xbc + (int64_t)t * d->ch;
            const float *x = row + h * d->hd;
            const float *restrict B = row + d->inner + g * d->ds;
            const float *restrict C = row + d->inner + d->ng * d->ds + g * d->ds;
            const float dt = jb->dt[(int64_t)t * jb->dt_stride + h];
            const float dA = expf(dt * jb->A[h]);
            float *y = jb->y + (int64_t)t * d->inner + h * d->hd;
            for (int64_t i = 0; i < d->hd; i++) {
                float *restrict s = S + i * d->ds; /* the state never aliases B, C */
                const float xdt = x[i] * dt;
                /* eight partial sums: one running sum is a chain of dependent adds the
                 * compiler may not reorder (and so cannot vectorize) */
                float p[8] = {0};
                int64_t j = 0;
                for (; j + 8 <= d->ds; j += 8)
                    for (int k = 0; k < 8; k++) {
                        s[j + k] = s[j + k] * dA + B[j + k] * xdt;
                        p[k] += s[j + k] * C[j + k];
                    }
                float acc = ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]));
                for (; j < d->ds; j++) {
                    s[j] = s[j] * dA + B[j] * xdt;
                    acc += s[j] * C[j];
                }
                y[i] = acc + jb->D[h] * x[i];
            }
        }
    }
}

/* The Mamba-2 mixer of layer l over c->xb, into c->proj. */
static void m2_mixer(model_ctx *c, const model_layer *ly, const model_layer_hp *hp,
                     int32_t n_tok) {
    const model *m = c->m;
    const m2_dims d = m2_dims_of(m);
    const int64_t B = c->max_batch;
    float *zx = c->extra, *conv = zx + B * d.nin, *y = conv + B * d.ch;
    op_linear(c, &ly->ssm_in, NULL, c->xb, n_tok, zx);
    for (int32_t t = 0; t < n_tok; t++) {
        float *dt = zx + t * d.nin + d.inner + d.ch;
        for (int64_t h = 0; h < d.nh; h++) dt[h] = softplus(dt[h] + ly->ssm_dt_b[h]);
    }
    for (int32_t e = 0; e < c->n_seq; e++) {
        const int32_t r0 = c->seq_first[e], r1 = c->seq_first[e + 1];
        float *cs = c->seq_kv[e].state + hp->state_off; /* conv state [K-1][ch] */
        for (int32_t t = r0; t < r1; t++) {
            const float *x = zx + t * d.nin + d.inner;
            float *o = conv + t * d.ch;
            for (int64_t ch = 0; ch < d.ch; ch++) {
                const float *w = ly->ssm_conv1d + ch * d.K;
                float s = 0;
                for (int64_t k = 0; k < d.K - 1; k++) s += w[k] * cs[k * d.ch + ch];
                s += w[d.K - 1] * x[ch];
                o[ch] = silu(ly->ssm_conv1d_b ? s + ly->ssm_conv1d_b[ch] : s);
            }
            if (d.K > 1) {
                memmove(cs, cs + d.ch, (size_t)((d.K - 2) * d.ch) * sizeof(float));
                memcpy(cs + (d.K - 2) * d.ch, x, (size_t)d.ch * sizeof(float));
            }
        }
        m2_job jb = {.d = d, .xbc = conv + r0 * d.ch, .dt = zx + r0 * d.nin + d.inner + d.ch,
                     .dt_stride = d.nin, .A = ly->ssm_a, .D = ly->ssm_d,
                     .S = cs + (d.K - 1) * d.ch, .y = y + r0 * d.inner, .n = r1 - r0};
        if (jb.n > 0) hl_pool_run(c->pool, m2_scan, &jb);
    }
    /* gate, grouped norm, output */
    const int64_t gs = d.inner / d.ng;
    for (int32_t t = 0; t < n_tok; t++) {
        float *yt = y + t * d.inner;
        const float *z = zx + t * d.nin;
        for (int64_t i = 0; i < d.inner; i++) yt[i] *= silu(z[i]);
        for (int64_t g = 0; g < d.ng; g++)
            op_rmsnorm(yt + g * gs, yt + g * gs, ly->ssm_norm + g * gs, 1, gs, m->x.norm_eps);
    }
    op_linear(c, &ly->ssm_out, NULL, y, n_tok, c->proj);
}

static void mamba2_forward(model_ctx *c, int32_t n_tok) {
    const model *m = c->m;
    const int64_t E = m->hp.n_embd;
    op_embed(c, &m->tok_embd, n_tok, 0.0f, c->x);
    for (int32_t l = 0; l < m->hp.n_layer; l++) {
        const model_layer *ly = &m->layers[l];
        op_rmsnorm(c->xb, c->x, ly->attn_norm, n_tok, E, m->x.norm_eps);
        m2_mixer(c, ly, &m->lhp[l], n_tok);
        op_add(c->x, c->proj, n_tok * E);
    }
}

/* Nemotron-H's attention: plain GQA, no RoPE. */
static void nemotron_attention(model_ctx *c, const model_layer *ly, const model_layer_hp *h,
                               int32_t l, int32_t n_tok) {
    op_linear_many(c, &ly->wq, c->q, &ly->wk, c->k, &ly->wv, c->v, c->xb, n_tok);
    const op_attn a = {.layer = l, .store = true, .n_head = h->n_head, .n_head_kv = h->n_head_kv,
                       .head_dim_k = h->head_dim_k, .head_dim_v = h->head_dim_v,
                       .scale = 1.0f / sqrtf((float)h->head_dim_k), .causal = true};
    op_attention(c, &a, n_tok);
    op_linear(c, &ly->wo, NULL, c->att, n_tok, c->proj);
}

/* Nemotron-H's MLP: down(relu(up x)^2). */
static void nemotron_mlp(model_ctx *c, const model_layer *ly, const model_layer_hp *h,
                         int32_t n_tok) {
    op_linear(c, &ly->w_up, NULL, c->xb, n_tok, c->up);
    const int64_t n = (int64_t)n_tok * h->n_ff;
    for (int64_t i = 0; i < n; i++) {
        const float r = c->up[i] > 0.0f ? c->up[i] : 0.0f;
        c->up[i] = r * r;
    }
    op_linear(c, &ly->w_down, NULL, c->up, n_tok, c->proj);
}

static void nemotron_h_forward(model_ctx *c, int32_t n_tok) {
    const model *m = c->m;
    const int64_t E = m->hp.n_embd;
    op_embed(c, &m->tok_embd, n_tok, 0.0f, c->x);
    for (int32_t l = 0; l < m->hp.n_layer; l++) {
        const model_layer *ly = &m->layers[l];
        const model_layer_hp *h = &m->lhp[l];
        op_rmsnorm(c->xb, c->x, ly->attn_norm, n_tok, E, m->x.norm_eps);
        if (h->state_floats)
            m2_mixer(c, ly, h, n_tok);
        else if (h->n_ff == 0)
            nemotron_attention(c, ly, h, l, n_tok);
        else
            nemotron_mlp(c, ly, h, n_tok);
        op_add(c->x, c->proj, n_tok * E);
    }
}

/* The ssm.* keys, checked. Mamba-2 layers (all of them, or in a hybrid those with neither
 * KV heads nor a feed-forward length) lose their attention sizes and get a state. */
static hl_status m2_read_hparams(model_loader *L, bool hybrid, hl_err *err) {
    model *m = L->m;
    model_hp_ext *x = &m->x;
    hl_status st;
    if ((st = model_hp_int(L, "ssm.conv_kernel", true, 0, &x->ssm_d_conv, err)) ||
        (st = model_hp_int(L, "ssm.inner_size", true, 0, &x->ssm_d_inner, err)) ||
        (st = model_hp_int(L, "ssm.state_size", true, 0, &x->ssm_d_state, err)) ||
        (st = model_hp_int(L, "ssm.time_step_rank", true, 0, &x->ssm_dt_rank, err)) ||
        (st = model_hp_int(L, "ssm.group_count", false, 1, &x->ssm_n_group, err)))
        return st;
    if (x->ssm_d_conv < 2 || x->ssm_d_conv > M2_MAX_CONV || x->ssm_d_inner % x->ssm_dt_rank != 0 ||
        x->ssm_dt_rank % x->ssm_n_group != 0 || x->ssm_d_inner % x->ssm_n_group != 0)
        return hl_fail(err, HL_ERR_FORMAT,
                       "unsupported ssm sizes (conv_kernel %d, inner_size %d, state_size %d, "
                       "time_step_rank %d, group_count %d)",
                       x->ssm_d_conv, x->ssm_d_inner, x->ssm_d_state, x->ssm_dt_rank,
                       x->ssm_n_group);
    const m2_dims d = m2_dims_of(m);
    for (int32_t l = 0; l < m->hp.n_layer; l++) {
        model_layer_hp *h = &m->lhp[l];
        if (hybrid && (h->n_head_kv > 0 || h->n_ff > 0)) {
            if (h->n_head_kv > 0 && h->n_ff > 0)
                return hl_fail(err, HL_ERR_FORMAT,
                               "layer %d has both attention heads and a feed-forward length", l);
            if (h->n_head_kv == 0) h->n_head = h->head_dim_k = h->head_dim_v = 0; /* MLP */
            continue;
        }
        h->n_head = h->n_head_kv = h->head_dim_k = h->head_dim_v = 0;
        h->n_ff = 0;
        h->state_floats = (d.K - 1) * d.ch + d.nh * d.hd * d.ds;
    }
    return HL_OK;
}

static hl_status mamba2_read_hparams(model_loader *L, hl_err *err) {
    return m2_read_hparams(L, false, err);
}

static hl_status nemotron_h_read_hparams(model_loader *L, hl_err *err) {
    return m2_read_hparams(L, true, err);
}

#define M2_TENSORS                                                                          \
    MT_EMBD_OUTPUT,                                                                         \
    MT_L("blk.%d.attn_norm.weight", attn_norm, MT_VEC, MD_EMBD, MD_ONE),                    \
    MT_L("blk.%d.ssm_in.weight", ssm_in, MT_MAT, MD_EMBD, MD_SSM_IN_M2),                    \
    MT_L("blk.%d.ssm_conv1d.weight", ssm_conv1d, MT_VEC, MD_SSM_CONV_K, MD_SSM_CONV_CH),    \
    MT_L("blk.%d.ssm_conv1d.bias", ssm_conv1d_b, MT_VEC | MT_OPT, MD_SSM_CONV_CH, MD_ONE),  \
    MT_L("blk.%d.ssm_dt.bias", ssm_dt_b, MT_VEC, MD_SSM_HEADS, MD_ONE),                     \
    MT_L("blk.%d.ssm_a", ssm_a, MT_VEC, MD_ONE, MD_SSM_HEADS),                              \
    MT_L("blk.%d.ssm_d", ssm_d, MT_VEC, MD_ONE, MD_SSM_HEADS),                              \
    MT_L("blk.%d.ssm_norm.weight", ssm_norm, MT_VEC, MD_SSM_GROUP_INNER, MD_SSM_GROUPS),    \
    MT_L("blk.%d.ssm_out.weight", ssm_out, MT_MAT, MD_SSM_INNER, MD_EMBD)

static const model_tensor_spec mamba2_tensors[] = {M2_TENSORS};
static const model_tensor_spec nemotron_h_tensors[] = {
    M2_TENSORS,
    MT_ATTN_QKVO,
    MT_L("blk.%d.ffn_up.weight", w_up, MT_MAT, MD_EMBD, MD_FF),
    MT_L("blk.%d.ffn_down.weight", w_down, MT_MAT, MD_FF, MD_EMBD),
};
#define N_SPECS(t) (int32_t)(sizeof t / sizeof t[0])

const model_arch_desc model_arch_mamba2 = {
    .name = "mamba2", .rope_kind = MODEL_ROPE_NORM, .ffn_optional = true,
    .read_hparams = mamba2_read_hparams, .tensors = mamba2_tensors,
    .n_tensors = N_SPECS(mamba2_tensors), .extra_floats = m2_extra_floats,
    .forward = mamba2_forward,
};

/* rope_kind: unused (Nemotron-H's attention has no RoPE) */
const model_arch_desc model_arch_nemotron_h = {
    .name = "nemotron_h", .rope_kind = MODEL_ROPE_NORM, .read_hparams = nemotron_h_read_hparams,
    .tensors = nemotron_h_tensors, .n_tensors = N_SPECS(nemotron_h_tensors),
    .extra_floats = m2_extra_floats, .forward = nemotron_h_forward,
};
