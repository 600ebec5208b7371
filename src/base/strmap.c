#include "base/strmap.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

typedef struct slot {
    char *key; /* NULL = empty */
    size_t len;
    uint64_t hash;
    int64_t value;
} slot;

struct hl_strmap {
    slot *slots;
    size_t cap; /* power of two */
    size_t count;
};

static size_t pow2_at_least(size_t n) {
    size_t c = 16;
    while (c < n) c <<= 1;
    return c;
}

hl_strmap *hl_strmap_create(size_t expected) {
    hl_strmap *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->cap = pow2_at_least(expected * 2 + 1);
    m->slots = calloc(m->cap, sizeof *m->slots);
    if (!m->slots) {
        free(m);
        return NULL;
    }
    return m;
}

void hl_strmap_destroy(hl_strmap *m) {
    if (!m) return;
    for (size_t i = 0; i < m->cap; i++) free(m->slots[i].key);
    free(m->slots);
    free(m);
}

static slot *find_slot(slot *slots, size_t cap, const char *key, size_t len, uint64_t h) {
    size_t i = (size_t)h & (cap - 1);
    for (;;) {
        slot *s = &slots[i];
        if (!s->key) return s;
        if (s->hash == h && s->len == len && memcmp(s->key, key, len) == 0) return s;
        i = (i + 1) & (cap - 1);
    }
}

static hl_status grow(hl_strmap *m) {
    size_t ncap = m->cap * 2;
    slot *ns = calloc(ncap, sizeof *ns);
    if (!ns) return HL_ERR_NOMEM;
    for (size_t i = 0; i < m->cap; i++) {
        slot *s = &m->slots[i];
        if (!s->key) continue;
        *find_slot(ns, ncap, s->key, s->len, s->hash) = *s;
    }
    free(m->slots);
    m->slots = ns;
    m->cap = ncap;
    return HL_OK;
}

hl_status hl_strmap_put(hl_strmap *m, const char *key, size_t len, int64_t value) {
    if ((m->count + 1) * 4 > m->cap * 3 && grow(m) != HL_OK) return HL_ERR_NOMEM;
    uint64_t h = XXH3_64bits(key, len);
    slot *s = find_slot(m->slots, m->cap, key, len, h);
    if (s->key) {
        s->value = value;
        return HL_OK;
    }
    char *k = malloc(len + 1);
    if (!k) return HL_ERR_NOMEM;
    if (len) memcpy(k, key, len);
    k[len] = '\0';
    s->key = k;
    s->len = len;
    s->hash = h;
    s->value = value;
    m->count++;
    return HL_OK;
}

bool hl_strmap_get(const hl_strmap *m, const char *key, size_t len, int64_t *value) {
    uint64_t h = XXH3_64bits(key, len);
    slot *s = find_slot(m->slots, m->cap, key, len, h);
    if (!s->key) return false;
    if (value) *value = s->value;
    return true;
}

size_t hl_strmap_count(const hl_strmap *m) { return m->count; }
