/*
 * llama2c.c - Karpathy's llama2.c checkpoints (the legacy "version 0" export: a 7 x int32
 * header, then f32 weights) and its tokenizer format.
 *
 * Weights, in file order: token_embedding [vocab][dim], rms_att [L][dim], wq [L][dim][dim],
 * wk [L][kv_dim][dim], wv [L][kv_dim][dim], wo [L][dim][dim], rms_ffn [L][dim],
 * w1 [L][hidden][dim], w2 [L][dim][hidden], w3 [L][hidden][dim], rms_final [dim],
 * freq_cis_real/imag [seq_len][head_size/2] (ignored: RoPE is computed), then, when
 * vocab_size is negative, a separate classifier [vocab][dim]. Each matrix is row-major with
 * the output dimension as rows, which is exactly a model_weight; RoPE rotates adjacent pairs.
 */
#include "model/internal.h"

#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "tensor/types.h"

#define L2C_HEADER_BYTES 28
#define L2C_MAX_DIM (1 << 20)

static bool add_u64(uint64_t *acc, uint64_t a, uint64_t b, uint64_t c) {
    uint64_t p;
    if (__builtin_mul_overflow(a, b, &p) || __builtin_mul_overflow(p, c, &p)) return false;
    return !__builtin_add_overflow(*acc, p, acc);
}

/* What the GGUF loader derives from a tensor table, for this fixed layout: the llama
 * architecture, uniform layers, the matmul list, the KV geometry. */
static hl_status finish_model(model *m, hl_err *err) {
    const model_hparams *hp = &m->hp;
    m->arch = &model_arch_llama;
    m->x = (model_hp_ext){.norm_eps = hp->rms_eps, .causal = true, .rope_attn_factor = 1.0f};
    m->lhp = calloc((size_t)hp->n_layer, sizeof *m->lhp);
    if (!m->lhp) return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    hl_status st = HL_OK;
    for (int32_t l = 0; l < hp->n_layer && !st; l++) {
        m->lhp[l] = (model_layer_hp){
            .n_head = hp->n_head, .n_head_kv = hp->n_head_kv, .head_dim_k = hp->head_dim_k,
            .head_dim_v = hp->head_dim_v, .n_ff = hp->n_ff, .n_rot = hp->n_rot,
            .rope_base = hp->rope_freq_base, .rope_scale = hp->rope_freq_scale, .kv_src = l};
        model_layer *ly = &m->layers[l];
        const model_weight *ws[] = {&ly->wq, &ly->wk, &ly->wv, &ly->wo,
                                    &ly->w_gate, &ly->w_up, &ly->w_down};
        for (size_t i = 0; i < sizeof ws / sizeof ws[0] && !st; i++) st = model_add_mat(m, ws[i], err);
    }
    if (!st) st = model_add_mat(m, &m->output, err);
    if (st) return st;
    /* every matmul (the output too), the embeddings when untied, the norms; all f32 */
    for (int32_t i = 0; i < m->n_mats; i++)
        m->tensor_bytes += (size_t)m->mats[i]->n_rows * (size_t)m->mats[i]->n_cols * 4;
    if (m->output.data != m->tok_embd.data)
        m->tensor_bytes += (size_t)hp->n_vocab * (size_t)hp->n_embd * 4;
    m->tensor_bytes += (size_t)(2 * hp->n_layer + 1) * (size_t)hp->n_embd * 4;
    return model_build_kv_geom(m, err);
}

hl_status model_load_llama2c(const char *path, const char *tokenizer_path, model **out,
                             hl_err *err) {
    return model_load_llama2c_ex(path, tokenizer_path, NULL, out, err);
}

hl_status model_load_llama2c_ex(const char *path, const char *tokenizer_path,
                                const model_load_opts *opts, model **out, hl_err *err) {
    *out = NULL;
    kern_init();
    model *m = calloc(1, sizeof *m);
    if (!m) return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    hl_status st = opts && opts->use_mmap ? hl_map_open(path, &m->map, err)
                                          : hl_map_read(path, &m->map, err);
    if (st) goto fail;
    if (m->map.size < L2C_HEADER_BYTES) {
        st = hl_fail(err, HL_ERR_FORMAT, "%s: too small for a llama2.c checkpoint (%zu bytes)",
                     path, m->map.size);
        goto fail;
    }
    int32_t h[7];
    memcpy(h, m->map.data, sizeof h);
    if ((uint32_t)h[0] == 0x616b3432u) {
        st = hl_fail(err, HL_ERR_UNSUPPORTED,
                     "%s: llama2.c version 1/2 exports are not supported (only the legacy format)",
                     path);
        goto fail;
    }
    const int32_t dim = h[0], hidden = h[1], n_layers = h[2], n_heads = h[3], n_kv = h[4];
    const int32_t seq_len = h[6];
    const bool shared = h[5] > 0;
    const int64_t vocab = h[5] < 0 ? -(int64_t)h[5] : h[5];
    if (dim <= 0 || dim > L2C_MAX_DIM || hidden <= 0 || hidden > L2C_MAX_DIM || n_layers <= 0 ||
        n_layers > 4096 || n_heads <= 0 || n_kv <= 0 || n_kv > n_heads || n_heads % n_kv != 0 ||
        dim % n_heads != 0 || vocab == 0 || vocab > L2C_MAX_DIM * 4 || seq_len <= 0 ||
        seq_len > L2C_MAX_DIM || (dim / n_heads) % 2 != 0) {
        st = hl_fail(err, HL_ERR_FORMAT,
                     "%s: bad llama2.c header (dim=%d hidden_dim=%d n_layers=%d n_heads=%d "
                     "n_kv_heads=%d vocab_size=%d seq_len=%d)",
                     path, dim, hidden, n_layers, n_heads, n_kv, h[5], seq_len);
        goto fail;
    }
    const int64_t hs = dim / n_heads, kv_dim = hs * n_kv;
    uint64_t n_floats = 0;
    bool ok = add_u64(&n_floats, (uint64_t)vocab, (uint64_t)dim, 1) &&
              add_u64(&n_floats, (uint64_t)n_layers, (uint64_t)dim, 2) /* rms att+ffn */ &&
              add_u64(&n_floats, (uint64_t)n_layers, (uint64_t)dim, (uint64_t)dim * 2) &&
              add_u64(&n_floats, (uint64_t)n_layers, (uint64_t)dim, (uint64_t)kv_dim * 2) &&
              add_u64(&n_floats, (uint64_t)n_layers, (uint64_t)dim, (uint64_t)hidden * 3) &&
              add_u64(&n_floats, (uint64_t)dim, 1, 1) &&
              add_u64(&n_floats, (uint64_t)seq_len, (uint64_t)hs, 1) &&
              (shared || add_u64(&n_floats, (uint64_t)vocab, (uint64_t)dim, 1));
    uint64_t want = 0;
    if (!ok || __builtin_mul_overflow(n_floats, 4u, &want) ||
        __builtin_add_overflow(want, (uint64_t)L2C_HEADER_BYTES, &want) || want != m->map.size) {
        st = hl_fail(err, HL_ERR_FORMAT,
                     "%s: file has %zu bytes, but its llama2.c header (dim=%d n_layers=%d "
                     "vocab_size=%d) needs %llu",
                     path, m->map.size, dim, n_layers, h[5], (unsigned long long)want);
        goto fail;
    }

    model_hparams *hp = &m->hp;
    *hp = (model_hparams){
        .arch = "llama",
        .n_vocab = (int32_t)vocab,
        .n_ctx_train = seq_len,
        .n_embd = dim,
        .n_layer = n_layers,
        .n_ff = hidden,
        .n_head = n_heads,
        .n_head_kv = n_kv,
        .head_dim_k = (int32_t)hs,
        .head_dim_v = (int32_t)hs,
        .n_rot = (int32_t)hs,
        .rms_eps = 1e-5f,
        .rope_freq_base = 10000.0f,
        .rope_freq_scale = 1.0f,
        .rope_kind = MODEL_ROPE_NORM,
    };
    m->layers = calloc((size_t)n_layers, sizeof *m->layers);
    if (!m->layers) {
        st = hl_fail(err, HL_ERR_NOMEM, "out of memory");
        goto fail;
    }
    const float *p = (const float *)(m->map.data + L2C_HEADER_BYTES);
#define MAT(rows, cols)                                                                   \
    ((model_weight){.type = HL_TYPE_F32, .n_rows = (rows), .n_cols = (cols),              \
                    .ne = {(cols), (rows), 1, 1}, .data = p})
    m->tok_embd = MAT(vocab, dim);
    p += vocab * dim;
    for (int32_t l = 0; l < n_layers; l++) m->layers[l].attn_norm = p + (int64_t)l * dim;
    p += (int64_t)n_layers * dim;
    for (int32_t l = 0; l < n_layers; l++, p += (int64_t)dim * dim) m->layers[l].wq = MAT(dim, dim);
    for (int32_t l = 0; l < n_layers; l++, p += kv_dim * dim) m->layers[l].wk = MAT(kv_dim, dim);
    for (int32_t l = 0; l < n_layers; l++, p += kv_dim * dim) m->layers[l].wv = MAT(kv_dim, dim);
    for (int32_t l = 0; l < n_layers; l++, p += (int64_t)dim * dim) m->layers[l].wo = MAT(dim, dim);
    for (int32_t l = 0; l < n_layers; l++) m->layers[l].ffn_norm = p + (int64_t)l * dim;
    p += (int64_t)n_layers * dim;
    for (int32_t l = 0; l < n_layers; l++, p += (int64_t)hidden * dim)
        m->layers[l].w_gate = MAT(hidden, dim);
    for (int32_t l = 0; l < n_layers; l++, p += (int64_t)hidden * dim)
        m->layers[l].w_down = MAT(dim, hidden);
    for (int32_t l = 0; l < n_layers; l++, p += (int64_t)hidden * dim)
        m->layers[l].w_up = MAT(hidden, dim);
    m->output_norm = p;
    p += dim;
    p += (int64_t)seq_len * hs; /* freq_cis_real + freq_cis_imag */
    m->output = shared ? m->tok_embd : MAT(vocab, dim);
#undef MAT
    if ((st = finish_model(m, err))) goto fail;

    if (tokenizer_path) {
        if ((st = model_llama2c_vocab_load(tokenizer_path, &m->vocab, err))) goto fail;
        if (tok_vocab_n_tokens(m->vocab) != hp->n_vocab) {
            st = hl_fail(err, HL_ERR_FORMAT, "tokenizer '%s' has %d tokens but the model has %d",
                         tokenizer_path, tok_vocab_n_tokens(m->vocab), hp->n_vocab);
            goto fail;
        }
    }
    *out = m;
    return HL_OK;
fail:
    model_free(m);
    return st;
}

/* ---- tokenizer ---- */

static bool is_byte_token(const uint8_t *s, int32_t len) {
    static const char hex[] = "0123456789ABCDEFabcdef";
    return len == 6 && memcmp(s, "<0x", 3) == 0 && s[5] == '>' && s[3] &&
           strchr(hex, s[3]) != NULL && s[4] && strchr(hex, s[4]) != NULL;
}

hl_status model_llama2c_vocab_load(const char *path, tok_vocab **out, hl_err *err) {
    *out = NULL;
    char *buf;
    size_t len;
    hl_status st = hl_file_read(path, &buf, &len, err);
    if (st) return st;
    tok_vocab *v = NULL;
    char *text = NULL;
    const uint8_t *d = (const uint8_t *)buf;
    int32_t max_len;
    if (len < 4) {
        st = hl_fail(err, HL_ERR_FORMAT, "%s: too small for a llama2.c tokenizer", path);
        goto done;
    }
    memcpy(&max_len, d, 4);
    if (max_len <= 0 || max_len > (1 << 16)) {
        st = hl_fail(err, HL_ERR_FORMAT, "%s: bad max_token_length %d", path, max_len);
        goto done;
    }
    text = malloc((size_t)max_len * 3 + 1); /* ' ' (1 byte) becomes U+2581 (3 bytes) */
    v = tok_vocab_create(TOK_MODEL_SPM, NULL);
    if (!text || !v) {
        st = hl_fail(err, HL_ERR_NOMEM, "out of memory");
        goto done;
    }
    size_t off = 4;
    int32_t id = 0;
    while (off < len) {
        float score;
        int32_t n;
        if (len - off < 8) {
            st = hl_fail(err, HL_ERR_FORMAT, "%s: truncated at token %d", path, id);
            goto done;
        }
        memcpy(&score, d + off, 4);
        memcpy(&n, d + off + 4, 4);
        off += 8;
        if (n < 0 || n > max_len || (size_t)n > len - off) {
            st = hl_fail(err, HL_ERR_FORMAT, "%s: token %d has bad length %d (max %d)", path, id,
                         n, max_len);
            goto done;
        }
        const uint8_t *s = d + off;
        off += (size_t)n;
        tok_token_type type = TOK_TYPE_NORMAL;
        size_t tl = 0;
        if (id <= 2) {
            /* llama2.c stores "<unk>", "\n<s>\n", "\n</s>\n"; use SentencePiece's names. */
            static const char *const names[] = {"<unk>", "<s>", "</s>"};
            tl = strlen(names[id]);
            memcpy(text, names[id], tl);
            type = id == 0 ? TOK_TYPE_UNKNOWN : TOK_TYPE_CONTROL;
        } else if (is_byte_token(s, n)) {
            memcpy(text, s, (size_t)n);
            tl = (size_t)n;
            type = TOK_TYPE_BYTE;
        } else {
            for (int32_t i = 0; i < n; i++) {
                if (s[i] == ' ') {
                    memcpy(text + tl, "\xe2\x96\x81", 3);
                    tl += 3;
                } else {
                    text[tl++] = (char)s[i];
                }
            }
        }
        if ((st = tok_vocab_add_token(v, text, tl, score, type))) {
            hl_fail(err, st, "%s: cannot add token %d", path, id);
            goto done;
        }
        if (id == INT32_MAX - 1) {
            st = hl_fail(err, HL_ERR_FORMAT, "%s: too many tokens", path);
            goto done;
        }
        id++;
    }
    if (id < 3) {
        st = hl_fail(err, HL_ERR_FORMAT, "%s: only %d tokens", path, id);
        goto done;
    }
    tok_vocab_set_special(v, TOK_SPECIAL_UNK, 0);
    tok_vocab_set_special(v, TOK_SPECIAL_BOS, 1);
    tok_vocab_set_special(v, TOK_SPECIAL_EOS, 2);
    tok_vocab_set_add_bos(v, true);
    tok_vocab_set_add_eos(v, false);
    tok_vocab_set_add_space_prefix(v, true);
    if ((st = tok_vocab_finish(v, err))) {
        hl_err_prefix(err, "%s", path);
        goto done;
    }
    *out = v;
    v = NULL;
done:
    tok_vocab_destroy(v);
    free(text);
    free(buf);
    return st;
}
