/*
 * tok.c - the vocabulary (builder, GGUF loader, queries), special-token partitioning,
 * the encode driver for all three algorithms, and decoding (pieces, whole sequences,
 * streaming). SPM lives in spm.c, WordPiece in wpm.c, byte-level BPE in bpe.c.
 */
#include "tok/vocab.h"

#include "base/utf8.h"

#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ builder */

/* BPE pre-tokenizer names that change llama.cpp's defaults. */
typedef struct pre_traits {
    const char *name;
    bool add_bos;
    bool ignore_merges;
} pre_traits;

static const pre_traits k_pre_traits[] = {
    {"llama3", true, true},   {"llama-v3", true, true},  {"llama-bpe", true, true},
    {"falcon3", true, true},  {"falcon-h1", true, true}, {"pixtral", true, true},
    {"midm-2.0", true, true}, {"lfm2", true, true},      {"tekken", true, true},
    {"chameleon", true, false},
};

tok_vocab *tok_vocab_create(tok_model_kind kind, const char *pre) {
    tok_vocab *v = calloc(1, sizeof *v);
    if (!v) return NULL;
    v->kind = kind;
    v->pre = strdup(pre && *pre ? pre : "default");
    v->merges = hl_strmap_create(kind == TOK_MODEL_BPE ? 1024 : 16);
    if (!v->pre || !v->merges) {
        tok_vocab_destroy(v);
        return NULL;
    }
    for (int i = 0; i < TOK_SPECIAL_COUNT; i++) v->special[i] = -1;
    switch (kind) {
    case TOK_MODEL_SPM:
        v->add_bos = true;
        v->add_space_prefix = true;
        break;
    case TOK_MODEL_WPM: /* [CLS] ... [SEP] */
        v->add_bos = true;
        v->add_eos = true;
        break;
    case TOK_MODEL_BPE:
        for (size_t i = 0; i < sizeof k_pre_traits / sizeof k_pre_traits[0]; i++) {
            if (strcmp(v->pre, k_pre_traits[i].name) == 0) {
                v->add_bos = k_pre_traits[i].add_bos;
                v->ignore_merges = k_pre_traits[i].ignore_merges;
            }
        }
        break;
    default:
        break;
    }
    return v;
}

void tok_vocab_destroy(tok_vocab *v) {
    if (!v) return;
    free(v->pre);
    free(v->tokens);
    free(v->text_arena);
    hl_strmap_destroy(v->merges);
    hl_strmap_destroy(v->token_map);
    free(v->is_eog);
    free(v->piece_arena);
    free(v->piece_off);
    free(v->piece_len);
    free(v->trie);
    tok_pretok_destroy(v->pretok);
    free(v);
}

hl_status tok_vocab_add_token(tok_vocab *v, const char *text, size_t len, float score,
                              tok_token_type type) {
    if (v->finished || len > UINT32_MAX || v->n_tokens == INT32_MAX) return HL_ERR_INVALID;
    if ((size_t)v->n_tokens == v->cap_tokens) {
        size_t ncap = v->cap_tokens ? v->cap_tokens * 2 : 256;
        tok_entry *nt = realloc(v->tokens, ncap * sizeof *nt);
        if (!nt) return HL_ERR_NOMEM;
        v->tokens = nt;
        v->cap_tokens = ncap;
    }
    if (v->arena_cap - v->arena_len < len + 1) {
        size_t ncap = v->arena_cap ? v->arena_cap : 4096;
        while (ncap - v->arena_len < len + 1) ncap *= 2;
        char *na = realloc(v->text_arena, ncap);
        if (!na) return HL_ERR_NOMEM;
        v->text_arena = na;
        v->arena_cap = ncap;
    }
    tok_entry *e = &v->tokens[v->n_tokens++];
    e->text_off = v->arena_len;
    e->text_len = (uint32_t)len;
    e->score = score;
    e->type = (uint8_t)type;
    e->strip = 0;
    if (len) memcpy(v->text_arena + v->arena_len, text, len);
    v->text_arena[v->arena_len + len] = '\0';
    v->arena_len += len + 1;
    return HL_OK;
}

/* Merge keys are "left" 0xFF "right": 0xFF never occurs in UTF-8, so a token that
 * contains a space cannot make two merges collide. */
#define MERGE_SEP '\xff'

hl_status tok_vocab_add_merge(tok_vocab *v, const char *merge, size_t len) {
    if (v->finished) return HL_ERR_INVALID;
    /* Split at the first space after the first byte, as llama.cpp does. */
    const char *sp = len > 1 ? memchr(merge + 1, ' ', len - 1) : NULL;
    if (!sp) return HL_ERR_FORMAT;
    char small[256];
    char *key = len <= sizeof small ? small : malloc(len);
    if (!key) return HL_ERR_NOMEM;
    memcpy(key, merge, len);
    key[sp - merge] = MERGE_SEP;
    hl_status st = HL_OK;
    int64_t old;
    if (!hl_strmap_get(v->merges, key, len, &old)) /* the first occurrence keeps its rank */
        st = hl_strmap_put(v->merges, key, len, v->n_merges);
    if (key != small) free(key);
    if (st == HL_OK) v->n_merges++;
    return st;
}

void tok_vocab_set_special(tok_vocab *v, tok_special which, int32_t id) {
    if ((int)which >= 0 && which < TOK_SPECIAL_COUNT) v->special[which] = id;
}
void tok_vocab_set_token_strip(tok_vocab *v, int32_t id, int strip) {
    if (tok_id_valid(v, id) && !v->finished)
        v->tokens[id].strip = (uint8_t)(strip & (TOK_STRIP_LEFT | TOK_STRIP_RIGHT));
}
void tok_vocab_set_add_bos(tok_vocab *v, bool on) { v->add_bos = on; }
void tok_vocab_set_add_eos(tok_vocab *v, bool on) { v->add_eos = on; }
void tok_vocab_set_add_space_prefix(tok_vocab *v, bool on) { v->add_space_prefix = on; }

static const char *special_name(tok_special s) {
    static const char *names[TOK_SPECIAL_COUNT] = {"bos", "eos", "eot", "eom", "unknown",
                                                   "separator", "padding", "cls", "mask"};
    return names[s];
}

static const char *tok_text(const tok_vocab *v, int32_t id) {
    return v->text_arena + v->tokens[id].text_off;
}

/* Texts llama.cpp treats as end-of-turn markers when the file names no EOT. */
static const char *const k_eot_texts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<EOT>",
    "_<EOT>", ("<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"),
    "<end_of_utterance>",
};
/* Texts that end generation whatever the metadata says. */
static const char *const k_eog_texts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<end_of_turn>",
    "<|endoftext|>", "<|eom_id|>", "<EOT>", "_<EOT>", "<|end_of_text|>",
    "<end_of_utterance>",
};
#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

/* SPM byte tokens are "<0xXX>"; returns the byte or -1. */
static int parse_byte_token(const char *t, size_t n) {
    if (n != 6 || t[0] != '<' || t[1] != '0' || t[2] != 'x' || t[5] != '>') return -1;
    int val = 0;
    for (int i = 3; i < 5; i++) {
        char c = t[i];
        int d = c >= '0' && c <= '9' ? c - '0'
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                       : -1;
        if (d < 0) return -1;
        val = val * 16 + d;
    }
    return val;
}

static void replace_all_spm_spaces(const char *in, size_t n, char *out, size_t *out_len) {
    size_t w = 0;
    for (size_t i = 0; i < n; i++) {
        if (i + 2 < n && (uint8_t)in[i] == 0xE2 && (uint8_t)in[i + 1] == 0x96 &&
            (uint8_t)in[i + 2] == 0x81) {
            out[w++] = ' ';
            i += 2;
        } else {
            out[w++] = in[i];
        }
    }
    *out_len = w;
}

/* The bytes of every token, computed once (decoding is then a copy). */
static hl_status build_pieces(tok_vocab *v, hl_err *err) {
    size_t n = (size_t)v->n_tokens;
    v->piece_off = malloc(n * sizeof *v->piece_off);
    v->piece_len = malloc(n * sizeof *v->piece_len);
    /* No piece is longer than its text. */
    v->piece_arena = malloc(v->arena_len ? v->arena_len : 1);
    if (!v->piece_off || !v->piece_len || !v->piece_arena)
        return hl_fail(err, HL_ERR_NOMEM, "out of memory building the token pieces");
    size_t w = 0;
    for (size_t i = 0; i < n; i++) {
        const tok_entry *e = &v->tokens[i];
        const char *t = v->text_arena + e->text_off;
        char *out = v->piece_arena + w;
        size_t len = 0;
        int type = e->type;
        if (type == TOK_TYPE_CONTROL || type == TOK_TYPE_UNKNOWN ||
            type == TOK_TYPE_USER_DEFINED) {
            memcpy(out, t, e->text_len);
            len = e->text_len;
        } else if (v->kind == TOK_MODEL_BPE) {
            if (type == TOK_TYPE_NORMAL) {
                int64_t r = tok_bpe_unicode_to_bytes(t, e->text_len, out);
                if (r >= 0) {
                    len = (size_t)r;
                } else { /* not byte-mapped text: keep it as is */
                    memcpy(out, t, e->text_len);
                    len = e->text_len;
                }
            }
        } else if (type == TOK_TYPE_NORMAL) {
            replace_all_spm_spaces(t, e->text_len, out, &len);
        } else if (type == TOK_TYPE_BYTE) {
            int b = parse_byte_token(t, e->text_len);
            if (b >= 0) {
                out[0] = (char)b;
                len = 1;
            } else {
                memcpy(out, t, e->text_len);
                len = e->text_len;
            }
        }
        v->piece_off[i] = w;
        v->piece_len[i] = (uint32_t)len;
        if (len > v->max_piece_len) v->max_piece_len = (uint32_t)len;
        w += len;
    }
    return HL_OK;
}

static bool is_matchable_special(int type) {
    return type == TOK_TYPE_CONTROL || type == TOK_TYPE_USER_DEFINED || type == TOK_TYPE_UNKNOWN;
}

static hl_status build_trie(tok_vocab *v, hl_err *err) {
    size_t n_special = 0, bytes = 0;
    for (int32_t i = 0; i < v->n_tokens; i++) {
        if (is_matchable_special(v->tokens[i].type) && v->tokens[i].text_len > 0) {
            n_special++;
            bytes += v->tokens[i].text_len;
        }
    }
    if (n_special == 0) return HL_OK;
    size_t cap = bytes + 1;
    if (cap > INT32_MAX) return hl_fail(err, HL_ERR_UNSUPPORTED, "special tokens too large");
    v->trie = malloc(cap * sizeof *v->trie);
    if (!v->trie) return hl_fail(err, HL_ERR_NOMEM, "out of memory building special tokens");
    v->trie[0] = (tok_trie_node){-1, -1, -1, 0};
    v->n_trie = 1;
    for (int32_t id = 0; id < v->n_tokens; id++) {
        const tok_entry *e = &v->tokens[id];
        if (!is_matchable_special(e->type) || e->text_len == 0) continue;
        const uint8_t *t = (const uint8_t *)tok_text(v, id);
        v->special_first_byte[t[0] >> 3] |= (uint8_t)(1u << (t[0] & 7));
        int32_t node = 0;
        for (uint32_t k = 0; k < e->text_len; k++) {
            int32_t c = v->trie[node].first_child;
            while (c >= 0 && v->trie[c].byte != t[k]) c = v->trie[c].next_sibling;
            if (c < 0) {
                c = v->n_trie++;
                v->trie[c] = (tok_trie_node){-1, v->trie[node].first_child, -1, t[k]};
                v->trie[node].first_child = c;
            }
            node = c;
        }
        /* Two special tokens with the same text: the first id wins. */
        if (v->trie[node].token < 0) v->trie[node].token = id;
    }
    return HL_OK;
}

hl_status tok_vocab_finish(tok_vocab *v, hl_err *err) {
    if (v->finished) return hl_fail(err, HL_ERR_INVALID, "tokenizer vocabulary already finished");
    if (v->kind != TOK_MODEL_SPM && v->kind != TOK_MODEL_BPE && v->kind != TOK_MODEL_WPM)
        return hl_fail(err, HL_ERR_INVALID, "tokenizer vocabulary has no model type");
    if (v->n_tokens == 0) return hl_fail(err, HL_ERR_FORMAT, "tokenizer vocabulary is empty");
    for (int i = 0; i < TOK_SPECIAL_COUNT; i++) {
        int32_t id = v->special[i];
        if (id < -1 || id >= v->n_tokens)
            return hl_fail(err, HL_ERR_FORMAT,
                           "tokenizer: %s token id %d is out of range (vocabulary has %d tokens)",
                           special_name((tok_special)i), (int)id, (int)v->n_tokens);
    }
    for (int32_t i = 0; i < v->n_tokens; i++) {
        if (v->tokens[i].type > TOK_TYPE_BYTE)
            return hl_fail(err, HL_ERR_FORMAT, "tokenizer: token %d has invalid type %d", (int)i,
                           (int)v->tokens[i].type);
    }
    v->token_map = hl_strmap_create((size_t)v->n_tokens);
    v->is_eog = calloc((size_t)v->n_tokens, 1);
    if (!v->token_map || !v->is_eog)
        return hl_fail(err, HL_ERR_NOMEM, "out of memory building the vocabulary");
    for (int i = 0; i < 256; i++) v->byte_token[i] = -1;
    for (int32_t id = 0; id < v->n_tokens; id++) {
        const tok_entry *e = &v->tokens[id];
        if (hl_strmap_put(v->token_map, tok_text(v, id), e->text_len, id) != HL_OK)
            return hl_fail(err, HL_ERR_NOMEM, "out of memory building the vocabulary");
        if (e->text_len > v->max_token_len) v->max_token_len = e->text_len;
        if (e->type == TOK_TYPE_BYTE) {
            int b = parse_byte_token(tok_text(v, id), e->text_len);
            if (b >= 0 && v->byte_token[b] < 0) v->byte_token[b] = id;
        }
    }

    /* End of generation, as llama.cpp decides it: EOT/EOM found by text when the file
     * does not name them, every well-known end marker, then EOS/EOT/EOM. Markers are
     * forced to control type so they are never produced from plain text. */
    if (v->special[TOK_SPECIAL_EOT] < 0) {
        for (size_t k = 0; k < N_OF(k_eot_texts) && v->special[TOK_SPECIAL_EOT] < 0; k++) {
            int32_t id = tok_lookup(v, k_eot_texts[k], strlen(k_eot_texts[k]));
            if (id >= 0) {
                v->special[TOK_SPECIAL_EOT] = id;
                v->tokens[id].type = TOK_TYPE_CONTROL;
            }
        }
    }
    if (v->special[TOK_SPECIAL_EOM] < 0) {
        int32_t id = tok_lookup(v, "<|eom_id|>", 10);
        if (id >= 0) {
            v->special[TOK_SPECIAL_EOM] = id;
            v->tokens[id].type = TOK_TYPE_CONTROL;
        }
    }
    for (size_t k = 0; k < N_OF(k_eog_texts); k++) {
        int32_t id = tok_lookup(v, k_eog_texts[k], strlen(k_eog_texts[k]));
        if (id >= 0) {
            v->is_eog[id] = 1;
            v->tokens[id].type = TOK_TYPE_CONTROL;
        }
    }
    static const tok_special eog_roles[] = {TOK_SPECIAL_EOS, TOK_SPECIAL_EOT, TOK_SPECIAL_EOM};
    for (size_t k = 0; k < N_OF(eog_roles); k++)
        if (v->special[eog_roles[k]] >= 0) v->is_eog[v->special[eog_roles[k]]] = 1;

    if (v->kind == TOK_MODEL_SPM) v->spm_word_chunks = tok_spm_words_independent(v);

    hl_status st = build_pieces(v, err);
    if (st == HL_OK) st = build_trie(v, err);
    if (st != HL_OK) return st;
    if (v->kind == TOK_MODEL_BPE) {
        st = tok_pretok_create(v->pre, &v->pretok, err);
        if (st != HL_OK) {
            hl_err_prefix(err, "tokenizer pre-tokenizer \"%s\"", v->pre);
            return st;
        }
    }
    v->finished = true;
    return HL_OK;
}

/* ------------------------------------------------------------------ queries */

tok_model_kind tok_vocab_kind(const tok_vocab *v) { return v->kind; }
int32_t tok_vocab_n_tokens(const tok_vocab *v) { return v->n_tokens; }
int32_t tok_vocab_special(const tok_vocab *v, tok_special which) {
    return (int)which >= 0 && which < TOK_SPECIAL_COUNT ? v->special[which] : -1;
}
bool tok_vocab_add_bos(const tok_vocab *v) { return v->add_bos; }
bool tok_vocab_add_eos(const tok_vocab *v) { return v->add_eos; }

bool tok_is_eog(const tok_vocab *v, int32_t id) {
    return tok_id_valid(v, id) && v->is_eog && v->is_eog[id];
}
bool tok_is_control(const tok_vocab *v, int32_t id) {
    return tok_id_valid(v, id) && v->tokens[id].type == TOK_TYPE_CONTROL;
}
const char *tok_token_text(const tok_vocab *v, int32_t id, size_t *len) {
    if (!tok_id_valid(v, id)) {
        if (len) *len = 0;
        return NULL;
    }
    if (len) *len = v->tokens[id].text_len;
    return tok_text(v, id);
}
float tok_token_score(const tok_vocab *v, int32_t id) {
    return tok_id_valid(v, id) ? v->tokens[id].score : 0.0f;
}
tok_token_type tok_token_get_type(const tok_vocab *v, int32_t id) {
    return tok_id_valid(v, id) ? (tok_token_type)v->tokens[id].type : TOK_TYPE_UNDEFINED;
}
int32_t tok_find_token(const tok_vocab *v, const char *text, size_t len) {
    return v->token_map ? tok_lookup(v, text, len) : -1;
}

int64_t tok_merge_rank(const tok_vocab *v, const char *left, size_t left_len, const char *right,
                       size_t right_len) {
    size_t n = left_len + right_len + 1;
    char small[512];
    char *key = n <= sizeof small ? small : malloc(n);
    if (!key) return -1;
    memcpy(key, left, left_len);
    key[left_len] = MERGE_SEP;
    memcpy(key + left_len + 1, right, right_len);
    int64_t rank;
    bool found = hl_strmap_get(v->merges, key, n, &rank);
    if (key != small) free(key);
    return found ? rank : -1;
}
const tok_pretok *tok_vocab_pretok(const tok_vocab *v) { return v->pretok; }
bool tok_vocab_ignore_merges(const tok_vocab *v) { return v->ignore_merges; }

/* ------------------------------------------------------------------ GGUF loading */

/* Reads a token id key: absent keeps *id; 0xFFFFFFFF / -1 mean "none". */
static hl_status read_id_key(const gguf_file *f, const char *key, int32_t n_tokens, int32_t *id,
                             hl_err *err) {
    if (gguf_find_key(f, key) < 0) return HL_OK;
    uint32_t u;
    int32_t s;
    int64_t val;
    if (gguf_get_u32(f, key, &u)) val = u == UINT32_MAX ? -1 : (int64_t)u;
    else if (gguf_get_i32(f, key, &s)) val = s;
    else return hl_fail(err, HL_ERR_FORMAT, "%s: expected an integer token id", key);
    if (val < -1 || val >= n_tokens)
        return hl_fail(err, HL_ERR_FORMAT, "%s = %lld is out of range (vocabulary has %d tokens)",
                       key, (long long)val, (int)n_tokens);
    *id = (int32_t)val;
    return HL_OK;
}

/* Whether s (len bytes) contains needle, ASCII case-insensitively. */
static bool contains_ci(const char *s, size_t len, const char *needle) {
    size_t n = strlen(needle);
    for (size_t i = 0; i + n <= len; i++) {
        size_t k = 0;
        while (k < n && (s[i + k] | 0x20) == (needle[k] | 0x20)) k++;
        if (k == n) return true;
    }
    return false;
}

static void set_strip_by_text(tok_vocab *v, const char *text, int strip) {
    /* the text map is built later, in finish: scan */
    for (int32_t i = 0; i < v->n_tokens; i++)
        if (v->tokens[i].text_len == strlen(text) && memcmp(tok_text(v, i), text, strlen(text)) == 0)
            v->tokens[i].strip = (uint8_t)strip;
}

/* GGUF has no per-token strip flags; llama.cpp sets them for some models by name. */
static void apply_model_strip_rules(const gguf_file *f, tok_vocab *v) {
    gguf_str name = {0}, arch = {0};
    gguf_get_str(f, "general.name", &name);
    gguf_get_str(f, "general.architecture", &arch);
    if (contains_ci(v->pre, strlen(v->pre), "jina-v2-de") ||
        contains_ci(v->pre, strlen(v->pre), "jina-v2-es") ||
        contains_ci(v->pre, strlen(v->pre), "jina-v2-code") ||
        (arch.ptr && (contains_ci(arch.ptr, arch.len, "nomic-bert-moe") ||
                      contains_ci(arch.ptr, arch.len, "jina-bert-v3")))) {
        set_strip_by_text(v, "<mask>", TOK_STRIP_LEFT);
    } else if (name.ptr && (contains_ci(name.ptr, name.len, "phi-3") ||
                            contains_ci(name.ptr, name.len, "phi3"))) {
        for (int32_t i = 0; i < v->n_tokens; i++)
            if (is_matchable_special(v->tokens[i].type)) v->tokens[i].strip = TOK_STRIP_RIGHT;
        set_strip_by_text(v, "</s>", TOK_STRIP_RIGHT);
        set_strip_by_text(v, "<unk>", 0);
        set_strip_by_text(v, "<s>", 0);
        set_strip_by_text(v, "<|endoftext|>", 0);
    }
}

static hl_status load_gguf_into(const gguf_file *f, tok_vocab **out, hl_err *err) {
    gguf_str model;
    if (!gguf_get_str(f, "tokenizer.ggml.model", &model))
        return hl_fail(err, HL_ERR_FORMAT, "the model has no tokenizer (tokenizer.ggml.model "
                                           "is missing)");
    tok_model_kind kind;
    if (gguf_str_eq(model, "llama")) kind = TOK_MODEL_SPM;
    else if (gguf_str_eq(model, "gpt2")) kind = TOK_MODEL_BPE;
    else if (gguf_str_eq(model, "bert")) kind = TOK_MODEL_WPM;
    else if (gguf_str_eq(model, "no_vocab"))
        return hl_fail(err, HL_ERR_UNSUPPORTED, "the model has no vocabulary "
                                                "(tokenizer.ggml.model = \"no_vocab\")");
    else
        return hl_fail(err, HL_ERR_UNSUPPORTED, "unsupported tokenizer model \"%.*s\"",
                       (int)(model.len > 64 ? 64 : model.len), model.ptr);

    char pre[128] = "default";
    gguf_str pre_s;
    if (kind == TOK_MODEL_BPE && gguf_get_str(f, "tokenizer.ggml.pre", &pre_s)) {
        if (pre_s.len >= sizeof pre || memchr(pre_s.ptr, '\0', pre_s.len))
            return hl_fail(err, HL_ERR_FORMAT, "tokenizer.ggml.pre is not a valid name");
        memcpy(pre, pre_s.ptr, pre_s.len);
        pre[pre_s.len] = '\0';
        if (!pre[0]) strcpy(pre, "default");
    }

    gguf_type et;
    uint64_t n;
    if (!gguf_get_arr(f, "tokenizer.ggml.tokens", &et, &n) || et != GGUF_TYPE_STRING)
        return hl_fail(err, HL_ERR_FORMAT, "tokenizer.ggml.tokens is missing or not a string array");
    if (n == 0 || n > INT32_MAX)
        return hl_fail(err, HL_ERR_FORMAT, "tokenizer.ggml.tokens has %llu entries",
                       (unsigned long long)n);
    const uint8_t *scores = NULL, *types = NULL;
    uint64_t m;
    if (gguf_find_key(f, "tokenizer.ggml.scores") >= 0) {
        if (!gguf_get_arr(f, "tokenizer.ggml.scores", &et, &m) || et != GGUF_TYPE_FLOAT32)
            return hl_fail(err, HL_ERR_FORMAT, "tokenizer.ggml.scores is not a float32 array");
        if (m != n)
            return hl_fail(err, HL_ERR_FORMAT, "tokenizer.ggml.scores has %llu entries, "
                           "tokens has %llu", (unsigned long long)m, (unsigned long long)n);
        scores = gguf_arr_data(f, "tokenizer.ggml.scores");
    }
    if (gguf_find_key(f, "tokenizer.ggml.token_type") >= 0) {
        if (!gguf_get_arr(f, "tokenizer.ggml.token_type", &et, &m) ||
            (et != GGUF_TYPE_INT32 && et != GGUF_TYPE_UINT32))
            return hl_fail(err, HL_ERR_FORMAT, "tokenizer.ggml.token_type is not an int32 array");
        if (m != n)
            return hl_fail(err, HL_ERR_FORMAT, "tokenizer.ggml.token_type has %llu entries, "
                           "tokens has %llu", (unsigned long long)m, (unsigned long long)n);
        types = gguf_arr_data(f, "tokenizer.ggml.token_type");
    }

    tok_vocab *v = tok_vocab_create(kind, pre);
    if (!v) return hl_fail(err, HL_ERR_NOMEM, "out of memory creating the vocabulary");
    *out = v;
    for (uint64_t i = 0; i < n; i++) {
        gguf_str t = gguf_arr_str(f, "tokenizer.ggml.tokens", i);
        float score = 0.0f;
        int32_t type = TOK_TYPE_NORMAL;
        if (scores) memcpy(&score, scores + 4 * i, 4);
        if (types) memcpy(&type, types + 4 * i, 4);
        if (type < 0 || type > TOK_TYPE_BYTE)
            return hl_fail(err, HL_ERR_FORMAT, "tokenizer.ggml.token_type[%llu] = %d is not a "
                           "valid token type", (unsigned long long)i, (int)type);
        if (t.len > UINT32_MAX)
            return hl_fail(err, HL_ERR_FORMAT, "token %llu is too long", (unsigned long long)i);
        if (tok_vocab_add_token(v, t.ptr, (size_t)t.len, score, (tok_token_type)type) != HL_OK)
            return hl_fail(err, HL_ERR_NOMEM, "out of memory loading the vocabulary");
    }

    if (kind == TOK_MODEL_BPE) {
        if (!gguf_get_arr(f, "tokenizer.ggml.merges", &et, &m) || et != GGUF_TYPE_STRING)
            return hl_fail(err, HL_ERR_FORMAT, "BPE tokenizer without tokenizer.ggml.merges "
                                               "(or not a string array)");
        for (uint64_t i = 0; i < m; i++) {
            gguf_str s = gguf_arr_str(f, "tokenizer.ggml.merges", i);
            hl_status st = tok_vocab_add_merge(v, s.ptr, (size_t)s.len);
            if (st == HL_ERR_FORMAT)
                return hl_fail(err, st, "tokenizer.ggml.merges[%llu] = \"%.*s\" is not "
                               "\"left right\"", (unsigned long long)i,
                               (int)(s.len > 64 ? 64 : s.len), s.ptr);
            if (st != HL_OK) return hl_fail(err, st, "out of memory loading merges");
        }
    }

    /* Defaults as llama.cpp has them, then the file's values (validated). */
    int32_t nt = (int32_t)n;
    int32_t *sp = v->special;
    if (kind == TOK_MODEL_SPM) {
        sp[TOK_SPECIAL_BOS] = 1, sp[TOK_SPECIAL_EOS] = 2, sp[TOK_SPECIAL_UNK] = 0;
    } else if (kind == TOK_MODEL_BPE) {
        sp[TOK_SPECIAL_BOS] = 11, sp[TOK_SPECIAL_EOS] = 11;
    } else {
        sp[TOK_SPECIAL_UNK] = 100, sp[TOK_SPECIAL_CLS] = 101, sp[TOK_SPECIAL_SEP] = 102;
        sp[TOK_SPECIAL_PAD] = 0, sp[TOK_SPECIAL_MASK] = 103;
    }
    for (int i = 0; i < TOK_SPECIAL_COUNT; i++)
        if (sp[i] >= nt) sp[i] = -1; /* a default that does not fit this vocabulary */
    static const struct {
        const char *key;
        tok_special which;
    } id_keys[] = {
        {"tokenizer.ggml.bos_token_id", TOK_SPECIAL_BOS},
        {"tokenizer.ggml.eos_token_id", TOK_SPECIAL_EOS},
        {"tokenizer.ggml.eot_token_id", TOK_SPECIAL_EOT},
        {"tokenizer.ggml.eom_token_id", TOK_SPECIAL_EOM},
        {"tokenizer.ggml.unknown_token_id", TOK_SPECIAL_UNK},
        {"tokenizer.ggml.seperator_token_id", TOK_SPECIAL_SEP}, /* the old spelling */
        {"tokenizer.ggml.separator_token_id", TOK_SPECIAL_SEP},
        {"tokenizer.ggml.padding_token_id", TOK_SPECIAL_PAD},
        {"tokenizer.ggml.cls_token_id", TOK_SPECIAL_CLS},
        {"tokenizer.ggml.mask_token_id", TOK_SPECIAL_MASK},
    };
    for (size_t i = 0; i < N_OF(id_keys); i++) {
        hl_status st = read_id_key(f, id_keys[i].key, nt, &sp[id_keys[i].which], err);
        if (st != HL_OK) return st;
    }
    bool b;
    if (gguf_get_bool(f, "tokenizer.ggml.add_bos_token", &b)) v->add_bos = b;
    if (gguf_get_bool(f, "tokenizer.ggml.add_eos_token", &b)) v->add_eos = b;
    if (kind == TOK_MODEL_WPM && gguf_get_bool(f, "tokenizer.ggml.add_sep_token", &b))
        v->add_eos = b;
    if (gguf_get_bool(f, "tokenizer.ggml.add_space_prefix", &b)) v->add_space_prefix = b;
    apply_model_strip_rules(f, v);
    return tok_vocab_finish(v, err);
}

hl_status tok_vocab_load_gguf(const gguf_file *f, tok_vocab **out, hl_err *err) {
    tok_vocab *v = NULL;
    *out = NULL;
    hl_status st = load_gguf_into(f, &v, err);
    if (st != HL_OK) {
        tok_vocab_destroy(v);
        return st;
    }
    *out = v;
    return HL_OK;
}

/* ------------------------------------------------------------------ encoding */

typedef struct special_match {
    size_t start;
    uint32_t len;
    int32_t id;
} special_match;

typedef struct match_list {
    special_match *m;
    size_t n, cap;
} match_list;

static hl_status match_push(match_list *l, size_t start, uint32_t len, int32_t id) {
    if (l->n == l->cap) {
        size_t ncap = l->cap ? l->cap * 2 : 64;
        special_match *nm = realloc(l->m, ncap * sizeof *nm);
        if (!nm) return HL_ERR_NOMEM;
        l->m = nm;
        l->cap = ncap;
    }
    l->m[l->n++] = (special_match){start, len, id};
    return HL_OK;
}

/* llama.cpp's priority: longer special tokens are split out first. */
static int cmp_priority(const void *a, const void *b) {
    const special_match *x = a, *y = b;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    if (x->id != y->id) return x->id < y->id ? -1 : 1;
    return x->start < y->start ? -1 : x->start > y->start;
}
static int cmp_start(const void *a, const void *b) {
    const special_match *x = a, *y = b;
    return x->start < y->start ? -1 : x->start > y->start;
}

/* Finds the special tokens to split out of text, in text order. Equivalent to
 * llama.cpp's partition (each special token, longest first, cut out of the raw
 * fragments left to right) without its O(tokens * text) scan: every occurrence is
 * found with a trie walk, then occurrences are accepted by priority when they do not
 * overlap one accepted before. */
static hl_status find_specials(const tok_vocab *v, const char *text, size_t len,
                               bool parse_special, match_list *out) {
    if (!v->trie) return HL_OK;
    const uint8_t *t = (const uint8_t *)text;
    for (size_t p = 0; p < len; p++) {
        if (!(v->special_first_byte[t[p] >> 3] & (1u << (t[p] & 7)))) continue;
        int32_t node = 0;
        for (size_t q = p; q < len; q++) {
            int32_t c = v->trie[node].first_child;
            while (c >= 0 && v->trie[c].byte != t[q]) c = v->trie[c].next_sibling;
            if (c < 0) break;
            node = c;
            int32_t id = v->trie[node].token;
            if (id < 0) continue;
            int type = v->tokens[id].type;
            if (!parse_special && type != TOK_TYPE_USER_DEFINED) continue;
            if (match_push(out, p, (uint32_t)(q - p + 1), id) != HL_OK) return HL_ERR_NOMEM;
        }
    }
    if (out->n == 0) return HL_OK;
    qsort(out->m, out->n, sizeof *out->m, cmp_priority);
    uint8_t *taken = calloc(len, 1);
    if (!taken) return HL_ERR_NOMEM;
    size_t kept = 0;
    for (size_t i = 0; i < out->n; i++) {
        special_match m = out->m[i];
        /* Rejected if it overlaps a match accepted before (O(length) per match). */
        bool free_span = true;
        for (size_t k = m.start; k < m.start + m.len; k++) {
            if (taken[k]) {
                free_span = false;
                break;
            }
        }
        if (!free_span) continue;
        memset(taken + m.start, 1, m.len);
        out->m[kept++] = m;
    }
    free(taken);
    out->n = kept;
    qsort(out->m, out->n, sizeof *out->m, cmp_start);
    return HL_OK;
}

typedef struct bpe_split_ctx {
    const tok_vocab *v;
    const char *text;
    tok_sink *sink;
    hl_err *err;
    hl_status st;
} bpe_split_ctx;

static void bpe_emit_word(void *ud, size_t start, size_t len) {
    bpe_split_ctx *c = ud;
    if (c->st != HL_OK || len == 0) return;
    c->st = tok_bpe_encode_word(c->v, c->text + start, len, c->sink, c->err);
}

static hl_status encode_raw(const tok_vocab *v, const char *text, size_t len, bool space_prefix,
                            tok_sink *sink, hl_err *err) {
    switch (v->kind) {
    case TOK_MODEL_SPM:
        return tok_spm_encode(v, text, len, space_prefix, sink, err);
    case TOK_MODEL_WPM:
        return tok_wpm_encode(v, text, len, sink, err);
    case TOK_MODEL_BPE: {
        bpe_split_ctx c = {v, text, sink, err, HL_OK};
        hl_status st = tok_pretok_split(v->pretok, text, len, bpe_emit_word, &c, err);
        return st != HL_OK ? st : c.st;
    }
    default:
        return hl_fail(err, HL_ERR_INVALID, "tokenizer has no model");
    }
}

static bool is_c_space(char c) {
    return c == ' ' || (c >= '\t' && c <= '\r');
}

hl_status tok_encode(const tok_vocab *v, const char *text, size_t len, bool add_special,
                     bool parse_special, int32_t *out, size_t max_out, size_t *n_out,
                     hl_err *err) {
    *n_out = 0;
    if (!v->finished) return hl_fail(err, HL_ERR_INVALID, "tokenizer vocabulary not finished");
    if (!text && len) return hl_fail(err, HL_ERR_INVALID, "tok_encode: NULL text");
    tok_sink sink = {out, out ? max_out : 0, 0};
    bool wpm = v->kind == TOK_MODEL_WPM;
    if (add_special && v->add_bos) {
        int32_t id = wpm && v->special[TOK_SPECIAL_CLS] >= 0 ? v->special[TOK_SPECIAL_CLS]
                                                             : v->special[TOK_SPECIAL_BOS];
        if (id >= 0) tok_sink_push(&sink, id);
    }
    match_list ml = {0};
    hl_status st = len ? find_specials(v, text, len, parse_special, &ml) : HL_OK;
    if (st != HL_OK) {
        free(ml.m);
        return hl_fail(err, st, "out of memory finding special tokens");
    }
    /* SPM puts a space before the text at the start and after every special token. */
    bool prev_special = true;
    size_t pos = 0;
    for (size_t i = 0; i <= ml.n && st == HL_OK; i++) {
        size_t end = i < ml.n ? ml.m[i].start : len;
        if (i > 0 && (v->tokens[ml.m[i - 1].id].strip & TOK_STRIP_RIGHT))
            while (pos < end && is_c_space(text[pos])) pos++;
        if (i < ml.n && (v->tokens[ml.m[i].id].strip & TOK_STRIP_LEFT))
            while (end > pos && is_c_space(text[end - 1])) end--;
        if (end > pos) {
            st = encode_raw(v, text + pos, end - pos, v->add_space_prefix && prev_special, &sink,
                            err);
            prev_special = false;
        }
        if (i < ml.n) {
            tok_sink_push(&sink, ml.m[i].id);
            prev_special = true;
            pos = ml.m[i].start + ml.m[i].len;
        }
    }
    free(ml.m);
    if (st != HL_OK) return st;
    if (add_special && v->add_eos) {
        int32_t id = wpm && v->special[TOK_SPECIAL_SEP] >= 0 ? v->special[TOK_SPECIAL_SEP]
                                                             : v->special[TOK_SPECIAL_EOS];
        if (id >= 0) tok_sink_push(&sink, id);
    }
    *n_out = sink.n;
    return HL_OK;
}

/* ------------------------------------------------------------------ decoding */

/* The piece of id (NULL for an invalid id); empty for hidden special tokens. */
static const char *piece_of(const tok_vocab *v, int32_t id, bool render_special, size_t *len) {
    if (!v->finished || !tok_id_valid(v, id)) return NULL;
    int type = v->tokens[id].type;
    if (!render_special && (type == TOK_TYPE_CONTROL || type == TOK_TYPE_UNKNOWN)) {
        *len = 0;
        return "";
    }
    *len = v->piece_len[id];
    return v->piece_arena + v->piece_off[id];
}

int32_t tok_token_to_piece(const tok_vocab *v, int32_t id, bool render_special, char *buf,
                           size_t cap) {
    size_t n;
    const char *p = piece_of(v, id, render_special, &n);
    if (!p) return -1;
    if (buf) memcpy(buf, p, n < cap ? n : cap);
    return (int32_t)n;
}

int64_t tok_decode(const tok_vocab *v, const int32_t *ids, size_t n, bool render_special,
                   bool remove_leading_space, char *buf, size_t cap) {
    int64_t total = 0;
    bool strip = remove_leading_space && v->add_space_prefix;
    for (size_t i = 0; i < n; i++) {
        size_t len;
        const char *p = piece_of(v, ids[i], render_special, &len);
        if (!p) return -1;
        /* Like llama.cpp, only the first token may lose its space (a BOS there uses up
         * the chance). */
        if (i == 0 && strip && len > 0 && p[0] == ' ') p++, len--;
        if (buf && (uint64_t)total < cap) {
            size_t room = cap - (size_t)total;
            memcpy(buf + total, p, len < room ? len : room);
        }
        total += (int64_t)len;
    }
    return total;
}

/* ------------------------------------------------------------------ streaming */

void tok_stream_init(tok_stream *s, const tok_vocab *v, bool render_special,
                     bool strip_leading_space) {
    memset(s, 0, sizeof *s);
    s->vocab = v;
    s->render_special = render_special;
    s->strip_leading_space = strip_leading_space;
    s->at_start = true;
}

static const uint8_t k_replacement[3] = {0xEF, 0xBF, 0xBD};

int32_t tok_stream_push(tok_stream *s, int32_t id, char *buf, size_t cap) {
    size_t plen = 0;
    const char *p = piece_of(s->vocab, id, s->render_special, &plen);
    if (!p) { /* an invalid id contributes nothing */
        p = "";
        plen = 0;
    }
    if (s->at_start && s->strip_leading_space && s->vocab->add_space_prefix && plen > 0 &&
        p[0] == ' ')
        p++, plen--;
    /* Bytes are the held tail followed by the piece; read through at(). */
    size_t np = s->n_pending, total = np + plen, w = 0, i = 0;
#define AT(k) ((k) < np ? s->pending[(k)] : (uint8_t)p[(k) - np])
    uint8_t hold[8];
    size_t n_hold = 0;
    while (i < total) {
        uint8_t b = AT(i);
        int k = hl_utf8_seq_len(b);
        size_t m = 1;
        if (k > 1)
            while (m < (size_t)k && i + m < total && hl_utf8_cont_ok(b, (int)m, AT(i + m))) m++;
        if (k >= 1 && m == (size_t)k) {
            if (cap - w < m) return -1;
            for (size_t j = 0; j < m; j++) buf[w++] = (char)AT(i + j);
            i += m;
        } else if (k > 1 && i + m == total) { /* a valid start, cut short: wait */
            for (size_t j = 0; j < m; j++) hold[n_hold++] = AT(i + j);
            i += m;
        } else { /* one U+FFFD per maximal invalid subpart */
            if (cap < w + 3) return -1;
            memcpy(buf + w, k_replacement, 3);
            w += 3;
            i += m;
        }
    }
#undef AT
    memcpy(s->pending, hold, n_hold);
    s->n_pending = n_hold;
    s->at_start = false;
    return (int32_t)w;
}

size_t tok_stream_buf_size(const tok_vocab *v) {
    return 3 * ((size_t)v->max_piece_len + sizeof ((tok_stream *)0)->pending);
}

int32_t tok_stream_flush(tok_stream *s, char *buf, size_t cap) {
    if (s->n_pending == 0) return 0;
    if (cap < 3) return -1;
    memcpy(buf, k_replacement, 3);
    s->n_pending = 0;
    return 3;
}
