/*
 * wpm.c - WordPiece (BERT) encoding as llama.cpp does it. Each code point is mapped to
 * the first code point of its canonical decomposition (so accents drop off) and
 * lowercased. Nonspacing marks (category Mn) that remain, combining accents written as
 * code points of their own ("e\u0301"), are dropped as well: that is what HF's
 * BasicTokenizer does for uncased vocabularies (NFD, then drop Mn), so "e\u0301" and
 * "\u00e9" both become "e" instead of the whole word becoming [UNK]. Whitespace
 * separates words, control characters vanish, punctuation, ASCII symbols and CJK
 * ideographs are words of their own. Each word, prefixed with
 * U+2581 (GGUF BERT vocabularies store word-initial pieces that way and continuation
 * pieces without "##"), is cut greedily into the longest tokens from the left; a
 * word that cannot be cut completely becomes one unknown token.
 */
#include "tok/vocab.h"

#include "base/utf8.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

/* llama.cpp's lenient decoder: checks lead and continuation bits only; an invalid
 * byte yields U+FFFD and advances by one. */
static uint32_t decode_cpt(const uint8_t *s, size_t n, size_t *off) {
    size_t i = *off;
    uint8_t b = s[i];
    if (b < 0x80) {
        *off = i + 1;
        return b;
    }
    size_t k = (b & 0xE0) == 0xC0 ? 2 : (b & 0xF0) == 0xE0 ? 3 : (b & 0xF8) == 0xF0 ? 4 : 0;
    if (k == 0 || i + k > n) goto bad;
    uint32_t c = k == 2 ? (b & 0x1Fu) : k == 3 ? (b & 0x0Fu) : (b & 0x07u);
    for (size_t j = 1; j < k; j++) {
        if ((s[i + j] & 0xC0) != 0x80) goto bad;
        c = (c << 6) | (s[i + j] & 0x3Fu);
    }
    *off = i + k;
    return c;
bad:
    *off = i + 1;
    return 0xFFFD;
}

static bool is_wpm_space(uint32_t c) {
    switch (c) {
    case 0x09: case 0x0A: case 0x0B: case 0x0C: case 0x0D: case 0x20: case 0x85: case 0xA0:
    case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000:
        return true;
    default:
        return c >= 0x2000 && c <= 0x200A;
    }
}

static bool is_chinese_char(uint32_t c) {
    return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) ||
           (c >= 0x20000 && c <= 0x2A6DF) || (c >= 0x2A700 && c <= 0x2B73F) ||
           (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
           (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

static uint32_t first_of_nfd(uint32_t c) {
    if (c < 0xC0) return c;
    utf8proc_int32_t out[32];
    int last_boundclass = 0;
    utf8proc_ssize_t n = utf8proc_decompose_char((utf8proc_int32_t)c, out, 32,
                                                 UTF8PROC_DECOMPOSE, &last_boundclass);
    return n >= 1 && n <= 32 ? (uint32_t)out[0] : c;
}

/* Cuts word (which starts with U+2581) into tokens; unk if it cannot be done. */
static void encode_word(const tok_vocab *v, const char *w, size_t n, tok_sink *sink) {
    size_t start_n = sink->n;
    for (size_t i = 0; i < n;) {
        size_t j = n - i > v->max_token_len ? i + v->max_token_len : n;
        int32_t id = -1;
        for (; j > i; j--) {
            id = tok_lookup(v, w + i, j - i);
            if (id >= 0) break;
        }
        if (id < 0) {
            sink->n = start_n;
            break;
        }
        tok_sink_push(sink, id);
        i = j;
    }
    if (sink->n == start_n && v->special[TOK_SPECIAL_UNK] >= 0)
        tok_sink_push(sink, v->special[TOK_SPECIAL_UNK]);
}

hl_status tok_wpm_encode(const tok_vocab *v, const char *text, size_t len, tok_sink *sink,
                         hl_err *err) {
    /* A word buffer: each code point becomes at most 4 bytes, plus the U+2581 prefix. */
    size_t cap;
    if (__builtin_mul_overflow(len, 4, &cap) || __builtin_add_overflow(cap, 8, &cap))
        return hl_fail(err, HL_ERR_UNSUPPORTED, "text too long to tokenize");
    char *word = malloc(cap);
    if (!word) return hl_fail(err, HL_ERR_NOMEM, "out of memory tokenizing");
    const uint8_t *s = (const uint8_t *)text;
    size_t wn = 0; /* bytes in word after the prefix */
    memcpy(word, "\xe2\x96\x81", 3);
#define FINISH_WORD()                                                                          \
    do {                                                                                      \
        if (wn > 0) encode_word(v, word, wn + 3, sink);                                       \
        wn = 0;                                                                               \
    } while (0)
    for (size_t off = 0; off < len;) {
        uint32_t c = first_of_nfd(decode_cpt(s, len, &off));
        if (is_wpm_space(c)) {
            FINISH_WORD();
            continue;
        }
        utf8proc_category_t cat = utf8proc_category((utf8proc_int32_t)c);
        if (c == 0 || c == 0xFFFD || cat == UTF8PROC_CATEGORY_CC ||
            cat == UTF8PROC_CATEGORY_CF || cat == UTF8PROC_CATEGORY_CO ||
            cat == UTF8PROC_CATEGORY_CS || cat == UTF8PROC_CATEGORY_MN)
            continue;
        uint32_t lower = (uint32_t)utf8proc_tolower((utf8proc_int32_t)c);
        bool punct = cat >= UTF8PROC_CATEGORY_PC && cat <= UTF8PROC_CATEGORY_PO;
        bool symbol = cat >= UTF8PROC_CATEGORY_SM && cat <= UTF8PROC_CATEGORY_SO;
        if (punct || (c < 0x7F && symbol) || is_chinese_char(c)) {
            FINISH_WORD();
            wn = hl_utf8_put(lower, word + 3);
            FINISH_WORD();
        } else {
            wn += hl_utf8_put(lower, word + 3 + wn);
        }
    }
    FINISH_WORD();
#undef FINISH_WORD
    free(word);
    return HL_OK;
}
