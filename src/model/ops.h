/*
 * ops.h - the building blocks every architecture's forward pass is written with.
 *
 * Each op works on the rows of the batch held by a model_ctx (internal.h): n_tok rows,
 * one per token, row t at offset t * width. Ops that need the batch's positions or
 * sequences (embedding lookup, RoPE, attention) read c->tok_id / tok_pos / tok_seq.
 * Matmul ops run on the context's thread pool; the rest are cheap loops on the calling
 * thread. None allocates. A row's result never depends on the other rows of the batch,
 * so a token gets the same bits in any batch (kernels.h).
 */
#ifndef HL_MODEL_OPS_H
#define HL_MODEL_OPS_H

#include "model/internal.h"

/* out[t] = scale * w[tok_id[t]] (scale 0 means 1: no multiply). */
void op_embed(model_ctx *c, const model_weight *w, int32_t n_tok, float scale, float *out);
/* out[t] += w[tok_pos[t]] (absolute position embeddings), or w[row] for every token
 * (a token-type row). Use c->proj as scratch. Positions must be < w->n_rows. */
void op_add_rows_by_pos(model_ctx *c, const model_weight *w, int32_t n_tok, float *out);
void op_add_row(model_ctx *c, const model_weight *w, int64_t row, int32_t n_tok, float *out);

/* RMSNorm of each row; w NULL: no weight (unit). out may equal x. */
void op_rmsnorm(float *out, const float *x, const float *w, int32_t n_tok, int64_t n,
                float eps);
/* LayerNorm of each row with optional weight and bias. out may equal x. */
void op_layernorm(float *out, const float *x, const float *w, const float *b, int32_t n_tok,
                  int64_t n, float eps);
/* RMSNorm over each head of each row (qwen3 / gemma q-k norms). */
void op_head_norm(model_ctx *c, float *x, const float *w, int32_t n_tok, int32_t n_heads,
                  int32_t head_dim, float eps);

/* out = x W^T (+ bias): n_tok rows of w->n_rows. */
void op_linear(model_ctx *c, const model_weight *w, const float *bias, const float *x,
               int32_t n_tok, float *out);
/* Two or three weights over the same input, quantized once (w3 may be NULL); outputs are
 * exactly those of separate op_linear calls without bias. */
void op_linear_many(model_ctx *c, const model_weight *w1, float *out1, const model_weight *w2,
                    float *out2, const model_weight *w3, float *out3, const float *x,
                    int32_t n_tok);
void op_add_bias(float *x, const float *bias, int32_t n_tok, int64_t n); /* bias may be NULL */
void op_add(float *x, const float *y, int64_t n);
void op_scale(float *x, float s, int64_t n);
/* Splits fused rows: src has n_tok rows of (n_a + n_b [+ n_c]) floats. */
void op_split(const float *src, int32_t n_tok, float *a, int64_t n_a, float *b, int64_t n_b,
              float *cc, int64_t n_c);

typedef enum op_act { OP_SILU, OP_GELU_TANH, OP_GELU_ERF } op_act;
void op_act_apply(float *x, int64_t n, op_act act);
/* gate = act(gate) * up, elementwise. */
void op_glu(float *gate, const float *up, int64_t n, op_act act);
/* A gated feed-forward: out = (act(x gate^T) * (x up^T)) down^T, n_ff hidden units a
 * token, held in c->gate and c->up. */
void op_ffn_glu(model_ctx *c, const model_weight *gate, const model_weight *up,
                const model_weight *down, int64_t n_ff, op_act act, const float *x,
                int32_t n_tok, float *out);

/* RoPE over the first n_rot dims of each head (the rest pass through), with the layer's
 * base, scale and frequency factors and the model's scaling kind; neox rotates halves
 * (x[i], x[i + n_rot/2]), else adjacent pairs. */
void op_rope(model_ctx *c, const model_layer_hp *h, bool neox, float *x, int32_t n_tok,
             int32_t n_heads, int32_t head_dim);

typedef struct op_attn {
    int32_t layer;   /* whose cache is read (and written when store) */
    bool store;      /* first write this batch's c->k, c->v into that cache */
    int32_t n_head, n_head_kv, head_dim_k, head_dim_v;
    float scale;     /* applied to q.k */
    float softcap;   /* 0: none; else scores = softcap * tanh(scores / softcap) */
    int32_t window;  /* 0: full; W: keys at p-W+1..p */
    bool causal;     /* false: the whole sequence of this batch */
    const float *sinks; /* per query head: an extra logit in the softmax's denominator */
} op_attn;
/* Attention of c->q ([n_tok][n_head][head_dim_k]) over the cache, into c->att
 * ([n_tok][n_head][head_dim_v]). */
void op_attention(model_ctx *c, const op_attn *a, int32_t n_tok);
/* op_attention's scratch in model_ctx: attn_tmp holds op_attn_tmp_floats(max head dim)
 * floats per pool thread (a key range's partial output); attn_part
 * holds OP_ATTN_PART_FLOATS, the partials of key ranges split across threads. */
int64_t op_attn_tmp_floats(int64_t max_head_dim);
#define OP_ATTN_PART_FLOATS ((int64_t)1 << 19)

/* Mixture-of-experts feed-forward (qwen3moe): per token, softmax over the n_expert logits
 * of router @ x, the top k (ties: the lower expert), their weights renormalised to sum 1;
 * out[t] = sum over the chosen e of w_e * down_e(silu(gate_e x) * up_e x). The experts are
 * 3-D weights (MT_EXPERTS): expert e is rows [e * ne[1], (e + 1) * ne[1]). Tokens are
 * grouped by expert (each expert's matmuls run once over its tokens), experts summed in
 * index order, so a token's result is the same in any batch. scratch: n_tok *
 * op_moe_scratch_floats(...) floats. */
int64_t op_moe_scratch_floats(int64_t n_embd, int32_t n_expert, int64_t n_ff_exp);
void op_moe(model_ctx *c, const model_weight *router, const model_weight *gate,
            const model_weight *up, const model_weight *down, int32_t n_used, const float *x,
            int32_t n_tok, float *out, float *scratch);

/* op_moe with the variations other architectures need (op_moe is op_moe_ex with the
 * zero defaults and no biases). */
typedef enum op_moe_routing {
    OP_MOE_SOFTMAX_NORM = 0, /* softmax over all experts, top k, renormalised (qwen3moe) */
    OP_MOE_TOPK_SOFTMAX,     /* top k of the logits, softmax over those k (gpt-oss) */
} op_moe_routing;
typedef enum op_moe_act {
    OP_MOE_SILU = 0,   /* silu(gate) * up */
    OP_MOE_SWIGLU_OAI, /* gpt-oss: g = min(gate, 7), u = clamp(up, -7, 7),
                        * g * sigmoid(1.702 g) * (u + 1) */
} op_moe_act;
typedef struct op_moe_args {
    const model_weight *router, *gate, *up, *down;
    const float *router_b;               /* [n_expert], added to the logits; or NULL */
    const float *b_gate, *b_up, *b_down; /* per expert ([n_expert][rows]) or NULL; down's
                                          * is added before the expert's weight */
    int32_t n_used;
    op_moe_routing routing;
    op_moe_act act;
} op_moe_args;
void op_moe_ex(model_ctx *c, const op_moe_args *a, const float *x, int32_t n_tok, float *out,
               float *scratch);
/* A DeepSeek-style router for op_moe_gated (deepseek2): per token the scores are the
 * sigmoid (else the softmax) of the router logits; experts are chosen on score + sel_bias
 * (when given; the bias only selects); with n_group > 1 the experts form n_group equal
 * consecutive groups, a group's rank is the sum of its two best selection scores, and only
 * the n_group_used best groups compete; the top n_used then win (ties: the lower index).
 * Their weights are their unbiased scores, divided by their sum when norm (the sum held
 * at least 2^-14), times scale (0: 1). The experts then run as in op_moe. */
typedef struct op_moe_gating {
    bool sigmoid;
    const float *sel_bias; /* [n_expert] or NULL */
    int32_t n_group, n_group_used;
    bool norm;
    float scale;
} op_moe_gating;
#define OP_MOE_MAX_EXPERTS 1024
#define OP_MOE_MAX_GROUPS 256
/* scratch: n_tok * op_moe_gated_scratch_floats(...) floats. */
int64_t op_moe_gated_scratch_floats(int64_t n_embd, int32_t n_expert, int64_t n_ff_exp);
void op_moe_gated(model_ctx *c, const op_moe_gating *gt, const model_weight *router,
                  const model_weight *gate, const model_weight *up, const model_weight *down,
                  int32_t n_used, const float *x, int32_t n_tok, float *out, float *scratch);

/* The final norm / output / softcap steps the driver applies (forward.c) share these. */
void op_softcap(float *x, int64_t n, float cap);

#endif
