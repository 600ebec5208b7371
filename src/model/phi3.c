/*
 * phi3.c - phi3 (Phi-3, Phi-3.5, Phi-4 mini): a llama-like pre-norm decoder with fused
 * projections, partial rotary and LongRoPE.
 *
 * Per layer, for a batch of tokens:
 *   xb = rmsnorm(x) * attn_norm
 *   [q | k | v] = xb Wqkv   (one fused matrix; files with separate q/k/v also load)
 *   q, k = RoPE (neox) on the first rope.dimension_count dims of each head
 *   att = softmax(q k^T / sqrt(d)) v over the cache, causal
 *   x += att Wo
 *   xb = rmsnorm(x) * ffn_norm;  [gate | up] = xb Wup;  x += (silu(gate) * up) Wdown
 *
 * LongRoPE: the file carries two sets of per-frequency divisors, rope_factors_long and
 * rope_factors_short (theta_i = pos * base^(-2i/n_rot) / factor_i), and an attention
 * factor multiplying cos and sin (rope.scaling.attn_factor, 1 when absent, as llama.cpp
 * reads it). Which set applies depends on the context the model is served with, not on
 * the positions: like llama.cpp (llama_model::get_rope_factors), the long factors iff
 * the per-sequence context size, rounded up to a multiple of 256 as llama.cpp pads it,
 * exceeds rope.scaling.original_context_length. The context size is the evaluation's
 * (model_ctx_set_n_ctx; unset: the model_kv's capacity, or for block tables the trained
 * context; see c->n_ctx_eval), fixed for a sequence, so its cache is built with one set.
 *
 * phi3.attention.sliding_window is ignored, as llama.cpp does (its Phi-3 files declare a
 * window the models were not run with).
 */
#include "model/ops.h"

#include <math.h>
#include <string.h>

/* llama.cpp pads the context it is asked for up to a multiple of this. */
#define PHI3_CTX_PAD 256

static const float *phi3_rope_factors(const model_ctx *c) {
    const model *m = c->m;
    if (!m->rope_long) return m->rope_short;
    if (!m->rope_short) return m->rope_long;
    const int64_t n = c->n_ctx_eval > 0 ? c->n_ctx_eval : m->hp.n_ctx_train;
    const int64_t padded = (n + PHI3_CTX_PAD - 1) / PHI3_CTX_PAD * PHI3_CTX_PAD;
    return padded > m->x.n_ctx_orig ? m->rope_long : m->rope_short;
}

static void phi3_forward(model_ctx *c, int32_t n_tok) {
    const model *m = c->m;
    const int64_t E = m->hp.n_embd;
    const float eps = m->x.norm_eps;
    const float *factors = phi3_rope_factors(c);

    op_embed(c, &m->tok_embd, n_tok, 0.0f, c->x);
    for (int32_t l = 0; l < m->hp.n_layer; l++) {
        const model_layer *ly = &m->layers[l];
        model_layer_hp h = m->lhp[l];
        if (factors) h.rope_factors = factors;
        const int64_t nq = (int64_t)h.n_head * h.head_dim_k;
        const int64_t nk = (int64_t)h.n_head_kv * h.head_dim_k;
        const int64_t nv = (int64_t)h.n_head_kv * h.head_dim_v;
        const int64_t F = h.n_ff;

        /* attention */
        op_rmsnorm(c->xb, c->x, ly->attn_norm, n_tok, E, eps);
        if (ly->wqkv.data) {
            op_linear(c, &ly->wqkv, NULL, c->xb, n_tok, c->gate);
            op_split(c->gate, n_tok, c->q, nq, c->k, nk, c->v, nv);
        } else {
            op_linear_many(c, &ly->wq, c->q, &ly->wk, c->k, &ly->wv, c->v, c->xb, n_tok);
            op_add_bias(c->q, ly->bq, n_tok, nq);
            op_add_bias(c->k, ly->bk, n_tok, nk);
            op_add_bias(c->v, ly->bv, n_tok, nv);
        }
        op_rope(c, &h, true, c->q, n_tok, h.n_head, h.head_dim_k);
        op_rope(c, &h, true, c->k, n_tok, h.n_head_kv, h.head_dim_k);
        const op_attn a = {.layer = l, .store = true, .n_head = h.n_head,
                           .n_head_kv = h.n_head_kv, .head_dim_k = h.head_dim_k,
                           .head_dim_v = h.head_dim_v,
                           .scale = 1.0f / sqrtf((float)h.head_dim_k), .causal = true};
        op_attention(c, &a, n_tok);
        op_linear(c, &ly->wo, NULL, c->att, n_tok, c->proj);
        op_add(c->x, c->proj, n_tok * E);

        /* feed-forward: ffn_up's rows are [gate | up] */
        op_rmsnorm(c->xb, c->x, ly->ffn_norm, n_tok, E, eps);
        op_linear(c, &ly->w_up, NULL, c->xb, n_tok, c->up);
        for (int32_t t = 0; t < n_tok; t++) {
            const float *row = c->up + (int64_t)t * 2 * F;
            memcpy(c->gate + (int64_t)t * F, row, (size_t)F * sizeof *row);
            op_glu(c->gate + (int64_t)t * F, row + F, F, OP_SILU);
        }
        op_linear(c, &ly->w_down, NULL, c->gate, n_tok, c->proj);
        op_add(c->x, c->proj, n_tok * E);
    }
}

static const model_tensor_spec phi3_tensors[] = {
    MT_EMBD_OUTPUT,
    MT_G("rope_factors_long.weight", rope_long, MT_VEC | MT_OPT, MD_ROT2, MD_ONE),
    MT_G("rope_factors_short.weight", rope_short, MT_VEC | MT_OPT, MD_ROT2, MD_ONE),
    MT_L("blk.%d.attn_norm.weight", attn_norm, MT_VEC, MD_EMBD, MD_ONE),
    MT_L("blk.%d.attn_qkv.weight", wqkv, MT_MAT | MT_OPT, MD_EMBD, MD_QKV),
    MT_L("blk.%d.attn_q.weight", wq, MT_MAT | MT_OPT, MD_EMBD, MD_Q),
    MT_L("blk.%d.attn_k.weight", wk, MT_MAT | MT_OPT, MD_EMBD, MD_KVK),
    MT_L("blk.%d.attn_v.weight", wv, MT_MAT | MT_OPT, MD_EMBD, MD_KVV),
    MT_L("blk.%d.attn_q.bias", bq, MT_VEC | MT_OPT, MD_Q, MD_ONE),
    MT_L("blk.%d.attn_k.bias", bk, MT_VEC | MT_OPT, MD_KVK, MD_ONE),
    MT_L("blk.%d.attn_v.bias", bv, MT_VEC | MT_OPT, MD_KVV, MD_ONE),
    MT_L("blk.%d.attn_output.weight", wo, MT_MAT, MD_O, MD_EMBD),
    MT_L("blk.%d.ffn_norm.weight", ffn_norm, MT_VEC, MD_EMBD, MD_ONE),
    MT_L("blk.%d.ffn_up.weight", w_up, MT_MAT, MD_EMBD, MD_FF2),
    MT_L("blk.%d.ffn_down.weight", w_down, MT_MAT, MD_FF, MD_EMBD),
};
#define N_SPECS(t) (int32_t)(sizeof t / sizeof t[0])

/* Each layer needs the fused attn_qkv or all three of attn_q/k/v; a file with both is
 * ambiguous. Longrope files carry both factor sets (one alone applies always). */
static hl_status phi3_check(model_loader *L, hl_err *err) {
    const model *m = L->m;
    for (int32_t l = 0; l < m->hp.n_layer; l++) {
        const model_layer *ly = &m->layers[l];
        const int n_sep = !!ly->wq.data + !!ly->wk.data + !!ly->wv.data;
        if (ly->wqkv.data && n_sep)
            return hl_fail(err, HL_ERR_FORMAT,
                           "layer %d has both 'blk.%d.attn_qkv.weight' and separate q/k/v", l, l);
        if (!ly->wqkv.data && n_sep < 3)
            return hl_fail(err, HL_ERR_FORMAT, "missing tensor 'blk.%d.attn_qkv.weight'", l);
    }
    return HL_OK;
}

const model_arch_desc model_arch_phi3 = {
    .name = "phi3", .rope_kind = MODEL_ROPE_NEOX, .tensors = phi3_tensors,
    .n_tensors = N_SPECS(phi3_tensors), .check = phi3_check, .forward = phi3_forward,
};
