/*
 * gemma.c - gemma2 and gemma3: sliding-window layers mixed with global ones, sandwich
 * norms around attention and feed-forward, GELU (tanh) GLU, embeddings scaled by
 * sqrt(n_embd), tied output.
 *
 * Per layer:
 *   xb = rmsnorm(x) * attn_norm
 *   q, k, v = xb Wq, xb Wk, xb Wv;  q, k = rmsnorm per head (gemma3), RoPE (neox)
 *   att = softmax(softcap(q k^T / sqrt(d))) v, causal, over the last W keys on local layers
 *   h = x + rmsnorm(att Wo) * post_attention_norm
 *   out = h + rmsnorm(Wdown(gelu(Wgate xb') * Wup xb')) * post_ffw_norm,
 *         xb' = rmsnorm(h) * ffn_norm
 * gemma2: local layers alternate with global ones (pattern 2), attention scores and the
 * final logits are soft-capped. gemma3: 5 local : 1 global (pattern 6), local layers
 * rotate with rope.freq_base_swa and no scaling, global ones with rope.freq_base and the
 * file's linear scaling.
 */
#include "model/ops.h"

#include <math.h>

static void gemma_forward(model_ctx *c, int32_t n_tok) {
    const model *m = c->m;
    const int64_t E = m->hp.n_embd;
    const float eps = m->x.norm_eps;

    op_embed(c, &m->tok_embd, n_tok, sqrtf((float)E), c->x);
    for (int32_t l = 0; l < m->hp.n_layer; l++) {
        const model_layer *ly = &m->layers[l];
        const model_layer_hp *h = &m->lhp[l];

        op_rmsnorm(c->xb, c->x, ly->attn_norm, n_tok, E, eps);
        op_linear_many(c, &ly->wq, c->q, &ly->wk, c->k, &ly->wv, c->v, c->xb, n_tok);
        if (ly->q_norm) op_head_norm(c, c->q, ly->q_norm, n_tok, h->n_head, h->head_dim_k, eps);
        if (ly->k_norm) op_head_norm(c, c->k, ly->k_norm, n_tok, h->n_head_kv, h->head_dim_k, eps);
        op_rope(c, h, true, c->q, n_tok, h->n_head, h->head_dim_k);
        op_rope(c, h, true, c->k, n_tok, h->n_head_kv, h->head_dim_k);
        const op_attn a = {.layer = l, .store = true, .n_head = h->n_head,
                           .n_head_kv = h->n_head_kv, .head_dim_k = h->head_dim_k,
                           .head_dim_v = h->head_dim_v,
                           .scale = 1.0f / sqrtf((float)h->head_dim_k),
                           .softcap = m->x.attn_softcap, .window = h->window, .causal = true};
        op_attention(c, &a, n_tok);
        op_linear(c, &ly->wo, NULL, c->att, n_tok, c->proj);
        op_rmsnorm(c->proj, c->proj, ly->post_attn_norm, n_tok, E, eps);
        op_add(c->x, c->proj, n_tok * E);

        op_rmsnorm(c->xb, c->x, ly->ffn_norm, n_tok, E, eps);
        op_ffn_glu(c, &ly->w_gate, &ly->w_up, &ly->w_down, h->n_ff, OP_GELU_TANH,
                   c->xb, n_tok, c->proj);
        op_rmsnorm(c->proj, c->proj, ly->post_ffn_norm, n_tok, E, eps);
        op_add(c->x, c->proj, n_tok * E);
    }
}

#define GEMMA_TENSORS(qk_norm)                                                              \
    MT_EMBD_OUTPUT,                                                                         \
    MT_L("blk.%d.attn_norm.weight", attn_norm, MT_VEC, MD_EMBD, MD_ONE),                    \
    MT_ATTN_QKVO,                                                                           \
    MT_L("blk.%d.attn_q_norm.weight", q_norm, MT_VEC | (qk_norm), MD_HEAD_K, MD_ONE),       \
    MT_L("blk.%d.attn_k_norm.weight", k_norm, MT_VEC | (qk_norm), MD_HEAD_K, MD_ONE),       \
    MT_L("blk.%d.post_attention_norm.weight", post_attn_norm, MT_VEC, MD_EMBD, MD_ONE),     \
    MT_L("blk.%d.ffn_norm.weight", ffn_norm, MT_VEC, MD_EMBD, MD_ONE),                      \
    MT_FFN_GLU,                                                                             \
    MT_L("blk.%d.post_ffw_norm.weight", post_ffn_norm, MT_VEC, MD_EMBD, MD_ONE)

static const model_tensor_spec gemma2_tensors[] = {GEMMA_TENSORS(MT_OPT)};
static const model_tensor_spec gemma3_tensors[] = {GEMMA_TENSORS(0)};
#define N_SPECS(t) (int32_t)(sizeof t / sizeof t[0])

/* A cap of 0 in the file means none. */
static hl_status read_softcap(model_loader *L, const char *key, float *out, hl_err *err) {
    return model_hp_float(L, key, 0.0f, out, err);
}

static hl_status gemma2_read_hparams(model_loader *L, hl_err *err) {
    model *m = L->m;
    hl_status st = model_hp_sliding_window(L, 2, err);
    if (!st) st = read_softcap(L, "attn_logit_softcapping", &m->x.attn_softcap, err);
    if (!st) st = read_softcap(L, "final_logit_softcapping", &m->x.final_softcap, err);
    return st;
}

static hl_status gemma3_read_hparams(model_loader *L, hl_err *err) {
    model *m = L->m;
    hl_status st = model_hp_sliding_window(L, 6, err);
    float base_swa = 10000.0f;
    if (!st) st = model_hp_float(L, "rope.freq_base_swa", 10000.0f, &base_swa, err);
    if (!st) st = read_softcap(L, "final_logit_softcapping", &m->x.final_softcap, err);
    for (int32_t l = 0; !st && l < m->hp.n_layer; l++) {
        if (m->lhp[l].window == 0) continue;
        m->lhp[l].rope_base = base_swa; /* local layers: their own base, no scaling */
        m->lhp[l].rope_scale = 1.0f;
    }
    return st;
}

const model_arch_desc model_arch_gemma2 = {
    .name = "gemma2", .rope_kind = MODEL_ROPE_NEOX, .read_hparams = gemma2_read_hparams,
    .tensors = gemma2_tensors, .n_tensors = N_SPECS(gemma2_tensors), .forward = gemma_forward,
};

const model_arch_desc model_arch_gemma3 = {
    .name = "gemma3", .rope_kind = MODEL_ROPE_NEOX, .read_hparams = gemma3_read_hparams,
    .tensors = gemma3_tensors, .n_tensors = N_SPECS(gemma3_tensors), .forward = gemma_forward,
};
