/*
 * qwen35.c - qwen35 (Qwen3.5): a hybrid of Gated DeltaNet layers (a short causal
 * convolution and a delta-rule recurrent state) and gated full attention every
 * full_attention_interval-th layer. Semantics as llama.cpp implements them.
 *
 * Every layer: h = x + mixer(rmsnorm(x) * attn_norm);
 *              x = h + ffn(rmsnorm(h) * post_attention_norm), ffn = silu-gated MLP.
 * qwen35moe (the same layers, the same file): ffn = the routed experts (op_moe: softmax,
 * top expert_used_count, renormalised) + the shared expert (a silu-gated MLP
 * expert_shared_feed_forward_length wide) times sigmoid(ffn_gate_inp_shexp . xb).
 * Layer l is full attention iff (l + 1) % full_attention_interval == 0, else GDN.
 *
 * Full attention: attn_q gives per head [q (d) | gate (d)]; q and k RMS-normed per head;
 * RoPE neox on the first rope.dimension_count dims (llama.cpp's IMROPE with text
 * positions is exactly that); att = softmax(q k^T / sqrt(d)) v; out = (att *
 * sigmoid(gate)) Wo.
 *
 * Gated DeltaNet (n_k = ssm.group_count key heads, n_v = ssm.time_step_rank value heads,
 * d_k = ssm.state_size, d_v = ssm.inner_size / n_v):
 *   [q | k | v] = xb Wqkv  ([n_k d_k | n_k d_k | n_v d_v]), z = xb Wgate
 *   qkv = silu(causal depthwise conv (kernel K = ssm.conv_kernel) over the sequence)
 *   q, k: l2-normalised per head (x / max(|x|, eps)); q scaled by 1/sqrt(d_k)
 *   beta = sigmoid(xb Wbeta), g = softplus(xb Walpha + dt_bias) * ssm_a   (per v head)
 *   per v head h (key head h % n_k, tiled):
 *       S = exp(g) S;  S += k (beta (v - S^T k))^T;  o = S^T q        (S: d_k x d_v)
 *   out = (rmsnorm(o per head) * ssm_norm * silu(z)) Wssm_out
 *
 * State per GDN layer and sequence (lhp state_floats): the conv's last K-1 inputs
 * [K-1][channels] (oldest first), then S [n_v][d_k][d_v].
 *
 * A sequence with one token in the batch (decode) takes the recurrence step directly;
 * longer runs (prefill) are processed in chunks of QWEN35_CHUNK tokens with the chunked
 * delta rule (WY/UT form): with G_t the cumulative log decay inside the chunk and S0 the
 * state before it, the deltas u_t = beta_t (v_t - S_{t-1}^T k_t) solve the unit lower
 * triangular system
 *     u_t + beta_t sum_{s<t} e^(G_t - G_s) (k_t.k_s) u_s = beta_t (v_t - e^G_t S0^T k_t),
 * then o_t = e^G_t S0^T q_t + sum_{s<=t} e^(G_t - G_s) (q_t.k_s) u_s and
 * S = e^G_n S0 + sum_s e^(G_n - G_s) k_s u_s^T: the same state as token by token (to
 * float rounding; G is kept in double), with the state decayed and written once per
 * chunk instead of every token, and the work on the SIMD row kernels (kernels.h).
 */
#include "model/ops.h"

#include "kernels/kernels.h"

#include <math.h>
#include <string.h>

#define QWEN35_CHUNK 64
#define QWEN35_MAX_DV 256
#define QWEN35_MAX_WIDTH (1 << 20)

/* The GDN dimensions of a model. */
typedef struct gdn_dims {
    int64_t K, ch, inner, nk, nv, dk, dv;
} gdn_dims;

static gdn_dims gdn_dims_of(const model *m) {
    const model_hp_ext *x = &m->x;
    gdn_dims d = {.K = x->ssm_d_conv, .inner = x->ssm_d_inner, .nk = x->ssm_n_group,
                  .nv = x->ssm_dt_rank, .dk = x->ssm_d_state};
    d.dv = d.nv ? d.inner / d.nv : 0;
    d.ch = d.inner + 2 * d.nk * d.dk;
    return d;
}

/* Per-token scratch in c->extra, as planes of max_batch rows: GDN raw qkv, conv out, z,
 * beta, g, o; attention [q | gate] per head. */
static int64_t qwen35_extra_floats(const model *m) {
    const gdn_dims d = gdn_dims_of(m);
    const int64_t gdn = 2 * d.ch + 2 * d.inner + 2 * d.nv;
    const int64_t att = 2 * (int64_t)m->hp.n_head * m->hp.head_dim_k;
    return gdn > att ? gdn : att;
}

static inline float silu(float x) { return x / (1.0f + expf(-x)); }
static inline float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
static inline float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/* Eight partial sums, so the compiler can vectorize it (a single sum is a chain of
 * dependent adds it may not reorder). */
static float dot(const float *a, const float *b, int64_t n) {
    float p[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) p[j] += a[i + j] * b[i + j];
    float s = ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

/* The delta rule of one sequence's rows over the value heads (split across threads). */
typedef struct gdn_job {
    gdn_dims d;
    float *conv, *beta, *g, *o; /* row 0's q|k|v, beta, g, o (planes: rows of ch, nv, nv,
                                 * inner floats) */
    float *S;            /* [nv][dk][dv] */
    int32_t n;           /* rows */
} gdn_job;

/* x *= a, in blocks of 8 the compiler vectorizes. */
static void scale(float *x, float a, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) x[i + j] *= a;
    for (; i < n; i++) x[i] *= a;
}

/* One token: S = e^g S; v <- beta (v - S^T k); S += k v^T; o = S^T q. */
static void gdn_step(const gdn_dims *d, float *S, const float *q, const float *k, float *v,
                     float beta, float g, float *o) {
    scale(S, expf(g), d->dk * d->dv);
    memset(o, 0, (size_t)d->dv * sizeof *o);
    kern_axpy_rows(o, k, S, d->dv, d->dk, d->dv); /* S^T k */
    for (int64_t j = 0; j < d->dv; j++) v[j] = beta * (v[j] - o[j]);
    for (int64_t i = 0; i < d->dk; i++) kern_axpy(S + i * d->dv, k[i], v, d->dv);
    memset(o, 0, (size_t)d->dv * sizeof *o);
    kern_axpy_rows(o, q, S, d->dv, d->dk, d->dv); /* S^T q */
}

/* One chunk of n tokens of head h (see the top of the file). u_t overwrites v_t. G: n
 * doubles; sq0: n rows of d_v floats. */
static void gdn_chunk(const gdn_job *jb, int64_t h, int32_t t0, int32_t n, double *G, float *sq0) {
    const gdn_dims *d = &jb->d;
    const int64_t kh = h % d->nk, ch = d->ch;
    float *S = jb->S + h * d->dk * d->dv;
    float p[QWEN35_CHUNK];
    float *q0 = jb->conv + (int64_t)t0 * ch + kh * d->dk;
    float *k0 = jb->conv + (int64_t)t0 * ch + d->nk * d->dk + kh * d->dk;
    float *v0 = jb->conv + (int64_t)t0 * ch + 2 * d->nk * d->dk + h * d->dv;
#define Q_(t) (q0 + (int64_t)(t) * ch)
#define K_(t) (k0 + (int64_t)(t) * ch)
#define V_(t) (v0 + (int64_t)(t) * ch)
#define O_(t) (jb->o + (int64_t)(t0 + (t)) * d->inner + h * d->dv)
    /* cumulative log decays in double: G reaches hundreds within a chunk, where a float's
     * G_t - G_s would lose the digits exp() needs */
    double acc = 0;
    for (int32_t t = 0; t < n; t++) G[t] = acc += jb->g[(int64_t)(t0 + t) * d->nv + h];
    /* S0^T k_t (into o_t for now) and S0^T q_t */
    for (int32_t t = 0; t < n; t++) {
        float *sq = sq0 + (int64_t)t * d->dv;
        memset(O_(t), 0, (size_t)d->dv * sizeof(float));
        memset(sq, 0, (size_t)d->dv * sizeof(float));
        kern_axpy_rows(O_(t), K_(t), S, d->dv, d->dk, d->dv);
        kern_axpy_rows(sq, Q_(t), S, d->dv, d->dk, d->dv);
    }
    /* forward substitution: u_t in v_t's place */
    for (int32_t t = 0; t < n; t++) {
        const float beta = jb->beta[(int64_t)(t0 + t) * d->nv + h], eG = (float)exp(G[t]);
        float *u = V_(t);
        const float *sk = O_(t);
        for (int64_t j = 0; j < d->dv; j++) u[j] = beta * (u[j] - eG * sk[j]);
        if (t == 0) continue;
        kern_dot_rows(p, K_(t), k0, ch, t, d->dk, 1.0f);
        for (int32_t s2 = 0; s2 < t; s2++) p[s2] *= -beta * (float)exp(G[t] - G[s2]);
        kern_axpy_rows(u, p, v0, ch, t, d->dv);
    }
    /* outputs */
    for (int32_t t = 0; t < n; t++) {
        float *o = O_(t);
        const float eG = (float)exp(G[t]);
        const float *sq = sq0 + (int64_t)t * d->dv;
        for (int64_t j = 0; j < d->dv; j++) o[j] = eG * sq[j];
        kern_dot_rows(p, Q_(t), k0, ch, t + 1, d->dk, 1.0f);
        for (int32_t s2 = 0; s2 <= t; s2++) p[s2] *= (float)exp(G[t] - G[s2]);
        kern_axpy_rows(o, p, v0, ch, t + 1, d->dv);
    }
    /* state: S = e^G_n S0 + sum_s e^(G_n - G_s) k_s u_s^T */
    scale(S, (float)exp(G[n - 1]), d->dk * d->dv);
    float decay[QWEN35_CHUNK];
    for (int32_t s2 = 0; s2 < n; s2++) decay[s2] = (float)exp(G[n - 1] - G[s2]);
    for (int64_t i = 0; i < d->dk; i++) {
        for (int32_t s2 = 0; s2 < n; s2++) p[s2] = decay[s2] * K_(s2)[i];
        kern_axpy_rows(S + i * d->dv, p, v0, ch, n, d->dv);
    }
#undef Q_
#undef K_
#undef V_
#undef O_
}

static void gdn_run(void *ctx, int ith, int nth) {
    const gdn_job *jb = ctx;
    const gdn_dims *d = &jb->d;
    /* G and the chunk's S0^T q rows; d_v is bounded at load (QWEN35_MAX_DV) */
    static _Thread_local double G[QWEN35_CHUNK];
    static _Thread_local float sq0[QWEN35_CHUNK * QWEN35_MAX_DV];
    for (int64_t h = ith; h < d->nv; h += nth) {
        if (jb->n == 1) { /* decode: the step */
            const int64_t kh = h % d->nk;
            const float *row = jb->conv;
            gdn_step(d, jb->S + h * d->dk * d->dv, row + kh * d->dk,
                     row + d->nk * d->dk + kh * d->dk, jb->conv + 2 * d->nk * d->dk + h * d->dv,
                     jb->beta[h], jb->g[h], jb->o + h * d->dv);
            continue;
        }
        for (int32_t t0 = 0; t0 < jb->n; t0 += QWEN35_CHUNK)
            gdn_chunk(jb, h, t0, jb->n - t0 < QWEN35_CHUNK ? jb->n - t0 : QWEN35_CHUNK, G, sq0);
    }
}

static void l2norm(float *x, int64_t n, float eps) {
    const float s = sqrtf(dot(x, x, n));
    const float r = 1.0f / (s > eps ? s : eps);
    for (int64_t i = 0; i < n; i++) x[i] *= r;
}

static void gdn_layer(model_ctx *c, const model_layer *ly, const model_layer_hp *hp,
                      int32_t n_tok) {
    const model *m = c->m;
    const gdn_dims d = gdn_dims_of(m);
    const float eps = m->x.norm_eps;
    const int64_t B = c->max_batch;
    float *raw = c->extra, *conv = raw + B * d.ch, *z = conv + B * d.ch, *beta = z + B * d.inner,
          *g = beta + B * d.nv, *o = g + B * d.nv;
    op_linear_many(c, &ly->wqkv, raw, &ly->ssm_z, z, NULL, NULL, c->xb, n_tok);
    op_linear_many(c, &ly->ssm_beta, beta, &ly->ssm_alpha, g, NULL, NULL, c->xb, n_tok);
    const float qscale = 1.0f / sqrtf((float)d.dk);
    for (int32_t t = 0; t < n_tok; t++)
        for (int64_t h = 0; h < d.nv; h++) {
            beta[t * d.nv + h] = sigmoid(beta[t * d.nv + h]);
            g[t * d.nv + h] = softplus(g[t * d.nv + h] + ly->ssm_dt_b[h]) * ly->ssm_a[h];
        }
    for (int32_t e = 0; e < c->n_seq; e++) {
        const int32_t r0 = c->seq_first[e], r1 = c->seq_first[e + 1];
        float *cs = c->seq_kv[e].state + hp->state_off; /* conv state [K-1][ch] */
        /* causal conv over the sequence's rows, the state holding the previous inputs */
        for (int32_t t = r0; t < r1; t++) {
            const float *x = raw + t * d.ch;
            float *y = conv + t * d.ch;
            for (int64_t ch = 0; ch < d.ch; ch++) {
                const float *w = ly->ssm_conv1d + ch * d.K;
                float s = 0;
                for (int64_t k = 0; k < d.K - 1; k++) s += w[k] * cs[k * d.ch + ch];
                y[ch] = silu(s + w[d.K - 1] * x[ch]);
            }
            if (d.K > 1) {
                memmove(cs, cs + d.ch, (size_t)((d.K - 2) * d.ch) * sizeof(float));
                memcpy(cs + (d.K - 2) * d.ch, x, (size_t)d.ch * sizeof(float));
            }
            for (int64_t h = 0; h < 2 * d.nk; h++) l2norm(y + h * d.dk, d.dk, eps);
            for (int64_t i = 0; i < d.nk * d.dk; i++) y[i] *= qscale;
        }
        gdn_job jb = {.d = d, .conv = conv + r0 * d.ch, .beta = beta + r0 * d.nv,
                      .g = g + r0 * d.nv, .o = o + r0 * d.inner,
                      .S = cs + (d.K - 1) * d.ch, .n = r1 - r0};
        if (jb.n > 0) hl_pool_run(c->pool, gdn_run, &jb);
    }
    /* gated norm: rmsnorm(o_h) * ssm_norm * silu(z_h), in place, then the output */
    for (int32_t t = 0; t < n_tok; t++)
        for (int64_t h = 0; h < d.nv; h++) {
            float *oh = o + t * d.inner + h * d.dv;
            const float *zh = z + t * d.inner + h * d.dv;
            const float r = 1.0f / sqrtf(dot(oh, oh, d.dv) / (float)d.dv + eps);
            for (int64_t j = 0; j < d.dv; j++) oh[j] = oh[j] * r * ly->ssm_norm[j] * silu(zh[j]);
        }
    op_linear(c, &ly->ssm_out, NULL, o, n_tok, c->proj);
}

static void attn_layer(model_ctx *c, const model_layer *ly, const model_layer_hp *h, int32_t l,
                       int32_t n_tok) {
    const float eps = c->m->x.norm_eps;
    const int64_t hd = h->head_dim_k, nq = (int64_t)h->n_head * hd;
    float *qg = c->extra; /* [n_tok][n_head][q | gate] */
    op_linear_many(c, &ly->wq, qg, &ly->wk, c->k, &ly->wv, c->v, c->xb, n_tok);
    for (int32_t t = 0; t < n_tok; t++)
        for (int64_t hh = 0; hh < h->n_head; hh++)
            memcpy(c->q + t * nq + hh * hd, qg + t * 2 * nq + hh * 2 * hd,
                   (size_t)hd * sizeof(float));
    op_head_norm(c, c->q, ly->q_norm, n_tok, h->n_head, h->head_dim_k, eps);
    op_head_norm(c, c->k, ly->k_norm, n_tok, h->n_head_kv, h->head_dim_k, eps);
    op_rope(c, h, true, c->q, n_tok, h->n_head, h->head_dim_k);
    op_rope(c, h, true, c->k, n_tok, h->n_head_kv, h->head_dim_k);
    const op_attn a = {.layer = l, .store = true, .n_head = h->n_head, .n_head_kv = h->n_head_kv,
                       .head_dim_k = h->head_dim_k, .head_dim_v = h->head_dim_v,
                       .scale = 1.0f / sqrtf((float)h->head_dim_k), .causal = true};
    op_attention(c, &a, n_tok);
    const int64_t no = (int64_t)h->n_head * h->head_dim_v;
    for (int32_t t = 0; t < n_tok; t++)
        for (int64_t i = 0; i < no; i++)
            c->att[t * no + i] *= sigmoid(qg[t * 2 * nq + (i / hd) * 2 * hd + hd + i % hd]);
    op_linear(c, &ly->wo, NULL, c->att, n_tok, c->proj);
}

/* Per-token floats of c->extra the MoE feed-forward uses: op_moe's scratch, then the
 * shared expert's gate and up (planes of max_batch rows after op_moe's). */
static int64_t moe_floats(const model *m) {
    return op_moe_scratch_floats(m->hp.n_embd, m->x.n_expert, m->x.n_ff_exp) +
           2 * (int64_t)m->x.n_ff_shexp;
}

/* qwen35moe's feed-forward, xb -> proj: the routed experts (softmax, top k, renormalised)
 * plus the shared expert, scaled by sigmoid(gate_inp_shexp . xb) when the file has that
 * gate. */
static void moe_ffn(model_ctx *c, const model_layer *ly, int32_t n_tok) {
    const model *m = c->m;
    const int64_t E = m->hp.n_embd, F = m->x.n_ff_shexp, B = c->max_batch;
    op_moe(c, &ly->ffn_gate_inp, &ly->ffn_gate_exps, &ly->ffn_up_exps, &ly->ffn_down_exps,
           m->x.n_expert_used, c->xb, n_tok, c->proj, c->extra);
    if (!ly->ffn_up_shexp.data) return;
    float *g = c->extra + B * op_moe_scratch_floats(E, m->x.n_expert, m->x.n_ff_exp);
    float *u = g + B * F;
    op_linear_many(c, &ly->ffn_gate_shexp, g, &ly->ffn_up_shexp, u, NULL, NULL, c->xb, n_tok);
    op_glu(g, u, (int64_t)n_tok * F, OP_SILU);
    op_linear(c, &ly->ffn_down_shexp, NULL, g, n_tok, c->xc);
    for (int32_t t = 0; t < n_tok; t++) {
        const float s = ly->ffn_gate_inp_shexp
                            ? sigmoid(dot(ly->ffn_gate_inp_shexp, c->xb + t * E, E))
                            : 1.0f;
        for (int64_t i = 0; i < E; i++) c->proj[t * E + i] += s * c->xc[t * E + i];
    }
}

static void qwen35_forward(model_ctx *c, int32_t n_tok) {
    const model *m = c->m;
    const int64_t E = m->hp.n_embd;
    const float eps = m->x.norm_eps;
    op_embed(c, &m->tok_embd, n_tok, 0.0f, c->x);
    for (int32_t l = 0; l < m->hp.n_layer; l++) {
        const model_layer *ly = &m->layers[l];
        const model_layer_hp *h = &m->lhp[l];
        op_rmsnorm(c->xb, c->x, ly->attn_norm, n_tok, E, eps);
        if (h->state_floats)
            gdn_layer(c, ly, h, n_tok);
        else
            attn_layer(c, ly, h, l, n_tok);
        op_add(c->x, c->proj, n_tok * E);

        op_rmsnorm(c->xb, c->x, ly->post_attn_norm, n_tok, E, eps);
        if (ly->ffn_gate_inp.data) {
            moe_ffn(c, ly, n_tok);
        } else {
            op_ffn_glu(c, &ly->w_gate, &ly->w_up, &ly->w_down, h->n_ff, OP_SILU,
                       c->xb, n_tok, c->proj);
        }
        op_add(c->x, c->proj, n_tok * E);
    }
}

static hl_status qwen35_read_hparams(model_loader *L, hl_err *err) {
    model *m = L->m;
    model_hp_ext *x = &m->x;
    hl_status st;
    int32_t interval = 0;
    if ((st = model_hp_int(L, "ssm.conv_kernel", true, 0, &x->ssm_d_conv, err)) ||
        (st = model_hp_int(L, "ssm.inner_size", true, 0, &x->ssm_d_inner, err)) ||
        (st = model_hp_int(L, "ssm.state_size", true, 0, &x->ssm_d_state, err)) ||
        (st = model_hp_int(L, "ssm.time_step_rank", true, 0, &x->ssm_dt_rank, err)) ||
        (st = model_hp_int(L, "ssm.group_count", true, 0, &x->ssm_n_group, err)) ||
        (st = model_hp_int(L, "full_attention_interval", false, 4, &interval, err)))
        return st;
    if (x->ssm_d_conv < 1 || x->ssm_d_conv > 16 || x->ssm_d_state < 1 ||
        x->ssm_d_state > QWEN35_MAX_WIDTH || x->ssm_n_group < 1 || x->ssm_dt_rank < 1 ||
        x->ssm_dt_rank % x->ssm_n_group != 0 || x->ssm_d_inner % x->ssm_dt_rank != 0 ||
        x->ssm_d_inner / x->ssm_dt_rank > QWEN35_MAX_DV || x->ssm_d_inner > QWEN35_MAX_WIDTH)
        return hl_fail(err, HL_ERR_FORMAT,
                       "unsupported ssm sizes (conv_kernel %d, inner_size %d, state_size %d, "
                       "time_step_rank %d, group_count %d)",
                       x->ssm_d_conv, x->ssm_d_inner, x->ssm_d_state, x->ssm_dt_rank,
                       x->ssm_n_group);
    if (interval < 1)
        return hl_fail(err, HL_ERR_FORMAT, "full_attention_interval %d must be positive",
                       interval);
    const gdn_dims d = gdn_dims_of(m);
    for (int32_t l = 0; l < m->hp.n_layer; l++) {
        model_layer_hp *h = &m->lhp[l];
        if ((l + 1) % interval == 0) {
            if (h->n_head_kv == 0)
                return hl_fail(err, HL_ERR_FORMAT, "attention layer %d has no KV heads", l);
            continue;
        }
        /* a GDN layer: no attention heads, a state instead */
        h->n_head = h->n_head_kv = h->head_dim_k = h->head_dim_v = 0;
        h->state_floats = (d.K - 1) * d.ch + d.nv * d.dk * d.dv;
    }
    return HL_OK;
}

/* The tensors qwen35 and qwen35moe share: all but the feed-forward. */
#define QWEN35_TENSORS                                                                        \
    MT_EMBD_OUTPUT,                                                                           \
    MT_L("blk.%d.attn_norm.weight", attn_norm, MT_VEC, MD_EMBD, MD_ONE),                      \
    MT_L("blk.%d.post_attention_norm.weight", post_attn_norm, MT_VEC, MD_EMBD, MD_ONE),       \
    /* Gated DeltaNet layers */                                                               \
    MT_L("blk.%d.attn_qkv.weight", wqkv, MT_MAT, MD_EMBD, MD_SSM_CONV_CH),                    \
    MT_L("blk.%d.attn_gate.weight", ssm_z, MT_MAT, MD_EMBD, MD_SSM_INNER),                    \
    MT_L("blk.%d.ssm_conv1d.weight", ssm_conv1d, MT_VEC, MD_SSM_CONV_K, MD_SSM_CONV_CH),      \
    MT_L("blk.%d.ssm_dt.bias", ssm_dt_b, MT_VEC, MD_SSM_HEADS, MD_ONE),                       \
    MT_L("blk.%d.ssm_a", ssm_a, MT_VEC, MD_SSM_HEADS, MD_ONE),                                \
    MT_L("blk.%d.ssm_beta.weight", ssm_beta, MT_MAT, MD_EMBD, MD_SSM_HEADS),                  \
    MT_L("blk.%d.ssm_alpha.weight", ssm_alpha, MT_MAT, MD_EMBD, MD_SSM_HEADS),                \
    MT_L("blk.%d.ssm_norm.weight", ssm_norm, MT_VEC, MD_SSM_HEAD_V, MD_ONE),                  \
    MT_L("blk.%d.ssm_out.weight", ssm_out, MT_MAT, MD_SSM_INNER, MD_EMBD),                    \
    /* full-attention layers */                                                               \
    MT_L("blk.%d.attn_q.weight", wq, MT_MAT, MD_EMBD, MD_Q2),                                 \
    MT_L("blk.%d.attn_k.weight", wk, MT_MAT, MD_EMBD, MD_KVK),                                \
    MT_L("blk.%d.attn_v.weight", wv, MT_MAT, MD_EMBD, MD_KVV),                                \
    MT_L("blk.%d.attn_output.weight", wo, MT_MAT, MD_O, MD_EMBD),                             \
    MT_L("blk.%d.attn_q_norm.weight", q_norm, MT_VEC, MD_HEAD_K, MD_ONE),                     \
    MT_L("blk.%d.attn_k_norm.weight", k_norm, MT_VEC, MD_HEAD_K, MD_ONE)

static const model_tensor_spec qwen35_tensors[] = {
    QWEN35_TENSORS,
    MT_FFN_GLU,
};

/* The shared expert's tensors have no size (and are not loaded) without
 * expert_shared_feed_forward_length. */
static const model_tensor_spec qwen35moe_tensors[] = {
    QWEN35_TENSORS,
    MT_L("blk.%d.ffn_gate_inp.weight", ffn_gate_inp, MT_MAT, MD_EMBD, MD_EXPERTS),
    MT_FFN_EXPS,
    MT_L("blk.%d.ffn_gate_shexp.weight", ffn_gate_shexp, MT_MAT, MD_EMBD, MD_FF_SHEXP),
    MT_L("blk.%d.ffn_up_shexp.weight", ffn_up_shexp, MT_MAT, MD_EMBD, MD_FF_SHEXP),
    MT_L("blk.%d.ffn_down_shexp.weight", ffn_down_shexp, MT_MAT, MD_FF_SHEXP, MD_EMBD),
    MT_L("blk.%d.ffn_gate_inp_shexp.weight", ffn_gate_inp_shexp, MT_VEC | MT_OPT, MD_EMBD,
         MD_ONE),
};
#define N_SPECS(t) (int32_t)(sizeof t / sizeof t[0])

static hl_status qwen35moe_read_hparams(model_loader *L, hl_err *err) {
    hl_status st = qwen35_read_hparams(L, err);
    if (!st) st = model_hp_experts(L, 0, err);
    if (!st)
        st = model_hp_int(L, "expert_shared_feed_forward_length", false, 0, &L->m->x.n_ff_shexp,
                          err);
    return st;
}

static int64_t qwen35moe_extra_floats(const model *m) {
    const int64_t a = qwen35_extra_floats(m), b = moe_floats(m);
    return a > b ? a : b;
}

const model_arch_desc model_arch_qwen35 = {
    .name = "qwen35", .rope_kind = MODEL_ROPE_NEOX, .read_hparams = qwen35_read_hparams,
    .tensors = qwen35_tensors, .n_tensors = N_SPECS(qwen35_tensors),
    .extra_floats = qwen35_extra_floats, .forward = qwen35_forward,
};

const model_arch_desc model_arch_qwen35moe = {
    .name = "qwen35moe", .rope_kind = MODEL_ROPE_NEOX, .read_hparams = qwen35moe_read_hparams,
    .tensors = qwen35moe_tensors, .n_tensors = N_SPECS(qwen35moe_tensors),
    .extra_floats = qwen35moe_extra_floats, .forward = qwen35_forward,
};
