/*
 * bpe.c - byte-level BPE over one pre-tokenized word (see internal.h).
 *
 * The word's bytes are mapped to GPT-2's printable characters, each mapped byte
 * starts as one symbol, and the adjacent pair with the lowest merge rank (leftmost
 * on ties) is merged until no pair has a rank. Candidate pairs live in a heap; a
 * popped pair is stale when either side has changed since it was pushed, which is
 * detected from the symbols' lengths (symbols only grow, and their start offsets
 * never move). Every merge pushes at most two pairs, so a word of n bytes costs
 * O(n) rank lookups and O(n log n) heap work: no quadratic path, even for one
 * megabyte-long word.
 */
#include "tok/internal.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- GPT-2 byte <-> unicode ---- */

/* Bytes 33..126, 161..172 and 174..255 stand for themselves; the other 68 bytes are
 * numbered in order and shifted to U+0100..U+0143. */
static uint32_t byte_to_cpt(unsigned b) {
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174) return b;
    if (b <= 32) return 256 + b;
    if (b <= 160) return 256 + 33 + (b - 127);
    return 256 + 67; /* 173 */
}

static int cpt_to_byte(uint32_t c) {
    if ((c >= 33 && c <= 126) || (c >= 161 && c <= 172) || (c >= 174 && c <= 255)) return (int)c;
    if (c >= 256 && c <= 288) return (int)(c - 256);
    if (c >= 289 && c <= 322) return (int)(c - 289 + 127);
    if (c == 323) return 173;
    return -1;
}

/* Writes the mapped character of byte b (1 or 2 UTF-8 bytes). */
static size_t put_mapped(unsigned b, char *out) {
    uint32_t c = byte_to_cpt(b);
    if (c < 0x80) {
        out[0] = (char)c;
        return 1;
    }
    out[0] = (char)(0xC0 | (c >> 6));
    out[1] = (char)(0x80 | (c & 0x3F));
    return 2;
}

size_t tok_bpe_bytes_to_unicode(const char *in, size_t len, char *out) {
    size_t o = 0;
    for (size_t i = 0; i < len; i++) o += put_mapped((unsigned char)in[i], out + o);
    return o;
}

int64_t tok_bpe_unicode_to_bytes(const char *in, size_t len, char *out) {
    const unsigned char *s = (const unsigned char *)in;
    size_t o = 0;
    for (size_t i = 0; i < len;) {
        uint32_t c;
        if (s[i] < 0x80) {
            c = s[i];
            i += 1;
        } else if ((s[i] & 0xE0) == 0xC0 && i + 1 < len && (s[i + 1] & 0xC0) == 0x80) {
            c = ((uint32_t)(s[i] & 0x1F) << 6) | (s[i + 1] & 0x3F);
            i += 2;
        } else {
            return -1; /* mapped characters are all below U+0800 */
        }
        int b = cpt_to_byte(c);
        if (b < 0) return -1;
        out[o++] = (char)b;
    }
    return (int64_t)o;
}

/* ---- merging ---- */

typedef struct bpe_sym {
    uint32_t start, len; /* in the mapped word; len 0 once merged into its left */
    int32_t prev, next;
} bpe_sym;

/* A candidate merge of symbol `left` with its next symbol. key orders the heap:
 * rank in the high half, left index in the low half (ties go to the leftmost pair).
 * The pair is stale once either side's length differs from the recorded one: a
 * symbol only changes by absorbing its right neighbour, so an unchanged left still
 * has the same right neighbour. */
typedef struct bpe_pair {
    uint64_t key;
    uint32_t left_len, right_len;
} bpe_pair;

/* A 4-ary min-heap: shallower than a binary one and its children share cache lines,
 * which matters for the million-entry heaps of very long words. */
typedef struct bpe_heap {
    bpe_pair *v;
    size_t n;
} bpe_heap;

static void heap_sift_down(bpe_heap *h, size_t i, bpe_pair p) {
    size_t n = h->n;
    for (;;) {
        size_t c = 4 * i + 1;
        if (c >= n) break;
        size_t best = c, end = c + 4 < n ? c + 4 : n;
        for (size_t k = c + 1; k < end; k++)
            if (h->v[k].key < h->v[best].key) best = k;
        if (h->v[best].key >= p.key) break;
        h->v[i] = h->v[best];
        i = best;
    }
    h->v[i] = p;
}

static void heap_push(bpe_heap *h, bpe_pair p) {
    size_t i = h->n++;
    while (i > 0) {
        size_t parent = (i - 1) / 4;
        if (h->v[parent].key <= p.key) break;
        h->v[i] = h->v[parent];
        i = parent;
    }
    h->v[i] = p;
}

static bpe_pair heap_pop(bpe_heap *h) {
    bpe_pair top = h->v[0];
    bpe_pair last = h->v[--h->n];
    if (h->n) heap_sift_down(h, 0, last);
    return top;
}

static void heap_build(bpe_heap *h) {
    if (h->n < 2) return;
    for (size_t i = (h->n - 2) / 4 + 1; i-- > 0;) heap_sift_down(h, i, h->v[i]);
}

typedef struct bpe_work {
    const tok_vocab *vocab;
    const char *mapped;
    bpe_sym *syms;
    bpe_heap heap;
} bpe_work;

/* The pair (left, left's next) if the vocab has that merge; false otherwise. */
static bool rank_pair(const bpe_work *w, int32_t left, bpe_pair *out) {
    if (left < 0) return false;
    const bpe_sym *l = &w->syms[left];
    if (l->next < 0) return false;
    const bpe_sym *r = &w->syms[l->next];
    int64_t rank = tok_merge_rank(w->vocab, w->mapped + l->start, l->len, w->mapped + r->start,
                                  r->len);
    if (rank < 0 || rank > UINT32_MAX) return false;
    *out = (bpe_pair){((uint64_t)rank << 32) | (uint32_t)left, l->len, r->len};
    return true;
}

static void try_pair(bpe_work *w, int32_t left) {
    bpe_pair p;
    if (rank_pair(w, left, &p)) heap_push(&w->heap, p);
}

/* Emits the token of mapped text s, or, when the vocab lacks it, the tokens of its
 * characters (each one byte of the original word). */
static void emit_piece(const tok_vocab *v, const char *s, size_t len, tok_sink *sink) {
    int32_t id = tok_find_token(v, s, len);
    if (id >= 0) {
        tok_sink_push(sink, id);
        return;
    }
    for (size_t i = 0; i < len;) {
        size_t n = ((unsigned char)s[i] & 0xE0) == 0xC0 && i + 1 < len ? 2 : 1;
        id = tok_find_token(v, s + i, n);
        if (id >= 0) tok_sink_push(sink, id);
        i += n;
    }
}

enum { BPE_STACK_BYTES = 96 };

hl_status tok_bpe_encode_word(const tok_vocab *v, const char *word, size_t len, tok_sink *sink,
                              hl_err *err) {
    if (len == 0) return HL_OK;
    /* 2 bytes per mapped byte and 3 heap entries per symbol must fit in uint32/int32. */
    if (len > (size_t)INT32_MAX / 4) {
        return hl_fail(err, HL_ERR_UNSUPPORTED, "word of %zu bytes is too long to tokenize", len);
    }
    char mapped_stack[2 * BPE_STACK_BYTES];
    bpe_sym syms_stack[BPE_STACK_BYTES];
    bpe_pair heap_stack[3 * BPE_STACK_BYTES];
    char *mapped = mapped_stack;
    bpe_sym *syms = syms_stack;
    bpe_pair *heap = heap_stack;
    if (len > BPE_STACK_BYTES) {
        mapped = malloc(2 * len);
        syms = malloc(len * sizeof *syms);
        heap = malloc(3 * len * sizeof *heap);
        if (!mapped || !syms || !heap) {
            free(mapped);
            free(syms);
            free(heap);
            return hl_fail(err, HL_ERR_NOMEM, "out of memory encoding a %zu-byte word", len);
        }
    }

    size_t mlen = 0;
    for (size_t i = 0; i < len; i++) {
        size_t n = put_mapped((unsigned char)word[i], mapped + mlen);
        syms[i] = (bpe_sym){(uint32_t)mlen, (uint32_t)n, (int32_t)i - 1,
                            i + 1 < len ? (int32_t)i + 1 : -1};
        mlen += n;
    }

    int32_t whole = -1;
    if (tok_vocab_ignore_merges(v)) whole = tok_find_token(v, mapped, mlen);
    if (whole >= 0) {
        tok_sink_push(sink, whole);
    } else {
        bpe_work w = {v, mapped, syms, {heap, 0}};
        for (size_t i = 0; i + 1 < len; i++) {
            if (rank_pair(&w, (int32_t)i, &heap[w.heap.n])) w.heap.n++;
        }
        heap_build(&w.heap);
        while (w.heap.n) {
            bpe_pair p = heap_pop(&w.heap);
            int32_t left = (int32_t)(uint32_t)p.key;
            bpe_sym *l = &syms[left];
            if (l->len != p.left_len) continue;
            bpe_sym *r = &syms[l->next];
            if (r->len != p.right_len) continue;
            l->len += r->len;
            r->len = 0;
            l->next = r->next;
            if (r->next >= 0) syms[r->next].prev = left;
            try_pair(&w, l->prev);
            try_pair(&w, left);
        }
        for (int32_t i = 0; i >= 0; i = syms[i].next) {
            emit_piece(v, mapped + syms[i].start, syms[i].len, sink);
        }
    }

    if (mapped != mapped_stack) {
        free(mapped);
        free(syms);
        free(heap);
    }
    return HL_OK;
}
