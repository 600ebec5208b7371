/*
 * internal.h - what the files of src/model/ share: the model and its weights, the
 * per-layer hyperparameters, the evaluation context, and the architecture descriptor.
 * Not for use outside src/model/.
 *
 * An architecture is one file (llama.c, gemma.c, ...) that defines a model_arch_desc: its
 * GGUF names, a hyperparameter reader, a tensor table (data: names, shapes, required or
 * optional), and a forward pass written on the shared ops of ops.h. model.c loads any
 * registered architecture by walking its table; forward.c drives evaluation (batches,
 * KV views, logits, pooling) and calls the architecture's forward for the layers.
 *
 * The model owns its file mapping, weight table and tokenizer; model_free() releases them.
 */
#ifndef HL_MODEL_INTERNAL_H
#define HL_MODEL_INTERNAL_H

#include <stdalign.h>

#include "base/file.h"
#include "base/pool.h"
#include "kv/layout.h"
#include "model/model.h"

/* A weight of up to 4 dims (GGUF order: ne[0] is the row length). As a matrix it has
 * n_rows = ne[1]*ne[2]*ne[3] rows of n_cols = ne[0] elements of `type`, row-major. */
typedef struct model_weight {
    uint32_t type;
    int64_t n_rows;
    int64_t n_cols;
    int64_t ne[4];
    const void *data;
} model_weight;

/* Every tensor any architecture's layer may have; each architecture's table says which
 * it loads (unused ones stay zero). Vectors are f32. */
typedef struct model_layer {
    const float *attn_norm, *attn_norm_b;
    model_weight wq, wk, wv, wo, wqkv;
    const float *bq, *bk, *bv, *bo, *bqkv;
    const float *q_norm, *k_norm;    /* per-head RMSNorm weights */
    const float *post_attn_norm, *post_attn_norm_b; /* gemma: sandwich; bert: post-LN */
    const float *ffn_norm, *ffn_norm_b;
    model_weight w_gate, w_up, w_down;
    const float *b_up, *b_down;
    const float *post_ffn_norm, *post_ffn_norm_b;
    const float *layer_out_scale;    /* gemma4: one float */
    model_weight pl_gate, pl_proj;   /* gemma4: per-layer input gate and projection */
    const float *pl_post_norm;
    /* qwen35 Gated DeltaNet: z (output gate), beta and alpha projections, conv kernel
     * [channels][kernel], dt bias, A (-exp(A_log)), the gated norm, the output */
    model_weight ssm_z, ssm_beta, ssm_alpha, ssm_out;
    const float *ssm_conv1d, *ssm_dt_b, *ssm_a, *ssm_norm;
    /* Mamba-2 (and lfm2's short conv): the input projection (mamba2: [z | xBC | dt];
     * lfm2: [B | C | x]), the conv bias and the per-head skip D */
    model_weight ssm_in;
    const float *ssm_conv1d_b, *ssm_d;
    /* mixture of experts: the router [n_expert][n_embd] and the experts' gate, up and
     * down stacked (MT_EXPERTS: expert e's rows start at row e * ne[1]) */
    model_weight ffn_gate_inp, ffn_gate_exps, ffn_up_exps, ffn_down_exps;
    /* gpt-oss: the router's bias [n_expert], the experts' biases ([n_expert][n_ff_exp] for
     * gate and up, [n_expert][n_embd] for down), per-head attention sinks */
    const float *ffn_gate_inp_b, *b_gate_exps, *b_up_exps, *b_down_exps;
    const float *attn_sinks;
    /* a shared expert (qwen35moe): its SwiGLU and the gate vector [n_embd] whose dot with
     * the input, through a sigmoid, scales it */
    model_weight ffn_gate_shexp, ffn_up_shexp, ffn_down_shexp;
    const float *ffn_gate_inp_shexp;
    /* deepseek2 multi-head latent attention: q down-projection, its norm and up-projection
     * (or a plain wq), the kv down-projection with the shared rope key (kv_a_mqa) and its
     * norm, the per-head up-projections of the latent to k_nope (k_b) and v (v_b), or the
     * fused older form (kv_b); the router's selection bias and a SwiGLU shared expert */
    model_weight wq_a, wq_b, wkv_a, wk_b, wv_b, wkv_b;
    const float *q_a_norm, *kv_a_norm;
    const float *exp_probs_b;
} model_layer;

/* What a layer's attention and feed-forward look like (most models: the same for all). */
typedef struct model_layer_hp {
    int32_t n_head, n_head_kv; /* n_head_kv 0: no KV of its own (reads kv_src's) */
    int32_t head_dim_k, head_dim_v;
    int32_t n_ff;
    int32_t n_rot;        /* leading dims of each head that RoPE rotates */
    float rope_base;
    float rope_scale;     /* 1 / linear factor */
    const float *rope_factors; /* per-pair frequency divisors [n_rot/2], or NULL */
    int32_t window;       /* 0: full attention; W: keys at p-W+1..p */
    int32_t kv_src;       /* layer whose cache this layer's attention reads */
    /* Recurrent layers (short conv, SSM, delta rule): floats of state this layer keeps
     * per sequence, at state_off in the sequence's state buffer. 0: none. */
    int64_t state_floats;
    int64_t state_off;
} model_layer_hp;

typedef enum model_rope_scaling {
    MODEL_ROPE_SCALING_NONE = 0,
    MODEL_ROPE_SCALING_LINEAR,
    MODEL_ROPE_SCALING_YARN,
    MODEL_ROPE_SCALING_LONGROPE,
} model_rope_scaling;

/* Hyperparameters beyond the public ones, read by the loader or the architecture. */
typedef struct model_hp_ext {
    float norm_eps;       /* RMS or LayerNorm epsilon, as the architecture uses it */
    bool layer_norm;      /* the file names a LayerNorm epsilon (BERT), not an RMS one */
    bool causal;          /* false: every token sees its whole sequence (BERT) */
    float embd_scale;     /* token embeddings are multiplied by this (gemma: sqrt(n_embd)) */
    float attn_softcap;   /* 0: none */
    float final_softcap;  /* 0: none */
    float attn_scale;     /* 0: 1/sqrt(head_dim_k) */
    model_rope_scaling rope_scaling;
    float rope_attn_factor;   /* cos/sin multiplier (longrope, yarn mscale) */
    int32_t n_ctx_orig;       /* rope.scaling.original_context_length */
    float yarn_ext_factor, yarn_beta_fast, yarn_beta_slow;
    int32_t n_embd_per_layer; /* gemma4 per-layer inputs */
    int32_t n_token_types;    /* BERT token types */
    /* {arch}.ssm.*: recurrent mixers (qwen35's Gated DeltaNet) */
    int32_t ssm_d_conv, ssm_d_inner, ssm_d_state, ssm_dt_rank, ssm_n_group;
    /* {arch}.expert_*: mixture-of-experts feed-forward (qwen3moe) */
    int32_t n_expert, n_expert_used, n_ff_exp;
    int32_t n_ff_shexp; /* expert_shared_feed_forward_length (0: no shared expert) */
    /* deepseek2: MLA ranks and head parts (mla_absorbed: k_b/v_b, the latent is cached;
     * else kv_b, full heads are cached), the leading dense layers, the DeepSeek router */
    int32_t mla_q_lora, mla_kv_lora, mla_nope, mla_v;
    bool mla_absorbed;
    int32_t n_dense_lead, n_expert_shared, n_expert_groups, n_expert_groups_used;
    bool expert_sigmoid, expert_norm;
    float expert_scale;
    float mla_kq_scale; /* the attention's score scale (YaRN's mscale^2 / sqrt(head)) */
} model_hp_ext;

struct model_arch_desc;

struct model {
    model_hparams hp;
    model_hp_ext x;
    const struct model_arch_desc *arch;
    model_layer_hp *lhp; /* [n_layer] */
    model_weight tok_embd; /* n_vocab rows of n_embd */
    const float *output_norm, *output_norm_b; /* NULL: no final norm */
    model_weight output; /* == tok_embd when tied; no data: an embedding model */
    const float *rope_freqs; /* optional per-frequency divisors [n_rot/2], else NULL */
    const float *rope_long, *rope_short; /* phi3 longrope factors */
    model_weight pos_embd, type_embd;    /* BERT */
    const float *embd_norm, *embd_norm_b;
    model_weight pl_tok_embd, pl_model_proj; /* gemma4 */
    const float *pl_proj_norm;
    model_layer *layers;
    kv_geom kv; /* f32 geometry of this model's KV (per-layer heads and sizes) */
    /* Cache slots: slot 0 the full-attention layers, slot 1 (when the model has
     * sliding-window layers) the windowed ones, each geometry giving the other slot's
     * layers no storage. layer_slot[l]: the slot holding the cache layer l reads. */
    int32_t n_kv_slots;
    int32_t kv_window;  /* the windowed slot's W (the largest window) */
    kv_geom kv_slot[2];
    uint8_t *layer_slot; /* [n_layer] */
    int64_t state_floats; /* recurrent state per sequence, all layers (model_build_kv_geom) */
    /* every loaded matmul weight and the bytes of all loaded tensors: what
     * model_weight_bytes and the context's scratch size iterate */
    const model_weight **mats;
    int32_t n_mats;
    size_t tensor_bytes;
    tok_vocab *vocab;
    gguf_file *gguf; /* owned, for GGUF models */
    hl_map map;      /* owned, for llama2.c checkpoints */
};

/* ---- evaluation context (forward.c) ---- */

#define MODEL_ROPE_TABLES 4

/* cos/sin of one RoPE configuration for every token of the batch. */
typedef struct model_rope_table {
    bool valid;
    int32_t n_rot;
    float base, scale, attn_factor;
    const float *factors;
    float *cos, *sin; /* [max_batch][max_rot/2] */
} model_rope_table;

/* The largest key head a q8_0 cache takes (attention quantizes q on the stack). */
#define MODEL_KV_Q8_MAX_HEAD_DIM 1024
/* KV geometries a context remembers as checked (model_ctx.geom_ok) */
#define MODEL_GEOM_SEEN 8

/* The KV buffers of one sequence as the forward pass sees them. */
typedef struct model_seq_kv {
    void *const *blocks;
    int32_t B;
    int32_t len;
    const kv_geom *geom;
} model_seq_kv;

/* One view per cache slot; a caller that keeps every layer in one buffer (the combined
 * geometry m->kv) gives the same view for both. state: the sequence's recurrent state
 * (m->state_floats floats, as of position len), or NULL for a model without one. */
typedef struct model_seq_views {
    model_seq_kv slot[2];
    float *state;
} model_seq_views;

struct model_ctx {
    const model *m;
    hl_pool *pool;
    int32_t max_batch;
    /* activations, max_batch rows each (sizes: the largest layer's) */
    float *x;    /* residual stream [B][n_embd] */
    float *xb;   /* normed input of a block [B][n_embd] */
    float *xc;   /* a second [B][n_embd] (sandwich norms, BERT post-LN) */
    float *q;    /* [B][max q] */
    float *k;    /* [B][max k] */
    float *v;    /* [B][max v] */
    float *att;  /* attention output [B][max n_head * head_dim_v] */
    float *proj; /* output of Wo / Wdown [B][n_embd] */
    float *gate; /* [B][max(n_ff, fused widths)] */
    float *up;   /* [B][max n_ff] */
    float *extra; /* [B][extra_floats]: the architecture's own per-token scratch */
    int64_t extra_floats;
    model_rope_table rope[MODEL_ROPE_TABLES];
    int32_t max_rot;
    float *head_tmp; /* [max head dim] */
    /* op_attention's (ops.h): per pool thread attn_tmp_floats; key-range partials */
    float *attn_tmp, *attn_part;
    size_t attn_tmp_floats, attn_part_floats;
    float *logits;   /* [n_vocab], the last token's */
    /* the batch: per token its id, position and sequence; per sequence its KV and the
     * end of its tokens in this batch (exclusive position) */
    int32_t *tok_id, *tok_pos, *tok_seq;
    model_seq_views *seq_kv;
    int32_t *seq_end;
    /* the batch's sequences: n_seq of them, sequence e's tokens are rows
     * [seq_first[e], seq_first[e + 1]) in position order (recurrent layers walk them) */
    int32_t n_seq;
    int32_t *seq_first; /* [max_batch + 1] */
    int32_t *logit_rows;
    /* the per-sequence context size: as the caller set it (model_ctx_set_n_ctx, 0: not
     * set), and as the batch being evaluated sees it (that, else the model_kv's capacity,
     * else 0: unknown). RoPE that depends on it (phi3 longrope) reads n_ctx_eval. */
    int32_t n_ctx_set, n_ctx_eval;
    void *mm_scratch;
    size_t scratch_bytes;
    /* KV geometries (a pool's) that passed the full per-layer check against `want`: a
     * later batch on the same one compares only these fields (forward.c, check_view) */
    struct {
        const kv_geom *g, *want;
        const kv_layer_dims *dims;
        int32_t n_layer;
        hl_type k_type, v_type;
    } geom_ok[MODEL_GEOM_SEEN];
    int32_t n_geom_ok; /* how many were ever added (the slot of the next: modulo) */
};

/* ---- architecture descriptor ---- */

typedef struct model_loader {
    const gguf_file *f;
    const char *prefix; /* metadata key prefix: the GGUF's general.architecture */
    model *m;
} model_loader;

/* Shape codes of the tensor table, resolved per layer (model.c: model_dim). */
enum {
    MD_ONE = 0,
    MD_EMBD,
    MD_VOCAB,
    MD_FF,      /* the layer's n_ff */
    MD_Q,       /* n_head * head_dim_k */
    MD_KVK,     /* n_head_kv * head_dim_k */
    MD_KVV,     /* n_head_kv * head_dim_v */
    MD_O,       /* n_head * head_dim_v */
    MD_HEAD_K,  /* head_dim_k */
    MD_ROT2,    /* n_rot / 2 (of the hparams) */
    MD_QKV,     /* Q + KVK + KVV */
    MD_FF2,     /* 2 * n_ff (fused gate|up) */
    MD_CTX,     /* n_ctx_train */
    MD_TYPES,   /* token types */
    MD_PL,      /* n_embd_per_layer */
    MD_PL_ALL,  /* n_embd_per_layer * n_layer */
    MD_Q2,      /* 2 * n_head * head_dim_k (q with a gate per head) */
    /* recurrent layers only (lhp state_floats > 0; 0 elsewhere), from x.ssm_*: */
    MD_SSM_CONV_K,  /* conv kernel */
    MD_SSM_CONV_CH, /* conv channels: d_inner + 2 * n_group * d_state */
    MD_SSM_INNER,   /* d_inner */
    MD_SSM_HEADS,   /* dt_rank (value heads) */
    MD_SSM_HEAD_V,  /* d_inner / dt_rank */
    MD_EXPERTS,     /* x.n_expert */
    MD_FF_EXP,      /* x.n_ff_exp */
    MD_HEADS,       /* the layer's n_head (attention sinks) */
    MD_FF_SHEXP,    /* x.n_ff_shexp */
    /* recurrent layers only (0 elsewhere): */
    MD_SSM_INNER3,  /* 3 * d_inner (lfm2's in_proj: B | C | x) */
    MD_SSM_IN_M2,   /* 2 * d_inner + 2 * n_group * d_state + dt_rank (mamba2's in_proj) */
    MD_SSM_GROUPS,  /* n_group */
    MD_SSM_GROUP_INNER, /* d_inner / n_group (mamba2's grouped norm) */
    /* codes from MD_ARCH on are the architecture's own (model_arch_desc.dim) */
    MD_ARCH = 64,
};

enum {
    MT_MAT = 0,      /* a matmul weight */
    MT_EMB = 1,      /* rows read one at a time (dequantized): embeddings */
    MT_VEC = 2,      /* f32 vector */
    MT_LAYER = 1 << 4, /* per layer: the name has "%d" for the layer index */
    MT_OPT = 1 << 5,   /* may be absent */
    MT_EXPERTS = 1 << 6, /* a 3-D matmul weight {ne0, ne1, x.n_expert}: one matrix per expert */
    MT_HEADS = 1 << 7,   /* a 3-D matmul weight {ne0, ne1, the layer's n_head}: one per head */
};

typedef struct model_tensor_spec {
    const char *name;
    uint16_t off;  /* offsetof(model_layer, f) for MT_LAYER, else offsetof(struct model, f) */
    uint8_t flags; /* kind | MT_LAYER | MT_OPT */
    uint8_t ne0, ne1; /* shape codes */
} model_tensor_spec;

#define MT_G(name, field, fl, a, b) {name, offsetof(struct model, field), (fl), (a), (b)}
#define MT_L(name, field, fl, a, b) {name, offsetof(model_layer, field), (fl) | MT_LAYER, (a), (b)}

/* Rows that many tables share word for word (GGUF's common names), to splice into a
 * table: the embeddings, final norm and optional output projection; */
#define MT_EMBD_OUTPUT                                                                      \
    MT_G("token_embd.weight", tok_embd, MT_EMB, MD_EMBD, MD_VOCAB),                         \
    MT_G("output_norm.weight", output_norm, MT_VEC, MD_EMBD, MD_ONE),                       \
    MT_G("output.weight", output, MT_MAT | MT_OPT, MD_EMBD, MD_VOCAB)
/* the attention's q, k, v and output projections (no biases); */
#define MT_ATTN_QKVO                                                                        \
    MT_L("blk.%d.attn_q.weight", wq, MT_MAT, MD_EMBD, MD_Q),                                \
    MT_L("blk.%d.attn_k.weight", wk, MT_MAT, MD_EMBD, MD_KVK),                              \
    MT_L("blk.%d.attn_v.weight", wv, MT_MAT, MD_EMBD, MD_KVV),                              \
    MT_L("blk.%d.attn_output.weight", wo, MT_MAT, MD_O, MD_EMBD)
/* a gated feed-forward's gate, up and down projections; */
#define MT_FFN_GLU                                                                          \
    MT_L("blk.%d.ffn_gate.weight", w_gate, MT_MAT, MD_EMBD, MD_FF),                         \
    MT_L("blk.%d.ffn_up.weight", w_up, MT_MAT, MD_EMBD, MD_FF),                             \
    MT_L("blk.%d.ffn_down.weight", w_down, MT_MAT, MD_FF, MD_EMBD)
/* the experts' stacked gate, up and down projections (x.n_ff_exp rows each). */
#define MT_FFN_EXPS                                                                         \
    MT_L("blk.%d.ffn_gate_exps.weight", ffn_gate_exps, MT_MAT | MT_EXPERTS, MD_EMBD,        \
         MD_FF_EXP),                                                                        \
    MT_L("blk.%d.ffn_up_exps.weight", ffn_up_exps, MT_MAT | MT_EXPERTS, MD_EMBD, MD_FF_EXP), \
    MT_L("blk.%d.ffn_down_exps.weight", ffn_down_exps, MT_MAT | MT_EXPERTS, MD_FF_EXP,      \
         MD_EMBD)

typedef struct model_arch_desc {
    const char *name;
    const char *const *aliases; /* other general.architecture values, NULL-terminated */
    model_rope_kind rope_kind;
    bool no_output;             /* an embedding model: no output projection */
    bool ffn_optional;          /* feed_forward_length may be 0 (mamba2: no feed-forward) */
    /* After the common keys are read (model.c: hp, lhp filled uniformly): the
     * architecture's own keys and per-layer differences. May be NULL. */
    hl_status (*read_hparams)(model_loader *L, hl_err *err);
    const model_tensor_spec *tensors;
    int32_t n_tensors;
    /* After the table is loaded: checks across tensors (may be NULL). */
    hl_status (*check)(model_loader *L, hl_err *err);
    /* Per-token floats of c->extra this architecture needs (may be NULL: none). */
    int64_t (*extra_floats)(const model *m);
    /* Runs the layers over the batch described in c (tok_id/pos/seq, seq_kv): from token
     * ids to the last layer's residual stream in c->x. The driver then applies the output
     * norm, the output matmul and the final softcap. */
    void (*forward)(model_ctx *c, int32_t n_tok);
    /* The value of the architecture's own shape codes (>= MD_ARCH) for layer l (-1: a
     * global tensor); 0: the layer has no such tensor. May be NULL. */
    int64_t (*dim)(const model *m, int32_t l, uint8_t code);
} model_arch_desc;

extern const model_arch_desc model_arch_llama, model_arch_qwen2, model_arch_qwen3;
extern const model_arch_desc model_arch_gemma2, model_arch_gemma3;
extern const model_arch_desc model_arch_gemma4;
extern const model_arch_desc model_arch_bert, model_arch_nomic_bert;
extern const model_arch_desc model_arch_phi3;
extern const model_arch_desc model_arch_qwen35;
extern const model_arch_desc model_arch_qwen3moe;
extern const model_arch_desc model_arch_lfm2;
extern const model_arch_desc model_arch_mamba2, model_arch_nemotron_h;
extern const model_arch_desc model_arch_gptoss;
extern const model_arch_desc model_arch_qwen35moe;
extern const model_arch_desc model_arch_deepseek2;

/* llama.c: the llama family's attention sublayer for layer l (x += attn(rmsnorm(x)) with
 * optional q/k/v/o biases, per-head q/k norms and attention sinks, the layer's sliding
 * window, rope of the model's kind), for architectures that share it (qwen3moe, gpt-oss). */
void model_llama_attention(model_ctx *c, int32_t l, int32_t n_tok);

/* qwen3moe.c: reads {arch}.expert_count, expert_used_count and expert_feed_forward_length
 * into m->x and checks them; all are required, except the last when n_ff_exp_dflt > 0
 * (Mixtral's experts are feed_forward_length wide). */
hl_status model_hp_experts(model_loader *L, int32_t n_ff_exp_dflt, hl_err *err);

/* Records a loaded matmul weight (for model_weight_bytes' companions and scratch sizes). */
hl_status model_add_mat(model *m, const model_weight *w, hl_err *err);
/* Builds m->kv from m->lhp (after loading). */
hl_status model_build_kv_geom(model *m, hl_err *err);

/* model.c helpers for architectures' read_hparams */
hl_status model_hp_int(const model_loader *L, const char *suffix, bool required, int32_t dflt,
                       int32_t *out, hl_err *err);
hl_status model_hp_float(const model_loader *L, const char *suffix, float dflt, float *out,
                         hl_err *err);
/* A per-layer array (or one value for all layers) of ints or bools. */
hl_status model_hp_layer_ints(const model_loader *L, const char *suffix, int32_t *out,
                              bool *present, hl_err *err);
/* {arch}.attention.sliding_window W and its pattern (an int n: layer l is local iff
 * l % n < n - 1, llama.cpp's rule; or a bool per layer, true = local): sets lhp[].window.
 * default_pattern applies when the key is absent. No window key: nothing changes. */
hl_status model_hp_sliding_window(model_loader *L, int32_t default_pattern, hl_err *err);

#endif
