/*
 * fuzz_tok.c - libFuzzer target for the tokenizer core. Builds three small vocabs by
 * hand (SPM with byte fallback and special tokens, SPM without byte tokens, and a
 * WordPiece one), then for every input: encodes it with each vocab, with and
 * without special-token parsing, checks every id is in range and the count is the
 * same with a too-small buffer, decodes it, and streams the ids through tok_stream
 * checking the output is valid UTF-8. SPM with byte tokens must round-trip valid
 * UTF-8 input that has no U+2581 and no special token in it. Build with `make fuzz`:
 *   build-fuzz/fuzz/fuzz_tok -max_total_time=120
 */
#define _GNU_SOURCE /* memmem */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/utf8.h"
#include "tok/tok.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static tok_vocab *g_vocab[3];

static void add(tok_vocab *v, const char *t, float score, tok_token_type type) {
    if (tok_vocab_add_token(v, t, strlen(t), score, type) != HL_OK) abort();
}

static tok_vocab *make_spm(bool bytes) {
    tok_vocab *v = tok_vocab_create(TOK_MODEL_SPM, NULL);
    add(v, "<unk>", 0, TOK_TYPE_UNKNOWN);
    add(v, "<s>", 0, TOK_TYPE_CONTROL);
    add(v, "</s>", 0, TOK_TYPE_CONTROL);
    if (bytes) {
        for (int b = 0; b < 256; b++) {
            char name[8];
            snprintf(name, sizeof name, "<0x%02X>", b);
            add(v, name, 0, TOK_TYPE_BYTE);
        }
    }
    static const char *const words[] = {"\xe2\x96\x81", "a", "b", "ab", ("\xe2\x96\x81" "a"),
                                        "\xe2\x96\x81\xe2\x96\x81", "ba", "aba", "\xc3\xa9",
                                        "<|im_end|>", "<u>"};
    for (size_t i = 0; i < sizeof words / sizeof words[0]; i++)
        add(v, words[i], -(float)(i % 4), i == 10 ? TOK_TYPE_USER_DEFINED : TOK_TYPE_NORMAL);
    tok_vocab_set_special(v, TOK_SPECIAL_BOS, 1);
    tok_vocab_set_special(v, TOK_SPECIAL_EOS, 2);
    tok_vocab_set_special(v, TOK_SPECIAL_UNK, 0);
    hl_err err;
    if (tok_vocab_finish(v, &err) != HL_OK) abort();
    return v;
}

static tok_vocab *make_wpm(void) {
    tok_vocab *v = tok_vocab_create(TOK_MODEL_WPM, NULL);
    static const char *const t[] = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", ("\xe2\x96\x81" "a"),
                                    "b", ("\xe2\x96\x81" "ab"), "\xe2\x96\x81.", ("\xe2\x96\x81"
                                    "\xe4\xbd\xa0")};
    for (int i = 0; i < 9; i++) add(v, t[i], 0, i < 4 ? TOK_TYPE_CONTROL : TOK_TYPE_NORMAL);
    tok_vocab_set_special(v, TOK_SPECIAL_UNK, 1);
    tok_vocab_set_special(v, TOK_SPECIAL_CLS, 2);
    tok_vocab_set_special(v, TOK_SPECIAL_SEP, 3);
    hl_err err;
    if (tok_vocab_finish(v, &err) != HL_OK) abort();
    return v;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!g_vocab[0]) {
        g_vocab[0] = make_spm(true);
        g_vocab[1] = make_spm(false);
        g_vocab[2] = make_wpm();
    }
    const char *text = (const char *)data;
    size_t cap = 4 * size + 8;
    int32_t *ids = malloc(cap * sizeof *ids);
    char *out = malloc(8 * size + 64);
    for (int k = 0; k < 3; k++) {
        const tok_vocab *v = g_vocab[k];
        for (int ps = 0; ps < 2; ps++) {
            size_t n = 0, n_small = 0;
            hl_err err;
            if (tok_encode(v, text, size, ps, ps, ids, cap, &n, &err) != HL_OK) abort();
            if (n > cap) abort();
            if (tok_encode(v, text, size, ps, ps, ids, 1, &n_small, &err) != HL_OK) abort();
            if (n_small != n) abort();
            if (tok_encode(v, text, size, ps, ps, ids, cap, &n, &err) != HL_OK) abort();
            for (size_t i = 0; i < n; i++)
                if (ids[i] < 0 || ids[i] >= tok_vocab_n_tokens(v)) abort();
            int64_t dn = tok_decode(v, ids, n, ps, true, out, 8 * size + 64);
            if (dn < 0 || (size_t)dn > 8 * size + 64) abort();
            /* no round trip when a special token is in the text: a space prefix follows it */
            bool plain = hl_utf8_valid(data, size) && !memmem(data, size, "\xe2\x96\x81", 3) &&
                         !memmem(data, size, "<u>", 3);
            if (k == 0 && !ps && plain && (dn != (int64_t)size || memcmp(out, data, size) != 0))
                abort();
            tok_stream s;
            tok_stream_init(&s, v, ps, true);
            char buf[256];
            if (tok_stream_buf_size(v) > sizeof buf) abort();
            for (size_t i = 0; i < n; i++) {
                int32_t w = tok_stream_push(&s, ids[i], buf, sizeof buf);
                if (w < 0 || !hl_utf8_valid(buf, (size_t)w)) abort();
            }
            int32_t w = tok_stream_flush(&s, buf, sizeof buf);
            if (w < 0 || !hl_utf8_valid(buf, (size_t)w)) abort();
        }
    }
    free(ids);
    free(out);
    return 0;
}
