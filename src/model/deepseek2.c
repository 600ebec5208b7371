/*
 * deepseek2.c - DeepSeek-V2/V3-style models as GLM-4.7-Flash's GGUF uses them: multi-head
 * latent attention (MLA), leading dense layers, then mixture-of-experts layers with a
 * DeepSeek router and shared experts. Semantics as llama.cpp implements them.
 *
 * Per layer, for a batch of tokens (H heads; per head q and k are [nope | rope], the rope
 * part rotated with NORM (adjacent pair) RoPE; R = kv_lora_rank):
 *   xb = rmsnorm(x) * attn_norm
 *   q = q_b(rmsnorm(q_a xb) * q_a_norm)  (or wq xb)               [H][nope + rope]
 *   [c_kv | k_pe] = kv_a_mqa xb;  c_kv = rmsnorm(c_kv) * kv_a_norm  [R | rope], one k_pe
 *     shared by every head
 *   absorbed (k_b/v_b in the file; key_length_mla set): the cache holds one "head" per
 *     token, K = [c_kv | k_pe], V = c_kv; each head's query is [k_b_h q_nope | q_pe], so
 *     q.k = q_nope . (k_b_h^T c_kv) + q_pe . k_pe; the attention's output o_h (R wide)
 *     becomes v_b_h o_h (v wide)
 *   older files (kv_b): [k_nope | v] per head = kv_b c_kv; the cache holds H full heads
 *     K = [k_nope | k_pe], V = v
 *   scores scaled by mscale^2 / sqrt(nope + rope) (mscale: YaRN's, below); x += att Wo
 *   xb = rmsnorm(x) * ffn_norm; the first leading_dense_block_count layers: a SwiGLU FFN;
 *   the others: x += moe(xb) + shared(xb) (ops.h op_moe_gated: sigmoid or softmax scores,
 *   the selection bias exp_probs_b, expert groups, weights normalised and scaled), the
 *   shared experts one SwiGLU n_ff_exp * expert_shared_count wide.
 *
 * YaRN (llama.cpp's deepseek2): the GGUF's yarn_log_multiplier is 0.1 * mscale_all_dim;
 * with it the rotation keeps unit magnitude and the scores get
 * mscale^2, mscale = 1 + 0.1 * mscale_all_dim * ln(factor); without it the rotation has
 * the usual 1 + 0.1 ln(factor) and the scores that squared.
 */
#include "model/ops.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "kernels/kernels.h"
#include "tensor/types.h"

#define DS2_MAX_EXPERTS OP_MOE_MAX_EXPERTS

/* the architecture's shape codes (model_arch_desc.dim) */
enum {
    DS_Q_LORA = MD_ARCH, /* q_lora_rank (0: a plain wq) */
    DS_Q,                /* n_head * (nope + rope) */
    DS_WQ,               /* that when there is no q_lora, else 0 */
    DS_KV_A,             /* kv_lora + rope */
    DS_KV_LORA,          /* kv_lora */
    DS_NOPE_ABS,         /* nope (absorbed form), else 0 */
    DS_V_ABS,            /* v head (absorbed form), else 0 */
    DS_KV_B,             /* n_head * (nope + v) (older form), else 0 */
    DS_O,                /* n_head * v */
    DS_FF_DENSE,         /* n_ff on the leading dense layers, else 0 */
    DS_EXPERTS,          /* n_expert on expert layers, else 0 */
    DS_FF_EXP,           /* n_ff_exp on expert layers, else 0 */
    DS_FF_SHEXP,         /* n_ff_exp * n_expert_shared on expert layers, else 0 */
};

static bool ds_moe_layer(const model *m, int32_t l) {
    return l >= m->x.n_dense_lead && m->x.n_expert > 0;
}

static int64_t ds_dim(const model *m, int32_t l, uint8_t code) {
    const model_hp_ext *x = &m->x;
    const int64_t H = m->hp.n_head, rope = m->hp.n_rot;
    const bool moe = ds_moe_layer(m, l < 0 ? 0 : l);
    switch (code) {
    case DS_Q_LORA: return x->mla_q_lora;
    case DS_Q: return H * (x->mla_nope + rope);
    case DS_WQ: return x->mla_q_lora ? 0 : H * (x->mla_nope + rope);
    case DS_KV_A: return x->mla_kv_lora + rope;
    case DS_KV_LORA: return x->mla_kv_lora;
    case DS_NOPE_ABS: return x->mla_absorbed ? x->mla_nope : 0;
    case DS_V_ABS: return x->mla_absorbed ? x->mla_v : 0;
    case DS_KV_B: return x->mla_absorbed ? 0 : H * (x->mla_nope + x->mla_v);
    case DS_O: return H * x->mla_v;
    case DS_FF_DENSE: return moe ? 0 : m->lhp[l < 0 ? 0 : l].n_ff;
    case DS_EXPERTS: return moe ? x->n_expert : 0;
    case DS_FF_EXP: return moe ? x->n_ff_exp : 0;
    case DS_FF_SHEXP: return moe ? (int64_t)x->n_ff_exp * x->n_expert_shared : 0;
    default: return -1;
    }
}

/* Per-token scratch: the attention's (full q, q latent, kv latent, per-head gathers, the
 * heads' outputs, kv_b's output) or the experts' (op_moe_gated), never both at once. */
static int64_t ds_extra_floats(const model *m) {
    const model_hp_ext *x = &m->x;
    const int64_t H = m->hp.n_head, rope = m->hp.n_rot;
    const int64_t R = x->mla_kv_lora, nope = x->mla_nope, v = x->mla_v;
    const int64_t wide = R > nope ? (R > v ? R : v) : (nope > v ? nope : v);
    int64_t attn = H * (nope + rope) + x->mla_q_lora + (R + rope) + 2 * wide + H * v;
    if (!x->mla_absorbed) attn += H * (nope + v);
    const int64_t moe =
        x->n_expert ? op_moe_gated_scratch_floats(m->hp.n_embd, x->n_expert, x->n_ff_exp) : 0;
    return attn > moe ? attn : moe;
}

/* out[t][h] = W_h in[t][h] for each head h (in_w wide at in + t * in_stride + h * in_hs,
 * o_w wide at out + t * o_stride + h * o_hs), W_h the rows [h * o_w, (h + 1) * o_w) of w:
 * one matmul per head over the batch, through the gather buffers gin [n_tok][in_w] and
 * gout [n_tok][o_w]. */
static void per_head_linear(model_ctx *c, const model_weight *w, int32_t n_head, const float *in,
                            int64_t in_stride, int64_t in_hs, int64_t in_w, float *out,
                            int64_t o_stride, int64_t o_hs, int64_t o_w, int32_t n_tok,
                            float *gin, float *gout) {
    const size_t row = hl_row_size(w->type, w->n_cols);
    for (int32_t h = 0; h < n_head; h++) {
        for (int32_t t = 0; t < n_tok; t++)
            memcpy(gin + (size_t)t * in_w, in + (size_t)t * in_stride + (size_t)h * in_hs,
                   (size_t)in_w * sizeof *in);
        kern_matmul(c->pool, (hl_type)w->type, (const uint8_t *)w->data + (size_t)h * o_w * row,
                    o_w, in_w, gin, n_tok, gout, c->mm_scratch);
        for (int32_t t = 0; t < n_tok; t++)
            memcpy(out + (size_t)t * o_stride + (size_t)h * o_hs, gout + (size_t)t * o_w,
                   (size_t)o_w * sizeof *out);
    }
}

static void ds_attention(model_ctx *c, int32_t l, int32_t n_tok) {
    const model *m = c->m;
    const model_hp_ext *x = &m->x;
    const model_layer *ly = &m->layers[l];
    const model_layer_hp *h = &m->lhp[l];
    const int64_t E = m->hp.n_embd;
    const float eps = x->norm_eps;
    const int32_t H = m->hp.n_head, rope = m->hp.n_rot;
    const int64_t R = x->mla_kv_lora, nope = x->mla_nope, vd = x->mla_v, dq = nope + rope;
    const int64_t wide = R > nope ? (R > vd ? R : vd) : (nope > vd ? nope : vd);
    float *qf = c->extra;                         /* [n_tok][H][nope + rope] */
    float *qa = qf + (size_t)n_tok * H * dq;      /* [n_tok][q_lora] */
    float *kva = qa + (size_t)n_tok * x->mla_q_lora; /* [n_tok][R + rope] */
    float *gin = kva + (size_t)n_tok * (R + rope);   /* [n_tok][wide] */
    float *gout = gin + (size_t)n_tok * wide;        /* [n_tok][wide] */
    float *ao = gout + (size_t)n_tok * wide;         /* [n_tok][H][v] */
    float *kvb = ao + (size_t)n_tok * H * vd;        /* [n_tok][H][nope + v] (kv_b form) */

    op_rmsnorm(c->xb, c->x, ly->attn_norm, n_tok, E, eps);
    if (x->mla_q_lora) {
        op_linear(c, &ly->wq_a, NULL, c->xb, n_tok, qa);
        op_rmsnorm(qa, qa, ly->q_a_norm, n_tok, x->mla_q_lora, eps);
        op_linear(c, &ly->wq_b, NULL, qa, n_tok, qf);
    } else {
        op_linear(c, &ly->wq, NULL, c->xb, n_tok, qf);
    }
    /* the rope parts: each head's tail of q, the tail of the kv row */
    op_rope(c, h, false, qf + nope, n_tok, H, (int32_t)dq);
    op_linear(c, &ly->wkv_a, NULL, c->xb, n_tok, kva);
    for (int32_t t = 0; t < n_tok; t++) {
        float *r = kva + (size_t)t * (R + rope);
        kern_rmsnorm(r, r, ly->kv_a_norm, R, eps);
    }
    op_rope(c, h, false, kva + R, n_tok, 1, (int32_t)(R + rope));

    op_attn a = {.layer = l, .store = true, .n_head = H, .n_head_kv = h->n_head_kv,
                 .head_dim_k = h->head_dim_k, .head_dim_v = h->head_dim_v,
                 .scale = x->mla_kq_scale, .causal = true};
    if (x->mla_absorbed) {
        /* K = [c_kv | k_pe], V = c_kv; q_h = [k_b_h q_nope_h | q_pe_h] */
        const int64_t dk = R + rope;
        memcpy(c->k, kva, (size_t)n_tok * (size_t)dk * sizeof *c->k);
        for (int32_t t = 0; t < n_tok; t++)
            memcpy(c->v + (size_t)t * R, kva + (size_t)t * dk, (size_t)R * sizeof *c->v);
        per_head_linear(c, &ly->wk_b, H, qf, H * dq, dq, nope, c->q, H * dk, dk, R, n_tok, gin,
                        gout);
        for (int32_t t = 0; t < n_tok; t++)
            for (int32_t hd = 0; hd < H; hd++)
                memcpy(c->q + ((size_t)t * H + hd) * dk + R,
                       qf + ((size_t)t * H + hd) * dq + nope, (size_t)rope * sizeof *c->q);
        op_attention(c, &a, n_tok);
        /* c->att [n_tok][H][R] -> v_b_h per head -> ao [n_tok][H][v] */
        per_head_linear(c, &ly->wv_b, H, c->att, H * R, R, R, ao, H * vd, vd, vd, n_tok, gin,
                        gout);
        op_linear(c, &ly->wo, NULL, ao, n_tok, c->proj);
    } else {
        /* [k_nope | v] per head from the latent; K = [k_nope | k_pe], V = v */
        for (int32_t t = 0; t < n_tok; t++)
            memcpy(gin + (size_t)t * R, kva + (size_t)t * (R + rope), (size_t)R * sizeof *gin);
        op_linear(c, &ly->wkv_b, NULL, gin, n_tok, kvb);
        for (int32_t t = 0; t < n_tok; t++)
            for (int32_t hd = 0; hd < H; hd++) {
                const float *src = kvb + ((size_t)t * H + hd) * (nope + vd);
                float *k = c->k + ((size_t)t * H + hd) * dq;
                memcpy(k, src, (size_t)nope * sizeof *k);
                memcpy(k + nope, kva + (size_t)t * (R + rope) + R, (size_t)rope * sizeof *k);
                memcpy(c->v + ((size_t)t * H + hd) * vd, src + nope, (size_t)vd * sizeof *k);
            }
        memcpy(c->q, qf, (size_t)n_tok * (size_t)(H * dq) * sizeof *c->q);
        op_attention(c, &a, n_tok);
        op_linear(c, &ly->wo, NULL, c->att, n_tok, c->proj);
    }
    op_add(c->x, c->proj, n_tok * E);
}

static void ds_forward(model_ctx *c, int32_t n_tok) {
    const model *m = c->m;
    const model_hp_ext *x = &m->x;
    const int64_t E = m->hp.n_embd;
    const float eps = x->norm_eps;

    op_embed(c, &m->tok_embd, n_tok, 0.0f, c->x);
    for (int32_t l = 0; l < m->hp.n_layer; l++) {
        const model_layer *ly = &m->layers[l];
        ds_attention(c, l, n_tok);

        op_rmsnorm(c->xb, c->x, ly->ffn_norm, n_tok, E, eps);
        if (!ds_moe_layer(m, l)) {
            const int64_t F = m->lhp[l].n_ff;
            op_ffn_glu(c, &ly->w_gate, &ly->w_up, &ly->w_down, F, OP_SILU, c->xb, n_tok, c->proj);
            op_add(c->x, c->proj, n_tok * E);
            continue;
        }
        const op_moe_gating gt = {.sigmoid = x->expert_sigmoid, .sel_bias = ly->exp_probs_b,
                                  .n_group = x->n_expert_groups,
                                  .n_group_used = x->n_expert_groups_used,
                                  .norm = x->expert_norm, .scale = x->expert_scale};
        op_moe_gated(c, &gt, &ly->ffn_gate_inp, &ly->ffn_gate_exps, &ly->ffn_up_exps,
                     &ly->ffn_down_exps, x->n_expert_used, c->xb, n_tok, c->proj, c->extra);
        op_add(c->x, c->proj, n_tok * E);
        if (ly->ffn_gate_shexp.data) {
            const int64_t F = ly->ffn_gate_shexp.n_rows;
            op_ffn_glu(c, &ly->ffn_gate_shexp, &ly->ffn_up_shexp, &ly->ffn_down_shexp, F, OP_SILU,
                       c->xb, n_tok, c->proj);
            op_add(c->x, c->proj, n_tok * E);
        }
    }
}

static const model_tensor_spec ds_tensors[] = {
    MT_EMBD_OUTPUT,
    MT_L("blk.%d.attn_norm.weight", attn_norm, MT_VEC, MD_EMBD, MD_ONE),
    MT_L("blk.%d.attn_q_a.weight", wq_a, MT_MAT, MD_EMBD, DS_Q_LORA),
    MT_L("blk.%d.attn_q_a_norm.weight", q_a_norm, MT_VEC, DS_Q_LORA, MD_ONE),
    MT_L("blk.%d.attn_q_b.weight", wq_b, MT_MAT, DS_Q_LORA, DS_Q),
    MT_L("blk.%d.attn_q.weight", wq, MT_MAT, MD_EMBD, DS_WQ),
    MT_L("blk.%d.attn_kv_a_mqa.weight", wkv_a, MT_MAT, MD_EMBD, DS_KV_A),
    MT_L("blk.%d.attn_kv_a_norm.weight", kv_a_norm, MT_VEC, DS_KV_LORA, MD_ONE),
    MT_L("blk.%d.attn_k_b.weight", wk_b, MT_MAT | MT_HEADS, DS_NOPE_ABS, DS_KV_LORA),
    MT_L("blk.%d.attn_v_b.weight", wv_b, MT_MAT | MT_HEADS, DS_KV_LORA, DS_V_ABS),
    MT_L("blk.%d.attn_kv_b.weight", wkv_b, MT_MAT, DS_KV_LORA, DS_KV_B),
    MT_L("blk.%d.attn_output.weight", wo, MT_MAT, DS_O, MD_EMBD),
    MT_L("blk.%d.ffn_norm.weight", ffn_norm, MT_VEC, MD_EMBD, MD_ONE),
    MT_L("blk.%d.ffn_gate.weight", w_gate, MT_MAT, MD_EMBD, DS_FF_DENSE),
    MT_L("blk.%d.ffn_up.weight", w_up, MT_MAT, MD_EMBD, DS_FF_DENSE),
    MT_L("blk.%d.ffn_down.weight", w_down, MT_MAT, DS_FF_DENSE, MD_EMBD),
    MT_L("blk.%d.ffn_gate_inp.weight", ffn_gate_inp, MT_MAT, MD_EMBD, DS_EXPERTS),
    MT_L("blk.%d.exp_probs_b.bias", exp_probs_b, MT_VEC | MT_OPT, DS_EXPERTS, MD_ONE),
    MT_L("blk.%d.ffn_gate_exps.weight", ffn_gate_exps, MT_MAT | MT_EXPERTS, MD_EMBD, DS_FF_EXP),
    MT_L("blk.%d.ffn_up_exps.weight", ffn_up_exps, MT_MAT | MT_EXPERTS, MD_EMBD, DS_FF_EXP),
    MT_L("blk.%d.ffn_down_exps.weight", ffn_down_exps, MT_MAT | MT_EXPERTS, DS_FF_EXP, MD_EMBD),
    MT_L("blk.%d.ffn_gate_shexp.weight", ffn_gate_shexp, MT_MAT, MD_EMBD, DS_FF_SHEXP),
    MT_L("blk.%d.ffn_up_shexp.weight", ffn_up_shexp, MT_MAT, MD_EMBD, DS_FF_SHEXP),
    MT_L("blk.%d.ffn_down_shexp.weight", ffn_down_shexp, MT_MAT, DS_FF_SHEXP, MD_EMBD),
};

/* An optional non-negative integer key (absent: dflt; 0 allowed). */
static hl_status ds_uint(const model_loader *L, const char *suffix, int32_t dflt, int32_t *out,
                         hl_err *err) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", L->prefix, suffix);
    *out = dflt;
    if (gguf_find_key(L->f, key) < 0) return HL_OK;
    uint32_t u;
    int32_t i;
    if (gguf_get_u32(L->f, key, &u) && u <= (1u << 20)) *out = (int32_t)u;
    else if (gguf_get_i32(L->f, key, &i) && i >= 0 && i <= (1 << 20)) *out = i;
    else
        return hl_fail(err, HL_ERR_FORMAT,
                       "metadata key '%s' is not a small non-negative integer", key);
    return HL_OK;
}

static hl_status ds_read_hparams(model_loader *L, hl_err *err) {
    model *m = L->m;
    model_hp_ext *x = &m->x;
    model_hparams *hp = &m->hp;
    hl_status st;
    int32_t k_mla = 0, v_mla = 0, gating = 0;
    if ((st = ds_uint(L, "attention.q_lora_rank", 0, &x->mla_q_lora, err)) ||
        (st = model_hp_int(L, "attention.kv_lora_rank", true, 0, &x->mla_kv_lora, err)) ||
        (st = ds_uint(L, "attention.key_length_mla", 0, &k_mla, err)) ||
        (st = ds_uint(L, "attention.value_length_mla", 0, &v_mla, err)) ||
        (st = ds_uint(L, "leading_dense_block_count", 0, &x->n_dense_lead, err)) ||
        (st = ds_uint(L, "expert_count", 0, &x->n_expert, err)) ||
        (st = ds_uint(L, "expert_used_count", 0, &x->n_expert_used, err)) ||
        (st = ds_uint(L, "expert_feed_forward_length", 0, &x->n_ff_exp, err)) ||
        (st = ds_uint(L, "expert_shared_count", 0, &x->n_expert_shared, err)) ||
        (st = ds_uint(L, "expert_group_count", 1, &x->n_expert_groups, err)) ||
        (st = ds_uint(L, "expert_group_used_count", 1, &x->n_expert_groups_used, err)) ||
        (st = ds_uint(L, "expert_gating_func", 0, &gating, err)) ||
        (st = model_hp_float(L, "expert_weights_scale", 1.0f, &x->expert_scale, err)))
        return st;
    char key[128];
    snprintf(key, sizeof key, "%s.expert_weights_norm", L->prefix);
    bool norm = false;
    if (gguf_find_key(L->f, key) >= 0 && !gguf_get_bool(L->f, key, &norm))
        return hl_fail(err, HL_ERR_FORMAT, "metadata key '%s' is not a bool", key);
    x->expert_norm = norm;

    /* the per-head parts: key_length_mla / value_length_mla name them in files with the
     * absorbed tensors (key_length / value_length are then the cache's: kv_lora + rope and
     * kv_lora); older files give them as key_length / value_length */
    const int32_t rope = hp->n_rot;
    x->mla_absorbed = k_mla > 0 && v_mla > 0;
    const int32_t dq = x->mla_absorbed ? k_mla : hp->head_dim_k;
    x->mla_v = x->mla_absorbed ? v_mla : hp->head_dim_v;
    x->mla_nope = dq - rope;
    if (x->mla_nope < 1 || rope < 2)
        return hl_fail(err, HL_ERR_FORMAT,
                       "%s: key length %d must exceed rope.dimension_count %d", L->prefix, dq,
                       rope);
    if (x->mla_absorbed && (hp->head_dim_k != x->mla_kv_lora + rope ||
                            hp->head_dim_v != x->mla_kv_lora))
        return hl_fail(err, HL_ERR_FORMAT,
                       "%s: attention.key_length %d / value_length %d must be kv_lora_rank + "
                       "rope (%d) / kv_lora_rank (%d) with key_length_mla",
                       L->prefix, hp->head_dim_k, hp->head_dim_v, x->mla_kv_lora + rope,
                       x->mla_kv_lora);

    /* the router: expert_gating_func 1 softmax, 2 sigmoid; absent: softmax, except the
     * GLM-4.7-Flash files that predate the key (47/48 layers, 154880 tokens), as llama.cpp */
    if (gating == 0) {
        const gguf_tensor *te = gguf_find_tensor(L->f, "token_embd.weight");
        gating = (hp->n_layer == 47 || hp->n_layer == 48) && te && te->ne[1] == 154880 ? 2 : 1;
    }
    if (gating != 1 && gating != 2)
        return hl_fail(err, HL_ERR_UNSUPPORTED, "%s: unsupported expert_gating_func %d",
                       L->prefix, gating);
    x->expert_sigmoid = gating == 2;
    if (x->n_dense_lead > hp->n_layer) x->n_dense_lead = hp->n_layer;
    if (x->n_dense_lead < hp->n_layer) {
        if (x->n_expert < 1 || x->n_expert > DS2_MAX_EXPERTS || x->n_expert_used < 1 ||
            x->n_expert_used > x->n_expert || x->n_ff_exp < 1 || x->n_expert_groups < 1 ||
            x->n_expert_groups > OP_MOE_MAX_GROUPS || x->n_expert % x->n_expert_groups != 0 ||
            x->n_expert_groups_used < 1 || x->n_expert_groups_used > x->n_expert_groups ||
            (int64_t)x->n_expert_groups_used * (x->n_expert / x->n_expert_groups) <
                x->n_expert_used)
            return hl_fail(err, HL_ERR_FORMAT,
                           "%s: bad expert hyperparameters (expert_count %d, expert_used_count "
                           "%d, expert_feed_forward_length %d, expert_group_count %d, "
                           "expert_group_used_count %d)",
                           L->prefix, x->n_expert, x->n_expert_used, x->n_ff_exp,
                           x->n_expert_groups, x->n_expert_groups_used);
    } else {
        x->n_expert = 0; /* no expert layer: the expert tensors must be absent */
    }

    /* YaRN's score scale (see the top of this file) */
    float log_mul = 0.0f;
    snprintf(key, sizeof key, "%s.rope.scaling.yarn_log_multiplier", L->prefix);
    if (gguf_find_key(L->f, key) >= 0 &&
        (!gguf_get_f32(L->f, key, &log_mul) || !(log_mul >= 0.0f && log_mul < 100.0f)))
        return hl_fail(err, HL_ERR_FORMAT, "metadata key '%s' is not a valid float", key);
    log_mul /= 0.1f; /* the converter stored 0.1 * mscale_all_dim */
    float mscale = 1.0f;
    if (x->rope_scaling == MODEL_ROPE_SCALING_YARN && hp->rope_freq_scale < 1.0f) {
        const float lf = logf(1.0f / hp->rope_freq_scale);
        const float raf = x->rope_attn_factor;
        /* llama.cpp: yarn_attn_factor 1 with a log multiplier, else 1 + 0.1 ln f; the rope
         * kernel multiplies by 1 + 0.1 ln f again, which the context divides out */
        const float pre = log_mul != 0.0f ? 1.0f : 1.0f + 0.1f * lf;
        x->rope_attn_factor = pre / (1.0f + 0.1f * lf) * raf;
        const float org = x->rope_attn_factor * (1.0f + 0.1f * lf);
        mscale = org * (1.0f + 0.1f * log_mul * lf);
    }
    x->mla_kq_scale = mscale * mscale / sqrtf((float)dq);

    for (int32_t l = 0; l < hp->n_layer; l++) {
        model_layer_hp *h = &m->lhp[l];
        if (x->mla_absorbed) {
            h->n_head_kv = 1;
            h->head_dim_k = x->mla_kv_lora + rope;
            h->head_dim_v = x->mla_kv_lora;
        } else {
            h->n_head_kv = hp->n_head;
            h->head_dim_k = dq;
            h->head_dim_v = x->mla_v;
        }
        /* expert layers: c->gate / c->up hold the shared experts */
        if (ds_moe_layer(m, l)) h->n_ff = x->n_ff_exp * x->n_expert_shared;
    }
    hp->n_head_kv = m->lhp[0].n_head_kv;
    return HL_OK;
}

const model_arch_desc model_arch_deepseek2 = {
    .name = "deepseek2", .rope_kind = MODEL_ROPE_NORM, .read_hparams = ds_read_hparams,
    .tensors = ds_tensors, .n_tensors = (int32_t)(sizeof ds_tensors / sizeof ds_tensors[0]),
    .extra_floats = ds_extra_floats, .forward = ds_forward, .dim = ds_dim,
};
