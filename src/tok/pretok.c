/*
 * pretok.c - BPE pre-tokenizers (see pretok.h).
 *
 * Each name maps to the regex list llama.cpp uses for that tokenizer.ggml.pre value.
 * llama.cpp runs some of them through hand-written matchers and others through
 * std::regex over "category-collapsed" text; both behave like the plain regexes
 * below under PCRE2 with UTF + UCP, with these adjustments:
 *   - case-insensitive contractions are spelled (?:'[sS]|...) because PCRE2's
 *     caseless UCP matching would also take U+017F for 's' and U+212A for 'k';
 *   - deepseek-llm's "\s+$" is "\s+\z" (PCRE2's $ also matches before a final \n);
 *   - \s and \S are rewritten to the Unicode White_Space set that llama.cpp and
 *     Rust's regex use (PCRE2's \s also takes U+180E, no longer a space).
 * Where llama.cpp approximates a Hugging Face regex that std::regex cannot express
 * (gpt-4o, tekken use \p{Lu}/\p{Ll}), we use the Hugging Face original.
 *
 * Splitting: regex k runs over every piece left by regex k-1 (matched or not), as
 * a separate subject, so a lookahead never sees past its piece; text between
 * matches becomes a piece too. Invalid UTF-8 bytes are treated as U+FFFD for
 * matching (what llama.cpp does), but spans keep pointing at the original bytes.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tok/pretok.h"

#include "base/utf8.h"

#include <pcre2.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PRETOK_MAX_REGEX 8

struct tok_pretok {
    size_t n_regex;
    pcre2_code *re[PRETOK_MAX_REGEX];
    bool jit[PRETOK_MAX_REGEX];
};

/* ---- regex sets ---- */

#define RE_CONTRACTIONS_CI "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"

/* GPT-2's pattern; llama.cpp's matcher also takes a lone whitespace run (\s+). */
#define RE_GPT2                                                                            \
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"

#define RE_LLAMA3                                                                          \
    RE_CONTRACTIONS_CI "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}"                        \
                       "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

#define RE_QWEN2                                                                           \
    RE_CONTRACTIONS_CI "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}"                             \
                       "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

/* The cased-letter ranges of DeepSeek LLM's tokenizer.json (Lu/Ll/Lt, Unicode ~11). */
#define RE_DEEPSEEK_LETTERS                                                                \
    "A-Za-z\\x{b5}\\x{c0}-\\x{d6}\\x{d8}-\\x{f6}\\x{f8}-\\x{1ba}\\x{1bc}-\\x{1bf}"          \
    "\\x{1c4}-\\x{293}\\x{295}-\\x{2af}\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37b}-\\x{37d}"   \
    "\\x{37f}\\x{386}\\x{388}-\\x{38a}\\x{38c}\\x{38e}-\\x{3a1}\\x{3a3}-\\x{3f5}"            \
    "\\x{3f7}-\\x{481}\\x{48a}-\\x{52f}\\x{531}-\\x{556}\\x{10a0}-\\x{10c5}"                 \
    "\\x{13a0}-\\x{13f5}\\x{13f8}-\\x{13fd}\\x{1c90}-\\x{1cba}\\x{1cbd}-\\x{1cbf}"           \
    "\\x{1d00}-\\x{1d2b}\\x{1d6b}-\\x{1d77}\\x{1d79}-\\x{1d9a}\\x{1e00}-\\x{1f15}"           \
    "\\x{1f18}-\\x{1f1d}\\x{1f20}-\\x{1f45}\\x{1f48}-\\x{1f4d}\\x{1f50}-\\x{1f57}"           \
    "\\x{1f59}\\x{1f5b}\\x{1f5d}\\x{1f5f}-\\x{1f7d}\\x{1f80}-\\x{1fb4}\\x{1fb6}-\\x{1fbc}"   \
    "\\x{1fbe}\\x{1fc2}-\\x{1fc4}\\x{1fc6}-\\x{1fcc}\\x{1fd0}-\\x{1fd3}\\x{1fd6}-\\x{1fdb}"   \
    "\\x{1fe0}-\\x{1fec}\\x{1ff2}-\\x{1ff4}\\x{1ff6}-\\x{1ffc}\\x{2102}\\x{2107}"            \
    "\\x{210a}-\\x{2113}\\x{2115}\\x{2119}-\\x{211d}\\x{2124}\\x{2126}\\x{2128}"             \
    "\\x{212a}-\\x{212d}\\x{212f}-\\x{2134}\\x{2139}\\x{213c}-\\x{213f}\\x{2145}-\\x{2149}"  \
    "\\x{214e}\\x{2183}\\x{2184}\\x{2c00}-\\x{2c7b}\\x{2c7e}-\\x{2ce4}\\x{2ceb}-\\x{2cee}"   \
    "\\x{2cf2}\\x{2cf3}\\x{a640}-\\x{a66d}\\x{a680}-\\x{a69b}\\x{a722}-\\x{a76f}"            \
    "\\x{a771}-\\x{a787}\\x{a78b}-\\x{a78e}\\x{ab70}-\\x{abbf}\\x{fb00}-\\x{fb06}"           \
    "\\x{fb13}-\\x{fb17}\\x{ff21}-\\x{ff3a}\\x{ff41}-\\x{ff5a}\\x{10400}-\\x{1044f}"         \
    "\\x{104b0}-\\x{104d3}\\x{104d8}-\\x{104fb}\\x{10c80}-\\x{10cb2}\\x{10cc0}-\\x{10cf2}"   \
    "\\x{118a0}-\\x{118df}\\x{1e900}-\\x{1e943}"

/* CJK ideographs, U+0800..U+4E00 and Hangul, as DeepSeek spells them. */
#define RE_DEEPSEEK_CJK "[\\x{4e00}-\\x{9fa5}\\x{800}-\\x{4e00}\\x{ac00}-\\x{d7ff}]+"

static const char *const RES_GPT2[] = {RE_GPT2, NULL};
static const char *const RES_LLAMA3[] = {RE_LLAMA3, NULL};
static const char *const RES_QWEN2[] = {RE_QWEN2, NULL};
static const char *const RES_DEFAULT[] = {
    "[\\p{P}\\$\\+<=>\\^~\\|]+",
    RE_GPT2,
    "\\p{N}+",
    "[0-9][0-9][0-9]",
    NULL,
};
static const char *const RES_FALCON[] = {
    "[\\p{P}\\$\\+<=>\\^~\\|`]+",
    RE_GPT2,
    "[0-9][0-9][0-9]",
    NULL,
};
static const char *const RES_STARCODER[] = {"\\p{N}", RE_GPT2, NULL};
static const char *const RES_DEEPSEEK_LLM[] = {
    "[\\r\\n]",
    "\\s?[" RE_DEEPSEEK_LETTERS "]+",
    "\\s?[!-/:-~\\x{ff01}-\\x{ff0f}\\x{ff1a}-\\x{ff5e}\\x{2018}-\\x{201f}\\x{3000}-\\x{3002}]+",
    "\\s+\\z",
    RE_DEEPSEEK_CJK,
    "\\p{N}+",
    NULL,
};
static const char *const RES_DEEPSEEK_CODER[] = {
    "[\\r\\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", RE_DEEPSEEK_CJK, "\\p{N}", NULL,
};
static const char *const RES_DEEPSEEK3[] = {
    "\\p{N}{1,3}",
    "[\\x{4e00}-\\x{9fa5}\\x{3040}-\\x{309f}\\x{30a0}-\\x{30ff}]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?"
    "[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    NULL,
};
static const char *const RES_BLOOM[] = {" ?[^(\\s|.,!?\\x{2026}\\x{3002}\\x{ff0c}\\x{3001}"
                                        "\\x{964}\\x{6d4}\\x{60c})]+",
                                        NULL};
static const char *const RES_VIKING[] = {" ?[^(\\s|.,!?\\x{2026}\\x{3002}\\x{ff0c}\\x{3001}"
                                         "\\x{964}\\x{6d4}\\x{60c})]+",
                                         "\\p{N}", NULL};
#define RE_UPPERISH "[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]"
#define RE_LOWERISH "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]"
static const char *const RES_TEKKEN[] = {
    "[^\\r\\n\\p{L}\\p{N}]?" RE_UPPERISH "*" RE_LOWERISH "+|[^\\r\\n\\p{L}\\p{N}]?" RE_UPPERISH
    "+" RE_LOWERISH "*|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    NULL,
};
static const char *const RES_GPT4O[] = {
    "[^\\r\\n\\p{L}\\p{N}]?" RE_UPPERISH "*" RE_LOWERISH "+" RE_CONTRACTIONS_CI
    "?|[^\\r\\n\\p{L}\\p{N}]?" RE_UPPERISH "+" RE_LOWERISH "*" RE_CONTRACTIONS_CI
    "?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    NULL,
};

typedef struct pretok_def {
    const char *name;
    const char *const *regexes;
} pretok_def;

static const pretok_def PRETOK_DEFS[] = {
    {"default", RES_DEFAULT},
    {"llama3", RES_LLAMA3},
    {"llama-bpe", RES_LLAMA3},
    {"llama-v3", RES_LLAMA3},
    {"falcon3", RES_LLAMA3},
    {"falcon-h1", RES_LLAMA3},
    {"pixtral", RES_LLAMA3},
    {"dbrx", RES_LLAMA3},
    {"smaug-bpe", RES_LLAMA3},
    {"chatglm-bpe", RES_LLAMA3},
    {"bailingmoe", RES_LLAMA3},
    {"midm-2.0", RES_LLAMA3},
    {"lfm2", RES_LLAMA3},
    {"qwen2", RES_QWEN2},
    {"deepseek-r1-qwen", RES_QWEN2},
    {"megrez", RES_QWEN2},
    {"stablelm2", RES_QWEN2},
    {"gpt-2", RES_GPT2},
    {"gpt2", RES_GPT2},
    {"mpt", RES_GPT2},
    {"olmo", RES_GPT2},
    {"jais", RES_GPT2},
    {"phi-2", RES_GPT2},
    {"jina-es", RES_GPT2},
    {"jina-de", RES_GPT2},
    {"jina-v1-en", RES_GPT2},
    {"jina-v2-es", RES_GPT2},
    {"jina-v2-de", RES_GPT2},
    {"jina-v2-code", RES_GPT2},
    {"roberta-bpe", RES_GPT2},
    {"gigachat", RES_GPT2},
    {"trillion", RES_GPT2},
    {"gpt-neox", RES_GPT2},
    {"falcon", RES_FALCON},
    {"starcoder", RES_STARCODER},
    {"refact", RES_STARCODER},
    {"command-r", RES_STARCODER},
    {"smollm", RES_STARCODER},
    {"codeshell", RES_STARCODER},
    {"exaone", RES_STARCODER},
    {"minerva-7b", RES_STARCODER},
    {"deepseek-llm", RES_DEEPSEEK_LLM},
    {"deepseek-coder", RES_DEEPSEEK_CODER},
    {"deepseek-v3", RES_DEEPSEEK3},
    {"bloom", RES_BLOOM},
    {"poro-chat", RES_BLOOM},
    {"gpt3-finnish", RES_BLOOM},
    {"viking", RES_VIKING},
    {"tekken", RES_TEKKEN},
    {"gpt-4o", RES_GPT4O},
    {"llama4", RES_GPT4O},
};

/* White_Space, as a character-class body. */
#define WS_CLASS                                                                           \
    "\\t-\\r \\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}"          \
    "\\x{205f}\\x{3000}"

/* Copies pattern re with \s and \S spelled as WS_CLASS (inside a class: its body).
 * Returns a malloc'd string or NULL on OOM. */
static char *rewrite_spaces(const char *re) {
    size_t n = strlen(re), extra = 0;
    for (size_t i = 0; i + 1 < n; i++)
        if (re[i] == '\\') extra += sizeof WS_CLASS + 3, i++;
    char *out = malloc(n + extra + 1);
    if (!out) return NULL;
    size_t o = 0;
    bool in_class = false;
    for (size_t i = 0; i < n; i++) {
        char c = re[i];
        if (c == '\\' && i + 1 < n) {
            char e = re[i + 1];
            i++;
            if (e == 's' && in_class) {
                o += (size_t)sprintf(out + o, "%s", WS_CLASS);
            } else if (e == 's') {
                o += (size_t)sprintf(out + o, "[%s]", WS_CLASS);
            } else if (e == 'S' && !in_class) {
                o += (size_t)sprintf(out + o, "[^%s]", WS_CLASS);
            } else {
                out[o++] = c;
                out[o++] = e;
            }
            continue;
        }
        if (c == '[' && !in_class) {
            in_class = true;
            out[o++] = c;
            if (i + 1 < n && re[i + 1] == '^') out[o++] = re[++i];
            continue;
        }
        if (c == ']' && in_class) in_class = false;
        out[o++] = c;
    }
    out[o] = '\0';
    return out;
}

hl_status tok_pretok_create(const char *name, tok_pretok **out, hl_err *err) {
    *out = NULL;
    if (!name) name = "default";
    const pretok_def *def = NULL;
    for (size_t i = 0; i < sizeof PRETOK_DEFS / sizeof PRETOK_DEFS[0]; i++) {
        if (strcmp(PRETOK_DEFS[i].name, name) == 0) {
            def = &PRETOK_DEFS[i];
            break;
        }
    }
    if (!def) {
        return hl_fail(err, HL_ERR_UNSUPPORTED,
                       "unknown BPE pre-tokenizer \"%.100s\" (tokenizer.ggml.pre)", name);
    }
    tok_pretok *p = calloc(1, sizeof *p);
    if (!p) return hl_fail(err, HL_ERR_NOMEM, "out of memory creating pre-tokenizer");
    for (const char *const *re = def->regexes; *re; re++) {
        int code;
        PCRE2_SIZE at;
        char *pattern = rewrite_spaces(*re);
        if (!pattern) {
            tok_pretok_destroy(p);
            return hl_fail(err, HL_ERR_NOMEM, "out of memory creating pre-tokenizer");
        }
        pcre2_code *c = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED,
                                      PCRE2_UTF | PCRE2_UCP, &code, &at, NULL);
        free(pattern);
        if (!c) {
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message(code, msg, sizeof msg);
            tok_pretok_destroy(p);
            return hl_fail(err, HL_ERR_INVALID, "pre-tokenizer %s: regex %zu: %s at offset %zu",
                           name, (size_t)(re - def->regexes), (const char *)msg, (size_t)at);
        }
        /* JIT is an optimisation: the interpreter runs when it is unavailable, and
         * under valgrind (make valgrind sets HEARTH_VALGRIND), which reports false
         * uninitialised reads inside JIT code. */
        bool jit = !getenv("HEARTH_VALGRIND") && pcre2_jit_compile(c, PCRE2_JIT_COMPLETE) == 0;
        p->jit[p->n_regex] = jit;
        p->re[p->n_regex++] = c;
    }
    *out = p;
    return HL_OK;
}

void tok_pretok_destroy(tok_pretok *p) {
    if (!p) return;
    for (size_t i = 0; i < p->n_regex; i++) pcre2_code_free(p->re[i]);
    free(p);
}

/* ---- splitting ---- */

/* A growing list of piece end offsets (pieces tile the subject). */
typedef struct ends {
    size_t *v;
    size_t n, cap;
} ends;

static bool ends_push(ends *e, size_t end) {
    if (e->n == e->cap) {
        size_t cap = e->cap ? e->cap * 2 : 64;
        size_t *nv = realloc(e->v, cap * sizeof *nv);
        if (!nv) return false;
        e->v = nv;
        e->cap = cap;
    }
    e->v[e->n++] = end;
    return true;
}

static size_t utf8_char_len(const unsigned char *s, size_t n) {
    size_t k = hl_utf8_valid_len(s, n);
    return k ? k : 1;
}

static int match_at(const pcre2_code *code, bool jit, const unsigned char *piece, size_t plen,
                    size_t off, pcre2_match_data *md) {
    int rc = jit ? pcre2_jit_match(code, piece, plen, off, 0, md, NULL)
                 : pcre2_match(code, piece, plen, off, PCRE2_NO_UTF_CHECK, md, NULL);
    /* JIT's stack is small; the interpreter keeps its backtracking on the heap */
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
        rc = pcre2_match(code, piece, plen, off, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md, NULL);
    return rc;
}

/* Splits each piece of in with code, appending the new piece ends to out. */
static hl_status split_pass(const pcre2_code *code, bool jit, const unsigned char *subj,
                            const ends *in, ends *out, pcre2_match_data *md, hl_err *err) {
    size_t start = 0;
    for (size_t i = 0; i < in->n; i++) {
        size_t end = in->v[i];
        const unsigned char *piece = subj + start;
        size_t plen = end - start;
        size_t last = 0, off = 0;
        if (plen == utf8_char_len(piece, plen)) { /* one character: nothing to split */
            if (!ends_push(out, end)) goto nomem;
            start = end;
            continue;
        }
        while (off < plen) {
            int rc = match_at(code, jit, piece, plen, off, md);
            if (rc == PCRE2_ERROR_NOMATCH) break;
            if (rc < 0) {
                PCRE2_UCHAR msg[160];
                pcre2_get_error_message(rc, msg, sizeof msg);
                return hl_fail(err, HL_ERR_INVALID, "pre-tokenizer regex failed: %s",
                               (const char *)msg);
            }
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
            size_t ms = ov[0], me = ov[1];
            if (me <= ms) { /* empty match: no piece, move on one character */
                off = ms + utf8_char_len(piece + ms, plen - ms);
                continue;
            }
            if (ms > last && !ends_push(out, start + ms)) goto nomem;
            if (!ends_push(out, start + me)) goto nomem;
            last = off = me;
        }
        if (plen > last && !ends_push(out, end)) goto nomem;
        start = end;
    }
    return HL_OK;
nomem:
    return hl_fail(err, HL_ERR_NOMEM, "out of memory splitting text");
}

hl_status tok_pretok_split(const tok_pretok *p, const char *text, size_t len,
                           tok_pretok_emit emit, void *ud, hl_err *err) {
    if (len == 0) return HL_OK;
    const unsigned char *src = (const unsigned char *)text;
    unsigned char *fixed = NULL; /* text with each invalid byte replaced by U+FFFD */
    size_t *orig = NULL;         /* fixed offset -> text offset */
    const unsigned char *subj = src;
    size_t slen = len;
    hl_status st = HL_OK;
    ends a = {0}, b = {0};
    pcre2_match_data *md = NULL;

    size_t bad = hl_utf8_first_invalid(src, len);
    if (bad < len) {
        size_t cap;
        if (__builtin_mul_overflow(len, (size_t)3, &cap) || cap == SIZE_MAX) {
            return hl_fail(err, HL_ERR_NOMEM, "text too long");
        }
        fixed = malloc(cap);
        orig = malloc((cap + 1) * sizeof *orig);
        if (!fixed || !orig) goto nomem;
        size_t i = 0, o = 0;
        while (i < len) {
            size_t n = src[i] < 0x80 ? 1 : hl_utf8_valid_len(src + i, len - i);
            if (n) {
                for (size_t k = 0; k < n; k++) orig[o + k] = i;
                memcpy(fixed + o, src + i, n);
                o += n;
                i += n;
            } else {
                fixed[o] = 0xEF, fixed[o + 1] = 0xBF, fixed[o + 2] = 0xBD;
                orig[o] = orig[o + 1] = orig[o + 2] = i;
                o += 3;
                i++;
            }
        }
        orig[o] = len;
        subj = fixed;
        slen = o;
    }

    md = pcre2_match_data_create(1, NULL);
    if (!md || !ends_push(&a, slen)) goto nomem;
    for (size_t r = 0; r < p->n_regex; r++) {
        b.n = 0;
        st = split_pass(p->re[r], p->jit[r], subj, &a, &b, md, err);
        if (st != HL_OK) goto done;
        ends t = a;
        a = b;
        b = t;
    }
    size_t start = 0;
    for (size_t i = 0; i < a.n; i++) {
        size_t s = orig ? orig[start] : start;
        size_t e = orig ? orig[a.v[i]] : a.v[i];
        if (e > s) emit(ud, s, e - s);
        start = a.v[i];
    }
    goto done;
nomem:
    st = hl_fail(err, HL_ERR_NOMEM, "out of memory splitting text");
done:
    pcre2_match_data_free(md);
    free(a.v);
    free(b.v);
    free(fixed);
    free(orig);
    return st;
}
