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
    /* U+180E is not White_Space (PCRE2's own \s would say it is) */
    CHECK_STR(SPLIT("gpt-2", "a\xe1\xa0\x8e!"), "[a][\xe1\xa0\x8e!]");
    /* U+3000 and U+00A0 are */
    CHECK_STR(SPLIT("gpt-2", "a\xe3\x80\x80\xc2\xa0 b"), "[a][\xe3\x80\x80\xc2\xa0][ b]");
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

/* ---- GPT-2 byte mapping ---- */

TEST(bpe_byte_mapping_roundtrip_all_bytes) {
    char all[256], mapped[512], back[256];
    for (int i = 0; i < 256; i++) all[i] = (char)i;
    size_t n = tok_bpe_bytes_to_unicode(all, 256, mapped);
    CHECK(n > 256 && n <= 512);
    CHECK_EQ_INT(tok_bpe_unicode_to_bytes(mapped, n, back), 256);
    CHECK(memcmp(all, back, 256) == 0);
    /* each byte maps to one distinct printable character */
    uint32_t seen[400] = {0};
    for (int i = 0; i < 256; i++) {
        char one = (char)i, m[2];
        size_t k = tok_bpe_bytes_to_unicode(&one, 1, m);
        CHECK(k == 1 || k == 2);
        const unsigned char *u = (const unsigned char *)m;
        uint32_t c = k == 1 ? u[0] : ((uint32_t)(u[0] & 0x1F) << 6) | (u[1] & 0x3F);
        CHECK_MSG(c > 32 && c < 400 && c != 127 && !seen[c], "byte %d -> U+%04X", i, (unsigned)c);
        seen[c] = 1;
    }
    char out[8];
    CHECK_EQ_INT(tok_bpe_bytes_to_unicode(" \n a", 4, out), 7);
    CHECK_EQ_INT(tok_bpe_bytes_to_unicode(" ", 1, out), 2);
    CHECK(memcmp(out, "\xc4\xa0", 2) == 0); /* U+0120 'Ġ' */
    CHECK_EQ_INT(tok_bpe_bytes_to_unicode("\n", 1, out), 2);
    CHECK(memcmp(out, "\xc4\x8a", 2) == 0); /* U+010A 'Ċ' */
    CHECK_EQ_INT(tok_bpe_bytes_to_unicode("\xad", 1, out), 2);
    CHECK(memcmp(out, "\xc5\x83", 2) == 0); /* U+0143: the last shifted byte */
    CHECK_EQ_INT(tok_bpe_bytes_to_unicode("\xe9", 1, out), 2);
    CHECK(memcmp(out, "\xc3\xa9", 2) == 0); /* U+00E9 stands for itself */
}

TEST(bpe_byte_mapping_rejects_unmapped_text) {
    char out[16];
    CHECK_EQ_INT(tok_bpe_unicode_to_bytes("a b", 3, out), -1);          /* raw space */
    CHECK_EQ_INT(tok_bpe_unicode_to_bytes("\xe4\xb8\x80", 3, out), -1); /* U+4E00 */
    CHECK_EQ_INT(tok_bpe_unicode_to_bytes("\xc4", 1, out), -1);         /* truncated */
    CHECK_EQ_INT(tok_bpe_unicode_to_bytes("\xc5\x84", 2, out), -1);     /* U+0144 */
    CHECK_EQ_INT(tok_bpe_unicode_to_bytes("", 0, out), 0);
    CHECK_EQ_INT(tok_bpe_unicode_to_bytes("\xc4\xa0hi", 4, out), 3);
    CHECK(memcmp(out, " hi", 3) == 0);
}

/* ---- llama.cpp golden vectors (encode without BOS/EOS, parse_special off; the
 * expected ids must also decode back to the input byte for byte) ---- */

#include "tok_vectors.h"

static int gguf_vectors(const char *name) {
    tok_vocab *v = tok_vectors_open_vocab(name);
    if (!v) return -2;
    int bad = run_vocab_vectors(v, name, TOK_VECTORS_DECODE);
    tok_vocab_destroy(v);
    return bad;
}

#define GGUF_VECTORS_TEST(tname, file)                                                   \
    TEST(tname) {                                                                       \
        int bad = gguf_vectors(file);                                                   \
        if (bad == -2) SKIP(file " not found (or failed to load)");                     \
        if (bad == -1) SKIP(file " vectors not found");                                 \
        CHECK_EQ_INT(bad, 0);                                                           \
    }

GGUF_VECTORS_TEST(bpe_vectors_gpt2, "ggml-vocab-gpt-2.gguf")
GGUF_VECTORS_TEST(bpe_vectors_deepseek_coder, "ggml-vocab-deepseek-coder.gguf")
GGUF_VECTORS_TEST(bpe_vectors_deepseek_llm, "ggml-vocab-deepseek-llm.gguf")
GGUF_VECTORS_TEST(bpe_vectors_falcon, "ggml-vocab-falcon.gguf")
GGUF_VECTORS_TEST(bpe_vectors_mpt, "ggml-vocab-mpt.gguf")
GGUF_VECTORS_TEST(bpe_vectors_refact, "ggml-vocab-refact.gguf")
GGUF_VECTORS_TEST(bpe_vectors_starcoder, "ggml-vocab-starcoder.gguf")

/* ---- Hugging Face tokenizer.json ---- */

static tok_vocab *open_hf(const char *rel, hl_err *err) {
    const char *path = test_shared_path(rel);
    if (!path) return NULL;
    tok_vocab *v = NULL;
    if (tok_vocab_load_hf(path, &v, err) != HL_OK) return NULL;
    return v;
}

TEST(bpe_vectors_llama3_hf) {
    hl_err err = {0};
    if (!test_shared_path("models/hf-tokenizers/llama3/tokenizer.json.gz"))
        SKIP("models/hf-tokenizers/llama3/tokenizer.json.gz not found");
    tok_vocab *v = open_hf("models/hf-tokenizers/llama3/tokenizer.json.gz", &err);
    CHECK_MSG(v, "load failed: %s", err.msg);
    CHECK_EQ_INT(tok_vocab_kind(v), TOK_MODEL_BPE);
    CHECK_EQ_INT(tok_vocab_n_tokens(v), 128256);
    CHECK(tok_vocab_ignore_merges(v));
    CHECK_EQ_INT(tok_vocab_special(v, TOK_SPECIAL_BOS), 128000); /* <|begin_of_text|> */
    CHECK_EQ_INT(tok_vocab_special(v, TOK_SPECIAL_EOS), 128009); /* config: <|eot_id|> */
    CHECK(tok_vocab_add_bos(v)); /* from the post-processor template */
    CHECK_EQ_INT(tok_token_get_type(v, 128000), TOK_TYPE_CONTROL);
    int bad = run_vocab_vectors(v, "ggml-vocab-llama-bpe.gguf", TOK_VECTORS_DECODE);
    tok_vocab_destroy(v);
    CHECK_EQ_INT(bad, 0);
}

/* llama.cpp's qwen2 vectors come from a Qwen2 vocab; Qwen3's tokenizer.json has the
 * same base vocab (151643 tokens) and merges, and only more added tokens (<think>,
 * <tool_call>, ...: ids 151643..151668), none of which occur in the test strings, so
 * every vector holds. Its NFC normalizer is ignored, as llama.cpp does. */
TEST(bpe_vectors_qwen2_from_qwen3_hf) {
    hl_err err = {0};
    if (!test_shared_path("models/hf-tokenizers/qwen3/tokenizer.json.gz"))
        SKIP("models/hf-tokenizers/qwen3/tokenizer.json.gz not found");
    tok_vocab *v = open_hf("models/hf-tokenizers/qwen3/tokenizer.json.gz", &err);
    CHECK_MSG(v, "load failed: %s", err.msg);
    CHECK_EQ_INT(tok_vocab_n_tokens(v), 151669);
    CHECK(!tok_vocab_ignore_merges(v));
    CHECK_EQ_INT(tok_vocab_special(v, TOK_SPECIAL_BOS), -1); /* bos_token: null */
    CHECK_EQ_INT(tok_vocab_special(v, TOK_SPECIAL_EOS), 151645); /* <|im_end|> */
    CHECK(!tok_vocab_add_bos(v));
    CHECK_EQ_INT(tok_token_get_type(v, 151644), TOK_TYPE_CONTROL);      /* <|im_start|> */
    CHECK_EQ_INT(tok_token_get_type(v, 151667), TOK_TYPE_USER_DEFINED); /* <think> */
    int bad = run_vocab_vectors(v, "ggml-vocab-qwen2.gguf", TOK_VECTORS_DECODE);
    tok_vocab_destroy(v);
    CHECK_EQ_INT(bad, 0);
}

/* ---- word merges on hand-built vocabularies ---- */

/* A BPE vocab from NUL-separated lists (texts already byte-mapped). */
static tok_vocab *tiny_vocab(const char *pre, const char *const *tokens,
                             const char *const *merges) {
    tok_vocab *v = tok_vocab_create(TOK_MODEL_BPE, pre);
    if (!v) return NULL;
    for (; *tokens; tokens++)
        if (tok_vocab_add_token(v, *tokens, strlen(*tokens), 0.0f, TOK_TYPE_NORMAL)) goto fail;
    for (; *merges; merges++)
        if (tok_vocab_add_merge(v, *merges, strlen(*merges))) goto fail;
    if (tok_vocab_finish(v, NULL) != HL_OK) goto fail;
    return v;
fail:
    tok_vocab_destroy(v);
    return NULL;
}

/* Encodes one word; returns the ids as "i j k" in a static buffer. */
static const char *word_ids(const tok_vocab *v, const char *w, size_t len) {
    static char out[256];
    int32_t ids[64];
    tok_sink sink = {ids, 64, 0};
    hl_err err;
    if (tok_bpe_encode_word(v, w, len, &sink, &err) != HL_OK) return "(error)";
    size_t o = 0;
    out[0] = '\0';
    for (size_t i = 0; i < sink.n && i < 64 && o < sizeof out - 16; i++)
        o += (size_t)snprintf(out + o, sizeof out - o, i ? " %d" : "%d", (int)ids[i]);
    return out;
}

TEST(bpe_word_lowest_rank_first_leftmost_on_ties) {
    static const char *const toks[] = {"a", "b", "c", "ab", "bc", "abc", "aa", NULL};
    static const char *const merges[] = {"b c", "a b", "a bc", "a a", NULL};
    tok_vocab *v = tiny_vocab("gpt-2", toks, merges);
    CHECK(v);
    CHECK_STR(word_ids(v, "abc", 3), "5");       /* b+c (rank 0), then a+bc */
    CHECK_STR(word_ids(v, "ab", 2), "3");
    CHECK_STR(word_ids(v, "aaa", 3), "6 0");     /* the leftmost "a a" wins the tie */
    CHECK_STR(word_ids(v, "cab", 3), "2 3");
    CHECK_STR(word_ids(v, "", 0), "");
    tok_vocab_destroy(v);
}

TEST(bpe_word_ignore_merges_and_fallback) {
    /* "abc" is a token no merge reaches; "xy" is a merge with no token */
    static const char *const toks[] = {"a", "b", "c", "abc", "x", "y", NULL};
    static const char *const merges[] = {"x y", NULL};
    tok_vocab *plain = tiny_vocab("gpt-2", toks, merges);
    tok_vocab *l3 = tiny_vocab("llama3", toks, merges);
    CHECK(plain && l3);
    CHECK(!tok_vocab_ignore_merges(plain) && tok_vocab_ignore_merges(l3));
    CHECK_STR(word_ids(plain, "abc", 3), "0 1 2");
    CHECK_STR(word_ids(l3, "abc", 3), "3");
    /* the merged piece "xy" is not a token: its characters' tokens instead */
    CHECK_STR(word_ids(plain, "xy", 2), "4 5");
    /* a byte with no token at all is dropped, as llama.cpp does */
    CHECK_STR(word_ids(plain, "azb", 3), "0 1");
    tok_vocab_destroy(plain);
    tok_vocab_destroy(l3);
}

TEST(bpe_word_long_words_are_linearithmic) {
    /* 512 KB of "ab" and of "a": a heap, not a quadratic rescan, keeps this fast */
    static const char *const toks[] = {"a", "b", "ab", "aa", "aaaa", "abab", NULL};
    static const char *const merges[] = {"a b", "a a", "aa aa", "ab ab", NULL};
    tok_vocab *v = tiny_vocab("gpt-2", toks, merges);
    CHECK(v);
    size_t n = 512 * 1024;
    char *w = malloc(n);
    int32_t *ids = malloc(n * sizeof *ids);
    CHECK(w && ids);
    for (size_t i = 0; i < n; i++) w[i] = i % 2 ? 'b' : 'a';
    tok_sink sink = {ids, n, 0};
    hl_err err;
    uint64_t t0 = hl_time_ns();
    CHECK_OK(tok_bpe_encode_word(v, w, n, &sink, &err), &err);
    CHECK_EQ_INT(sink.n, n / 4);
    for (size_t i = 0; i < sink.n; i++) CHECK_EQ_INT(ids[i], 5);
    memset(w, 'a', n);
    sink.n = 0;
    CHECK_OK(tok_bpe_encode_word(v, w, n, &sink, &err), &err);
    CHECK_EQ_INT(sink.n, n / 4);
    CHECK_EQ_INT(ids[0], 4);
    CHECK_EQ_INT(ids[sink.n - 1], 4);
    double ms = (double)(hl_time_ns() - t0) / 1e6;
    fprintf(stderr, "    two 512 KB words: %.0f ms\n", ms);
    free(w);
    free(ids);
    tok_vocab_destroy(v);
}

/* ---- tokenizer.json loading: a small file, and the errors ---- */

/* Writes text to DIR/name and returns the path (static buffer). */
static const char *write_tmp(const char *name, const char *text) {
    static char path[1024];
    snprintf(path, sizeof path, "%s/%s", test_tmpdir(), name);
    return hl_file_write(path, text, strlen(text), NULL) == HL_OK ? path : NULL;
}

static hl_status load_hf_text(const char *json, tok_vocab **v, hl_err *err) {
    const char *path = write_tmp("tokenizer.json", json);
    if (!path) return hl_fail(err, HL_ERR_IO, "cannot write the test file");
    return tok_vocab_load_hf(path, v, err);
}

TEST(bpe_hf_small_tokenizer_json) {
    /* hole at id 7; added tokens past the base vocab; merges in both notations;
     * a config beside it with an integer jansson cannot hold */
    CHECK(write_tmp("tokenizer_config.json",
                    "{\"bos_token\": null, \"eos_token\": {\"content\": \"<|end|>\"},"
                    " \"add_bos_token\": false, \"model_max_length\": "
                    "1000000000000000019884624838656}"));
    tok_vocab *v = NULL;
    hl_err err = {0};
    CHECK_OK(load_hf_text(
                 "{\"version\": \"1.0\", \"added_tokens\": ["
                 " {\"id\": 8, \"content\": \"<|end|>\", \"special\": true},"
                 " {\"id\": 9, \"content\": \"<think>\", \"special\": false}],"
                 " \"normalizer\": null,"
                 " \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false},"
                 " \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"c\": 2,"
                 "  \"ab\": 3, \"abc\": 4, \"\\u0120\": 5, \"\\u0120ab\": 6},"
                 "  \"merges\": [\"a b\", [\"ab\", \"c\"], \"\\u0120 ab\"]}}",
                 &v, &err),
             &err);
    CHECK_EQ_INT(tok_vocab_kind(v), TOK_MODEL_BPE);
    CHECK_EQ_INT(tok_vocab_n_tokens(v), 10);
    CHECK_EQ_INT(tok_token_get_type(v, 7), TOK_TYPE_UNUSED);
    CHECK_EQ_INT(tok_token_get_type(v, 8), TOK_TYPE_CONTROL);
    CHECK_EQ_INT(tok_token_get_type(v, 9), TOK_TYPE_USER_DEFINED);
    CHECK_EQ_INT(tok_vocab_special(v, TOK_SPECIAL_EOS), 8);
    CHECK_EQ_INT(tok_vocab_special(v, TOK_SPECIAL_BOS), -1);
    CHECK(!tok_vocab_add_bos(v));
    CHECK(!tok_vocab_ignore_merges(v));
    int32_t ids[8];
    size_t n = 0;
    CHECK_OK(tok_encode(v, "abc ab", 6, false, false, ids, 8, &n, &err), &err);
    CHECK_EQ_INT(n, 2);
    CHECK_EQ_INT(ids[0], 4);
    CHECK_EQ_INT(ids[1], 6);
    tok_vocab_destroy(v);
}

static void expect_hf_error(const char *json, hl_status code, const char *needle) {
    tok_vocab *v = (tok_vocab *)1;
    hl_err err = {0};
    hl_status st = load_hf_text(json, &v, &err);
    CHECK_MSG(st == code, "got %d (%s), want %d for %s", (int)st, err.msg, (int)code, json);
    CHECK(v == NULL);
    CHECK_MSG(strstr(err.msg, needle) != NULL, "message \"%s\" lacks \"%s\"", err.msg, needle);
}

TEST(bpe_hf_errors) {
    /* malformed JSON: jansson's line and column */
    expect_hf_error("{\"model\": {\"type\": \"BPE\",\n \"vocab\": {\"a\": 0,,}}}", HL_ERR_FORMAT,
                    ":2:");
    expect_hf_error("[1, 2]", HL_ERR_FORMAT, "no \"model\"");
    expect_hf_error("{\"version\": \"1.0\"}", HL_ERR_FORMAT, "no \"model\"");
    expect_hf_error("{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}}", HL_ERR_UNSUPPORTED,
                    "WordPiece");
    expect_hf_error("{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}", HL_ERR_UNSUPPORTED,
                    "Unigram");
    expect_hf_error("{\"model\": {\"type\": \"BPE\", \"byte_fallback\": true, \"vocab\": {},"
                    " \"merges\": []}}",
                    HL_ERR_UNSUPPORTED, "byte_fallback");
    expect_hf_error("{\"pre_tokenizer\": {\"type\": \"Metaspace\"},"
                    " \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}",
                    HL_ERR_UNSUPPORTED, "Metaspace");
    expect_hf_error("{\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": ["
                    " {\"type\": \"Split\", \"pattern\": {\"Regex\": \"\\\\w+\"}},"
                    " {\"type\": \"ByteLevel\", \"use_regex\": false}]},"
                    " \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}",
                    HL_ERR_UNSUPPORTED, "\\w+");
    static const char pre[] = "\"pre_tokenizer\": {\"type\": \"ByteLevel\"}, ";
    char buf[512];
    snprintf(buf, sizeof buf, "{%s\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": -1},"
             " \"merges\": []}}", pre);
    expect_hf_error(buf, HL_ERR_FORMAT, "invalid id");
    snprintf(buf, sizeof buf, "{%s\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0},"
             " \"merges\": [7]}}", pre);
    expect_hf_error(buf, HL_ERR_FORMAT, "merges[0]");
    snprintf(buf, sizeof buf, "{%s\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}}", pre);
    expect_hf_error(buf, HL_ERR_FORMAT, "merges");
    snprintf(buf, sizeof buf, "{%s\"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}}",
             pre);
    expect_hf_error(buf, HL_ERR_FORMAT, "empty");

    tok_vocab *v = NULL;
    hl_err err = {0};
    char missing[1024];
    snprintf(missing, sizeof missing, "%s/no-such-tokenizer.json", test_tmpdir());
    CHECK_EQ_INT(tok_vocab_load_hf(missing, &v, &err), HL_ERR_IO);
    CHECK(v == NULL);
}

/* ---- speed: well under a millisecond per KB on ordinary text ---- */

#include <time.h>

/* Timings are printed, never asserted (see bench/ for speed figures). */

/* CPU time of this process: other work on a busy machine does not count. */
static double bpe_cpu_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

TEST(bpe_speed_and_roundtrip_256k) {
    const char *inp = test_shared_path("testdata/tokenizer/llama.cpp/ggml-vocab-gpt-2.gguf.inp");
    if (!inp) SKIP("ggml-vocab-gpt-2.gguf.inp not found");
    tok_vocab *v = tok_vectors_open_vocab("ggml-vocab-gpt-2.gguf");
    if (!v) SKIP("ggml-vocab-gpt-2.gguf not found");
    char *base = NULL;
    size_t blen = 0;
    hl_err err;
    CHECK_OK(hl_file_read(inp, &base, &blen, &err), &err);
    size_t n = 256 * 1024;
    char *text = malloc(n);
    int32_t *ids = malloc(n * sizeof *ids);
    char *back = malloc(n);
    CHECK(text && ids && back && blen > 0);
    for (size_t i = 0; i < n; i++) text[i] = base[i % blen];
    size_t n_ids = 0;
    double t0 = bpe_cpu_ms();
    CHECK_OK(tok_encode(v, text, n, false, false, ids, n, &n_ids, &err), &err);
    double ms = bpe_cpu_ms() - t0;
    CHECK(n_ids > n / 8 && n_ids <= n);
    fprintf(stderr, "    256 KB: %.1f ms (cpu)\n", ms);
    CHECK_EQ_INT(tok_decode(v, ids, n_ids, false, false, back, n), (int64_t)n);
    CHECK(memcmp(back, text, n) == 0);
    free(base);
    free(text);
    free(ids);
    free(back);
    tok_vocab_destroy(v);
}

/* Any bytes at all: byte-level BPE must give them back exactly, and megabyte-long
 * words (one run of spaces, letters, digits) must stay well under a second.
 * raw_roundtrip: also for invalid UTF-8. Not for deepseek-llm, whose vocab has
 * user-defined duplicates of the byte tokens of 0xC0 and 0xF5..0xFF (bytes that never
 * occur in UTF-8): the vocab's text lookup returns those (later ids win, as in
 * llama.cpp) and they decode as text, e.g. byte 0xF8 comes back as "\xc3\xb8". */
static void bpe_hostile(const char *vocab_name, bool raw_roundtrip) {
    tok_vocab *v = tok_vectors_open_vocab(vocab_name);
    if (!v) SKIP("vocab not found");
    size_t cap = 1 << 20;
    char *text = malloc(cap);
    int32_t *ids = malloc(cap * sizeof *ids);
    char *back = malloc(cap);
    CHECK(text && ids && back);
    uint32_t seed = 7;
    hl_err err;
    for (int round = 0; round < 30; round++) {
        size_t len = (size_t)(round * 97 % 2500);
        for (size_t i = 0; i < len; i++) {
            seed = seed * 1664525u + 1013904223u;
            unsigned r = seed >> 24;
            /* raw bytes, or UTF-8-ish text with spaces, newlines, digits, quotes */
            text[i] = round % 3 == 0 && raw_roundtrip ? (char)r
                                                      : "ab 7\n'\xc3\xa9\xe4\xb8\x80\t!"[r % 13];
        }
        size_t n = 0;
        CHECK_OK(tok_encode(v, text, len, false, false, ids, cap, &n, &err), &err);
        CHECK_EQ_INT(tok_decode(v, ids, n, false, false, back, cap), (int64_t)len);
        CHECK_MSG(memcmp(back, text, len) == 0, "%s: round %d does not round-trip", vocab_name,
                  round);
    }
    static const char fills[] = {' ', 'a', '7', '\n'};
    for (size_t k = 0; k < sizeof fills; k++) {
        memset(text, fills[k], cap);
        size_t n = 0;
        double t0 = bpe_cpu_ms();
        CHECK_OK(tok_encode(v, text, cap, false, false, ids, cap, &n, &err), &err);
        double ms = bpe_cpu_ms() - t0;
        fprintf(stderr, "    %s: 1 MB of 0x%02x: %.0f ms (cpu)\n", vocab_name, fills[k], ms);
        CHECK_EQ_INT(tok_decode(v, ids, n, false, false, back, cap), (int64_t)cap);
        CHECK(memcmp(back, text, cap) == 0);
    }
    free(text);
    free(ids);
    free(back);
    tok_vocab_destroy(v);
}

TEST(bpe_hostile_input_gpt2) { bpe_hostile("ggml-vocab-gpt-2.gguf", true); }
TEST(bpe_hostile_input_deepseek_llm) { bpe_hostile("ggml-vocab-deepseek-llm.gguf", false); }
