/*
 * strmap.h - an open-addressing hash map from byte strings to int64 values.
 *
 * Keys are copied into the map (they may contain NUL bytes). Used for vocabularies
 * (token text -> id), BPE merge ranks and metadata lookups. Not thread-safe for
 * writers; concurrent readers are fine once building is done.
 * hl_strmap_create() allocates the map; hl_strmap_destroy() frees it with its key copies.
 */
#ifndef HL_BASE_STRMAP_H
#define HL_BASE_STRMAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

typedef struct hl_strmap hl_strmap;

hl_strmap *hl_strmap_create(size_t expected); /* NULL on OOM */
void hl_strmap_destroy(hl_strmap *m);         /* accepts NULL */

/* Inserts or replaces. HL_ERR_NOMEM on OOM (the map is unchanged then). */
hl_status hl_strmap_put(hl_strmap *m, const char *key, size_t len, int64_t value);
bool hl_strmap_get(const hl_strmap *m, const char *key, size_t len, int64_t *value);
size_t hl_strmap_count(const hl_strmap *m);

#endif
