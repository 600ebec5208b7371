/* Tests for the tokenizer core (tok.c, spm.c, wpm.c). */
#include <stdlib.h>
#include <time.h>

#include "base/file.h"
#include "gguf/gguf.h"
#include "test.h"
#include "tok/tok.h"
#include "tok_vectors.h"

#define VOCAB_OR_SKIP(var, name)                                                         \
    tok_vocab *var = tok_vectors_open_vocab(name);                                      \
    if (!var) SKIP("models/ggml-vocab/" name " not found (or failed to load)")

TEST(tok_vectors_llama_spm) {
    VOCAB_OR_SKIP(v, "ggml-vocab-llama-spm.gguf");
    CHECK_EQ_INT(tok_vocab_kind(v), TOK_MODEL_SPM);
    int bad = run_vocab_vectors(v, "ggml-vocab-llama-spm.gguf", TOK_VECTORS_DECODE);
    tok_vocab_destroy(v);
    if (bad < 0) SKIP("llama-spm vectors not found");
    CHECK_EQ_INT(bad, 0);
}

TEST(tok_vectors_phi3) {
    VOCAB_OR_SKIP(v, "ggml-vocab-phi-3.gguf");
    int bad = run_vocab_vectors(v, "ggml-vocab-phi-3.gguf", TOK_VECTORS_DECODE);
    tok_vocab_destroy(v);
    if (bad < 0) SKIP("phi-3 vectors not found");
    CHECK_EQ_INT(bad, 0);
}

TEST(tok_vectors_bert_bge) {
    VOCAB_OR_SKIP(v, "ggml-vocab-bert-bge.gguf");
    CHECK_EQ_INT(tok_vocab_kind(v), TOK_MODEL_WPM);
    int bad = run_vocab_vectors(v, "ggml-vocab-bert-bge.gguf", TOK_VECTORS_ENCODE);
    tok_vocab_destroy(v);
    if (bad < 0) SKIP("bert-bge vectors not found");
    CHECK_EQ_INT(bad, 0);
}

TEST(tok_vectors_files_parse) {
    tok_vectors tv;
    if (!tok_vectors_load("ggml-vocab-llama-spm.gguf", &tv)) SKIP("llama-spm vectors not found");
    size_t n = tv.n;
    /* string 0 is "ied 4 ½ months", expected " 474 287 29871 29946 29871 30226 7378" */
    bool first_ok = tv.v[0].len == strlen("ied 4 \xc2\xbd months") &&
                    memcmp(tv.v[0].text, "ied 4 \xc2\xbd months", tv.v[0].len) == 0 &&
                    tv.v[0].n_ids == 7 && tv.v[0].ids[0] == 474 && tv.v[0].ids[6] == 7378;
    bool empty_ok = tv.v[2].len == 0 && tv.v[2].n_ids == 0;
    tok_vectors_free(&tv);
    CHECK_EQ_INT(n, 46);
    CHECK(first_ok);
    CHECK(empty_ok);
}

/* ---- helpers ---- */

static tok_vocab *open_stories(void) {
    const char *path = test_shared_path("models/stories260K/stories260K.gguf");
    if (!path) return NULL;
    gguf_file *f = NULL;
    tok_vocab *v = NULL;
    hl_err err;
    if (gguf_open(path, &f, &err) != HL_OK || tok_vocab_load_gguf(f, &v, &err) != HL_OK) {
        fprintf(stderr, "    stories260K: %s\n", err.msg);
        v = NULL;
    }
    gguf_close(f);
    return v;
}

#define STORIES_OR_SKIP(var)                                                             \
    tok_vocab *var = open_stories();                                                    \
    if (!var) SKIP("models/stories260K/stories260K.gguf not found (or failed to load)")

static int32_t byte_tok(const tok_vocab *v, unsigned b) {
    char name[8];
    snprintf(name, sizeof name, "<0x%02X>", b);
    return tok_find_token(v, name, 6);
}

/* Encodes into a fixed buffer; returns the count (or -1 on error). */
static long encode(const tok_vocab *v, const char *s, size_t len, bool add_special,
                   bool parse_special, int32_t *ids, size_t cap) {
    size_t n = 0;
    hl_err err;
    if (tok_encode(v, s, len, add_special, parse_special, ids, cap, &n, &err) != HL_OK) {
        fprintf(stderr, "    tok_encode: %s\n", err.msg);
        return -1;
    }
    return n <= cap ? (long)n : -2;
}

TEST(tok_stories260K_vocab_and_byte_fallback) {
    STORIES_OR_SKIP(v);
    int32_t ids[64];
    CHECK_EQ_INT(tok_vocab_n_tokens(v), 512);
    CHECK_EQ_INT(tok_vocab_kind(v), TOK_MODEL_SPM);
    CHECK_EQ_INT(tok_vocab_special(v, TOK_SPECIAL_BOS), 1);
    CHECK_EQ_INT(tok_vocab_special(v, TOK_SPECIAL_EOS), 2);
    CHECK_EQ_INT(tok_vocab_special(v, TOK_SPECIAL_UNK), 0);
    CHECK_EQ_INT(tok_vocab_special(v, TOK_SPECIAL_SEP), -1); /* stored as 0xFFFFFFFF */
    CHECK(tok_vocab_add_bos(v));
    CHECK(!tok_vocab_add_eos(v));
    CHECK(tok_is_eog(v, 2));
    CHECK(!tok_is_eog(v, 1));
    CHECK(tok_is_control(v, 1));
    CHECK_EQ_INT(tok_token_get_type(v, 3), TOK_TYPE_BYTE);
    CHECK_EQ_INT(byte_tok(v, 0xF0), 3 + 0xF0);

    /* U+1F600 is not in the 512-token vocab: space token, then its four bytes. */
    const char *emoji = "\xf0\x9f\x98\x80";
    long n = encode(v, emoji, 4, true, false, ids, 64);
    CHECK_EQ_INT(n, 6);
    CHECK_EQ_INT(ids[0], 1);
    CHECK_EQ_INT(ids[1], tok_find_token(v, "\xe2\x96\x81", 3));
    CHECK_EQ_INT(ids[2], 3 + 0xF0);
    CHECK_EQ_INT(ids[3], 3 + 0x9F);
    CHECK_EQ_INT(ids[4], 3 + 0x98);
    CHECK_EQ_INT(ids[5], 3 + 0x80);
    char out[64];
    int64_t dn = tok_decode(v, ids + 1, 5, false, true, out, sizeof out);
    CHECK_EQ_INT(dn, 4);
    CHECK(memcmp(out, emoji, 4) == 0);

    /* A story sentence round-trips and uses multi-character tokens. */
    const char *s = "Once upon a time, there was a little girl named Lily.";
    n = encode(v, s, strlen(s), false, false, ids, 64);
    CHECK(n > 0 && n < (long)strlen(s));
    dn = tok_decode(v, ids, (size_t)n, false, true, out, sizeof out);
    CHECK_EQ_INT(dn, strlen(s));
    CHECK(memcmp(out, s, strlen(s)) == 0);
    /* Without removing the leading space, the prefix space is visible. */
    dn = tok_decode(v, ids, (size_t)n, false, false, out, sizeof out);
    CHECK_EQ_INT(dn, strlen(s) + 1);
    CHECK(out[0] == ' ');
    tok_vocab_destroy(v);
}

TEST(tok_piece_and_decode_conventions) {
    STORIES_OR_SKIP(v);
    char buf[16];
    CHECK_EQ_INT(tok_token_to_piece(v, 1, false, buf, sizeof buf), 0);
    CHECK_EQ_INT(tok_token_to_piece(v, 1, true, buf, sizeof buf), 3);
    CHECK(memcmp(buf, "<s>", 3) == 0);
    CHECK_EQ_INT(tok_token_to_piece(v, 0, false, buf, sizeof buf), 0); /* <unk> is hidden too */
    CHECK_EQ_INT(tok_token_to_piece(v, 3 + 'A', false, buf, sizeof buf), 1);
    CHECK(buf[0] == 'A');
    CHECK_EQ_INT(tok_token_to_piece(v, -1, true, buf, sizeof buf), -1);
    CHECK_EQ_INT(tok_token_to_piece(v, 512, true, buf, sizeof buf), -1);
    int32_t ids[3] = {1, 3 + 'h', 3 + 'i'};
    CHECK_EQ_INT(tok_decode(v, ids, 3, true, false, NULL, 0), 5);
    memset(buf, 'x', sizeof buf);
    CHECK_EQ_INT(tok_decode(v, ids, 3, true, false, buf, 4), 5); /* truncated, full length */
    CHECK(memcmp(buf, "<s>hx", 5) == 0);
    int32_t bad[2] = {3, 9999};
    CHECK_EQ_INT(tok_decode(v, bad, 2, false, false, buf, sizeof buf), -1);
    tok_vocab_destroy(v);
}

TEST(tok_stream_holds_split_utf8) {
    STORIES_OR_SKIP(v);
    tok_stream s;
    char out[128];
    tok_stream_init(&s, v, false, false);
    const uint8_t emoji[4] = {0xF0, 0x9F, 0x98, 0x80};
    CHECK_EQ_INT(tok_stream_push(&s, 3 + 'a', out, sizeof out), 1);
    CHECK(out[0] == 'a');
    for (int i = 0; i < 3; i++) CHECK_EQ_INT(tok_stream_push(&s, 3 + emoji[i], out, sizeof out), 0);
    /* too small a buffer: -1 and nothing consumed */
    CHECK_EQ_INT(tok_stream_push(&s, 3 + emoji[3], out, 3), -1);
    CHECK_EQ_INT(tok_stream_push(&s, 3 + emoji[3], out, sizeof out), 4);
    CHECK(memcmp(out, emoji, 4) == 0);
    CHECK_EQ_INT(tok_stream_flush(&s, out, sizeof out), 0);
    /* the longest stories260K piece is short; the bound covers 3 bytes per byte */
    CHECK(tok_stream_buf_size(v) >= 3 * 4 && tok_stream_buf_size(v) < 128);
    /* control tokens are silent unless rendered */
    CHECK_EQ_INT(tok_stream_push(&s, 2, out, sizeof out), 0);
    tok_stream_init(&s, v, true, false);
    CHECK_EQ_INT(tok_stream_push(&s, 2, out, sizeof out), 4);
    CHECK(memcmp(out, "</s>", 4) == 0);
    tok_vocab_destroy(v);
}

TEST(tok_stream_invalid_bytes_become_replacement) {
    STORIES_OR_SKIP(v);
    tok_stream s;
    char out[128];
    tok_stream_init(&s, v, false, false);
    /* a lone continuation byte and 0xFF: one U+FFFD each */
    CHECK_EQ_INT(tok_stream_push(&s, 3 + 0x80, out, sizeof out), 3);
    CHECK(memcmp(out, "\xef\xbf\xbd", 3) == 0);
    CHECK_EQ_INT(tok_stream_push(&s, 3 + 0xFF, out, sizeof out), 3);
    CHECK(memcmp(out, "\xef\xbf\xbd", 3) == 0);
    /* E2 82 then 'A': the cut-short sequence is one U+FFFD, then A */
    CHECK_EQ_INT(tok_stream_push(&s, 3 + 0xE2, out, sizeof out), 0);
    CHECK_EQ_INT(tok_stream_push(&s, 3 + 0x82, out, sizeof out), 0);
    CHECK_EQ_INT(tok_stream_push(&s, 3 + 'A', out, sizeof out), 4);
    CHECK(memcmp(out, "\xef\xbf\xbd" "A", 4) == 0);
    /* an overlong lead (C0) and a surrogate (ED A0 80) are invalid */
    CHECK_EQ_INT(tok_stream_push(&s, 3 + 0xC0, out, sizeof out), 3);
    CHECK_EQ_INT(tok_stream_push(&s, 3 + 0xED, out, sizeof out), 0);
    CHECK_EQ_INT(tok_stream_push(&s, 3 + 0xA0, out, sizeof out), 6);
    CHECK(memcmp(out, "\xef\xbf\xbd\xef\xbf\xbd", 6) == 0);
    CHECK_EQ_INT(tok_stream_push(&s, 3 + 0x80, out, sizeof out), 3);
    /* an incomplete tail is replaced on flush */
    CHECK_EQ_INT(tok_stream_push(&s, 3 + 0xF0, out, sizeof out), 0);
    CHECK_EQ_INT(tok_stream_push(&s, 3 + 0x9F, out, sizeof out), 0);
    CHECK_EQ_INT(tok_stream_flush(&s, out, 2), -1);
    CHECK_EQ_INT(tok_stream_flush(&s, out, sizeof out), 3);
    CHECK(memcmp(out, "\xef\xbf\xbd", 3) == 0);
    CHECK_EQ_INT(tok_stream_flush(&s, out, sizeof out), 0);
    tok_vocab_destroy(v);
}

TEST(tok_stream_matches_decode) {
    VOCAB_OR_SKIP(v, "ggml-vocab-llama-spm.gguf");
    const char *text = "Hello world! \xe4\xbd\xa0\xe5\xa5\xbd \xf0\x9f\xa6\x99 caf\xc3\xa9";
    int32_t ids[128];
    long n = encode(v, text, strlen(text), true, false, ids, 128);
    CHECK(n > 3);
    char dec[256], str[512];
    int64_t dn = tok_decode(v, ids + 1, (size_t)n - 1, false, true, dec, sizeof dec);
    CHECK_EQ_INT(dn, strlen(text));
    CHECK(memcmp(dec, text, strlen(text)) == 0);
    tok_stream s;
    tok_stream_init(&s, v, false, true);
    size_t w = 0;
    for (long i = 1; i < n; i++) {
        int32_t k = tok_stream_push(&s, ids[i], str + w, sizeof str - w);
        CHECK(k >= 0);
        w += (size_t)k;
    }
    w += (size_t)tok_stream_flush(&s, str + w, sizeof str - w);
    CHECK_EQ_INT(w, strlen(text));
    CHECK(memcmp(str, text, w) == 0);
    tok_vocab_destroy(v);
}

TEST(tok_special_parsing) {
    VOCAB_OR_SKIP(v, "ggml-vocab-llama-spm.gguf");
    int32_t a[64], b[64];
    const char *text = "<s>Hello</s>";
    long n = encode(v, text, strlen(text), false, true, a, 64);
    long m = encode(v, "Hello", 5, false, false, b, 64);
    CHECK(n > 2 && m > 0);
    CHECK_EQ_INT(n, m + 2);
    CHECK_EQ_INT(a[0], 1);
    CHECK(memcmp(a + 1, b, (size_t)m * sizeof *b) == 0); /* space prefix after a special */
    CHECK_EQ_INT(a[n - 1], 2);
    n = encode(v, text, strlen(text), false, false, a, 64);
    CHECK(n > 4);
    for (long i = 0; i < n; i++) CHECK(a[i] != 1 && a[i] != 2);
    char dec[64];
    int64_t dn = tok_decode(v, a, (size_t)n, false, true, dec, sizeof dec);
    CHECK_EQ_INT(dn, strlen(text));
    CHECK(memcmp(dec, text, (size_t)dn) == 0);
    /* add_special: BOS in front (SPM adds BOS, not EOS) */
    n = encode(v, "Hi", 2, true, false, a, 64);
    CHECK(n >= 2);
    CHECK_EQ_INT(a[0], 1);
    CHECK(a[n - 1] != 2);
    /* empty text: nothing, or just BOS */
    CHECK_EQ_INT(encode(v, "", 0, false, true, a, 64), 0);
    CHECK_EQ_INT(encode(v, "", 0, true, true, a, 64), 1);
    tok_vocab_destroy(v);
}

TEST(tok_encode_small_buffer_reports_count) {
    VOCAB_OR_SKIP(v, "ggml-vocab-llama-spm.gguf");
    const char *text = "The quick brown fox jumps over the lazy dog.";
    int32_t full[64], small[2] = {-7, -7};
    long n = encode(v, text, strlen(text), true, false, full, 64);
    CHECK(n > 5);
    size_t got = 0;
    hl_err err;
    CHECK_OK(tok_encode(v, text, strlen(text), true, false, small, 1, &got, &err), &err);
    CHECK_EQ_INT(got, n);
    CHECK_EQ_INT(small[0], full[0]);
    CHECK_EQ_INT(small[1], -7); /* nothing written past max_out */
    CHECK_OK(tok_encode(v, text, strlen(text), true, false, NULL, 0, &got, &err), &err);
    CHECK_EQ_INT(got, n);
    tok_vocab_destroy(v);
}

TEST(tok_wpm_encode_decode) {
    VOCAB_OR_SKIP(v, "ggml-vocab-bert-bge.gguf");
    CHECK_EQ_INT(tok_vocab_special(v, TOK_SPECIAL_CLS), 101);
    CHECK_EQ_INT(tok_vocab_special(v, TOK_SPECIAL_SEP), 102); /* the "seperator" key */
    CHECK_EQ_INT(tok_vocab_special(v, TOK_SPECIAL_UNK), 100);
    int32_t ids[64];
    const char *text = "Hello, World! The children were PLAYING.";
    long n = encode(v, text, strlen(text), true, false, ids, 64);
    CHECK(n > 4);
    CHECK_EQ_INT(ids[0], 101);
    CHECK_EQ_INT(ids[n - 1], 102);
    char dec[128];
    int64_t dn = tok_decode(v, ids, (size_t)n, false, true, dec, sizeof dec);
    const char *want = " hello , world ! the children were playing .";
    CHECK(dn >= 0);
    dec[dn] = '\0';
    CHECK_STR(dec, want);
    /* accents stripped, CJK split per character, unknown words become [UNK] */
    n = encode(v, "Caf\xc3\xa9", 5, false, false, ids, 64);
    long m = encode(v, "cafe", 4, false, false, ids + 32, 32);
    CHECK(n > 0 && n == m);
    CHECK(memcmp(ids, ids + 32, (size_t)n * sizeof *ids) == 0);
    n = encode(v, "\xe4\xbd\xa0\xe5\xa5\xbd", 6, false, false, ids, 64);
    CHECK_EQ_INT(n, 2);
    n = encode(v, "\xf0\x9f\xa6\x99", 4, false, false, ids, 64);
    CHECK_EQ_INT(n, 1);
    CHECK_EQ_INT(ids[0], 100);
    tok_vocab_destroy(v);
}

/* A combining accent written as a code point of its own (NFD text, "e\u0301") is dropped
 * like a precomposed one, as HF's BasicTokenizer does for uncased BERT (NFD, then drop
 * category Mn). Before, the mark stayed in the word and the whole word became [UNK].
 * Ids of bert-base-uncased (the bge vocabulary): "e" 1041, "cafe" 7668, "naive" 15743,
 * "resume" 13746. */
TEST(tok_wpm_drops_combining_marks) {
    VOCAB_OR_SKIP(v, "ggml-vocab-bert-bge.gguf");
    static const struct {
        const char *text;
        int32_t want[4];
        int n;
    } cases[] = {
        {"e\xcc\x81", {101, 1041, 102}, 3},
        {"Caf\xc3\xa9", {101, 7668, 102}, 3},
        {"Cafe\xcc\x81", {101, 7668, 102}, 3},
        {"NAI\xcc\x88VE re\xcc\x81sume\xcc\x81", {101, 15743, 13746, 102}, 4},
        {"\xcc\x81", {101, 102}, 2}, /* a lone mark is no word at all */
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        int32_t ids[16];
        long n = encode(v, cases[k].text, strlen(cases[k].text), true, false, ids, 16);
        bool same = n == cases[k].n;
        for (int i = 0; same && i < n; i++) same = ids[i] == cases[k].want[i];
        CHECK_MSG(same, "case %zu: %ld ids [%d %d %d %d], want %d [%d %d %d %d]", k, n,
                  n > 0 ? ids[0] : -1, n > 1 ? ids[1] : -1, n > 2 ? ids[2] : -1,
                  n > 3 ? ids[3] : -1, cases[k].n, cases[k].want[0], cases[k].want[1],
                  cases[k].want[2], cases[k].want[3]);
    }
    tok_vocab_destroy(v);
}

/* ---- hostile input ---- */

/* Time limits are for optimised builds; sanitizers slow the code several times. */
/* CPU time of this process, so that other processes on a busy machine do not count. */
static double cpu_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

/* Speed is a benchmark's business, not a test's: these tests print their timings
 * for a reader and check only that pathological inputs finish (the harness's
 * per-test time limit catches a quadratic regression). */

static uint32_t lcg(uint32_t *s) {
    *s = *s * 1664525u + 1013904223u;
    return *s >> 8;
}

static void hostile_inputs(const tok_vocab *v, bool roundtrip) {
    size_t cap = 1 << 20;
    char *text = malloc(cap);
    int32_t *ids = malloc((cap + 8) * sizeof *ids);
    char *dec = malloc(cap + 16);
    uint32_t seed = 12345;
    for (int round = 0; round < 40; round++) {
        size_t len = lcg(&seed) % 3000;
        bool valid = round % 4 == 1; /* valid UTF-8: random code points, NULs, spaces */
        for (size_t i = 0; i < len; i++) {
            uint32_t r = lcg(&seed);
            if (valid) {
                uint32_t c = r % 3 == 0 ? r % 128 : r % 3 == 1 ? 0x80 + r % 0x3000 : 0x10000 + r % 0x10000;
                if (c >= 0xD800 && c < 0xE000) c = ' ';
                if (c == 0x2581) c = 0;
                char u[4];
                size_t k = c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4;
                if (k == 1) u[0] = (char)c;
                else if (k == 2) u[0] = (char)(0xC0 | (c >> 6)), u[1] = (char)(0x80 | (c & 63));
                else if (k == 3)
                    u[0] = (char)(0xE0 | (c >> 12)), u[1] = (char)(0x80 | ((c >> 6) & 63)),
                    u[2] = (char)(0x80 | (c & 63));
                else
                    u[0] = (char)(0xF0 | (c >> 18)), u[1] = (char)(0x80 | ((c >> 12) & 63)),
                    u[2] = (char)(0x80 | ((c >> 6) & 63)), u[3] = (char)(0x80 | (c & 63));
                if (i + k > len) {
                    len = i;
                    break;
                }
                memcpy(text + i, u, k);
                i += k - 1;
                continue;
            }
            /* mix raw bytes, NULs, spaces, '<' and special-token-looking text */
            text[i] = (char)(round % 4 == 0 ? r : (r % 7 == 0 ? 0 : r % 5 == 0 ? ' ' : r));
        }
        if (round % 8 == 3 && len > 10) memcpy(text + len / 2, "<s></s>[CLS]", 10);
        for (int ps = 0; ps < 2; ps++) {
            size_t n = 0;
            hl_err err;
            CHECK_OK(tok_encode(v, text, len, true, ps, ids, cap, &n, &err), &err);
            for (size_t i = 0; i < n; i++) CHECK(ids[i] >= 0 && ids[i] < tok_vocab_n_tokens(v));
            int64_t dn = tok_decode(v, ids, n, ps, true, dec, cap + 16);
            CHECK(dn >= 0);
            if (roundtrip && valid && !ps) {
                /* SPM with every byte token: decode(encode(x)) == x for valid UTF-8
                 * (like llama.cpp, invalid bytes next to spaces do not round-trip) */
                dn = tok_decode(v, ids + 1, n - 1, false, true, dec, cap + 16);
                CHECK_EQ_INT(dn, len);
                CHECK(memcmp(dec, text, len) == 0);
            }
        }
    }
    /* 1 MB of spaces, and 1 MB of one letter: linear-ish time */
    for (int k = 0; k < 2; k++) {
        memset(text, k ? 'a' : ' ', cap);
        size_t n = 0;
        hl_err err;
        double t0 = cpu_ms();
        CHECK_OK(tok_encode(v, text, cap, false, true, ids, cap, &n, &err), &err);
        double ms = cpu_ms() - t0;
        fprintf(stderr, "    1 MB of '%c': %zu tokens in %.1f ms (cpu)\n", text[0], n, ms);
    }
    free(text);
    free(ids);
    free(dec);
}

TEST(tok_hostile_input_spm) {
    VOCAB_OR_SKIP(v, "ggml-vocab-llama-spm.gguf");
    /* found by fuzzing: a 2-byte lead before a space takes part of the escaped U+2581,
     * leaving more symbols than input bytes */
    char lead_space[4000];
    for (size_t i = 0; i < sizeof lead_space; i += 2) lead_space[i] = '\xc2', lead_space[i + 1] = ' ';
    int32_t *ids = malloc(9000 * sizeof *ids);
    long n = encode(v, lead_space, sizeof lead_space, false, false, ids, 9000);
    int32_t third = n > 3 ? ids[3] : -1;
    free(ids);
    /* "▁", then per pair the bytes C2 E2 96 81 as byte tokens */
    CHECK_EQ_INT(n, 1 + 4 * 2000);
    CHECK_EQ_INT(third, byte_tok(v, 0x96));
    hostile_inputs(v, true);
    tok_vocab_destroy(v);
}

TEST(tok_hostile_input_wpm) {
    VOCAB_OR_SKIP(v, "ggml-vocab-bert-bge.gguf");
    hostile_inputs(v, false);
    tok_vocab_destroy(v);
}

TEST(tok_speed_few_kb) {
    VOCAB_OR_SKIP(v, "ggml-vocab-llama-spm.gguf");
    tok_vocab *w = tok_vectors_open_vocab("ggml-vocab-bert-bge.gguf");
    char text[4096];
    const char *para = "It was the best of times, it was the worst of times, it was the age of "
                       "wisdom, it was the age of foolishness. Caf\xc3\xa9 \xe4\xbd\xa0\xe5\xa5\xbd! ";
    size_t len = 0, pl = strlen(para);
    while (len + pl < sizeof text) memcpy(text + len, para, pl), len += pl;
    int32_t ids[4096];
    const tok_vocab *vs[2] = {v, w};
    for (int k = 0; k < 2; k++) {
        if (!vs[k]) continue;
        size_t n = 0;
        hl_err err;
        double t0 = cpu_ms();
        for (int r = 0; r < 10; r++)
            CHECK_OK(tok_encode(vs[k], text, len, false, false, ids, 4096, &n, &err), &err);
        double ms_per_kb = (cpu_ms() - t0) / 10 / ((double)len / 1024);
        fprintf(stderr, "    %s: %.3f ms per KB\n", k ? "wpm" : "spm", ms_per_kb);
    }
    tok_vocab_destroy(v);
    tok_vocab_destroy(w);
}

/* ---- GGUF metadata handling (files built with the gguf writer) ---- */

static const char *const k_small_tokens[] = {"<unk>", "<s>", "</s>", "\xe2\x96\x81", "a",
                                             ("\xe2\x96\x81" "a"), "b", "<|im_end|>",
                                             "<|endoftext|>"};
#define N_SMALL 9

/* A small SPM vocab; `tweak` edits the writer before it is written. */
static hl_status load_small(void (*tweak)(gguf_writer *), tok_vocab **out, hl_err *err) {
    gguf_writer *w = gguf_writer_create();
    float scores[N_SMALL] = {0, 0, 0, -1, -2, -0.5f, -3, 0, 0};
    int32_t types[N_SMALL] = {2, 3, 3, 1, 1, 1, 1, 1, 1};
    gguf_writer_set_str(w, "tokenizer.ggml.model", "llama");
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", k_small_tokens, N_SMALL);
    gguf_writer_set_arr(w, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, scores, N_SMALL);
    gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, types, N_SMALL);
    if (tweak) tweak(w);
    uint8_t *buf = NULL;
    size_t len = 0;
    gguf_file *f = NULL;
    *out = NULL;
    hl_status st = gguf_writer_write_memory(w, &buf, &len, err);
    if (st == HL_OK) st = gguf_open_memory(buf, len, &f, err);
    if (st == HL_OK) st = tok_vocab_load_gguf(f, out, err);
    gguf_close(f);
    free(buf);
    gguf_writer_destroy(w);
    return st;
}

static void tweak_bos_99(gguf_writer *w) { gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 99); }
static void tweak_eos_none(gguf_writer *w) {
    gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 0xFFFFFFFFu);
}
static void tweak_sep_negative(gguf_writer *w) {
    gguf_writer_set_i32(w, "tokenizer.ggml.separator_token_id", -5);
}
static void tweak_no_model(gguf_writer *w) {
    gguf_writer_set_str(w, "tokenizer.ggml.model", "no_vocab");
}
static void tweak_t5(gguf_writer *w) { gguf_writer_set_str(w, "tokenizer.ggml.model", "t5"); }
static void tweak_short_scores(gguf_writer *w) {
    float s[3] = {0, 0, 0};
    gguf_writer_set_arr(w, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, s, 3);
}
static void tweak_bad_type(gguf_writer *w) {
    int32_t t[N_SMALL] = {2, 3, 3, 1, 1, 1, 42, 1, 1};
    gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, t, N_SMALL);
}
static void tweak_bpe_no_merges(gguf_writer *w) {
    gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
}
static void tweak_no_prefix(gguf_writer *w) {
    gguf_writer_set_bool(w, "tokenizer.ggml.add_space_prefix", false);
    gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", false);
    gguf_writer_set_bool(w, "tokenizer.ggml.add_eos_token", true);
}

TEST(tok_gguf_rejects_out_of_range_bos) {
    tok_vocab *v = (tok_vocab *)1;
    hl_err err = {0};
    hl_status st = load_small(tweak_bos_99, &v, &err);
    CHECK_EQ_INT(st, HL_ERR_FORMAT);
    CHECK(v == NULL);
    CHECK_MSG(strstr(err.msg, "bos_token_id") && strstr(err.msg, "99") &&
                  strstr(err.msg, "out of range"),
              "message: %s", err.msg);
    CHECK_EQ_INT(load_small(tweak_sep_negative, &v, &err), HL_ERR_FORMAT);
    CHECK_MSG(strstr(err.msg, "separator_token_id"), "message: %s", err.msg);
}

TEST(tok_gguf_load_errors_are_clear) {
    tok_vocab *v = NULL;
    hl_err err = {0};
    CHECK_EQ_INT(load_small(tweak_no_model, &v, &err), HL_ERR_UNSUPPORTED);
    CHECK_MSG(strstr(err.msg, "no_vocab"), "message: %s", err.msg);
    CHECK_EQ_INT(load_small(tweak_t5, &v, &err), HL_ERR_UNSUPPORTED);
    CHECK_MSG(strstr(err.msg, "t5"), "message: %s", err.msg);
    CHECK_EQ_INT(load_small(tweak_short_scores, &v, &err), HL_ERR_FORMAT);
    CHECK_MSG(strstr(err.msg, "scores") && strstr(err.msg, "3"), "message: %s", err.msg);
    CHECK_EQ_INT(load_small(tweak_bad_type, &v, &err), HL_ERR_FORMAT);
    CHECK_MSG(strstr(err.msg, "token_type[6]"), "message: %s", err.msg);
    CHECK_EQ_INT(load_small(tweak_bpe_no_merges, &v, &err), HL_ERR_FORMAT);
    CHECK_MSG(strstr(err.msg, "merges"), "message: %s", err.msg);
    CHECK(v == NULL);

    /* no tokenizer at all */
    gguf_writer *w = gguf_writer_create();
    gguf_writer_set_str(w, "general.architecture", "llama");
    uint8_t *buf = NULL;
    size_t len = 0;
    gguf_file *f = NULL;
    CHECK_OK(gguf_writer_write_memory(w, &buf, &len, &err), &err);
    gguf_writer_destroy(w);
    hl_status st = gguf_open_memory(buf, len, &f, &err);
    if (st == HL_OK) st = tok_vocab_load_gguf(f, &v, &err);
    gguf_close(f);
    free(buf);
    CHECK_EQ_INT(st, HL_ERR_FORMAT);
    CHECK_MSG(strstr(err.msg, "tokenizer.ggml.model"), "message: %s", err.msg);
}

TEST(tok_gguf_defaults_and_eog) {
    tok_vocab *v = NULL;
    hl_err err;
    CHECK_OK(load_small(NULL, &v, &err), &err);
    CHECK_EQ_INT(tok_vocab_special(v, TOK_SPECIAL_BOS), 1); /* SPM defaults */
    CHECK_EQ_INT(tok_vocab_special(v, TOK_SPECIAL_EOS), 2);
    CHECK_EQ_INT(tok_vocab_special(v, TOK_SPECIAL_UNK), 0);
    CHECK(tok_vocab_add_bos(v));
    CHECK(!tok_vocab_add_eos(v));
    /* end markers: found by text, made control, end generation */
    CHECK_EQ_INT(tok_vocab_special(v, TOK_SPECIAL_EOT), 7);
    CHECK(tok_is_eog(v, 7) && tok_is_eog(v, 8) && tok_is_eog(v, 2));
    CHECK(!tok_is_eog(v, 4) && !tok_is_eog(v, 1));
    CHECK(tok_is_control(v, 7) && tok_is_control(v, 8));
    /* as control tokens they are not produced from plain text */
    int32_t ids[32];
    long n = encode(v, "<|im_end|>", 10, false, false, ids, 32);
    CHECK(n > 1);
    for (long i = 0; i < n; i++) CHECK(ids[i] != 7);
    CHECK_EQ_INT(encode(v, "<|im_end|>", 10, false, true, ids, 32), 1);
    CHECK_EQ_INT(ids[0], 7);
    /* "a a": ▁a ▁a ; with add_special, BOS first */
    n = encode(v, "a a", 3, true, false, ids, 32);
    CHECK_EQ_INT(n, 3);
    CHECK_EQ_INT(ids[0], 1);
    CHECK_EQ_INT(ids[1], 5);
    CHECK_EQ_INT(ids[2], 5);
    /* no byte tokens: an unknown character is <unk> */
    n = encode(v, "ac", 2, false, false, ids, 32);
    CHECK_EQ_INT(n, 2);
    CHECK_EQ_INT(ids[0], 5);
    CHECK_EQ_INT(ids[1], 0);
    tok_vocab_destroy(v);

    CHECK_OK(load_small(tweak_eos_none, &v, &err), &err);
    CHECK_EQ_INT(tok_vocab_special(v, TOK_SPECIAL_EOS), -1);
    CHECK(!tok_is_eog(v, 2));
    tok_vocab_destroy(v);

    CHECK_OK(load_small(tweak_no_prefix, &v, &err), &err);
    CHECK(!tok_vocab_add_bos(v));
    CHECK(tok_vocab_add_eos(v));
    n = encode(v, "a", 1, true, false, ids, 32);
    CHECK_EQ_INT(n, 2);
    CHECK_EQ_INT(ids[0], 4); /* "a", not "▁a" */
    CHECK_EQ_INT(ids[1], 2);
    tok_vocab_destroy(v);
}

/* ---- builder ---- */

static tok_vocab *build(tok_model_kind kind, const char *const *texts, const int *types, int n) {
    tok_vocab *v = tok_vocab_create(kind, NULL);
    for (int i = 0; i < n; i++)
        if (tok_vocab_add_token(v, texts[i], strlen(texts[i]), -(float)i,
                                (tok_token_type)types[i]) != HL_OK)
            return NULL;
    return v;
}

TEST(tok_special_partition_longest_first) {
    static const char *const t[] = {"<unk>", "\xe2\x96\x81", "a", "ab", "bcd", ("\xe2\x96\x81" "a"),
                                    "<c>", "c", "d"};
    static const int ty[] = {2, 1, 1, 4, 4, 1, 3, 1, 1};
    tok_vocab *v = build(TOK_MODEL_SPM, t, ty, 9);
    CHECK(v);
    hl_err err;
    CHECK_OK(tok_vocab_finish(v, &err), &err);
    int32_t ids[16];
    /* llama.cpp splits the longer user-defined token out first: "a" + [bcd], even
     * though "ab" starts earlier; user-defined tokens match without parse_special. */
    long n = encode(v, "abcd", 4, false, false, ids, 16);
    CHECK_EQ_INT(n, 2);
    CHECK_EQ_INT(ids[0], 5);
    CHECK_EQ_INT(ids[1], 4);
    /* control tokens only with parse_special */
    n = encode(v, "<c>", 3, false, false, ids, 16);
    CHECK(n >= 1);
    for (long i = 0; i < n; i++) CHECK(ids[i] != 6);
    n = encode(v, "<c>ab<c>", 8, false, true, ids, 16);
    CHECK_EQ_INT(n, 3);
    CHECK_EQ_INT(ids[0], 6);
    CHECK_EQ_INT(ids[1], 3);
    CHECK_EQ_INT(ids[2], 6);
    /* <unk> text is special too when parsing */
    CHECK_EQ_INT(encode(v, "<unk>", 5, false, true, ids, 16), 1);
    CHECK_EQ_INT(ids[0], 0);
    tok_vocab_destroy(v);
}

TEST(tok_builder_validation) {
    static const char *const t[] = {"<unk>", "a", "b"};
    static const int ty[] = {2, 1, 1};
    hl_err err = {0};
    tok_vocab *v = build(TOK_MODEL_SPM, t, ty, 3);
    tok_vocab_set_special(v, TOK_SPECIAL_EOS, 3);
    CHECK_EQ_INT(tok_vocab_finish(v, &err), HL_ERR_FORMAT);
    CHECK_MSG(strstr(err.msg, "eos") && strstr(err.msg, "3"), "message: %s", err.msg);
    tok_vocab_destroy(v);

    v = tok_vocab_create(TOK_MODEL_WPM, NULL);
    CHECK_EQ_INT(tok_vocab_finish(v, &err), HL_ERR_FORMAT); /* empty */
    tok_vocab_destroy(v);

    v = build(TOK_MODEL_SPM, t, ty, 3);
    CHECK_OK(tok_vocab_finish(v, &err), &err);
    CHECK_EQ_INT(tok_vocab_add_token(v, "c", 1, 0, TOK_TYPE_NORMAL), HL_ERR_INVALID);
    CHECK_EQ_INT(tok_find_token(v, "b", 1), 2);
    CHECK_EQ_INT(tok_find_token(v, "c", 1), -1);
    size_t len;
    CHECK_STR(tok_token_text(v, 1, &len), "a");
    CHECK_EQ_INT(len, 1);
    CHECK(tok_token_text(v, 7, &len) == NULL);
    CHECK_NEAR(tok_token_score(v, 2), -2.0, 0);
    tok_vocab_destroy(v);
}

#include "tok/internal.h"

TEST(tok_merge_ranks) {
    static const char *const t[] = {"a", "b", "c", "ab", "abc"};
    static const int ty[] = {1, 1, 1, 1, 1};
    tok_vocab *v = build(TOK_MODEL_WPM, t, ty, 5);
    CHECK_OK(tok_vocab_add_merge(v, "a b", 3), NULL);
    CHECK_OK(tok_vocab_add_merge(v, "ab c", 4), NULL);
    CHECK_OK(tok_vocab_add_merge(v, "a b", 3), NULL); /* a duplicate keeps rank 0 */
    CHECK_EQ_INT(tok_vocab_add_merge(v, "abc", 3), HL_ERR_FORMAT);
    CHECK_EQ_INT(tok_vocab_add_merge(v, " ab", 3), HL_ERR_FORMAT);
    hl_err err;
    CHECK_OK(tok_vocab_finish(v, &err), &err);
    CHECK_EQ_INT(tok_merge_rank(v, "a", 1, "b", 1), 0);
    CHECK_EQ_INT(tok_merge_rank(v, "ab", 2, "c", 1), 1);
    CHECK_EQ_INT(tok_merge_rank(v, "a", 1, "bc", 2), -1);
    CHECK_EQ_INT(tok_merge_rank(v, "b", 1, "a", 1), -1);
    tok_vocab_destroy(v);
}

TEST(tok_phi3_specials_eat_following_whitespace) {
    VOCAB_OR_SKIP(v, "ggml-vocab-phi-3.gguf");
    const char *chat = "<|user|>\nHi<|end|>\n<|assistant|>\n";
    int32_t ids[32], hi[8];
    long n = encode(v, chat, strlen(chat), false, true, ids, 32);
    long m = encode(v, "Hi", 2, false, false, hi, 8);
    CHECK(m >= 1);
    CHECK_EQ_INT(n, m + 3);
    CHECK_EQ_INT(ids[0], 32010);
    CHECK(memcmp(ids + 1, hi, (size_t)m * sizeof *hi) == 0);
    CHECK_EQ_INT(ids[m + 1], 32007);
    CHECK_EQ_INT(ids[m + 2], 32001);
    CHECK(tok_is_eog(v, 32007));   /* <|end|> */
    CHECK(tok_is_eog(v, 32000));   /* <|endoftext|>, also EOS */
    CHECK(!tok_is_eog(v, 32001));
    tok_vocab_destroy(v);
}

TEST(tok_strip_flags_from_builder) {
    static const char *const t[] = {"<unk>", "\xe2\x96\x81", "x", "\xe2\x96\x81x", "<L>", "<R>"};
    static const int ty[] = {2, 1, 1, 1, 3, 3};
    tok_vocab *v = build(TOK_MODEL_SPM, t, ty, 6);
    tok_vocab_set_token_strip(v, 4, TOK_STRIP_LEFT);
    tok_vocab_set_token_strip(v, 5, TOK_STRIP_RIGHT);
    hl_err err;
    CHECK_OK(tok_vocab_finish(v, &err), &err);
    int32_t ids[16];
    /* "x  <L>" -> ▁x <L> ; "<R> \t x" -> <R> ▁x */
    long n = encode(v, "x  <L>", 6, false, true, ids, 16);
    CHECK_EQ_INT(n, 2);
    CHECK_EQ_INT(ids[0], 3);
    CHECK_EQ_INT(ids[1], 4);
    n = encode(v, "<R> \t x", 7, false, true, ids, 16);
    CHECK_EQ_INT(n, 2);
    CHECK_EQ_INT(ids[0], 5);
    CHECK_EQ_INT(ids[1], 3);
    /* without the flag the spaces stay (plus the prefix space): <L> ▁ ▁ ▁x */
    n = encode(v, "<L>  x", 6, false, true, ids, 16);
    CHECK_EQ_INT(n, 4);
    CHECK_EQ_INT(ids[0], 4);
    CHECK_EQ_INT(ids[1], 1);
    CHECK_EQ_INT(ids[2], 1);
    CHECK_EQ_INT(ids[3], 3);
    tok_vocab_destroy(v);
}
