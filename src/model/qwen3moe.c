/*
 * qwen3moe.c - qwen3's attention with a mixture-of-experts feed-forward.
 *
 * Per layer, for a batch of tokens:
 *   xb = rmsnorm(x) * attn_norm
 *   q, k, v = xb Wq, xb Wk, xb Wv; q, k RMS-normed per head, then NEOX RoPE
 *   x += attention Wo   (n_head * head_dim may differ from n_embd)
 *   xb = rmsnorm(x) * ffn_norm;  x += moe(xb)   (ops.h: op_moe; router softmax, top
 *   expert_used_count, weights renormalised to sum 1, each expert a SiLU GLU)
 */
#include "model/ops.h"

#include <math.h>

#define QWEN3MOE_MAX_EXPERTS 1024

static void qwen3moe_forward(model_ctx *c, int32_t n_tok) {
    const model *m = c->m;
    const int64_t E = m->hp.n_embd;
    const float eps = m->x.norm_eps;

    op_embed(c, &m->tok_embd, n_tok, 0.0f, c->x);
    for (int32_t l = 0; l < m->hp.n_layer; l++) {
        const model_layer *ly = &m->layers[l];
        model_llama_attention(c, l, n_tok); /* qwen3's: q/k norms present, neox */

        op_rmsnorm(c->xb, c->x, ly->ffn_norm, n_tok, E, eps);
        op_moe(c, &ly->ffn_gate_inp, &ly->ffn_gate_exps, &ly->ffn_up_exps, &ly->ffn_down_exps,
               m->x.n_expert_used, c->xb, n_tok, c->proj, c->extra);
        op_add(c->x, c->proj, n_tok * E);
    }
}

static const model_tensor_spec qwen3moe_tensors[] = {
    MT_EMBD_OUTPUT,
    MT_L("blk.%d.attn_norm.weight", attn_norm, MT_VEC, MD_EMBD, MD_ONE),
    MT_ATTN_QKVO,
    MT_L("blk.%d.attn_q_norm.weight", q_norm, MT_VEC, MD_HEAD_K, MD_ONE),
    MT_L("blk.%d.attn_k_norm.weight", k_norm, MT_VEC, MD_HEAD_K, MD_ONE),
    MT_L("blk.%d.ffn_norm.weight", ffn_norm, MT_VEC, MD_EMBD, MD_ONE),
    MT_L("blk.%d.ffn_gate_inp.weight", ffn_gate_inp, MT_MAT, MD_EMBD, MD_EXPERTS),
    MT_FFN_EXPS,
};

hl_status model_hp_experts(model_loader *L, int32_t n_ff_exp_dflt, hl_err *err) {
    model_hp_ext *x = &L->m->x;
    hl_status st;
    if ((st = model_hp_int(L, "expert_count", true, 0, &x->n_expert, err)) ||
        (st = model_hp_int(L, "expert_used_count", true, 0, &x->n_expert_used, err)) ||
        (st = model_hp_int(L, "expert_feed_forward_length", n_ff_exp_dflt == 0, n_ff_exp_dflt,
                           &x->n_ff_exp, err)))
        return st;
    if (x->n_expert < 1 || x->n_expert > QWEN3MOE_MAX_EXPERTS || x->n_expert_used < 1 ||
        x->n_expert_used > x->n_expert || x->n_ff_exp < 1)
        return hl_fail(err, HL_ERR_FORMAT,
                       "%s: bad expert hyperparameters (expert_count %d, expert_used_count %d, "
                       "expert_feed_forward_length %d)",
                       L->prefix, x->n_expert, x->n_expert_used, x->n_ff_exp);
    return HL_OK;
}

static hl_status qwen3moe_read_hparams(model_loader *L, hl_err *err) {
    return model_hp_experts(L, 0, err);
}

static int64_t qwen3moe_extra_floats(const model *m) {
    return op_moe_scratch_floats(m->hp.n_embd, m->x.n_expert, m->x.n_ff_exp);
}

const model_arch_desc model_arch_qwen3moe = {
    .name = "qwen3moe", .rope_kind = MODEL_ROPE_NEOX, .read_hparams = qwen3moe_read_hparams,
    .tensors = qwen3moe_tensors, .n_tensors = (int32_t)(sizeof qwen3moe_tensors /
                                                        sizeof qwen3moe_tensors[0]),
    .extra_floats = qwen3moe_extra_floats, .forward = qwen3moe_forward,
};
