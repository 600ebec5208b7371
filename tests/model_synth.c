/*
 * model_synth.c - see model_synth.h.
 */
#include "model_synth.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct mat {
    int rows, cols;
    float *w; /* rows x cols, as the model sees the weights (dequantized) */
} mat;

typedef struct ref_layer {
    float *attn_norm, *ffn_norm, *bq, *bk, *bv, *q_norm, *k_norm;
    mat wq, wk, wv, wo, gate, up, down;
    mat router, gate_exps, up_exps, down_exps; /* experts: n_expert stacked matrices */
} ref_layer;

struct synth_model {
    synth_cfg cfg;
    int hd, n_rot;
    mat emb, out;
    float *out_norm;
    float *rope_freqs; /* NULL unless cfg.rope_freqs */
    ref_layer *layers;
};

static uint64_t rng_next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static float rng_unit(uint64_t *s) { /* [-1, 1) */
    return (float)((double)(rng_next(s) >> 11) * 0x1.0p-53 * 2.0 - 1.0);
}

static float *rand_vec(uint64_t *rng, int n, float center, float spread) {
    float *v = malloc((size_t)n * sizeof *v);
    for (int i = 0; i < n; i++) v[i] = center + spread * rng_unit(rng);
    return v;
}

static bool want(const synth_cfg *c, const char *name) {
    return !c->skip_tensor || strcmp(c->skip_tensor, name) != 0;
}

static void add_vec(gguf_writer *w, const synth_cfg *c, const char *name, const float *v, int n) {
    if (!want(c, name)) return;
    int64_t ne[1] = {n};
    hl_err err;
    gguf_writer_add_tensor(w, name, HL_TYPE_F32, 1, ne, v, (uint64_t)n * 4, &err);
}

/* Random matrix in cfg->wtype (returned; the caller frees it); m->w gets the dequantized
 * values. */
static uint8_t *gen_mat(const synth_cfg *c, uint64_t *rng, int rows, int cols, mat *m) {
    m->rows = rows;
    m->cols = cols;
    float *src = rand_vec(rng, rows * cols, 0.0f, 1.5f / sqrtf((float)cols));
    hl_type t = c->wtype;
    size_t row = hl_row_size(t, cols);
    uint8_t *q = malloc(row * (size_t)rows);
    m->w = malloc((size_t)rows * (size_t)cols * sizeof(float));
    for (int r = 0; r < rows; r++) {
        if (t == HL_TYPE_F32) memcpy(q + row * (size_t)r, src + (size_t)r * cols, row);
        else hl_quantize_row(t, src + (size_t)r * cols, q + row * (size_t)r, cols);
        hl_dequantize_row(t, q + row * (size_t)r, m->w + (size_t)r * cols, cols);
    }
    free(src);
    return q;
}

/* n_exp experts of rows x cols as one 3-D tensor {cols, rows, n_exp}; m holds them
 * stacked (n_exp * rows rows). same: every expert is this matrix instead of random ones
 * (dequantized values; its quantized bytes in same_q). */
static void add_experts(gguf_writer *w, const synth_cfg *c, uint64_t *rng, const char *name,
                        int n_exp, int rows, int cols, const mat *same, const uint8_t *same_q,
                        mat *m) {
    const size_t row = hl_row_size(c->wtype, cols), one = row * (size_t)rows;
    uint8_t *q;
    if (same) {
        q = malloc(one * (size_t)n_exp);
        m->rows = rows * n_exp;
        m->cols = cols;
        m->w = malloc((size_t)m->rows * (size_t)cols * sizeof(float));
        for (int e = 0; e < n_exp; e++) {
            memcpy(q + one * (size_t)e, same_q, one);
            memcpy(m->w + (size_t)e * rows * cols, same->w, (size_t)rows * cols * sizeof(float));
        }
    } else {
        q = gen_mat(c, rng, rows * n_exp, cols, m);
    }
    if (want(c, name)) {
        int64_t ne[3] = {cols, rows, n_exp};
        hl_err err;
        gguf_writer_add_tensor(w, name, c->wtype, 3, ne, q, one * (size_t)n_exp, &err);
    }
    free(q);
}

/* Random matrix, stored in cfg->wtype; m->w gets the dequantized values. */
static void add_mat(gguf_writer *w, const synth_cfg *c, uint64_t *rng, const char *name, int rows,
                    int cols, mat *m) {
    hl_type t = c->wtype;
    size_t row = hl_row_size(t, cols);
    uint8_t *q = gen_mat(c, rng, rows, cols, m);
    if (want(c, name)) {
        int extra = c->bad_shape_tensor && strcmp(c->bad_shape_tensor, name) == 0 ? 1 : 0;
        int64_t ne[2] = {cols, rows + extra};
        uint8_t *data = q;
        if (extra) {
            data = calloc((size_t)(rows + 1), row);
            memcpy(data, q, row * (size_t)rows);
        }
        hl_err err;
        if (t == HL_TYPE_F32 && c->i32_tensor && strcmp(c->i32_tensor, name) == 0)
            t = HL_TYPE_I32; /* same size per element */
        gguf_writer_add_tensor(w, name, t, 2, ne, data, row * (size_t)(rows + extra), &err);
        if (extra) free(data);
    }
    free(q);
}

void synth_write_vocab(gguf_writer *w, int n_vocab) {
    char **toks = malloc((size_t)n_vocab * sizeof *toks);
    float *scores = malloc((size_t)n_vocab * sizeof *scores);
    int32_t *types = malloc((size_t)n_vocab * sizeof *types);
    for (int i = 0; i < n_vocab; i++) {
        toks[i] = malloc(32);
        if (i == 0) snprintf(toks[i], 32, "<unk>");
        else if (i == 1) snprintf(toks[i], 32, "<s>");
        else if (i == 2) snprintf(toks[i], 32, "</s>");
        else snprintf(toks[i], 32, "\xe2\x96\x81w%d", i);
        scores[i] = (float)-i;
        types[i] = i == 0 ? 2 : i < 3 ? 3 : 1;
    }
    gguf_writer_set_str(w, "tokenizer.ggml.model", "llama");
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)toks,
                            (uint64_t)n_vocab);
    gguf_writer_set_arr(w, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, scores, (uint64_t)n_vocab);
    gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, types, (uint64_t)n_vocab);
    gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 1);
    gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 2);
    gguf_writer_set_u32(w, "tokenizer.ggml.unknown_token_id", 0);
    for (int i = 0; i < n_vocab; i++) free(toks[i]);
    free(toks);
    free(scores);
    free(types);
}

synth_model *synth_build(const synth_cfg *cfg, const char *path) {
    synth_model *s = calloc(1, sizeof *s);
    s->cfg = *cfg;
    const synth_cfg *c = &s->cfg;
    s->hd = c->head_dim ? c->head_dim : c->n_embd / c->n_head;
    s->n_rot = c->n_rot ? c->n_rot : s->hd;
    uint64_t rng = c->seed * 2654435761u + 88172645463325252ull;
    uint64_t router_rng = c->seed * 40503u + 0x9e3779b97f4a7c15ull;
    gguf_writer *w = gguf_writer_create();
    char key[128];
#define KEY(suffix) (snprintf(key, sizeof key, "%s.%s", c->arch, suffix), key)
    gguf_writer_set_str(w, "general.architecture", c->arch);
    gguf_writer_set_u32(w, KEY("context_length"), 256);
    gguf_writer_set_u32(w, KEY("embedding_length"), (uint32_t)c->n_embd);
    gguf_writer_set_u32(w, KEY("block_count"), (uint32_t)c->n_layer);
    gguf_writer_set_u32(w, KEY("feed_forward_length"), (uint32_t)c->n_ff);
    gguf_writer_set_u32(w, KEY("attention.head_count"), (uint32_t)c->n_head);
    gguf_writer_set_u32(w, KEY("attention.head_count_kv"), (uint32_t)c->n_head_kv);
    gguf_writer_set_f32(w, KEY("attention.layer_norm_rms_epsilon"), 1e-6f);
    gguf_writer_set_f32(w, KEY("rope.freq_base"), c->rope_base);
    if (c->n_rot) gguf_writer_set_u32(w, KEY("rope.dimension_count"), (uint32_t)c->n_rot);
    if (c->head_dim) {
        gguf_writer_set_u32(w, KEY("attention.key_length"), (uint32_t)c->head_dim);
        gguf_writer_set_u32(w, KEY("attention.value_length"), (uint32_t)c->head_dim);
    }
    if (c->rope_linear_factor > 0) {
        gguf_writer_set_str(w, KEY("rope.scaling.type"), "linear");
        gguf_writer_set_f32(w, KEY("rope.scaling.factor"), c->rope_linear_factor);
    }
    if (c->n_expert > 0) {
        gguf_writer_set_u32(w, KEY("expert_count"), (uint32_t)c->n_expert);
        gguf_writer_set_u32(w, KEY("expert_used_count"), (uint32_t)c->n_expert_used);
    }
#undef KEY
    synth_write_vocab(w, c->n_vocab);

    const int E = c->n_embd, QD = c->n_head * s->hd, KD = c->n_head_kv * s->hd;
    add_mat(w, c, &rng, "token_embd.weight", c->n_vocab, E, &s->emb);
    s->out_norm = rand_vec(&rng, E, 1.0f, 0.2f);
    add_vec(w, c, "output_norm.weight", s->out_norm, E);
    if (c->tied) s->out = s->emb;
    else add_mat(w, c, &rng, "output.weight", c->n_vocab, E, &s->out);
    if (c->rope_freqs) {
        s->rope_freqs = rand_vec(&rng, s->n_rot / 2, 2.5f, 1.5f);
        add_vec(w, c, "rope_freqs.weight", s->rope_freqs, s->n_rot / 2);
    }
    s->layers = calloc((size_t)c->n_layer, sizeof *s->layers);
    for (int l = 0; l < c->n_layer; l++) {
        ref_layer *ly = &s->layers[l];
        char n[64];
#define NAME(x) (snprintf(n, sizeof n, "blk.%d.%s", l, x), n)
        ly->attn_norm = rand_vec(&rng, E, 1.0f, 0.2f);
        add_vec(w, c, NAME("attn_norm.weight"), ly->attn_norm, E);
        add_mat(w, c, &rng, NAME("attn_q.weight"), QD, E, &ly->wq);
        add_mat(w, c, &rng, NAME("attn_k.weight"), KD, E, &ly->wk);
        add_mat(w, c, &rng, NAME("attn_v.weight"), KD, E, &ly->wv);
        add_mat(w, c, &rng, NAME("attn_output.weight"), E, QD, &ly->wo);
        if (c->bias) {
            ly->bq = rand_vec(&rng, QD, 0.0f, 0.5f);
            ly->bk = rand_vec(&rng, KD, 0.0f, 0.5f);
            ly->bv = rand_vec(&rng, KD, 0.0f, 0.5f);
            add_vec(w, c, NAME("attn_q.bias"), ly->bq, QD);
            add_vec(w, c, NAME("attn_k.bias"), ly->bk, KD);
            add_vec(w, c, NAME("attn_v.bias"), ly->bv, KD);
        }
        if (c->qk_norm) {
            ly->q_norm = rand_vec(&rng, s->hd, 1.0f, 0.3f);
            ly->k_norm = rand_vec(&rng, s->hd, 1.0f, 0.3f);
            add_vec(w, c, NAME("attn_q_norm.weight"), ly->q_norm, s->hd);
            add_vec(w, c, NAME("attn_k_norm.weight"), ly->k_norm, s->hd);
        }
        ly->ffn_norm = rand_vec(&rng, E, 1.0f, 0.2f);
        add_vec(w, c, NAME("ffn_norm.weight"), ly->ffn_norm, E);
        if (c->n_expert > 0 && c->experts_identical) {
            /* the dense FFN's draws from rng, copied into every expert */
            uint8_t *qg = gen_mat(c, &rng, c->n_ff, E, &ly->gate);
            uint8_t *qu = gen_mat(c, &rng, c->n_ff, E, &ly->up);
            uint8_t *qd = gen_mat(c, &rng, E, c->n_ff, &ly->down);
            add_mat(w, c, &router_rng, NAME("ffn_gate_inp.weight"), c->n_expert, E,
                    &ly->router);
            add_experts(w, c, NULL, NAME("ffn_gate_exps.weight"), c->n_expert, c->n_ff, E,
                        &ly->gate, qg, &ly->gate_exps);
            add_experts(w, c, NULL, NAME("ffn_up_exps.weight"), c->n_expert, c->n_ff, E,
                        &ly->up, qu, &ly->up_exps);
            add_experts(w, c, NULL, NAME("ffn_down_exps.weight"), c->n_expert, E, c->n_ff,
                        &ly->down, qd, &ly->down_exps);
            free(qg);
            free(qu);
            free(qd);
        } else if (c->n_expert > 0) {
            add_mat(w, c, &rng, NAME("ffn_gate_inp.weight"), c->n_expert, E, &ly->router);
            add_experts(w, c, &rng, NAME("ffn_gate_exps.weight"), c->n_expert, c->n_ff, E,
                        NULL, NULL, &ly->gate_exps);
            add_experts(w, c, &rng, NAME("ffn_up_exps.weight"), c->n_expert, c->n_ff, E, NULL,
                        NULL, &ly->up_exps);
            add_experts(w, c, &rng, NAME("ffn_down_exps.weight"), c->n_expert, E, c->n_ff,
                        NULL, NULL, &ly->down_exps);
        } else {
            add_mat(w, c, &rng, NAME("ffn_gate.weight"), c->n_ff, E, &ly->gate);
            add_mat(w, c, &rng, NAME("ffn_up.weight"), c->n_ff, E, &ly->up);
            add_mat(w, c, &rng, NAME("ffn_down.weight"), E, c->n_ff, &ly->down);
        }
#undef NAME
    }
    hl_err err;
    if (gguf_writer_write_file(w, path, &err) != HL_OK) {
        fprintf(stderr, "synth_build: %s\n", err.msg);
        gguf_writer_destroy(w);
        synth_free(s);
        return NULL;
    }
    gguf_writer_destroy(w);
    return s;
}

void synth_free(synth_model *s) {
    if (!s) return;
    free(s->emb.w);
    if (!s->cfg.tied) free(s->out.w);
    free(s->out_norm);
    free(s->rope_freqs);
    for (int l = 0; s->layers && l < s->cfg.n_layer; l++) {
        ref_layer *ly = &s->layers[l];
        float *v[] = {ly->attn_norm, ly->ffn_norm, ly->bq, ly->bk, ly->bv, ly->q_norm,
                      ly->k_norm, ly->wq.w, ly->wk.w, ly->wv.w, ly->wo.w, ly->gate.w,
                      ly->up.w, ly->down.w, ly->router.w, ly->gate_exps.w, ly->up_exps.w,
                      ly->down_exps.w};
        for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) free(v[i]);
    }
    free(s->layers);
    free(s);
}

/* ---- reference forward: the textbook formulas, one token at a time ---- */

static void ref_rmsnorm(float *out, const float *x, const float *w, int n, float eps) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    double scale = 1.0 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++) out[i] = (float)(x[i] * scale * w[i]);
}

static void ref_matvec(const mat *m, const float *x, float *out) {
    for (int r = 0; r < m->rows; r++) {
        double acc = 0;
        for (int k = 0; k < m->cols; k++) acc += (double)m->w[(size_t)r * m->cols + k] * x[k];
        out[r] = (float)acc;
    }
}

static void ref_rope(const synth_model *s, float *head, int pos) {
    const synth_cfg *c = &s->cfg;
    double scale = c->rope_linear_factor > 0 ? 1.0 / c->rope_linear_factor : 1.0;
    for (int i = 0; i < s->n_rot / 2; i++) {
        double theta = pos * scale * pow(c->rope_base, -2.0 * i / s->n_rot);
        if (s->rope_freqs) theta /= s->rope_freqs[i];
        double cs = cos(theta), sn = sin(theta);
        int a = c->neox ? i : 2 * i, b = c->neox ? i + s->n_rot / 2 : 2 * i + 1;
        double x0 = head[a], x1 = head[b];
        head[a] = (float)(x0 * cs - x1 * sn);
        head[b] = (float)(x0 * sn + x1 * cs);
    }
}

/* Expert e of a stacked matrix. */
static mat expert(const mat *m, int n_exp, int e) {
    const int rows = m->rows / n_exp;
    return (mat){rows, m->cols, m->w + (size_t)e * rows * m->cols};
}

/* Mixtral's block in double: p = softmax(router xb); the top k (ties: the lower index);
 * out = sum over them of p_e / sum(p_chosen) * down_e(silu(gate_e xb) * up_e xb). g, u:
 * n_ff floats of scratch. */
static void ref_moe(const synth_model *s, const ref_layer *ly, const float *xb, float *g,
                    float *u, float *out) {
    const synth_cfg *c = &s->cfg;
    const int n_exp = c->n_expert, E = c->n_embd;
    double p[64], sum = 0, max = -INFINITY, chosen_sum = 0;
    bool chosen[64] = {0};
    float logit[64], *y = malloc((size_t)E * sizeof *y);
    ref_matvec(&ly->router, xb, logit);
    for (int e = 0; e < n_exp; e++) max = logit[e] > max ? logit[e] : max;
    for (int e = 0; e < n_exp; e++) sum += p[e] = exp(logit[e] - max);
    for (int e = 0; e < n_exp; e++) p[e] /= sum;
    for (int k = 0; k < c->n_expert_used; k++) {
        int best = -1;
        for (int e = 0; e < n_exp; e++)
            if (!chosen[e] && (best < 0 || p[e] > p[best])) best = e;
        chosen[best] = true;
        chosen_sum += p[best];
    }
    double acc[1024] = {0};
    for (int e = 0; e < n_exp; e++) {
        if (!chosen[e]) continue;
        const mat ge = expert(&ly->gate_exps, n_exp, e), ue = expert(&ly->up_exps, n_exp, e),
                  de = expert(&ly->down_exps, n_exp, e);
        ref_matvec(&ge, xb, g);
        ref_matvec(&ue, xb, u);
        for (int i = 0; i < c->n_ff; i++)
            g[i] = (float)(g[i] / (1.0 + exp(-(double)g[i])) * u[i]);
        ref_matvec(&de, g, y);
        for (int i = 0; i < E; i++) acc[i] += p[e] / chosen_sum * y[i];
    }
    for (int i = 0; i < E; i++) out[i] = (float)acc[i];
    free(y);
}

void synth_ref_forward(const synth_model *s, const int32_t *tokens, int n, float *out) {
    const synth_cfg *c = &s->cfg;
    const int E = c->n_embd, hd = s->hd, QD = c->n_head * hd, KD = c->n_head_kv * hd;
    const float eps = 1e-6f;
    float *K = calloc((size_t)c->n_layer * n * KD, sizeof(float));
    float *V = calloc((size_t)c->n_layer * n * KD, sizeof(float));
    float *x = malloc((size_t)E * 4), *xb = malloc((size_t)E * 4), *tmp = malloc((size_t)E * 4);
    float *q = malloc((size_t)QD * 4), *att = malloc((size_t)QD * 4);
    float *g = malloc((size_t)c->n_ff * 4), *u = malloc((size_t)c->n_ff * 4);
    float *sc = malloc((size_t)n * 4);
    for (int pos = 0; pos < n; pos++) {
        memcpy(x, s->emb.w + (size_t)tokens[pos] * E, (size_t)E * 4);
        for (int l = 0; l < c->n_layer; l++) {
            const ref_layer *ly = &s->layers[l];
            float *k = K + ((size_t)l * n + pos) * KD, *v = V + ((size_t)l * n + pos) * KD;
            ref_rmsnorm(xb, x, ly->attn_norm, E, eps);
            ref_matvec(&ly->wq, xb, q);
            ref_matvec(&ly->wk, xb, k);
            ref_matvec(&ly->wv, xb, v);
            for (int i = 0; c->bias && i < QD; i++) q[i] += ly->bq[i];
            for (int i = 0; c->bias && i < KD; i++) k[i] += ly->bk[i], v[i] += ly->bv[i];
            for (int h = 0; h < c->n_head; h++) {
                if (c->qk_norm) ref_rmsnorm(q + h * hd, q + h * hd, ly->q_norm, hd, eps);
                ref_rope(s, q + h * hd, pos);
            }
            for (int h = 0; h < c->n_head_kv; h++) {
                if (c->qk_norm) ref_rmsnorm(k + h * hd, k + h * hd, ly->k_norm, hd, eps);
                ref_rope(s, k + h * hd, pos);
            }
            for (int h = 0; h < c->n_head; h++) {
                int kvh = h / (c->n_head / c->n_head_kv);
                double max = -INFINITY, sum = 0;
                for (int t = 0; t <= pos; t++) {
                    const float *kt = K + ((size_t)l * n + t) * KD + kvh * hd;
                    double d = 0;
                    for (int i = 0; i < hd; i++) d += (double)q[h * hd + i] * kt[i];
                    sc[t] = (float)(d / sqrt((double)hd));
                    if (sc[t] > max) max = sc[t];
                }
                for (int t = 0; t <= pos; t++) sum += exp(sc[t] - max);
                for (int i = 0; i < hd; i++) {
                    double acc = 0;
                    for (int t = 0; t <= pos; t++)
                        acc += exp(sc[t] - max) / sum * V[((size_t)l * n + t) * KD + kvh * hd + i];
                    att[h * hd + i] = (float)acc;
                }
            }
            ref_matvec(&ly->wo, att, tmp);
            for (int i = 0; i < E; i++) x[i] += tmp[i];
            ref_rmsnorm(xb, x, ly->ffn_norm, E, eps);
            if (c->n_expert > 0) {
                ref_moe(s, ly, xb, g, u, tmp);
            } else {
                ref_matvec(&ly->gate, xb, g);
                ref_matvec(&ly->up, xb, u);
                for (int i = 0; i < c->n_ff; i++)
                    g[i] = (float)(g[i] / (1.0 + exp(-(double)g[i])) * u[i]);
                ref_matvec(&ly->down, g, tmp);
            }
            for (int i = 0; i < E; i++) x[i] += tmp[i];
        }
        ref_rmsnorm(xb, x, s->out_norm, E, eps);
        ref_matvec(&s->out, xb, out + (size_t)pos * c->n_vocab);
    }
    free(K);
    free(V);
    free(x);
    free(xb);
    free(tmp);
    free(q);
    free(att);
    free(g);
    free(u);
    free(sc);
}

model *synth_load(const synth_cfg *cfg, const char *path) {
    synth_model *s = synth_build(cfg, path);
    if (!s) return NULL;
    synth_free(s);
    model *m = NULL;
    return model_load(path, NULL, &m, NULL) == HL_OK ? m : NULL;
}

bool synth_write_bigram(const char *path, const char *const *tokens, const int32_t *types,
                        const int *next, int n_vocab, uint32_t n_ctx) {
    const int V = n_vocab;
    const size_t mat_n = (size_t)V * (size_t)V;
    float *eye = calloc(mat_n, sizeof *eye), *out = calloc(mat_n, sizeof *out);
    float *zeros = calloc(mat_n, sizeof *zeros), *ones = calloc((size_t)V, sizeof *ones);
    float *scores = calloc((size_t)V, sizeof *scores);
    gguf_writer *w = gguf_writer_create();
    hl_err err = {0};
    hl_status st = HL_ERR_NOMEM;
    if (!w || !eye || !out || !zeros || !ones || !scores) {
        snprintf(err.msg, sizeof err.msg, "out of memory");
        goto done;
    }
    gguf_writer_set_str(w, "general.architecture", "llama");
    gguf_writer_set_u32(w, "llama.context_length", n_ctx);
    gguf_writer_set_u32(w, "llama.embedding_length", (uint32_t)V);
    gguf_writer_set_u32(w, "llama.block_count", 1);
    gguf_writer_set_u32(w, "llama.feed_forward_length", (uint32_t)V);
    gguf_writer_set_u32(w, "llama.attention.head_count", 1);
    gguf_writer_set_u32(w, "llama.attention.head_count_kv", 1);
    gguf_writer_set_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-6f);
    gguf_writer_set_f32(w, "llama.rope.freq_base", 10000.0f);
    for (int i = 0; i < V; i++) scores[i] = (float)-i;
    gguf_writer_set_str(w, "tokenizer.ggml.model", "llama");
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", tokens, (uint64_t)V);
    gguf_writer_set_arr(w, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, scores, (uint64_t)V);
    gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, types, (uint64_t)V);
    gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 1);
    gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 2);
    gguf_writer_set_u32(w, "tokenizer.ggml.unknown_token_id", 0);
    for (int t = 0; t < V; t++) {
        eye[(size_t)t * V + t] = 1.0f;
        if (next[t] >= 0) out[(size_t)next[t] * V + t] = 10.0f; /* row next(t), column t */
        ones[t] = 1.0f;
    }
    static const char *const zero_mats[] = {"blk.0.attn_q.weight", "blk.0.attn_k.weight",
                                            "blk.0.attn_v.weight", "blk.0.attn_output.weight",
                                            "blk.0.ffn_gate.weight", "blk.0.ffn_up.weight",
                                            "blk.0.ffn_down.weight"};
    static const char *const norms[] = {"output_norm.weight", "blk.0.attn_norm.weight",
                                        "blk.0.ffn_norm.weight"};
    int64_t ne2[2] = {V, V}, ne1[1] = {V};
    const uint64_t mb = sizeof(float) * mat_n, vec = sizeof(float) * (uint64_t)V; /* bytes */
    st = gguf_writer_add_tensor(w, "token_embd.weight", HL_TYPE_F32, 2, ne2, eye, mb, &err);
    if (!st) st = gguf_writer_add_tensor(w, "output.weight", HL_TYPE_F32, 2, ne2, out, mb, &err);
    for (size_t i = 0; !st && i < sizeof norms / sizeof norms[0]; i++)
        st = gguf_writer_add_tensor(w, norms[i], HL_TYPE_F32, 1, ne1, ones, vec, &err);
    for (size_t i = 0; !st && i < sizeof zero_mats / sizeof zero_mats[0]; i++)
        st = gguf_writer_add_tensor(w, zero_mats[i], HL_TYPE_F32, 2, ne2, zeros, mb, &err);
    if (!st) st = gguf_writer_write_file(w, path, &err);
done:
    if (w) gguf_writer_destroy(w);
    free(eye), free(out), free(zeros), free(ones), free(scores);
    if (st) fprintf(stderr, "    bigram model %s: %s\n", path, err.msg);
    return st == HL_OK;
}
