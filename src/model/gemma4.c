/*
 * gemma4.c - gemma4 text models: gemma3's sandwich-norm block with layers that differ in
 * head size, KV heads and feed-forward width, KV sharing, per-layer token inputs and a
 * per-layer output scale.
 *
 * Per layer l (local = sliding window, from the bool array sliding_window_pattern):
 *   xb = rmsnorm(x) * attn_norm
 *   q = rmsnorm(xb Wq) * q_norm per head; k = rmsnorm(xb Wk) * k_norm per head;
 *   v = rmsnorm(xb Wv) per head without weight (no Wv: v is the K projection, unnormed)
 *   RoPE (neox): local layers rope.freq_base_swa over rope.dimension_count_swa dims of
 *   heads of key_length_swa; global layers rope.freq_base over rope.dimension_count with
 *   rope_freqs' divisors (1e30 leaves a pair unrotated: "proportional" rope)
 *   att = softmax(q k^T) v (scale 1: the norms fix the magnitude), causal, windowed on
 *   local layers
 *   h = x + rmsnorm(att Wo) * post_attention_norm
 *   x = h + rmsnorm(Wdown(gelu(Wgate xb') * Wup xb')) * post_ffw_norm, xb' = rmsnorm(h)*ffn_norm
 *   per-layer input (embedding_length_per_layer_input > 0):
 *     x += rmsnorm(Wproj(gelu(Winp_gate x) * P[l])) * post_norm
 *   x *= layer_output_scale
 * KV sharing: the last attention.shared_kv_layers layers compute no K/V; they attend with
 * their own q over the cache of the last earlier layer of their kind (n_layer_kv - 2 for
 * local layers, n_layer_kv - 1 for global ones, llama.cpp's rule).
 * P, computed once per token before the layers (into c->extra):
 *   P[l] = (rmsnorm((x0 Wpl_model_proj / sqrt(n_embd))[l]) * pl_proj_norm
 *           + per_layer_token_embd[id][l] * sqrt(n_pl)) / sqrt(2)
 * with x0 = token_embd[id] * sqrt(n_embd). Final logits are soft-capped by the driver.
 */
#include "model/ops.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* c->extra per token: [0, L*PL) holds P for the batch's rows (row t at t * L*PL); the
 * second half of the buffer (from max_batch * L*PL) is scratch. */
static int64_t gemma4_extra_floats(const model *m) {
    return 2 * (int64_t)m->x.n_embd_per_layer * m->hp.n_layer;
}

/* The per-layer inputs P of every token of the batch into c->extra. */
static void per_layer_inputs(model_ctx *c, int32_t n_tok) {
    const model *m = c->m;
    const int32_t L = m->hp.n_layer, PL = m->x.n_embd_per_layer;
    const int64_t LPL = (int64_t)L * PL;
    float *P = c->extra;
    float *tok = c->extra + (int64_t)c->max_batch * LPL;
    op_linear(c, &m->pl_model_proj, NULL, c->x, n_tok, P);
    op_scale(P, 1.0f / sqrtf((float)m->hp.n_embd), n_tok * LPL);
    op_rmsnorm(P, P, m->pl_proj_norm, n_tok * L, PL, m->x.norm_eps);
    op_embed(c, &m->pl_tok_embd, n_tok, sqrtf((float)PL), tok);
    op_add(P, tok, n_tok * LPL);
    op_scale(P, 1.0f / sqrtf(2.0f), n_tok * LPL);
}

/* x += rmsnorm(Wproj(gelu(Winp_gate x) * P[l])) * post_norm */
static void per_layer_add(model_ctx *c, const model_layer *ly, int32_t l, int32_t n_tok) {
    const model *m = c->m;
    const int64_t E = m->hp.n_embd, PL = m->x.n_embd_per_layer;
    const int64_t LPL = PL * m->hp.n_layer;
    float *g = c->extra + (int64_t)c->max_batch * LPL; /* scratch: per_layer_inputs is done with it */
    op_linear(c, &ly->pl_gate, NULL, c->x, n_tok, g);
    op_act_apply(g, n_tok * PL, OP_GELU_TANH);
    for (int32_t t = 0; t < n_tok; t++) {
        const float *p = c->extra + t * LPL + l * PL;
        for (int64_t i = 0; i < PL; i++) g[t * PL + i] *= p[i];
    }
    op_linear(c, &ly->pl_proj, NULL, g, n_tok, c->proj);
    op_rmsnorm(c->proj, c->proj, ly->pl_post_norm, n_tok, E, m->x.norm_eps);
    op_add(c->x, c->proj, n_tok * E);
}

static void gemma4_forward(model_ctx *c, int32_t n_tok) {
    const model *m = c->m;
    const int64_t E = m->hp.n_embd;
    const float eps = m->x.norm_eps;

    op_embed(c, &m->tok_embd, n_tok, sqrtf((float)E), c->x);
    if (m->x.n_embd_per_layer > 0) per_layer_inputs(c, n_tok);
    for (int32_t l = 0; l < m->hp.n_layer; l++) {
        const model_layer *ly = &m->layers[l];
        const model_layer_hp *h = &m->lhp[l];
        const model_layer_hp *src = &m->lhp[h->kv_src];
        const bool own_kv = h->kv_src == l;

        op_rmsnorm(c->xb, c->x, ly->attn_norm, n_tok, E, eps);
        if (!own_kv) {
            op_linear(c, &ly->wq, NULL, c->xb, n_tok, c->q);
        } else if (ly->wv.data) {
            op_linear_many(c, &ly->wq, c->q, &ly->wk, c->k, &ly->wv, c->v, c->xb, n_tok);
        } else {
            op_linear_many(c, &ly->wq, c->q, &ly->wk, c->k, NULL, NULL, c->xb, n_tok);
            /* V is the K projection before k's norm (head_dim_v == head_dim_k: checked) */
            memcpy(c->v, c->k, (size_t)n_tok * (size_t)ly->wk.n_rows * sizeof(float));
        }
        op_head_norm(c, c->q, ly->q_norm, n_tok, h->n_head, h->head_dim_k, eps);
        op_rope(c, h, true, c->q, n_tok, h->n_head, h->head_dim_k);
        if (own_kv) {
            op_head_norm(c, c->k, ly->k_norm, n_tok, h->n_head_kv, h->head_dim_k, eps);
            op_head_norm(c, c->v, NULL, n_tok, h->n_head_kv, h->head_dim_v, eps);
            op_rope(c, h, true, c->k, n_tok, h->n_head_kv, h->head_dim_k);
        }
        const op_attn a = {.layer = h->kv_src, .store = own_kv, .n_head = h->n_head,
                           .n_head_kv = src->n_head_kv, .head_dim_k = h->head_dim_k,
                           .head_dim_v = h->head_dim_v, .scale = 1.0f, .window = h->window,
                           .causal = true};
        op_attention(c, &a, n_tok);
        op_linear(c, &ly->wo, NULL, c->att, n_tok, c->proj);
        op_rmsnorm(c->proj, c->proj, ly->post_attn_norm, n_tok, E, eps);
        op_add(c->x, c->proj, n_tok * E);

        op_rmsnorm(c->xb, c->x, ly->ffn_norm, n_tok, E, eps);
        op_ffn_glu(c, &ly->w_gate, &ly->w_up, &ly->w_down, h->n_ff, OP_GELU_TANH,
                   c->xb, n_tok, c->proj);
        op_rmsnorm(c->proj, c->proj, ly->post_ffn_norm, n_tok, E, eps);
        op_add(c->x, c->proj, n_tok * E);

        if (m->x.n_embd_per_layer > 0) per_layer_add(c, ly, l, n_tok);
        if (ly->layer_out_scale) op_scale(c->x, ly->layer_out_scale[0], n_tok * E);
    }
}

/* Layers that share KV have n_head_kv 0 here, so the loader expects no K/V tensors for
 * them (and rejects any); attn_v is optional (V = K); per-layer-input tensors have size 0
 * and are skipped when the model has none. */
static const model_tensor_spec gemma4_tensors[] = {
    MT_EMBD_OUTPUT,
    MT_G("rope_freqs.weight", rope_freqs, MT_VEC | MT_OPT, MD_ROT2, MD_ONE),
    MT_G("per_layer_token_embd.weight", pl_tok_embd, MT_EMB, MD_PL_ALL, MD_VOCAB),
    MT_G("per_layer_model_proj.weight", pl_model_proj, MT_MAT, MD_EMBD, MD_PL_ALL),
    MT_G("per_layer_proj_norm.weight", pl_proj_norm, MT_VEC, MD_PL, MD_ONE),
    MT_L("blk.%d.attn_norm.weight", attn_norm, MT_VEC, MD_EMBD, MD_ONE),
    MT_L("blk.%d.attn_q.weight", wq, MT_MAT, MD_EMBD, MD_Q),
    MT_L("blk.%d.attn_k.weight", wk, MT_MAT, MD_EMBD, MD_KVK),
    MT_L("blk.%d.attn_v.weight", wv, MT_MAT | MT_OPT, MD_EMBD, MD_KVV),
    MT_L("blk.%d.attn_output.weight", wo, MT_MAT, MD_O, MD_EMBD),
    MT_L("blk.%d.attn_q_norm.weight", q_norm, MT_VEC, MD_HEAD_K, MD_ONE),
    /* required on layers with KV (gemma4_check); shared layers have none */
    MT_L("blk.%d.attn_k_norm.weight", k_norm, MT_VEC | MT_OPT, MD_HEAD_K, MD_ONE),
    MT_L("blk.%d.post_attention_norm.weight", post_attn_norm, MT_VEC, MD_EMBD, MD_ONE),
    MT_L("blk.%d.ffn_norm.weight", ffn_norm, MT_VEC, MD_EMBD, MD_ONE),
    MT_FFN_GLU,
    MT_L("blk.%d.post_ffw_norm.weight", post_ffn_norm, MT_VEC, MD_EMBD, MD_ONE),
    MT_L("blk.%d.layer_output_scale.weight", layer_out_scale, MT_VEC | MT_OPT, MD_ONE, MD_ONE),
    MT_L("blk.%d.inp_gate.weight", pl_gate, MT_MAT, MD_EMBD, MD_PL),
    MT_L("blk.%d.proj.weight", pl_proj, MT_MAT, MD_PL, MD_EMBD),
    /* required when the model has per-layer inputs (gemma4_check) */
    MT_L("blk.%d.post_norm.weight", pl_post_norm, MT_VEC | MT_OPT, MD_EMBD, MD_ONE),
};
#define N_SPECS(t) (int32_t)(sizeof t / sizeof t[0])

/* An optional count that may be 0 (absent: 0). */
static hl_status read_count(const model_loader *L, const char *suffix, int32_t *out,
                            hl_err *err) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", L->prefix, suffix);
    *out = 0;
    if (gguf_find_key(L->f, key) < 0) return HL_OK;
    uint32_t u;
    int32_t i;
    if (gguf_get_u32(L->f, key, &u) && u <= (1u << 20)) *out = (int32_t)u;
    else if (gguf_get_i32(L->f, key, &i) && i >= 0 && i <= (1 << 20)) *out = i;
    else return hl_fail(err, HL_ERR_FORMAT, "metadata key '%s' is not a small count", key);
    return HL_OK;
}

static hl_status gemma4_read_hparams(model_loader *L, hl_err *err) {
    model *m = L->m;
    model_hparams *hp = &m->hp;
    int32_t hd_k_swa, hd_v_swa, n_rot_swa, n_shared = 0, n_pl = 0;
    float base_swa;
    hl_status st = model_hp_sliding_window(L, 0, err);
    if (!st) st = model_hp_int(L, "attention.key_length_swa", false, hp->head_dim_k, &hd_k_swa, err);
    if (!st) st = model_hp_int(L, "attention.value_length_swa", false, hd_k_swa, &hd_v_swa, err);
    if (!st) st = model_hp_int(L, "rope.dimension_count_swa", false, hd_k_swa, &n_rot_swa, err);
    if (!st) st = model_hp_float(L, "rope.freq_base_swa", 10000.0f, &base_swa, err);
    if (!st) st = model_hp_float(L, "final_logit_softcapping", 0.0f, &m->x.final_softcap, err);
    if (!st) st = read_count(L, "attention.shared_kv_layers", &n_shared, err);
    if (!st) st = read_count(L, "embedding_length_per_layer_input", &n_pl, err);
    if (st) return st;
    if (n_rot_swa > hd_k_swa || n_rot_swa % 2 != 0)
        return hl_fail(err, HL_ERR_FORMAT,
                       "rope.dimension_count_swa %d must be even and at most the head size %d",
                       n_rot_swa, hd_k_swa);
    if ((int64_t)hp->n_head * hd_k_swa > (1 << 20) || (int64_t)hp->n_head * hd_v_swa > (1 << 20))
        return hl_fail(err, HL_ERR_FORMAT, "attention size is too large");
    const int32_t n_layer = hp->n_layer, n_layer_kv = n_layer - n_shared;
    if (n_shared > 0 && n_layer_kv < 2)
        return hl_fail(err, HL_ERR_FORMAT,
                       "attention.shared_kv_layers %d leaves fewer than 2 of %d layers with KV",
                       n_shared, n_layer);
    if ((int64_t)n_pl * n_layer > (1 << 24))
        return hl_fail(err, HL_ERR_FORMAT, "embedding_length_per_layer_input %d is too large",
                       n_pl);
    m->x.n_embd_per_layer = n_pl;
    m->x.attn_scale = 1.0f;
    for (int32_t l = 0; l < n_layer; l++) {
        model_layer_hp *h = &m->lhp[l];
        if (h->window > 0) {
            h->head_dim_k = hd_k_swa;
            h->head_dim_v = hd_v_swa;
            h->n_rot = n_rot_swa;
            h->rope_base = base_swa;
            h->rope_scale = 1.0f; /* local layers: their own base, no scaling */
        }
    }
    for (int32_t l = n_layer_kv; l < n_layer; l++) {
        model_layer_hp *h = &m->lhp[l];
        const int32_t src = n_layer_kv - (h->window > 0 ? 2 : 1);
        const model_layer_hp *s = &m->lhp[src];
        if ((s->window > 0) != (h->window > 0) || s->head_dim_k != h->head_dim_k ||
            s->head_dim_v != h->head_dim_v || h->n_head % s->n_head_kv != 0)
            return hl_fail(err, HL_ERR_FORMAT,
                           "layer %d shares the KV cache of layer %d, whose attention differs", l,
                           src);
        h->kv_src = src;
        h->n_head_kv = 0; /* no K/V tensors, no cache of its own */
    }
    return HL_OK;
}

/* Global layers rotate with rope_freqs; layers with their own KV need k_norm, and V = K
 * needs equal head sizes. */
static hl_status gemma4_check(model_loader *L, hl_err *err) {
    model *m = L->m;
    for (int32_t l = 0; l < m->hp.n_layer; l++) {
        model_layer_hp *h = &m->lhp[l];
        const model_layer *ly = &m->layers[l];
        if (h->window == 0) h->rope_factors = m->rope_freqs;
        if (m->x.n_embd_per_layer > 0 && !ly->pl_post_norm)
            return hl_fail(err, HL_ERR_FORMAT, "missing tensor 'blk.%d.post_norm.weight'", l);
        if (h->kv_src != l) continue;
        if (!ly->k_norm)
            return hl_fail(err, HL_ERR_FORMAT, "missing tensor 'blk.%d.attn_k_norm.weight'", l);
        if (!ly->wv.data && h->head_dim_v != h->head_dim_k)
            return hl_fail(err, HL_ERR_FORMAT,
                           "layer %d has no attn_v but its value and key sizes differ (%d, %d)", l,
                           h->head_dim_v, h->head_dim_k);
    }
    return HL_OK;
}

const model_arch_desc model_arch_gemma4 = {
    .name = "gemma4", .rope_kind = MODEL_ROPE_NEOX, .read_hparams = gemma4_read_hparams,
    .tensors = gemma4_tensors, .n_tensors = N_SPECS(gemma4_tensors), .check = gemma4_check,
    .extra_floats = gemma4_extra_floats, .forward = gemma4_forward,
};
