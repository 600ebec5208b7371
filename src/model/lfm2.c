/*
 * lfm2.c - LFM2 (Liquid): a hybrid of short-convolution blocks and GQA attention layers.
 * Semantics as llama.cpp implements them.
 *
 * Layer kind from the per-layer attention.head_count_kv array: 0 = short conv, > 0 =
 * attention. Every layer:
 *     h = x + op(rmsnorm(x) * attn_norm);  x = h + ffn(rmsnorm(h) * ffn_norm),
 * ffn = silu-gated MLP. The final norm is stored as token_embd_norm; the output is tied
 * to the embeddings unless output.weight is present.
 *
 * Attention: q and k RMS-normed per head, NEOX RoPE (the llama family's sublayer,
 * model_llama_attention).
 *
 * Short conv (K = shortconv.l_cache, E = n_embd):
 *     [B | C | X] = xb in_proj;  bx = B * X;
 *     y_t = sum_k w[k] bx_{t-K+1+k}   (depthwise causal conv, no bias, no activation)
 *     out = (C * y) out_proj
 * State per conv layer and sequence (lhp state_floats): the last K-1 bx rows
 * [K-1][E], oldest first.
 */
#include "model/ops.h"

#include <string.h>

#define LFM2_MAX_CONV 16

/* Per-token scratch in c->extra: the in_proj output [B | C | X]. */
static int64_t lfm2_extra_floats(const model *m) { return 3 * (int64_t)m->hp.n_embd; }

static void shortconv_layer(model_ctx *c, const model_layer *ly, const model_layer_hp *hp,
                            int32_t n_tok) {
    const model *m = c->m;
    const int64_t E = m->hp.n_embd, K = m->x.ssm_d_conv, W = 3 * E;
    float *bcx = c->extra;
    op_rmsnorm(c->xb, c->x, ly->attn_norm, n_tok, E, m->x.norm_eps);
    op_linear(c, &ly->ssm_in, NULL, c->xb, n_tok, bcx);
    for (int32_t e = 0; e < c->n_seq; e++) {
        float *cs = c->seq_kv[e].state + hp->state_off; /* [K-1][E] */
        for (int32_t t = c->seq_first[e]; t < c->seq_first[e + 1]; t++) {
            float *b = bcx + t * W, *cc = b + E, *xx = cc + E;
            for (int64_t i = 0; i < E; i++) xx[i] *= b[i]; /* bx, in X's place */
            float *y = c->xb + t * E; /* xb is free after in_proj */
            for (int64_t i = 0; i < E; i++) {
                const float *w = ly->ssm_conv1d + i * K;
                float s = 0;
                for (int64_t k = 0; k < K - 1; k++) s += w[k] * cs[k * E + i];
                y[i] = cc[i] * (s + w[K - 1] * xx[i]);
            }
            if (K > 1) {
                memmove(cs, cs + E, (size_t)((K - 2) * E) * sizeof(float));
                memcpy(cs + (K - 2) * E, xx, (size_t)E * sizeof(float));
            }
        }
    }
    op_linear(c, &ly->ssm_out, NULL, c->xb, n_tok, c->proj);
    op_add(c->x, c->proj, n_tok * E);
}

static void lfm2_forward(model_ctx *c, int32_t n_tok) {
    const model *m = c->m;
    const int64_t E = m->hp.n_embd;
    const float eps = m->x.norm_eps;
    op_embed(c, &m->tok_embd, n_tok, 0.0f, c->x);
    for (int32_t l = 0; l < m->hp.n_layer; l++) {
        const model_layer *ly = &m->layers[l];
        const model_layer_hp *h = &m->lhp[l];
        if (h->state_floats)
            shortconv_layer(c, ly, h, n_tok);
        else
            model_llama_attention(c, l, n_tok);

        op_rmsnorm(c->xb, c->x, ly->ffn_norm, n_tok, E, eps);
        op_ffn_glu(c, &ly->w_gate, &ly->w_up, &ly->w_down, h->n_ff, OP_SILU, c->xb, n_tok, c->proj);
        op_add(c->x, c->proj, n_tok * E);
    }
}

static hl_status lfm2_read_hparams(model_loader *L, hl_err *err) {
    model *m = L->m;
    model_hp_ext *x = &m->x;
    hl_status st = model_hp_int(L, "shortconv.l_cache", true, 0, &x->ssm_d_conv, err);
    if (st) return st;
    if (x->ssm_d_conv < 2 || x->ssm_d_conv > LFM2_MAX_CONV)
        return hl_fail(err, HL_ERR_FORMAT, "shortconv.l_cache %d is out of range [2, %d]",
                       x->ssm_d_conv, LFM2_MAX_CONV);
    /* the conv runs over the embedding's channels (the shape codes' d_inner) */
    x->ssm_d_inner = m->hp.n_embd;
    for (int32_t l = 0; l < m->hp.n_layer; l++) {
        model_layer_hp *h = &m->lhp[l];
        if (h->n_head_kv > 0) continue;
        /* a conv layer: no attention heads, a state instead */
        h->n_head = h->head_dim_k = h->head_dim_v = 0;
        h->state_floats = (int64_t)(x->ssm_d_conv - 1) * m->hp.n_embd;
    }
    return HL_OK;
}

static const model_tensor_spec lfm2_tensors[] = {
    MT_G("token_embd.weight", tok_embd, MT_EMB, MD_EMBD, MD_VOCAB),
    MT_G("token_embd_norm.weight", output_norm, MT_VEC, MD_EMBD, MD_ONE),
    MT_G("output.weight", output, MT_MAT | MT_OPT, MD_EMBD, MD_VOCAB),
    MT_L("blk.%d.attn_norm.weight", attn_norm, MT_VEC, MD_EMBD, MD_ONE),
    MT_L("blk.%d.ffn_norm.weight", ffn_norm, MT_VEC, MD_EMBD, MD_ONE),
    /* short-conv layers */
    MT_L("blk.%d.shortconv.conv.weight", ssm_conv1d, MT_VEC, MD_SSM_CONV_K, MD_SSM_INNER),
    MT_L("blk.%d.shortconv.in_proj.weight", ssm_in, MT_MAT, MD_EMBD, MD_SSM_INNER3),
    MT_L("blk.%d.shortconv.out_proj.weight", ssm_out, MT_MAT, MD_SSM_INNER, MD_EMBD),
    /* attention layers */
    MT_ATTN_QKVO,
    MT_L("blk.%d.attn_q_norm.weight", q_norm, MT_VEC, MD_HEAD_K, MD_ONE),
    MT_L("blk.%d.attn_k_norm.weight", k_norm, MT_VEC, MD_HEAD_K, MD_ONE),
    MT_FFN_GLU,
};
#define N_SPECS(t) (int32_t)(sizeof t / sizeof t[0])

const model_arch_desc model_arch_lfm2 = {
    .name = "lfm2", .rope_kind = MODEL_ROPE_NEOX, .read_hparams = lfm2_read_hparams,
    .tensors = lfm2_tensors, .n_tensors = N_SPECS(lfm2_tensors),
    .extra_floats = lfm2_extra_floats, .forward = lfm2_forward,
};
