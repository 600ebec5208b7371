/*
 * bert.c - encoder-only embedding models: bert (BGE, MiniLM, ...) and nomic-bert.
 * No output projection: model_embed pools the last layer's states as the file's
 * pooling_type says (bert: CLS, nomic: mean).
 *
 * Input, for every token (token type always 0, as llama.cpp feeds it):
 *   x = LayerNorm(token_embd[id] + token_types[0] (+ position_embd[pos]))   bert: positions
 * Per layer (post-LN), attention non-causal over the whole sequence:
 *   q, k, v = x Wq + bq, x Wk + bk, x Wv + bv      nomic: fused x Wqkv = [q|k|v], no biases,
 *                                                   RoPE (neox) on q and k
 *   h   = LayerNorm(x + (softmax(q k^T / sqrt(d)) v) Wo + bo)   attn_output_norm
 *   out = LayerNorm(h + FFN(h))                                  layer_output_norm
 *   FFN bert:  (gelu_tanh(h Wup + bup)) Wdown + bdown
 *   FFN nomic: (silu(h Wgate) * h Wup) Wdown
 * The last LayerNorm is the block's, so there is no output_norm.
 */
#include "model/ops.h"

#include <math.h>

static void bert_forward(model_ctx *c, int32_t n_tok) {
    const model *m = c->m;
    const int64_t E = m->hp.n_embd;
    const float eps = m->x.norm_eps;

    op_embed(c, &m->tok_embd, n_tok, 0.0f, c->x);
    if (m->type_embd.data) op_add_row(c, &m->type_embd, 0, n_tok, c->x);
    if (m->pos_embd.data) op_add_rows_by_pos(c, &m->pos_embd, n_tok, c->x);
    op_layernorm(c->x, c->x, m->embd_norm, m->embd_norm_b, n_tok, E, eps);

    for (int32_t l = 0; l < m->hp.n_layer; l++) {
        const model_layer *ly = &m->layers[l];
        const model_layer_hp *h = &m->lhp[l];
        const int64_t nq = (int64_t)h->n_head * h->head_dim_k;
        const int64_t nk = (int64_t)h->n_head_kv * h->head_dim_k;
        const int64_t nv = (int64_t)h->n_head_kv * h->head_dim_v;

        /* attention */
        if (ly->wqkv.data) {
            op_linear(c, &ly->wqkv, ly->bqkv, c->x, n_tok, c->gate);
            op_split(c->gate, n_tok, c->q, nq, c->k, nk, c->v, nv);
        } else {
            op_linear_many(c, &ly->wq, c->q, &ly->wk, c->k, &ly->wv, c->v, c->x, n_tok);
            op_add_bias(c->q, ly->bq, n_tok, nq);
            op_add_bias(c->k, ly->bk, n_tok, nk);
            op_add_bias(c->v, ly->bv, n_tok, nv);
        }
        if (!m->pos_embd.data) { /* positions come from rotations instead */
            op_rope(c, h, true, c->q, n_tok, h->n_head, h->head_dim_k);
            op_rope(c, h, true, c->k, n_tok, h->n_head_kv, h->head_dim_k);
        }
        const op_attn a = {.layer = l, .store = true, .n_head = h->n_head,
                           .n_head_kv = h->n_head_kv, .head_dim_k = h->head_dim_k,
                           .head_dim_v = h->head_dim_v,
                           .scale = 1.0f / sqrtf((float)h->head_dim_k), .causal = false};
        op_attention(c, &a, n_tok);
        op_linear(c, &ly->wo, ly->bo, c->att, n_tok, c->proj);
        op_add(c->x, c->proj, n_tok * E);
        op_layernorm(c->x, c->x, ly->post_attn_norm, ly->post_attn_norm_b, n_tok, E, eps);

        /* feed-forward */
        if (ly->w_gate.data) {
            op_linear_many(c, &ly->w_gate, c->gate, &ly->w_up, c->up, NULL, NULL, c->x, n_tok);
            op_glu(c->gate, c->up, (int64_t)n_tok * h->n_ff, OP_SILU);
        } else {
            op_linear(c, &ly->w_up, ly->b_up, c->x, n_tok, c->gate);
            op_act_apply(c->gate, (int64_t)n_tok * h->n_ff, OP_GELU_TANH);
        }
        op_linear(c, &ly->w_down, ly->b_down, c->gate, n_tok, c->proj);
        op_add(c->x, c->proj, n_tok * E);
        op_layernorm(c->x, c->x, ly->post_ffn_norm, ly->post_ffn_norm_b, n_tok, E, eps);
    }
}

#define BERT_COMMON_TENSORS                                                                 \
    MT_G("token_embd.weight", tok_embd, MT_EMB, MD_EMBD, MD_VOCAB),                         \
    MT_G("token_types.weight", type_embd, MT_EMB | MT_OPT, MD_EMBD, MD_TYPES),              \
    MT_G("token_embd_norm.weight", embd_norm, MT_VEC, MD_EMBD, MD_ONE),                     \
    MT_G("token_embd_norm.bias", embd_norm_b, MT_VEC, MD_EMBD, MD_ONE),                     \
    MT_L("blk.%d.attn_output.weight", wo, MT_MAT, MD_O, MD_EMBD),                           \
    MT_L("blk.%d.attn_output_norm.weight", post_attn_norm, MT_VEC, MD_EMBD, MD_ONE),        \
    MT_L("blk.%d.attn_output_norm.bias", post_attn_norm_b, MT_VEC, MD_EMBD, MD_ONE),        \
    MT_L("blk.%d.ffn_up.weight", w_up, MT_MAT, MD_EMBD, MD_FF),                             \
    MT_L("blk.%d.ffn_down.weight", w_down, MT_MAT, MD_FF, MD_EMBD),                         \
    MT_L("blk.%d.layer_output_norm.weight", post_ffn_norm, MT_VEC, MD_EMBD, MD_ONE),        \
    MT_L("blk.%d.layer_output_norm.bias", post_ffn_norm_b, MT_VEC, MD_EMBD, MD_ONE)

static const model_tensor_spec bert_tensors[] = {
    BERT_COMMON_TENSORS,
    MT_G("position_embd.weight", pos_embd, MT_EMB, MD_EMBD, MD_CTX),
    MT_L("blk.%d.attn_q.weight", wq, MT_MAT, MD_EMBD, MD_Q),
    MT_L("blk.%d.attn_k.weight", wk, MT_MAT, MD_EMBD, MD_KVK),
    MT_L("blk.%d.attn_v.weight", wv, MT_MAT, MD_EMBD, MD_KVV),
    MT_L("blk.%d.attn_q.bias", bq, MT_VEC, MD_Q, MD_ONE),
    MT_L("blk.%d.attn_k.bias", bk, MT_VEC, MD_KVK, MD_ONE),
    MT_L("blk.%d.attn_v.bias", bv, MT_VEC, MD_KVV, MD_ONE),
    MT_L("blk.%d.attn_output.bias", bo, MT_VEC, MD_EMBD, MD_ONE),
    MT_L("blk.%d.ffn_up.bias", b_up, MT_VEC, MD_FF, MD_ONE),
    MT_L("blk.%d.ffn_down.bias", b_down, MT_VEC, MD_EMBD, MD_ONE),
};

static const model_tensor_spec nomic_bert_tensors[] = {
    BERT_COMMON_TENSORS,
    MT_L("blk.%d.attn_qkv.weight", wqkv, MT_MAT, MD_EMBD, MD_QKV),
    MT_L("blk.%d.attn_qkv.bias", bqkv, MT_VEC | MT_OPT, MD_QKV, MD_ONE),
    MT_L("blk.%d.ffn_gate.weight", w_gate, MT_MAT, MD_EMBD, MD_FF),
};
#define N_SPECS(t) (int32_t)(sizeof t / sizeof t[0])

/* Token types: tokenizer.ggml.token_type_count, else the token_types tensor's rows (absent
 * tensor: none). The model is an encoder: non-causal whatever the file says. */
static hl_status bert_read_hparams(model_loader *L, hl_err *err) {
    model *m = L->m;
    if (!m->x.layer_norm)
        return hl_fail(err, HL_ERR_FORMAT, "missing metadata key '%s.attention.layer_norm_epsilon'",
                       L->prefix);
    m->x.causal = false;
    uint32_t n_types = 0;
    if (!gguf_get_u32(L->f, "tokenizer.ggml.token_type_count", &n_types)) {
        const gguf_tensor *t = gguf_find_tensor(L->f, "token_types.weight");
        if (t && t->n_dims >= 2 && t->ne[1] > 0 && t->ne[1] <= 1024) n_types = (uint32_t)t->ne[1];
    }
    if (n_types > 1024)
        return hl_fail(err, HL_ERR_FORMAT, "tokenizer.ggml.token_type_count %u is out of range",
                       n_types);
    m->x.n_token_types = (int32_t)n_types;
    return HL_OK;
}

const model_arch_desc model_arch_bert = {
    .name = "bert", .rope_kind = MODEL_ROPE_NEOX, /* unused: absolute positions */ .no_output = true,
    .read_hparams = bert_read_hparams, .tensors = bert_tensors,
    .n_tensors = N_SPECS(bert_tensors), .forward = bert_forward,
};

const model_arch_desc model_arch_nomic_bert = {
    .name = "nomic-bert", .rope_kind = MODEL_ROPE_NEOX, .no_output = true,
    .read_hparams = bert_read_hparams, .tensors = nomic_bert_tensors,
    .n_tensors = N_SPECS(nomic_bert_tensors), .forward = bert_forward,
};
