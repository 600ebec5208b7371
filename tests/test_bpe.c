/*
 * test_bpe.c - byte-level BPE: pre-tokenizers, GPT-2 byte mapping, word merges,
 * tokenizer.json loading, and llama.cpp's golden vectors for the BPE vocabs.
 */
#include "test.h"

#include <stdlib.h>

#include "base/file.h"
#include "base/status.h"
#include "tok/internal.h"
#include "tok/pretok.h"
#include "tok/tok.h"

/* ---- pre-tokenizer ---- */

typedef struct split_buf {
    const char *text;
    char out[4096];
    size_t n;
    size_t covered; /* the next expected start: spans must tile the text */
    bool tiled;
} split_buf;

static void split_collect(void *ud, size_t start, size_t len) {
    split_buf *b = ud;
    if (start != b->covered || len == 0) b->tiled = false;
    b->covered = start + len;
    if (b->n + len + 3 >= sizeof b->out) return;
    b->out[b->n++] = '[';
    memcpy(b->out + b->n, b->text + start, len);
    b->n += len;
    b->out[b->n++] = ']';
    b->out[b->n] = '\0';
}

/* Splits text with pre-tokenizer name; returns "[w1][w2]..." or an error string. */
static const char *split_str(const char *name, const char *text, size_t len) {
    static split_buf b;
    memset(&b, 0, sizeof b);
    b.text = text;
    b.tiled = true;
    tok_pretok *p = NULL;
    hl_err err;
    if (tok_pretok_create(name, &p, &err) != HL_OK) return "(create failed)";
    hl_status st = tok_pretok_split(p, text, len, split_collect, &b, &err);
    tok_pretok_destroy(p);
    if (st != HL_OK) return "(split failed)";
    if (!b.tiled || b.covered != len) return "(spans do not tile the text)";
    return b.out;
}

#define SPLIT(name, lit) split_str(name, lit, sizeof(lit) - 1)

TEST(bpe_pretok_gpt2_words) {
    CHECK_STR(SPLIT("gpt-2", "Hello world"), "[Hello][ world]");
    CHECK_STR(SPLIT("gpt-2", "I've been 'told he's there, 'RE you"),
              "[I]['ve][ been][ '][told][ he]['s][ there][,][ '][RE][ you]");
    CHECK_STR(SPLIT("gpt-2", "  Hello"), "[ ][ Hello]");
    CHECK_STR(SPLIT("gpt-2", "a   "), "[a][   ]");
    CHECK_STR(SPLIT("gpt-2", "a \t b"), "[a][ \t][ b]");
    CHECK_STR(SPLIT("gpt-2", "\tA"), "[\t][A]");
    CHECK_STR(SPLIT("gpt-2", "x 123456 3.14"), "[x][ 123456][ 3][.][14]");
    CHECK_STR(SPLIT("gpt-2", "\xe6\x88\x91\xe6\x83\xb3\xe5\x9c\xa8" "apple"),
              "[\xe6\x88\x91\xe6\x83\xb3\xe5\x9c\xa8" "apple]");
    CHECK_STR(SPLIT("gpt-2", "a\r\n\r\nb"), "[a][\r\n\r][\n][b]");
    CHECK_STR(SPLIT("mpt", "x  "), "[x][  ]");
}

TEST(bpe_pretok_llama3_words) {
    CHECK_STR(SPLIT("llama-bpe", "I'VE 'Ll it's"), "[I]['VE][ '][Ll][ it]['s]");
    CHECK_STR(SPLIT("llama3", "1234567 x12"), "[123][456][7][ x][12]");
    CHECK_STR(SPLIT("llama3", "a\r\n\r\n  b"), "[a][\r\n\r\n][ ][ b]");
    CHECK_STR(SPLIT("llama3", " \n\nfoo"), "[ \n\n][foo]");
    CHECK_STR(SPLIT("llama3", "foo!!\n\nbar"), "[foo][!!\n\n][bar]");
    CHECK_STR(SPLIT("llama3", "a   b  "), "[a][  ][ b][  ]");
    /* U+017F (long s) is not an ASCII s: no contraction, unlike PCRE2 caseless */
    CHECK_STR(SPLIT("llama3", "x'\xc5\xbf\xc5\xbf"), "[x]['\xc5\xbf\xc5\xbf]");
    CHECK_STR(SPLIT("llama3", "x'ss"), "[x]['s][s]");
    /* emoji are neither letters nor numbers */
    CHECK_STR(SPLIT("llama3", "\xf0\x9f\x9a\x80 (normal)"),
              "[\xf0\x9f\x9a\x80][ (][normal][)]");
    CHECK_STR(SPLIT("llama3", "\xe6\x88\x91\xe6\x83\xb3\xe5\x9c\xa8" "apple"),
              "[\xe6\x88\x91\xe6\x83\xb3\xe5\x9c\xa8" "apple]");
    CHECK_STR(SPLIT("qwen2", "x 1234"), "[x][ ][1][2][3][4]");
}

TEST(bpe_pretok_multi_regex_sets) {
    /* starcoder: digits first, then GPT-2 over each piece */
    CHECK_STR(SPLIT("starcoder", "ab 123"), "[ab][ ][1][2][3]");
    /* falcon: punctuation runs first, then GPT-2, then 3-digit groups */
    CHECK_STR(SPLIT("falcon", "a, b 12345"), "[a][,][ b][ ][123][45]");
    CHECK_STR(SPLIT("falcon", "12345"), "[123][45]");
    /* deepseek-coder: newlines are their own pieces; digits one by one */
    CHECK_STR(SPLIT("deepseek-coder", "a\n\nb 42"), "[a][\n][\n][b][ ][4][2]");
    /* deepseek-llm: trailing whitespace is one piece ("$" means end of piece only) */
    CHECK_STR(SPLIT("deepseek-llm", "Hi  \n"), "[Hi][  ][\n]");
    CHECK_STR(SPLIT("default", "a+b 1234"), "[a][+][b][ ][123][4]");
}

TEST(bpe_pretok_unknown_name_and_empty_text) {
    tok_pretok *p = (tok_pretok *)1;
    hl_err err;
    CHECK_EQ_INT(tok_pretok_create("no-such-pre", &p, &err), HL_ERR_UNSUPPORTED);
    CHECK(p == NULL);
    CHECK(strstr(err.msg, "no-such-pre") != NULL);
    CHECK_STR(split_str("gpt-2", "", 0), "");
    tok_pretok_destroy(NULL);
}

TEST(bpe_pretok_invalid_utf8) {
    /* Invalid bytes match like U+FFFD (a symbol) but spans keep the raw bytes. */
    CHECK_STR(SPLIT("gpt-2", "a\xff" "b"), "[a][\xff][b]");
    CHECK_STR(SPLIT("gpt-2", "x \xff\xfe!"), "[x][ \xff\xfe!]");
    CHECK_STR(SPLIT("llama3", "\xe4\xb8" "x"), "[\xe4\xb8][x]");
    CHECK_STR(SPLIT("gpt-2", "\xed\xa0\x80" "a"), "[\xed\xa0\x80][a]"); /* a surrogate */
    CHECK_STR(SPLIT("gpt-2", "ok\xc3"), "[ok][\xc3]");
}

TEST(bpe_pretok_spans_tile_random_bytes) {
    static const char *const names[] = {"default", "gpt-2", "llama3", "qwen2", "falcon",
                                        "starcoder", "deepseek-llm", "deepseek-coder",
                                        "deepseek-v3", "bloom", "viking", "tekken", "gpt-4o"};
    char text[600];
    uint32_t seed = 12345;
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        for (int round = 0; round < 20; round++) {
            size_t len = (size_t)(round * 29 % 600);
            for (size_t i = 0; i < len; i++) {
                seed = seed * 1103515245u + 12345u;
                unsigned r = (seed >> 16) & 0xFF;
                /* mostly ASCII text, some high bytes, some whitespace */
                text[i] = (char)(r < 120 ? (unsigned char)"ab 1\n'!\xe4\xb8\x80"[r % 11] : r);
            }
            const char *s = split_str(names[k], text, len);
            CHECK_MSG(s[0] != '(' || len == 0, "%s: %s", names[k], s);
        }
    }
}
