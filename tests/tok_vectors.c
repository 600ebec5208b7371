#include "tok_vectors.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "gguf/gguf.h"
#include "test.h"

#define SEP "\n__ggml_vocab_test__\n"

void tok_vectors_free(tok_vectors *tv) {
    if (!tv) return;
    for (size_t i = 0; i < tv->n; i++) free(tv->v[i].ids);
    free(tv->v);
    free(tv->inp);
    memset(tv, 0, sizeof *tv);
}

bool tok_vectors_load(const char *name, tok_vectors *out) {
    memset(out, 0, sizeof *out);
    char rel[512];
    snprintf(rel, sizeof rel, "testdata/tokenizer/llama.cpp/%s.inp", name);
    const char *inp_path = test_shared_path(rel);
    if (!inp_path) return false;
    char inp_copy[1024];
    snprintf(inp_copy, sizeof inp_copy, "%s", inp_path);
    snprintf(rel, sizeof rel, "testdata/tokenizer/llama.cpp/%s.out", name);
    const char *out_path = test_shared_path(rel);
    if (!out_path) return false;
    hl_err err;
    char *outb = NULL;
    size_t inp_len, out_len;
    if (hl_file_read(inp_copy, &out->inp, &inp_len, &err) != HL_OK ||
        hl_file_read(out_path, &outb, &out_len, &err) != HL_OK) {
        fprintf(stderr, "    tok_vectors: %s\n", err.msg);
        tok_vectors_free(out);
        return false;
    }
    size_t cap = 0;
    const char *p = out->inp, *end = out->inp + inp_len;
    const char *line = outb;
    bool ok = true;
    while (p < end) {
        const char *sep = NULL;
        for (const char *q = p; q + strlen(SEP) <= end; q++) {
            if (memcmp(q, SEP, strlen(SEP)) == 0) {
                sep = q;
                break;
            }
        }
        if (!sep) break; /* every string is followed by the separator */
        if (out->n == cap) {
            cap = cap ? cap * 2 : 64;
            out->v = realloc(out->v, cap * sizeof *out->v);
        }
        tok_vector *tv = &out->v[out->n++];
        memset(tv, 0, sizeof *tv);
        tv->text = p;
        tv->len = (size_t)(sep - p);
        p = sep + strlen(SEP);
        if (!*line) {
            ok = false;
            break;
        }
        const char *eol = strchr(line, '\n');
        if (!eol) eol = line + strlen(line);
        size_t idcap = 16;
        tv->ids = malloc(idcap * sizeof *tv->ids);
        for (const char *q = line; q < eol;) {
            while (q < eol && *q == ' ') q++;
            if (q >= eol) break;
            char *e;
            long id = strtol(q, &e, 10);
            if (e == q) {
                ok = false;
                break;
            }
            if (tv->n_ids == idcap) tv->ids = realloc(tv->ids, (idcap *= 2) * sizeof *tv->ids);
            tv->ids[tv->n_ids++] = (int32_t)id;
            q = e;
        }
        line = *eol ? eol + 1 : eol;
    }
    free(outb);
    if (!ok || out->n == 0) {
        fprintf(stderr, "    tok_vectors: %s: .inp and .out do not match up\n", name);
        tok_vectors_free(out);
        return false;
    }
    return true;
}

tok_vocab *tok_vectors_open_vocab(const char *name) {
    char rel[512];
    snprintf(rel, sizeof rel, "models/ggml-vocab/%s", name);
    const char *path = test_shared_path(rel);
    if (!path) return NULL;
    gguf_file *f = NULL;
    tok_vocab *v = NULL;
    hl_err err;
    if (gguf_open(path, &f, &err) != HL_OK || tok_vocab_load_gguf(f, &v, &err) != HL_OK) {
        fprintf(stderr, "    tok_vectors: %s: %s\n", name, err.msg);
        v = NULL;
    }
    gguf_close(f);
    return v;
}

static void print_ids(const char *what, const int32_t *ids, size_t n) {
    fprintf(stderr, "      %s:", what);
    for (size_t i = 0; i < n; i++) fprintf(stderr, " %d", (int)ids[i]);
    fputc('\n', stderr);
}

int run_vocab_vectors(const tok_vocab *v, const char *name, int flags) {
    tok_vectors tv;
    if (!tok_vectors_load(name, &tv)) return -1;
    int bad = 0;
    size_t cap = 1024;
    int32_t *ids = malloc(cap * sizeof *ids);
    for (size_t i = 0; i < tv.n; i++) {
        const tok_vector *t = &tv.v[i];
        size_t n = 0;
        hl_err err;
        hl_status st = tok_encode(v, t->text, t->len, false, false, ids, cap, &n, &err);
        if (st == HL_OK && n > cap) {
            cap = n;
            ids = realloc(ids, cap * sizeof *ids);
            st = tok_encode(v, t->text, t->len, false, false, ids, cap, &n, &err);
        }
        bool same = st == HL_OK && n == t->n_ids &&
                    (n == 0 || memcmp(ids, t->ids, n * sizeof *ids) == 0);
        if (!same) {
            bad++;
            fprintf(stderr, "    %s: string %zu \"%.*s\": encode mismatch%s%s\n", name, i,
                    (int)t->len, t->text, st == HL_OK ? "" : ": ", st == HL_OK ? "" : err.msg);
            print_ids("expected", t->ids, t->n_ids);
            if (st == HL_OK) print_ids("got     ", ids, n < cap ? n : cap);
            continue;
        }
        if (flags & TOK_VECTORS_DECODE) {
            int64_t dn = tok_decode(v, t->ids, t->n_ids, false, true, NULL, 0);
            char *text = malloc(dn > 0 ? (size_t)dn : 1);
            int64_t dn2 = tok_decode(v, t->ids, t->n_ids, false, true, text, dn > 0 ? (size_t)dn : 0);
            if (dn < 0 || dn2 != dn || (size_t)dn != t->len || memcmp(text, t->text, t->len) != 0) {
                bad++;
                fprintf(stderr, "    %s: string %zu \"%.*s\": decode gives \"%.*s\"\n", name, i,
                        (int)t->len, t->text, dn > 0 ? (int)dn : 0, text);
            }
            free(text);
        }
    }
    free(ids);
    tok_vectors_free(&tv);
    return bad;
}
