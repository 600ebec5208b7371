/*
 * spm.c - SentencePiece-style encoding as llama.cpp does it: spaces become U+2581
 * (with an optional leading one), the text is split into UTF-8 characters, and the
 * adjacent pair whose concatenation is the highest-scoring token is merged
 * repeatedly (a priority queue; ties go to the leftmost pair). Symbols that are not
 * tokens at the end fall back to <0xXX> byte tokens, else to the unknown token.
 * O(n log n) in the text length.
 */
#include "tok/vocab.h"

#include <stdlib.h>
#include <string.h>

typedef struct spm_symbol {
    int32_t prev, next;
    uint32_t off, n; /* bytes of the escaped text; n == 0 once merged away */
} spm_symbol;

typedef struct spm_bigram {
    float score;
    int32_t left, right;
    uint32_t size;
} spm_bigram;

/* A 4-ary heap: shallower than binary, fewer cache misses on long texts. */
#define HEAP_ARITY 4

typedef struct spm_heap {
    spm_bigram *a;
    size_t n, cap;
} spm_heap;

/* Whether x should pop before y. */
static bool bigram_before(const spm_bigram *x, const spm_bigram *y) {
    if (x->score != y->score) return x->score > y->score;
    return x->left < y->left;
}

static bool heap_push(spm_heap *h, spm_bigram b) {
    if (h->n == h->cap) {
        size_t ncap = h->cap ? h->cap * 2 : 64;
        spm_bigram *na = realloc(h->a, ncap * sizeof *na);
        if (!na) return false;
        h->a = na;
        h->cap = ncap;
    }
    size_t i = h->n++;
    while (i > 0) {
        size_t parent = (i - 1) / HEAP_ARITY;
        if (!bigram_before(&b, &h->a[parent])) break;
        h->a[i] = h->a[parent];
        i = parent;
    }
    h->a[i] = b;
    return true;
}

static void sift_down(spm_heap *h, size_t i) {
    spm_bigram x = h->a[i];
    for (;;) {
        size_t c = HEAP_ARITY * i + 1;
        if (c >= h->n) break;
        size_t end = c + HEAP_ARITY < h->n ? c + HEAP_ARITY : h->n;
        for (size_t k = c + 1; k < end; k++)
            if (bigram_before(&h->a[k], &h->a[c])) c = k;
        if (!bigram_before(&h->a[c], &x)) break;
        h->a[i] = h->a[c];
        i = c;
    }
    h->a[i] = x;
}

static spm_bigram heap_pop(spm_heap *h) {
    spm_bigram top = h->a[0];
    h->a[0] = h->a[--h->n];
    if (h->n > 0) sift_down(h, 0);
    return top;
}

static bool try_add_bigram(const tok_vocab *v, const char *text, const spm_symbol *sym,
                           int32_t left, int32_t right, spm_heap *h) {
    if (left < 0 || right < 0) return true;
    uint32_t size = sym[left].n + sym[right].n;
    int32_t id = tok_lookup(v, text + sym[left].off, size);
    if (id < 0) return true;
    return heap_push(h, (spm_bigram){v->tokens[id].score, left, right, size});
}

/* A symbol that is not a token: its bytes as <0xXX> tokens, else one unknown token. */
static void emit_unknown(const tok_vocab *v, const uint8_t *bytes, uint32_t n, tok_sink *sink) {
    for (uint32_t j = 0; j < n; j++) {
        if (v->byte_token[bytes[j]] < 0) {
            if (v->special[TOK_SPECIAL_UNK] >= 0) tok_sink_push(sink, v->special[TOK_SPECIAL_UNK]);
            return;
        }
    }
    for (uint32_t j = 0; j < n; j++) tok_sink_push(sink, v->byte_token[bytes[j]]);
}

/* llama.cpp's rule: the length comes from the lead byte alone (invalid bytes are 1). */
static uint32_t spm_char_len(uint8_t b) {
    static const uint8_t by_high_nibble[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return by_high_nibble[b >> 4];
}

static bool is_spm_space(const char *buf, const spm_symbol *s) {
    return s->n == 3 && memcmp(buf + s->off, "\xe2\x96\x81", 3) == 0;
}

hl_status tok_spm_encode(const tok_vocab *v, const char *text, size_t len, bool space_prefix,
                         tok_sink *sink, hl_err *err) {
    size_t cap;
    if (__builtin_add_overflow(len, 1, &cap) || __builtin_mul_overflow(cap, 3, &cap) ||
        cap > INT32_MAX)
        return hl_fail(err, HL_ERR_UNSUPPORTED, "text too long to tokenize (%zu bytes)", len);
    char *buf = malloc(cap);
    spm_symbol *sym = NULL;
    spm_heap heap = {0};
    hl_status st = HL_OK;
    if (!buf) {
        st = hl_fail(err, HL_ERR_NOMEM, "out of memory tokenizing");
        goto done;
    }
    size_t n = 0;
    if (space_prefix) {
        memcpy(buf, "\xe2\x96\x81", 3);
        n = 3;
    }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') {
            memcpy(buf + n, "\xe2\x96\x81", 3);
            n += 3;
        } else {
            buf[n++] = text[i];
        }
    }
    /* Count first: with invalid UTF-8 a lead byte can swallow part of an escaped space,
     * so the count is not bounded by the input's. */
    size_t count = 0;
    for (size_t off = 0; off < n; count++) off += spm_char_len((uint8_t)buf[off]);
    sym = malloc((count ? count : 1) * sizeof *sym);
    if (!sym) {
        st = hl_fail(err, HL_ERR_NOMEM, "out of memory tokenizing");
        goto done;
    }
    int32_t n_sym = 0;
    for (size_t off = 0; off < n;) {
        uint32_t cl = spm_char_len((uint8_t)buf[off]);
        if (cl > n - off) cl = (uint32_t)(n - off);
        sym[n_sym] = (spm_symbol){n_sym - 1, off + cl == n ? -1 : n_sym + 1, (uint32_t)off, cl};
        n_sym++;
        off += cl;
    }
    heap.cap = (size_t)n_sym + 64;
    heap.a = malloc(heap.cap * sizeof *heap.a);
    if (!heap.a) {
        st = hl_fail(err, HL_ERR_NOMEM, "out of memory tokenizing");
        goto done;
    }
    /* Merge chunk by chunk. When no token has U+2581 right after another character
     * (true of SentencePiece vocabularies that split on whitespace), no merge can
     * cross the start of a word, so words are independent and their heaps small:
     * same result, much faster. */
    for (int32_t a = 0, b; a < n_sym; a = b) {
        b = a + 1;
        if (v->spm_word_chunks) {
            while (b < n_sym && !(is_spm_space(buf, &sym[b]) && !is_spm_space(buf, &sym[b - 1])))
                b++;
        } else {
            b = n_sym;
        }
        sym[a].prev = -1;
        sym[b - 1].next = -1;
        /* Seed with every adjacent pair that is a token, then heapify in O(n). */
        heap.n = 0;
        for (int32_t i = a + 1; i < b; i++) {
            uint32_t size = sym[i - 1].n + sym[i].n;
            int32_t id = tok_lookup(v, buf + sym[i - 1].off, size);
            if (id >= 0) heap.a[heap.n++] = (spm_bigram){v->tokens[id].score, i - 1, i, size};
        }
        for (size_t k = heap.n / HEAP_ARITY + 1; k-- > 0;)
            if (k < heap.n) sift_down(&heap, k);
        while (heap.n > 0) {
            spm_bigram bg = heap_pop(&heap);
            spm_symbol *l = &sym[bg.left], *r = &sym[bg.right];
            /* Stale entry: one side was merged into something else since. */
            if (l->n == 0 || r->n == 0 || l->n + r->n != bg.size) continue;
            l->n += r->n;
            r->n = 0;
            l->next = r->next;
            if (r->next >= 0) sym[r->next].prev = bg.left;
            if (!try_add_bigram(v, buf, sym, l->prev, bg.left, &heap) ||
                !try_add_bigram(v, buf, sym, bg.left, l->next, &heap)) {
                st = hl_fail(err, HL_ERR_NOMEM, "out of memory tokenizing");
                goto done;
            }
        }
        for (int32_t i = a; i >= 0; i = sym[i].next) {
            int32_t id = tok_lookup(v, buf + sym[i].off, sym[i].n);
            if (id >= 0) tok_sink_push(sink, id);
            else emit_unknown(v, (const uint8_t *)buf + sym[i].off, sym[i].n, sink);
        }
    }
done:
    free(buf);
    free(sym);
    free(heap.a);
    return st;
}

bool tok_spm_words_independent(const tok_vocab *v) {
    for (int32_t id = 0; id < v->n_tokens; id++) {
        const char *t = v->text_arena + v->tokens[id].text_off;
        uint32_t n = v->tokens[id].text_len;
        /* the first char may be anything; look for U+2581 after a different char */
        for (uint32_t i = 1; i + 3 <= n; i++) {
            if (memcmp(t + i, "\xe2\x96\x81", 3) != 0) continue;
            if (i < 3 || memcmp(t + i - 3, "\xe2\x96\x81", 3) != 0) return false;
        }
    }
    return true;
}
