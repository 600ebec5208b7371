/*
 * model.c - loading llama-family GGUF models: hyperparameters from "{arch}.*" keys, every
 * tensor checked against them (shape and type), weights used in place from the mapping.
 */
#include "model/internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "tensor/types.h"

/* Bounds that keep every size computed from hparams far from overflow. */
#define MODEL_MAX_DIM (1 << 20)
#define MODEL_MAX_LAYERS 4096

static const char *const g_arch_names[] = {
    [MODEL_ARCH_LLAMA] = "llama",
    [MODEL_ARCH_MISTRAL] = "mistral",
    [MODEL_ARCH_QWEN2] = "qwen2",
    [MODEL_ARCH_QWEN3] = "qwen3",
};

const char *model_arch_name(model_arch arch) {
    if ((unsigned)arch >= sizeof g_arch_names / sizeof g_arch_names[0]) return "unknown";
    return g_arch_names[arch];
}

const model_hparams *model_get_hparams(const model *m) { return &m->hp; }

static size_t weight_bytes(const model_weight *w) {
    return w->data ? hl_row_size((hl_type)w->type, w->n_cols) * (size_t)w->n_rows : 0;
}

size_t model_weight_bytes(const model *m) {
    const model_hparams *hp = &m->hp;
    const size_t E = (size_t)hp->n_embd * sizeof(float);
    size_t n = weight_bytes(&m->tok_embd) + E; /* + output_norm */
    if (m->output.data != m->tok_embd.data) n += weight_bytes(&m->output);
    for (int32_t l = 0; l < hp->n_layer; l++) {
        const model_layer *ly = &m->layers[l];
        const model_weight *ws[] = {&ly->wq, &ly->wk, &ly->wv, &ly->wo,
                                    &ly->w_gate, &ly->w_up, &ly->w_down};
        for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) n += weight_bytes(ws[i]);
        n += 2 * E; /* attention and ffn norms */
        if (ly->bq) n += (size_t)(ly->wq.n_rows + ly->wk.n_rows + ly->wv.n_rows) * sizeof(float);
        if (ly->q_norm) n += 2 * (size_t)hp->head_dim_k * sizeof(float);
    }
    return n;
}
const tok_vocab *model_vocab(const model *m) { return m->vocab; }

void model_free(model *m) {
    if (!m) return;
    free(m->layers);
    tok_vocab_destroy(m->vocab);
    gguf_close(m->gguf);
    hl_map_close(&m->map);
    free(m);
}

/* ---- hparams ---- */

typedef struct loader {
    const gguf_file *f;
    const char *arch; /* key prefix */
    model *m;
} loader;

static bool arch_key(const loader *L, const char *suffix, char *key, size_t cap) {
    int n = snprintf(key, cap, "%s.%s", L->arch, suffix);
    return n > 0 && (size_t)n < cap;
}

/* Reads a positive int hparam; absent and required -> FORMAT. */
static hl_status hp_int(const loader *L, const char *suffix, bool required, int32_t dflt,
                        int32_t *out, hl_err *err) {
    char key[128];
    if (!arch_key(L, suffix, key, sizeof key)) return hl_fail(err, HL_ERR_INVALID, "key too long");
    if (gguf_find_key(L->f, key) < 0) {
        if (required) return hl_fail(err, HL_ERR_FORMAT, "missing metadata key '%s'", key);
        *out = dflt;
        return HL_OK;
    }
    uint32_t v;
    if (!gguf_get_u32(L->f, key, &v)) {
        int32_t s;
        if (!gguf_get_i32(L->f, key, &s) || s < 0)
            return hl_fail(err, HL_ERR_FORMAT, "metadata key '%s' is not a non-negative integer",
                           key);
        v = (uint32_t)s;
    }
    if (v == 0 || v > MODEL_MAX_DIM)
        return hl_fail(err, HL_ERR_FORMAT, "metadata key '%s' = %u is out of range [1, %d]", key,
                       v, MODEL_MAX_DIM);
    *out = (int32_t)v;
    return HL_OK;
}

/* An optional integer that may be 0 (absent: 0). */
static hl_status hp_uint_opt(const loader *L, const char *suffix, int32_t *out, hl_err *err) {
    char key[128];
    *out = 0;
    if (!arch_key(L, suffix, key, sizeof key)) return hl_fail(err, HL_ERR_INVALID, "key too long");
    if (gguf_find_key(L->f, key) < 0) return HL_OK;
    uint32_t v;
    int32_t s;
    if (gguf_get_u32(L->f, key, &v)) s = v > MODEL_MAX_DIM ? -1 : (int32_t)v;
    else if (!gguf_get_i32(L->f, key, &s)) s = -1;
    if (s < 0)
        return hl_fail(err, HL_ERR_FORMAT, "metadata key '%s' is not a small non-negative integer",
                       key);
    *out = s;
    return HL_OK;
}

static hl_status hp_float(const loader *L, const char *suffix, float dflt, float *out,
                          hl_err *err) {
    char key[128];
    if (!arch_key(L, suffix, key, sizeof key)) return hl_fail(err, HL_ERR_INVALID, "key too long");
    if (gguf_find_key(L->f, key) < 0) {
        *out = dflt;
        return HL_OK;
    }
    float v;
    if (!gguf_get_f32(L->f, key, &v))
        return hl_fail(err, HL_ERR_FORMAT, "metadata key '%s' is not a float", key);
    if (!(v > 0.0f) || v > 1e30f)
        return hl_fail(err, HL_ERR_FORMAT, "metadata key '%s' = %g is out of range", key, v);
    *out = v;
    return HL_OK;
}

static hl_status read_rope_scaling(const loader *L, float *freq_scale, hl_err *err) {
    char key[128];
    float factor = 1.0f;
    gguf_str type = {NULL, 0};
    arch_key(L, "rope.scaling.type", key, sizeof key);
    bool has_type = gguf_get_str(L->f, key, &type);
    hl_status st = hp_float(L, "rope.scaling.factor", 0.0f, &factor, err);
    if (st) return st;
    if (factor == 0.0f) {
        /* older files: a bare linear factor */
        st = hp_float(L, "rope.scale_linear", 1.0f, &factor, err);
        if (st) return st;
    }
    if (has_type && gguf_str_eq(type, "none")) factor = 1.0f;
    else if (has_type && !gguf_str_eq(type, "linear"))
        return hl_fail(err, HL_ERR_UNSUPPORTED,
                       "unsupported rope scaling type '%.*s' (only linear)",
                       (int)(type.len > 64 ? 64 : type.len), type.ptr);
    *freq_scale = 1.0f / factor;
    return HL_OK;
}

static hl_status read_hparams(loader *L, hl_err *err) {
    model_hparams *hp = &L->m->hp;
    hl_status st;
    if ((st = hp_int(L, "context_length", true, 0, &hp->n_ctx_train, err))) return st;
    if ((st = hp_int(L, "embedding_length", true, 0, &hp->n_embd, err))) return st;
    if ((st = hp_int(L, "block_count", true, 0, &hp->n_layer, err))) return st;
    if ((st = hp_int(L, "feed_forward_length", true, 0, &hp->n_ff, err))) return st;
    if ((st = hp_int(L, "attention.head_count", true, 0, &hp->n_head, err))) return st;
    if ((st = hp_int(L, "attention.head_count_kv", false, hp->n_head, &hp->n_head_kv, err)))
        return st;
    if (hp->n_layer > MODEL_MAX_LAYERS)
        return hl_fail(err, HL_ERR_FORMAT, "block_count %d is too large", hp->n_layer);
    if (hp->n_head_kv > hp->n_head || hp->n_head % hp->n_head_kv != 0)
        return hl_fail(err, HL_ERR_FORMAT,
                       "attention.head_count %d is not a multiple of head_count_kv %d",
                       hp->n_head, hp->n_head_kv);
    int32_t dflt_hd = hp->n_embd % hp->n_head == 0 ? hp->n_embd / hp->n_head : 0;
    if ((st = hp_int(L, "attention.key_length", dflt_hd == 0, dflt_hd, &hp->head_dim_k, err)))
        return st;
    if ((st = hp_int(L, "attention.value_length", false, hp->head_dim_k, &hp->head_dim_v, err)))
        return st;
    if ((st = hp_int(L, "rope.dimension_count", false, hp->head_dim_k, &hp->n_rot, err)))
        return st;
    if (hp->n_rot > hp->head_dim_k || hp->n_rot % 2 != 0)
        return hl_fail(err, HL_ERR_FORMAT,
                       "rope.dimension_count %d must be even and at most the head size %d",
                       hp->n_rot, hp->head_dim_k);
    if ((int64_t)hp->n_head * hp->head_dim_k > MODEL_MAX_DIM ||
        (int64_t)hp->n_head * hp->head_dim_v > MODEL_MAX_DIM)
        return hl_fail(err, HL_ERR_FORMAT, "attention size is too large");
    if ((st = hp_float(L, "attention.layer_norm_rms_epsilon", 1e-5f, &hp->rms_eps, err))) return st;
    if ((st = hp_float(L, "rope.freq_base", 10000.0f, &hp->rope_freq_base, err))) return st;
    if ((st = read_rope_scaling(L, &hp->rope_freq_scale, err))) return st;
    int32_t pooling = 0;
    if ((st = hp_uint_opt(L, "pooling_type", &pooling, err))) return st;
    if (pooling > MODEL_POOL_LAST)
        return hl_fail(err, HL_ERR_UNSUPPORTED, "unsupported pooling_type %d", pooling);
    hp->pooling = (model_pooling)pooling;
    hp->rope_kind = (hp->arch == MODEL_ARCH_QWEN2 || hp->arch == MODEL_ARCH_QWEN3)
                        ? MODEL_ROPE_NEOX
                        : MODEL_ROPE_NORM;
    return HL_OK;
}

/* ---- tensors ---- */

static void shape_str(char *buf, size_t cap, uint32_t n_dims, const int64_t *ne) {
    size_t o = 0;
    o += (size_t)snprintf(buf + o, cap - o, "[");
    for (uint32_t i = 0; i < n_dims && o < cap; i++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%lld", i ? ", " : "", (long long)ne[i]);
    if (o < cap) snprintf(buf + o, cap - o, "]");
}

/* Finds `name` and checks its shape is exactly ne[0..n_dims). NULL *out when absent and
 * not required. */
static hl_status find_tensor(const loader *L, const char *name, uint32_t n_dims,
                             const int64_t *ne, bool required, const gguf_tensor **out,
                             hl_err *err) {
    *out = NULL;
    const gguf_tensor *t = gguf_find_tensor(L->f, name);
    if (!t) {
        if (!required) return HL_OK;
        return hl_fail(err, HL_ERR_FORMAT, "missing tensor '%s'", name);
    }
    uint32_t nd = t->n_dims;
    while (nd > 1 && t->ne[nd - 1] == 1) nd--; /* trailing 1s are not a shape mismatch */
    bool ok = nd <= n_dims;
    for (uint32_t i = 0; ok && i < n_dims; i++) ok = t->ne[i] == ne[i];
    for (uint32_t i = n_dims; ok && i < GGUF_MAX_DIMS && i < t->n_dims; i++) ok = t->ne[i] == 1;
    if (!ok) {
        char got[96], want[96];
        shape_str(got, sizeof got, t->n_dims, t->ne);
        shape_str(want, sizeof want, n_dims, ne);
        return hl_fail(err, HL_ERR_FORMAT, "tensor '%s' has shape %s, expected %s", name, got,
                       want);
    }
    *out = t;
    return HL_OK;
}

enum { NEED_MATMUL = 1, NEED_DEQUANT = 2 };

static hl_status get_weight(const loader *L, const char *name, int64_t n_cols, int64_t n_rows,
                            bool required, int need, model_weight *out, hl_err *err) {
    memset(out, 0, sizeof *out);
    const gguf_tensor *t;
    int64_t ne[2] = {n_cols, n_rows};
    hl_status st = find_tensor(L, name, 2, ne, required, &t, err);
    if (st || !t) return st;
    const hl_type_traits *tr = hl_type_traits_get(t->type);
    if (!tr)
        return hl_fail(err, HL_ERR_UNSUPPORTED, "tensor '%s' has unknown type %u", name, t->type);
    if ((need & NEED_MATMUL) && !tr->can_matmul)
        return hl_fail(err, HL_ERR_UNSUPPORTED,
                       "tensor '%s' has type %s, which the matmul kernels do not support", name,
                       tr->name);
    if ((need & NEED_DEQUANT) && !tr->can_dequantize)
        return hl_fail(err, HL_ERR_UNSUPPORTED,
                       "tensor '%s' has type %s, which cannot be dequantized", name, tr->name);
    size_t row = hl_row_size(t->type, n_cols);
    if (row == 0 || t->n_bytes / row != (uint64_t)n_rows || t->n_bytes % row != 0)
        return hl_fail(err, HL_ERR_FORMAT,
                       "tensor '%s' (%s) has %llu bytes, expected %lld rows of %zu", name, tr->name,
                       (unsigned long long)t->n_bytes, (long long)n_rows, row);
    *out = (model_weight){.type = t->type, .n_rows = n_rows, .n_cols = n_cols, .data = t->data};
    return HL_OK;
}

/* 1-D f32 tensors (norm weights, biases). */
static hl_status get_vector(const loader *L, const char *name, int64_t n, bool required,
                            const float **out, hl_err *err) {
    *out = NULL;
    const gguf_tensor *t;
    hl_status st = find_tensor(L, name, 1, &n, required, &t, err);
    if (st || !t) return st;
    if (t->type != HL_TYPE_F32)
        return hl_fail(err, HL_ERR_UNSUPPORTED, "tensor '%s' has type %s, expected f32", name,
                       hl_type_name(t->type));
    if (((uintptr_t)t->data & 3) != 0)
        return hl_fail(err, HL_ERR_FORMAT, "tensor '%s' data is not 4-byte aligned", name);
    *out = t->data;
    return HL_OK;
}

static hl_status load_tensors(loader *L, hl_err *err) {
    model *m = L->m;
    model_hparams *hp = &m->hp;
    hl_status st;
    const gguf_tensor *emb = gguf_find_tensor(L->f, "token_embd.weight");
    if (!emb) return hl_fail(err, HL_ERR_FORMAT, "missing tensor 'token_embd.weight'");
    if (emb->ne[1] <= 0 || emb->ne[1] > INT32_MAX / 2)
        return hl_fail(err, HL_ERR_FORMAT, "tensor 'token_embd.weight' has a bad vocabulary size");
    hp->n_vocab = (int32_t)emb->ne[1];
    const int64_t E = hp->n_embd, V = hp->n_vocab;
    const int64_t QD = (int64_t)hp->n_head * hp->head_dim_k;
    const int64_t KD = (int64_t)hp->n_head_kv * hp->head_dim_k;
    const int64_t VD = (int64_t)hp->n_head_kv * hp->head_dim_v;
    const int64_t OD = (int64_t)hp->n_head * hp->head_dim_v;

    if ((st = get_weight(L, "token_embd.weight", E, V, true, NEED_DEQUANT, &m->tok_embd, err)))
        return st;
    if ((st = get_vector(L, "output_norm.weight", E, true, &m->output_norm, err))) return st;
    if ((st = get_weight(L, "output.weight", E, V, false, NEED_MATMUL, &m->output, err))) return st;
    if (!m->output.data) {
        const hl_type_traits *tr = hl_type_traits_get(m->tok_embd.type);
        if (!tr->can_matmul)
            return hl_fail(err, HL_ERR_UNSUPPORTED,
                           "tensor 'token_embd.weight' (tied output) has type %s, which the "
                           "matmul kernels do not support", tr->name);
        m->output = m->tok_embd;
    }
    if ((st = get_vector(L, "rope_freqs.weight", hp->n_rot / 2, false, &m->rope_freqs, err)))
        return st;

    m->layers = calloc((size_t)hp->n_layer, sizeof *m->layers);
    if (!m->layers) return hl_fail(err, HL_ERR_NOMEM, "out of memory for %d layers", hp->n_layer);
    const bool is_qwen2 = hp->arch == MODEL_ARCH_QWEN2, is_qwen3 = hp->arch == MODEL_ARCH_QWEN3;
    for (int32_t i = 0; i < hp->n_layer; i++) {
        model_layer *ly = &m->layers[i];
        char n[96];
#define NAME(s) (snprintf(n, sizeof n, "blk.%d.%s", (int)i, s), n)
        if ((st = get_vector(L, NAME("attn_norm.weight"), E, true, &ly->attn_norm, err))) return st;
        if ((st = get_weight(L, NAME("attn_q.weight"), E, QD, true, NEED_MATMUL, &ly->wq, err)))
            return st;
        if ((st = get_weight(L, NAME("attn_k.weight"), E, KD, true, NEED_MATMUL, &ly->wk, err)))
            return st;
        if ((st = get_weight(L, NAME("attn_v.weight"), E, VD, true, NEED_MATMUL, &ly->wv, err)))
            return st;
        if ((st = get_weight(L, NAME("attn_output.weight"), OD, E, true, NEED_MATMUL, &ly->wo,
                             err)))
            return st;
        if ((st = get_vector(L, NAME("attn_q.bias"), QD, is_qwen2, &ly->bq, err))) return st;
        if ((st = get_vector(L, NAME("attn_k.bias"), KD, is_qwen2, &ly->bk, err))) return st;
        if ((st = get_vector(L, NAME("attn_v.bias"), VD, is_qwen2, &ly->bv, err))) return st;
        if ((st = get_vector(L, NAME("attn_q_norm.weight"), hp->head_dim_k, is_qwen3, &ly->q_norm,
                             err)))
            return st;
        if ((st = get_vector(L, NAME("attn_k_norm.weight"), hp->head_dim_k, is_qwen3, &ly->k_norm,
                             err)))
            return st;
        if ((st = get_vector(L, NAME("ffn_norm.weight"), E, true, &ly->ffn_norm, err))) return st;
        if ((st = get_weight(L, NAME("ffn_gate.weight"), E, hp->n_ff, true, NEED_MATMUL,
                             &ly->w_gate, err)))
            return st;
        if ((st = get_weight(L, NAME("ffn_up.weight"), E, hp->n_ff, true, NEED_MATMUL, &ly->w_up,
                             err)))
            return st;
        if ((st = get_weight(L, NAME("ffn_down.weight"), hp->n_ff, E, true, NEED_MATMUL,
                             &ly->w_down, err)))
            return st;
#undef NAME
    }
    return HL_OK;
}

hl_status model_load_gguf_file(gguf_file *f, model **out, hl_err *err) {
    *out = NULL;
    kern_init(); /* type traits' can_* flags are filled in by the kernels */
    model *m = calloc(1, sizeof *m);
    if (!m) {
        gguf_close(f);
        return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    }
    m->gguf = f;
    loader L = {.f = f, .m = m};
    hl_status st;
    gguf_str arch;
    if (!gguf_get_str(f, "general.architecture", &arch)) {
        st = hl_fail(err, HL_ERR_FORMAT, "missing metadata key 'general.architecture'");
        goto fail;
    }
    int found = -1;
    for (size_t i = 0; i < sizeof g_arch_names / sizeof g_arch_names[0]; i++)
        if (gguf_str_eq(arch, g_arch_names[i])) found = (int)i;
    if (found < 0) {
        st = hl_fail(err, HL_ERR_UNSUPPORTED,
                     "unsupported model architecture '%.*s' (supported: llama, mistral, qwen2, "
                     "qwen3)",
                     (int)(arch.len > 64 ? 64 : arch.len), arch.ptr ? arch.ptr : "");
        goto fail;
    }
    m->hp.arch = (model_arch)found;
    L.arch = g_arch_names[found];
    if ((st = read_hparams(&L, err))) goto fail;
    if ((st = load_tensors(&L, err))) goto fail;
    if ((st = tok_vocab_load_gguf(f, &m->vocab, err))) {
        hl_err_prefix(err, "tokenizer");
        goto fail;
    }
    if (tok_vocab_n_tokens(m->vocab) > m->hp.n_vocab) {
        st = hl_fail(err, HL_ERR_FORMAT, "tokenizer has %d tokens but the model only %d",
                     tok_vocab_n_tokens(m->vocab), m->hp.n_vocab);
        goto fail;
    }
    *out = m;
    return HL_OK;
fail:
    model_free(m);
    return st;
}

static hl_status load_gguf(const char *path, bool use_mmap, model **out, hl_err *err) {
    *out = NULL;
    gguf_file *f;
    hl_status st = use_mmap ? gguf_open(path, &f, err) : gguf_open_read(path, &f, err);
    if (st) return st;
    st = model_load_gguf_file(f, out, err);
    if (st) hl_err_prefix(err, "%s", path);
    return st;
}

hl_status model_load_gguf(const char *path, model **out, hl_err *err) {
    return load_gguf(path, false, out, err);
}

hl_status model_load(const char *path, const char *tokenizer_path, model **out, hl_err *err) {
    return model_load_ex(path, tokenizer_path, NULL, out, err);
}

hl_status model_load_ex(const char *path, const char *tokenizer_path, const model_load_opts *opts,
                        model **out, hl_err *err) {
    const bool use_mmap = opts && opts->use_mmap;
    *out = NULL;
    FILE *fp = fopen(path, "rb");
    if (!fp) return hl_fail(err, HL_ERR_IO, "cannot open '%s'", path);
    uint8_t magic[4] = {0};
    size_t n = fread(magic, 1, 4, fp);
    fclose(fp);
    if (n == 4 && memcmp(magic, "GGUF", 4) == 0) {
        if (tokenizer_path)
            return hl_fail(err, HL_ERR_INVALID,
                           "a GGUF model has its own tokenizer; do not pass a tokenizer file");
        return load_gguf(path, use_mmap, out, err);
    }
    if (!tokenizer_path)
        return hl_fail(err, HL_ERR_INVALID,
                       "'%s' is not a GGUF file; a llama2.c checkpoint needs a tokenizer file",
                       path);
    return model_load_llama2c_ex(path, tokenizer_path, opts, out, err);
}
