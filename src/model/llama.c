/*
 * llama.c - the llama family: llama, mistral, qwen2 (q/k/v biases), qwen3 (q/k norms).
 *
 * Per layer, for a batch of tokens:
 *   xb = rmsnorm(x) * attn_norm
 *   q, k, v = xb Wq (+bq), xb Wk (+bk), xb Wv (+bv)
 *   q, k = rmsnorm per head (qwen3), then RoPE at each token's position
 *   att = softmax(q k^T / sqrt(d)) v over the cache, causal
 *   x += att Wo
 *   xb = rmsnorm(x) * ffn_norm;  x += (silu(xb Wgate) * xb Wup) Wdown
 * A llama GGUF with experts (Mixtral: llama.expert_count, ffn_gate_inp and ffn_*_exps in
 * place of ffn_gate/up/down) has a mixture-of-experts feed-forward instead: op_moe's
 * softmax router, the top expert_used_count experts with their weights renormalised to
 * sum 1 (llama.cpp: softmax gating, norm_w), each expert a SiLU GLU feed_forward_length
 * wide (or expert_feed_forward_length when the file has it).
 */
#include "model/ops.h"

#include <math.h>
#include <stdio.h>

void model_llama_attention(model_ctx *c, int32_t l, int32_t n_tok) {
    const model *m = c->m;
    const int64_t E = m->hp.n_embd;
    const float eps = m->x.norm_eps;
    const bool neox = m->hp.rope_kind == MODEL_ROPE_NEOX;
    const model_layer *ly = &m->layers[l];
    const model_layer_hp *h = &m->lhp[l];
    op_rmsnorm(c->xb, c->x, ly->attn_norm, n_tok, E, eps);
    op_linear_many(c, &ly->wq, c->q, &ly->wk, c->k, &ly->wv, c->v, c->xb, n_tok);
    op_add_bias(c->q, ly->bq, n_tok, ly->wq.n_rows);
    op_add_bias(c->k, ly->bk, n_tok, ly->wk.n_rows);
    op_add_bias(c->v, ly->bv, n_tok, ly->wv.n_rows);
    if (ly->q_norm) op_head_norm(c, c->q, ly->q_norm, n_tok, h->n_head, h->head_dim_k, eps);
    if (ly->k_norm) op_head_norm(c, c->k, ly->k_norm, n_tok, h->n_head_kv, h->head_dim_k, eps);
    op_rope(c, h, neox, c->q, n_tok, h->n_head, h->head_dim_k);
    op_rope(c, h, neox, c->k, n_tok, h->n_head_kv, h->head_dim_k);
    const op_attn a = {.layer = l, .store = true, .n_head = h->n_head,
                       .n_head_kv = h->n_head_kv, .head_dim_k = h->head_dim_k,
                       .head_dim_v = h->head_dim_v,
                       .scale = 1.0f / sqrtf((float)h->head_dim_k), .window = h->window,
                       .causal = true, .sinks = ly->attn_sinks};
    op_attention(c, &a, n_tok);
    op_linear(c, &ly->wo, ly->bo, c->att, n_tok, c->proj);
    op_add(c->x, c->proj, n_tok * E);
}

static void llama_forward(model_ctx *c, int32_t n_tok) {
    const model *m = c->m;
    const int64_t E = m->hp.n_embd;
    const float eps = m->x.norm_eps;

    op_embed(c, &m->tok_embd, n_tok, 0.0f, c->x);
    for (int32_t l = 0; l < m->hp.n_layer; l++) {
        const model_layer *ly = &m->layers[l];
        const model_layer_hp *h = &m->lhp[l];
        model_llama_attention(c, l, n_tok);

        /* feed-forward */
        op_rmsnorm(c->xb, c->x, ly->ffn_norm, n_tok, E, eps);
        if (ly->ffn_gate_inp.data) {
            op_moe(c, &ly->ffn_gate_inp, &ly->ffn_gate_exps, &ly->ffn_up_exps,
                   &ly->ffn_down_exps, m->x.n_expert_used, c->xb, n_tok, c->proj, c->extra);
        } else {
            op_ffn_glu(c, &ly->w_gate, &ly->w_up, &ly->w_down, h->n_ff, OP_SILU,
                       c->xb, n_tok, c->proj);
        }
        op_add(c->x, c->proj, n_tok * E);
    }
}

/* The table shared by the family; `bias` and `qk_norm` say whether qwen2's biases and
 * qwen3's head norms are required (MT_OPT elsewhere). */
#define LLAMA_TENSORS(bias, qk_norm)                                                    \
    MT_EMBD_OUTPUT,                                                                     \
    MT_G("rope_freqs.weight", rope_freqs, MT_VEC | MT_OPT, MD_ROT2, MD_ONE),            \
    MT_L("blk.%d.attn_norm.weight", attn_norm, MT_VEC, MD_EMBD, MD_ONE),                \
    MT_ATTN_QKVO,                                                                       \
    MT_L("blk.%d.attn_q.bias", bq, MT_VEC | (bias), MD_Q, MD_ONE),                      \
    MT_L("blk.%d.attn_k.bias", bk, MT_VEC | (bias), MD_KVK, MD_ONE),                    \
    MT_L("blk.%d.attn_v.bias", bv, MT_VEC | (bias), MD_KVV, MD_ONE),                    \
    MT_L("blk.%d.attn_q_norm.weight", q_norm, MT_VEC | (qk_norm), MD_HEAD_K, MD_ONE),   \
    MT_L("blk.%d.attn_k_norm.weight", k_norm, MT_VEC | (qk_norm), MD_HEAD_K, MD_ONE),   \
    MT_L("blk.%d.ffn_norm.weight", ffn_norm, MT_VEC, MD_EMBD, MD_ONE),                  \
    MT_FFN_GLU,                                                                         \
    /* experts (Mixtral): no size, so not loaded, without expert_count */               \
    MT_L("blk.%d.ffn_gate_inp.weight", ffn_gate_inp, MT_MAT, MD_EMBD, MD_EXPERTS),      \
    MT_FFN_EXPS

static const model_tensor_spec llama_tensors[] = {LLAMA_TENSORS(MT_OPT, MT_OPT)};
static const model_tensor_spec qwen2_tensors[] = {LLAMA_TENSORS(0, MT_OPT)};
static const model_tensor_spec qwen3_tensors[] = {LLAMA_TENSORS(MT_OPT, 0)};
#define N_SPECS(t) (int32_t)(sizeof t / sizeof t[0])

/* rope_freqs divides every layer's frequencies (llama 3.1's long-context factors). */
static hl_status llama_check(model_loader *L, hl_err *err) {
    (void)err;
    model *m = L->m;
    for (int32_t l = 0; l < m->hp.n_layer; l++) m->lhp[l].rope_factors = m->rope_freqs;
    return HL_OK;
}

/* Experts (Mixtral): expert_count and expert_used_count; the dense feed-forward then has
 * no size (its tensors are not loaded). Expert tensors without expert_count are named. */
static hl_status llama_read_hparams(model_loader *L, hl_err *err) {
    model *m = L->m;
    char key[96];
    snprintf(key, sizeof key, "%s.expert_count", L->prefix);
    if (gguf_find_key(L->f, key) < 0) {
        if (gguf_find_tensor(L->f, "blk.0.ffn_gate_exps.weight"))
            return hl_fail(err, HL_ERR_FORMAT,
                           "tensor 'blk.0.ffn_gate_exps.weight' holds experts but '%s' is "
                           "missing", key);
        return HL_OK;
    }
    hl_status st = model_hp_experts(L, m->hp.n_ff, err);
    if (st) return st;
    for (int32_t l = 0; l < m->hp.n_layer; l++) m->lhp[l].n_ff = 0;
    return HL_OK;
}

static int64_t llama_extra_floats(const model *m) {
    return m->x.n_expert > 0
               ? op_moe_scratch_floats(m->hp.n_embd, m->x.n_expert, m->x.n_ff_exp)
               : 0;
}

static const char *const llama_aliases[] = {"mistral", NULL};

const model_arch_desc model_arch_llama = {
    .name = "llama", .aliases = llama_aliases, .rope_kind = MODEL_ROPE_NORM,
    .read_hparams = llama_read_hparams, .tensors = llama_tensors,
    .n_tensors = N_SPECS(llama_tensors), .check = llama_check, .extra_floats = llama_extra_floats,
    .forward = llama_forward,
};

const model_arch_desc model_arch_qwen2 = {
    .name = "qwen2", .rope_kind = MODEL_ROPE_NEOX, .read_hparams = llama_read_hparams,
    .tensors = qwen2_tensors, .n_tensors = N_SPECS(qwen2_tensors), .check = llama_check,
    .extra_floats = llama_extra_floats, .forward = llama_forward,
};

const model_arch_desc model_arch_qwen3 = {
    .name = "qwen3", .rope_kind = MODEL_ROPE_NEOX, .read_hparams = llama_read_hparams,
    .tensors = qwen3_tensors, .n_tensors = N_SPECS(qwen3_tensors), .check = llama_check,
    .extra_floats = llama_extra_floats, .forward = llama_forward,
};
