/*
 * hf.c - tok_vocab_load_hf: a Hugging Face tokenizer.json (or .json.gz) with a
 * byte-level BPE model, turned into a vocab through the builder API.
 *
 * Ids come from model.vocab and added_tokens (special -> CONTROL, else
 * USER_DEFINED, like llama.cpp's converter; holes become UNUSED "[PADn]" tokens).
 * The pre-tokenizer name is recognised from pre_tokenizer (ByteLevel alone, or a
 * Split regex we know). BOS/EOS come from a tokenizer_config.json next to the file
 * when there is one, else from the post-processor template and common token names.
 * Other model types (WordPiece, Unigram, SentencePiece-style BPE) are refused.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "tok/internal.h"
#include "tok/vocab.h"

typedef struct hf_token {
    const char *text; /* owned by the JSON tree */
    size_t len;
    tok_token_type type;
    bool set;
} hf_token;

static const char *json_str(const json_t *o, const char *key) {
    const json_t *s = json_object_get(o, key);
    return json_is_string(s) ? json_string_value(s) : NULL;
}

/* ---- pre-tokenizer recognition ---- */

static const char HF_RE_GPT2[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)";
static const char HF_RE_GPT2_WS[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
static const char HF_RE_LLAMA3[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+"
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char HF_RE_QWEN2[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+"
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char HF_RE_GPT4O[] =
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+"
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+"
    "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+"
    "[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char HF_RE_TEKKEN[] =
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+|"
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*|"
    "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

typedef struct hf_pre_scan {
    int n_bytelevel;
    bool bytelevel_regex; /* a ByteLevel step that splits with GPT-2's regex */
    int n_digits;
    bool digits_individual;
    int n_split;
    const char *split[8];
    const char *other; /* the type of a step we do not know */
} hf_pre_scan;

static void scan_pre_step(const json_t *step, hf_pre_scan *s) {
    const char *type = json_str(step, "type");
    if (!type) {
        s->other = "(no type)";
    } else if (strcmp(type, "ByteLevel") == 0) {
        const json_t *ur = json_object_get(step, "use_regex");
        s->n_bytelevel++;
        if (!ur || json_is_true(ur)) s->bytelevel_regex = true;
    } else if (strcmp(type, "Digits") == 0) {
        s->n_digits++;
        s->digits_individual = json_is_true(json_object_get(step, "individual_digits"));
    } else if (strcmp(type, "Split") == 0) {
        const json_t *pat = json_object_get(step, "pattern");
        const char *re = json_str(pat, "Regex");
        if (!re) {
            s->other = "Split (with a plain string pattern)";
        } else if (s->n_split < 8) {
            s->split[s->n_split++] = re;
        } else {
            s->other = "Split (too many)";
        }
    } else if (strcmp(type, "Sequence") == 0) {
        const json_t *steps = json_object_get(step, "pretokenizers");
        size_t i;
        const json_t *sub;
        json_array_foreach(steps, i, sub) scan_pre_step(sub, s);
    } else {
        s->other = type;
    }
}

/* Maps pre_tokenizer to a tok_pretok name, or NULL with err filled. */
static const char *hf_pre_name(const json_t *pre, const char *path, hl_err *err) {
    hf_pre_scan s = {0};
    if (!json_is_object(pre)) {
        hl_fail(err, HL_ERR_UNSUPPORTED, "%s: no pre_tokenizer; only byte-level BPE is supported",
                path);
        return NULL;
    }
    scan_pre_step(pre, &s);
    if (s.other) {
        hl_fail(err, HL_ERR_UNSUPPORTED, "%s: pre_tokenizer step \"%.80s\" is not supported",
                path, s.other);
        return NULL;
    }
    if (s.n_bytelevel != 1) {
        hl_fail(err, HL_ERR_UNSUPPORTED,
                "%s: pre_tokenizer has no ByteLevel step; only byte-level BPE is supported", path);
        return NULL;
    }
    if (s.bytelevel_regex) {
        if (s.n_split == 0 && s.n_digits == 0) return "gpt-2";
        if (s.n_split == 0 && s.n_digits == 1 && s.digits_individual) return "starcoder";
    } else if (s.n_digits == 0) {
        if (s.n_split == 1) {
            const char *re = s.split[0];
            if (!strcmp(re, HF_RE_LLAMA3)) return "llama3";
            if (!strcmp(re, HF_RE_QWEN2)) return "qwen2";
            if (!strcmp(re, HF_RE_GPT4O)) return "gpt-4o";
            if (!strcmp(re, HF_RE_TEKKEN)) return "tekken";
            if (!strcmp(re, HF_RE_GPT2) || !strcmp(re, HF_RE_GPT2_WS)) return "gpt-2";
        }
        if (s.n_split >= 5 && !strcmp(s.split[0], "[\r\n]")) {
            if (!strncmp(s.split[1], "\\s?[A-Za-z", 10)) return "deepseek-llm";
            if (!strcmp(s.split[1], "\\s?\\p{L}+")) return "deepseek-coder";
        }
        if (s.n_split == 3 && !strcmp(s.split[0], "\\p{N}{1,3}")) return "deepseek-v3";
    }
    hl_fail(err, HL_ERR_UNSUPPORTED, "%s: unrecognised pre_tokenizer (%d Split regexes%s%.120s)",
            path, s.n_split, s.n_split ? ", first: " : "", s.n_split ? s.split[0] : "");
    return NULL;
}

/* ---- special tokens ---- */

/* Tokens llama.cpp's converter marks CONTROL even when tokenizer.json does not. */
static bool looks_special(const char *t, size_t n) {
    if (n >= 4 && !memcmp(t, "<|", 2) && !memcmp(t + n - 2, "|>", 2)) return true;
    /* DeepSeek's fullwidth bars: <｜...｜> */
    if (n >= 8 && !memcmp(t, "<\xef\xbd\x9c", 4) && !memcmp(t + n - 4, "\xef\xbd\x9c>", 4))
        return true;
    if (n >= 8 && !memcmp(t, "<unused", 7) && t[n - 1] == '>') return true;
    return (n == 5 && !memcmp(t, "<pad>", 5)) || (n == 6 && !memcmp(t, "<mask>", 6));
}

static int32_t find_text(const hf_token *toks, int32_t n, const char *text) {
    size_t len = strlen(text);
    /* added tokens are at the end: search backwards */
    for (int32_t i = n - 1; i >= 0; i--) {
        if (toks[i].len == len && !memcmp(toks[i].text, text, len)) return i;
    }
    return -1;
}

/* A config token is a string or {"content": "..."}. */
static const char *config_token(const json_t *cfg, const char *key) {
    const json_t *t = json_object_get(cfg, key);
    if (json_is_string(t)) return json_string_value(t);
    if (json_is_object(t)) return json_str(t, "content");
    return NULL;
}

/* tokenizer_config.json in the same directory, or NULL (absent or unreadable). */
static json_t *load_config(const char *path) {
    const char *slash = strrchr(path, '/');
    size_t dir = slash ? (size_t)(slash - path + 1) : 0;
    char *cfg_path = malloc(dir + sizeof "tokenizer_config.json");
    if (!cfg_path) return NULL;
    memcpy(cfg_path, path, dir);
    memcpy(cfg_path + dir, "tokenizer_config.json", sizeof "tokenizer_config.json");
    char *buf = NULL;
    size_t len = 0;
    json_t *cfg = NULL;
    if (hl_file_read(cfg_path, &buf, &len, NULL) == HL_OK) {
        /* model_max_length is often 1e30 written as an integer, too big for jansson */
        cfg = json_loadb(buf, len, JSON_DECODE_INT_AS_REAL, NULL);
        if (cfg && !json_is_object(cfg)) {
            json_decref(cfg);
            cfg = NULL;
        }
    }
    free(buf);
    free(cfg_path);
    return cfg;
}

/* The first SpecialToken of post_processor's TemplateProcessing "single" template. */
static const char *template_bos(const json_t *pp) {
    const char *type = json_str(pp, "type");
    if (!type) return NULL;
    if (!strcmp(type, "Sequence")) {
        size_t i;
        const json_t *sub;
        json_array_foreach(json_object_get(pp, "processors"), i, sub) {
            const char *b = template_bos(sub);
            if (b) return b;
        }
        return NULL;
    }
    if (strcmp(type, "TemplateProcessing") != 0) return NULL;
    const json_t *first = json_array_get(json_object_get(pp, "single"), 0);
    return json_str(json_object_get(first, "SpecialToken"), "id");
}

static void set_specials(tok_vocab *v, const hf_token *toks, int32_t n, const json_t *root,
                         const json_t *cfg) {
    static const char *const bos_names[] = {"<|begin_of_text|>", "<s>", "<|startoftext|>",
                                            "<\xef\xbd\x9c" "begin\xe2\x96\x81of\xe2\x96\x81"
                                            "sentence\xef\xbd\x9c>",
                                            "<bos>"};
    static const char *const eos_names[] = {"<|end_of_text|>", "</s>", "<|endoftext|>",
                                            "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81"
                                            "sentence\xef\xbd\x9c>",
                                            "<eos>"};
    int32_t bos = -1, eos = -1;
    const char *tmpl = template_bos(json_object_get(root, "post_processor"));
    if (cfg) {
        const char *b = config_token(cfg, "bos_token"), *e = config_token(cfg, "eos_token");
        if (b) bos = find_text(toks, n, b);
        if (e) eos = find_text(toks, n, e);
        const char *u = config_token(cfg, "unk_token"), *p = config_token(cfg, "pad_token");
        int32_t unk = u ? find_text(toks, n, u) : -1, pad = p ? find_text(toks, n, p) : -1;
        if (unk >= 0) tok_vocab_set_special(v, TOK_SPECIAL_UNK, unk);
        if (pad >= 0) tok_vocab_set_special(v, TOK_SPECIAL_PAD, pad);
    }
    if (bos < 0 && tmpl) bos = find_text(toks, n, tmpl);
    if (!cfg || (!json_object_get(cfg, "bos_token") && !json_object_get(cfg, "eos_token"))) {
        for (size_t i = 0; bos < 0 && i < sizeof bos_names / sizeof bos_names[0]; i++)
            bos = find_text(toks, n, bos_names[i]);
        for (size_t i = 0; eos < 0 && i < sizeof eos_names / sizeof eos_names[0]; i++)
            eos = find_text(toks, n, eos_names[i]);
    }
    if (bos >= 0) tok_vocab_set_special(v, TOK_SPECIAL_BOS, bos);
    if (eos >= 0) tok_vocab_set_special(v, TOK_SPECIAL_EOS, eos);

    /* add_bos: the config says so explicitly, else a template that starts with BOS */
    const json_t *ab = cfg ? json_object_get(cfg, "add_bos_token") : NULL;
    if (json_is_boolean(ab)) {
        tok_vocab_set_add_bos(v, json_is_true(ab) && bos >= 0);
    } else if (tmpl) {
        tok_vocab_set_add_bos(v, bos >= 0 && find_text(toks, n, tmpl) == bos);
    } else {
        tok_vocab_set_add_bos(v, false);
    }
    const json_t *ae = cfg ? json_object_get(cfg, "add_eos_token") : NULL;
    tok_vocab_set_add_eos(v, json_is_true(ae) && eos >= 0);
}

/* ---- loading ---- */

static hl_status parse_id(const json_t *j, int32_t limit, int32_t *id, const char *what,
                          const char *path, hl_err *err) {
    json_int_t x = json_is_integer(j) ? json_integer_value(j) : -1;
    if (x < 0 || x >= limit) {
        return hl_fail(err, HL_ERR_FORMAT, "%s: %s has an invalid id", path, what);
    }
    *id = (int32_t)x;
    return HL_OK;
}

static hl_status build_vocab(const json_t *root, const json_t *model, const char *path,
                             const char *pre, tok_vocab **out, hl_err *err) {
    const json_t *vocab = json_object_get(model, "vocab");
    const json_t *merges = json_object_get(model, "merges");
    const json_t *added = json_object_get(root, "added_tokens");
    if (!json_is_object(vocab)) {
        return hl_fail(err, HL_ERR_FORMAT, "%s: model.vocab is missing or not an object", path);
    }
    if (!json_is_array(merges)) {
        return hl_fail(err, HL_ERR_FORMAT, "%s: model.merges is missing or not an array", path);
    }
    if (added && !json_is_array(added)) {
        return hl_fail(err, HL_ERR_FORMAT, "%s: added_tokens is not an array", path);
    }

    /* Ids must be dense-ish: allow a little slack for holes, never a huge array. */
    size_t n_entries = json_object_size(vocab) + json_array_size(added);
    if (n_entries > (size_t)INT32_MAX / 4) {
        return hl_fail(err, HL_ERR_FORMAT, "%s: vocabulary too large", path);
    }
    int32_t limit = (int32_t)(n_entries + 1024);
    hf_token *toks = calloc((size_t)limit, sizeof *toks);
    if (!toks) return hl_fail(err, HL_ERR_NOMEM, "%s: out of memory", path);
    int32_t n = 0;
    hl_status st = HL_OK;
    tok_vocab *v = NULL;
    json_t *cfg = NULL;
    char *buf = NULL;
    size_t buf_cap = 0;

    const char *key;
    size_t key_len;
    json_t *val;
    json_object_keylen_foreach((json_t *)vocab, key, key_len, val) {
        int32_t id = 0;
        st = parse_id(val, limit, &id, "a model.vocab entry", path, err);
        if (st != HL_OK) goto done;
        toks[id] = (hf_token){key, key_len, TOK_TYPE_NORMAL, true};
        if (id >= n) n = id + 1;
    }
    size_t i;
    json_array_foreach(added, i, val) {
        int32_t id = 0;
        const json_t *content = json_object_get(val, "content");
        if (!json_is_string(content)) {
            st = hl_fail(err, HL_ERR_FORMAT, "%s: added_tokens[%zu] has no content", path, i);
            goto done;
        }
        st = parse_id(json_object_get(val, "id"), limit, &id, "an added token", path, err);
        if (st != HL_OK) goto done;
        const char *t = json_string_value(content);
        size_t len = json_string_length(content);
        bool special = json_is_true(json_object_get(val, "special")) || looks_special(t, len);
        toks[id] = (hf_token){t, len, special ? TOK_TYPE_CONTROL : TOK_TYPE_USER_DEFINED, true};
        if (id >= n) n = id + 1;
    }
    if (n == 0) {
        st = hl_fail(err, HL_ERR_FORMAT, "%s: the vocabulary is empty", path);
        goto done;
    }

    v = tok_vocab_create(TOK_MODEL_BPE, pre);
    if (!v) goto nomem;
    for (int32_t id = 0; id < n; id++) {
        char pad[32];
        const hf_token *t = &toks[id];
        if (t->set) {
            st = tok_vocab_add_token(v, t->text, t->len, 0.0f, t->type);
        } else {
            int k = snprintf(pad, sizeof pad, "[PAD%d]", (int)id);
            st = tok_vocab_add_token(v, pad, (size_t)k, 0.0f, TOK_TYPE_UNUSED);
        }
        if (st != HL_OK) goto fail_add;
    }
    json_array_foreach(merges, i, val) {
        if (json_is_string(val)) {
            st = tok_vocab_add_merge(v, json_string_value(val), json_string_length(val));
        } else if (json_is_array(val) && json_array_size(val) == 2 &&
                   json_is_string(json_array_get(val, 0)) &&
                   json_is_string(json_array_get(val, 1))) {
            const json_t *a = json_array_get(val, 0), *b = json_array_get(val, 1);
            size_t la = json_string_length(a), lb = json_string_length(b), need = la + lb + 1;
            if (need > buf_cap) {
                char *nb = realloc(buf, need * 2);
                if (!nb) goto nomem;
                buf = nb;
                buf_cap = need * 2;
            }
            memcpy(buf, json_string_value(a), la);
            buf[la] = ' ';
            memcpy(buf + la + 1, json_string_value(b), lb);
            st = tok_vocab_add_merge(v, buf, need);
        } else {
            st = hl_fail(err, HL_ERR_FORMAT, "%s: model.merges[%zu] is neither \"a b\" nor [a, b]",
                         path, i);
            goto done;
        }
        if (st != HL_OK) goto fail_add;
    }

    v->ignore_merges = json_is_true(json_object_get(model, "ignore_merges"));
    cfg = load_config(path);
    set_specials(v, toks, n, root, cfg);
    st = tok_vocab_finish(v, err);
    if (st != HL_OK) {
        hl_err_prefix(err, "%s", path);
        goto done;
    }
    *out = v;
    v = NULL;
    goto done;
fail_add:
    st = hl_fail(err, st, "%s: cannot add to the vocabulary (%s)", path, hl_status_str(st));
    goto done;
nomem:
    st = hl_fail(err, HL_ERR_NOMEM, "%s: out of memory", path);
done:
    tok_vocab_destroy(v);
    json_decref(cfg);
    free(buf);
    free(toks);
    return st;
}

hl_status tok_vocab_load_hf(const char *path, tok_vocab **out, hl_err *err) {
    *out = NULL;
    char *text = NULL;
    size_t len = 0;
    hl_status st = hl_file_read(path, &text, &len, err);
    if (st != HL_OK) return st;
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_ALLOW_NUL, &jerr);
    free(text);
    if (!root) {
        return hl_fail(err, HL_ERR_FORMAT, "%s:%d:%d: invalid JSON: %s", path, jerr.line,
                       jerr.column, jerr.text);
    }
    const json_t *model = json_object_get(root, "model");
    const char *type = json_str(model, "type");
    const char *pre = NULL;
    if (!json_is_object(root) || !json_is_object(model)) {
        st = hl_fail(err, HL_ERR_FORMAT, "%s: no \"model\" object (not a tokenizer.json?)", path);
    } else if (type && strcmp(type, "BPE") != 0) {
        st = hl_fail(err, HL_ERR_UNSUPPORTED,
                     "%s: tokenizer model type \"%.40s\" is not supported (only byte-level BPE; "
                     "use the model's GGUF vocabulary instead)",
                     path, type);
    } else if (!type && !json_object_get(model, "merges")) {
        st = hl_fail(err, HL_ERR_UNSUPPORTED, "%s: tokenizer model has no type and no merges",
                     path);
    } else if (json_is_true(json_object_get(model, "byte_fallback"))) {
        st = hl_fail(err, HL_ERR_UNSUPPORTED,
                     "%s: SentencePiece-style BPE (byte_fallback) is not supported; use the "
                     "model's GGUF vocabulary",
                     path);
    } else if ((pre = hf_pre_name(json_object_get(root, "pre_tokenizer"), path, err)) == NULL) {
        st = HL_ERR_UNSUPPORTED;
    } else {
        st = build_vocab(root, model, path, pre, out, err);
    }
    json_decref(root);
    return st;
}
