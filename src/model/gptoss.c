/*
 * gptoss.c - gpt-oss: the llama family's attention with biases, attention sinks and a
 * sliding window on every other layer, YaRN RoPE, and a mixture-of-experts feed-forward
 * with biases and a clamped SwiGLU. Semantics as llama.cpp implements them.
 *
 * Per layer, for a batch of tokens:
 *   xb = rmsnorm(x) * attn_norm
 *   q, k, v = xb Wq + bq, xb Wk + bk, xb Wv + bv;  q, k: NEOX RoPE with YaRN (ops.h)
 *   att = softmax([q k^T / sqrt(d), sink_h]) v with the sink column dropped (a learned
 *         per-head logit in the denominator only); even layers see keys p-W+1..p
 *         (attention.sliding_window W), odd layers the whole causal prefix
 *   x += att Wo + bo
 *   xb = rmsnorm(x) * post_attention_norm
 *   x += moe(xb): logits = router xb + router_b; the top expert_used_count logits, their
 *        weights the softmax over those k; expert e: g = Wgate_e xb + bg_e,
 *        u = Wup_e xb + bu_e, h = min(g, 7) * sigmoid(1.702 min(g, 7)) * (clamp(u, -7, 7) + 1),
 *        y_e = Wdown_e h + bd_e; out = sum_e w_e y_e
 * YaRN: rope.scaling.{type yarn, factor, original_context_length}; cos/sin are scaled by
 * 1 + 0.1 ln(factor) (ggml's rope_yarn mscale with attn_factor 1). The windowed layers
 * keep their keys in the sliding-window cache slot (internal.h).
 */
#include "model/ops.h"

static void gptoss_forward(model_ctx *c, int32_t n_tok) {
    const model *m = c->m;
    const int64_t E = m->hp.n_embd;
    const float eps = m->x.norm_eps;

    op_embed(c, &m->tok_embd, n_tok, 0.0f, c->x);
    for (int32_t l = 0; l < m->hp.n_layer; l++) {
        const model_layer *ly = &m->layers[l];
        model_llama_attention(c, l, n_tok); /* biases, sinks and the window from the layer */

        op_rmsnorm(c->xb, c->x, ly->ffn_norm, n_tok, E, eps);
        const op_moe_args a = {.router = &ly->ffn_gate_inp, .gate = &ly->ffn_gate_exps,
                               .up = &ly->ffn_up_exps, .down = &ly->ffn_down_exps,
                               .router_b = ly->ffn_gate_inp_b, .b_gate = ly->b_gate_exps,
                               .b_up = ly->b_up_exps, .b_down = ly->b_down_exps,
                               .n_used = m->x.n_expert_used, .routing = OP_MOE_TOPK_SOFTMAX,
                               .act = OP_MOE_SWIGLU_OAI};
        op_moe_ex(c, &a, c->xb, n_tok, c->proj, c->extra);
        op_add(c->x, c->proj, n_tok * E);
    }
}

static const model_tensor_spec gptoss_tensors[] = {
    MT_EMBD_OUTPUT,
    MT_L("blk.%d.attn_norm.weight", attn_norm, MT_VEC, MD_EMBD, MD_ONE),
    MT_ATTN_QKVO,
    MT_L("blk.%d.attn_q.bias", bq, MT_VEC, MD_Q, MD_ONE),
    MT_L("blk.%d.attn_k.bias", bk, MT_VEC, MD_KVK, MD_ONE),
    MT_L("blk.%d.attn_v.bias", bv, MT_VEC, MD_KVV, MD_ONE),
    MT_L("blk.%d.attn_output.bias", bo, MT_VEC, MD_EMBD, MD_ONE),
    MT_L("blk.%d.attn_sinks.weight", attn_sinks, MT_VEC, MD_HEADS, MD_ONE),
    /* the FFN's input norm, named after its place behind attention */
    MT_L("blk.%d.post_attention_norm.weight", ffn_norm, MT_VEC, MD_EMBD, MD_ONE),
    MT_L("blk.%d.ffn_gate_inp.weight", ffn_gate_inp, MT_MAT, MD_EMBD, MD_EXPERTS),
    MT_L("blk.%d.ffn_gate_inp.bias", ffn_gate_inp_b, MT_VEC, MD_EXPERTS, MD_ONE),
    MT_FFN_EXPS,
    MT_L("blk.%d.ffn_gate_exps.bias", b_gate_exps, MT_VEC, MD_FF_EXP, MD_EXPERTS),
    MT_L("blk.%d.ffn_up_exps.bias", b_up_exps, MT_VEC, MD_FF_EXP, MD_EXPERTS),
    MT_L("blk.%d.ffn_down_exps.bias", b_down_exps, MT_VEC, MD_EMBD, MD_EXPERTS),
};

static hl_status gptoss_read_hparams(model_loader *L, hl_err *err) {
    hl_status st = model_hp_experts(L, 0, err);
    /* llama.cpp: sliding window on even layers (pattern 2) unless the file says otherwise */
    if (!st) st = model_hp_sliding_window(L, 2, err);
    return st;
}

static int64_t gptoss_extra_floats(const model *m) {
    return op_moe_scratch_floats(m->hp.n_embd, m->x.n_expert, m->x.n_ff_exp);
}

const model_arch_desc model_arch_gptoss = {
    .name = "gpt-oss", .rope_kind = MODEL_ROPE_NEOX, .read_hparams = gptoss_read_hparams,
    .tensors = gptoss_tensors,
    .n_tensors = (int32_t)(sizeof gptoss_tensors / sizeof gptoss_tensors[0]),
    .extra_floats = gptoss_extra_floats, .forward = gptoss_forward,
};
