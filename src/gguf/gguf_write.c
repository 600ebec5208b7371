/*
 * gguf_write.c - the GGUF writer.
 *
 * Each key keeps its value already encoded (the bytes that follow the type field in
 * the file), so writing is a size pass and a copy pass into one buffer. Tensor data
 * goes at offsets aligned to general.alignment (default 32), zero-padded.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "gguf/gguf.h"
#include "tensor/types.h"

typedef struct wkv {
    char *key;
    size_t key_len;
    gguf_type type;
    uint8_t *val; /* encoded value */
    size_t val_len;
} wkv;

typedef struct wtensor {
    char *name;
    size_t name_len;
    uint32_t type;
    uint32_t n_dims;
    int64_t ne[GGUF_MAX_DIMS];
    uint8_t *data;
    uint64_t n_bytes;
} wtensor;

struct gguf_writer {
    wkv *kv;
    size_t n_kv, cap_kv;
    wtensor *tensors;
    size_t n_tensors, cap_tensors;
    uint32_t version;
};

gguf_writer *gguf_writer_create(void) {
    gguf_writer *w = calloc(1, sizeof *w);
    if (w) w->version = 3;
    return w;
}

void gguf_writer_destroy(gguf_writer *w) {
    if (!w) return;
    for (size_t i = 0; i < w->n_kv; i++) {
        free(w->kv[i].key);
        free(w->kv[i].val);
    }
    for (size_t i = 0; i < w->n_tensors; i++) {
        free(w->tensors[i].name);
        free(w->tensors[i].data);
    }
    free(w->kv);
    free(w->tensors);
    free(w);
}

void gguf_writer_set_version(gguf_writer *w, uint32_t version) { w->version = version; }

static void put_le(uint8_t *p, uint64_t v, int n) {
    for (int i = 0; i < n; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* Takes ownership of val (freed on failure too). */
static hl_status set_kv(gguf_writer *w, const char *key, gguf_type type, uint8_t *val,
                        size_t val_len) {
    if (!val) return HL_ERR_NOMEM;
    size_t key_len = strlen(key);
    for (size_t i = 0; i < w->n_kv; i++) {
        wkv *kv = &w->kv[i];
        if (kv->key_len == key_len && memcmp(kv->key, key, key_len) == 0) {
            free(kv->val);
            kv->type = type;
            kv->val = val;
            kv->val_len = val_len;
            return HL_OK;
        }
    }
    if (w->n_kv == w->cap_kv) {
        size_t cap = w->cap_kv ? w->cap_kv * 2 : 16;
        wkv *nk = realloc(w->kv, cap * sizeof *nk);
        if (!nk) {
            free(val);
            return HL_ERR_NOMEM;
        }
        w->kv = nk;
        w->cap_kv = cap;
    }
    char *k = malloc(key_len + 1);
    if (!k) {
        free(val);
        return HL_ERR_NOMEM;
    }
    memcpy(k, key, key_len + 1);
    w->kv[w->n_kv++] = (wkv){k, key_len, type, val, val_len};
    return HL_OK;
}

static hl_status set_scalar(gguf_writer *w, const char *key, gguf_type type, uint64_t bits) {
    size_t n = gguf_type_size(type);
    uint8_t *val = malloc(n);
    if (val) put_le(val, bits, (int)n);
    return set_kv(w, key, type, val, n);
}

hl_status gguf_writer_set_u8(gguf_writer *w, const char *key, uint8_t v) {
    return set_scalar(w, key, GGUF_TYPE_UINT8, v);
}
hl_status gguf_writer_set_i8(gguf_writer *w, const char *key, int8_t v) {
    return set_scalar(w, key, GGUF_TYPE_INT8, (uint8_t)v);
}
hl_status gguf_writer_set_u16(gguf_writer *w, const char *key, uint16_t v) {
    return set_scalar(w, key, GGUF_TYPE_UINT16, v);
}
hl_status gguf_writer_set_i16(gguf_writer *w, const char *key, int16_t v) {
    return set_scalar(w, key, GGUF_TYPE_INT16, (uint16_t)v);
}
hl_status gguf_writer_set_u32(gguf_writer *w, const char *key, uint32_t v) {
    return set_scalar(w, key, GGUF_TYPE_UINT32, v);
}
hl_status gguf_writer_set_i32(gguf_writer *w, const char *key, int32_t v) {
    return set_scalar(w, key, GGUF_TYPE_INT32, (uint32_t)v);
}
hl_status gguf_writer_set_u64(gguf_writer *w, const char *key, uint64_t v) {
    return set_scalar(w, key, GGUF_TYPE_UINT64, v);
}
hl_status gguf_writer_set_i64(gguf_writer *w, const char *key, int64_t v) {
    return set_scalar(w, key, GGUF_TYPE_INT64, (uint64_t)v);
}
hl_status gguf_writer_set_f32(gguf_writer *w, const char *key, float v) {
    uint32_t bits;
    memcpy(&bits, &v, sizeof bits);
    return set_scalar(w, key, GGUF_TYPE_FLOAT32, bits);
}
hl_status gguf_writer_set_f64(gguf_writer *w, const char *key, double v) {
    uint64_t bits;
    memcpy(&bits, &v, sizeof bits);
    return set_scalar(w, key, GGUF_TYPE_FLOAT64, bits);
}
hl_status gguf_writer_set_bool(gguf_writer *w, const char *key, bool v) {
    return set_scalar(w, key, GGUF_TYPE_BOOL, v ? 1 : 0);
}

hl_status gguf_writer_set_str(gguf_writer *w, const char *key, const char *v) {
    size_t len = strlen(v);
    uint8_t *val = malloc(8 + len);
    if (val) {
        put_le(val, len, 8);
        memcpy(val + 8, v, len);
    }
    return set_kv(w, key, GGUF_TYPE_STRING, val, 8 + len);
}

hl_status gguf_writer_set_arr(gguf_writer *w, const char *key, gguf_type elem_type,
                              const void *data, uint64_t n) {
    size_t esize = gguf_type_size(elem_type);
    if (esize == 0) return HL_ERR_INVALID; /* strings: gguf_writer_set_arr_str; no nesting */
    size_t bytes;
    if (n > SIZE_MAX || __builtin_mul_overflow((size_t)n, esize, &bytes) || bytes > SIZE_MAX - 12)
        return HL_ERR_NOMEM;
    uint8_t *val = malloc(12 + bytes);
    if (val) {
        put_le(val, (uint64_t)elem_type, 4);
        put_le(val + 4, n, 8);
        if (bytes) memcpy(val + 12, data, bytes);
    }
    return set_kv(w, key, GGUF_TYPE_ARRAY, val, 12 + bytes);
}

hl_status gguf_writer_set_arr_str(gguf_writer *w, const char *key, const char *const *v,
                                  uint64_t n) {
    size_t total = 12;
    for (uint64_t j = 0; j < n; j++) {
        size_t len = strlen(v[j]);
        if (__builtin_add_overflow(total, 8 + len, &total)) return HL_ERR_NOMEM;
    }
    uint8_t *val = malloc(total);
    if (val) {
        put_le(val, GGUF_TYPE_STRING, 4);
        put_le(val + 4, n, 8);
        size_t at = 12;
        for (uint64_t j = 0; j < n; j++) {
            size_t len = strlen(v[j]);
            put_le(val + at, len, 8);
            memcpy(val + at + 8, v[j], len);
            at += 8 + len;
        }
    }
    return set_kv(w, key, GGUF_TYPE_ARRAY, val, total);
}

hl_status gguf_writer_add_tensor(gguf_writer *w, const char *name, uint32_t type,
                                 uint32_t n_dims, const int64_t *ne, const void *data,
                                 uint64_t n_bytes, hl_err *err) {
    if (n_dims < 1 || n_dims > GGUF_MAX_DIMS)
        return hl_fail(err, HL_ERR_INVALID, "tensor '%s': n_dims %" PRIu32 " is out of range",
                       name, n_dims);
    const hl_type_traits *tr = hl_type_traits_get(type);
    if (!tr || tr->internal)
        return hl_fail(err, HL_ERR_INVALID, "tensor '%s': unknown type %" PRIu32, name, type);
    wtensor t = {0};
    t.type = type;
    t.n_dims = n_dims;
    int64_t rows = 1;
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) {
        t.ne[d] = d < n_dims ? ne[d] : 1;
        if (t.ne[d] < 0)
            return hl_fail(err, HL_ERR_INVALID, "tensor '%s': dimension %" PRIu32 " is negative",
                           name, d);
        if (d > 0 && __builtin_mul_overflow(rows, t.ne[d], &rows))
            return hl_fail(err, HL_ERR_INVALID, "tensor '%s': size overflows", name);
    }
    if (t.ne[0] % tr->block_size != 0)
        return hl_fail(err, HL_ERR_INVALID,
                       "tensor '%s': row length %" PRId64 " is not a multiple of %" PRId64
                       " (block size of %s)", name, t.ne[0], tr->block_size, tr->name);
    uint64_t row_bytes, want;
    if (__builtin_mul_overflow((uint64_t)(t.ne[0] / tr->block_size), (uint64_t)tr->type_size,
                               &row_bytes) ||
        __builtin_mul_overflow(row_bytes, (uint64_t)rows, &want) || want > SIZE_MAX)
        return hl_fail(err, HL_ERR_INVALID, "tensor '%s': size overflows", name);
    if (want != n_bytes)
        return hl_fail(err, HL_ERR_INVALID,
                       "tensor '%s': %" PRIu64 " bytes of data given, %s of this shape needs %"
                       PRIu64, name, n_bytes, tr->name, want);
    size_t name_len = strlen(name);
    for (size_t i = 0; i < w->n_tensors; i++)
        if (w->tensors[i].name_len == name_len && memcmp(w->tensors[i].name, name, name_len) == 0)
            return hl_fail(err, HL_ERR_INVALID, "duplicate tensor name '%s'", name);
    if (w->n_tensors == w->cap_tensors) {
        size_t cap = w->cap_tensors ? w->cap_tensors * 2 : 16;
        wtensor *nt = realloc(w->tensors, cap * sizeof *nt);
        if (!nt) return hl_fail(err, HL_ERR_NOMEM, "out of memory");
        w->tensors = nt;
        w->cap_tensors = cap;
    }
    t.name = malloc(name_len + 1);
    t.data = malloc(n_bytes ? (size_t)n_bytes : 1);
    if (!t.name || !t.data) {
        free(t.name);
        free(t.data);
        return hl_fail(err, HL_ERR_NOMEM, "tensor '%s': out of memory (%" PRIu64 " bytes)", name,
                       n_bytes);
    }
    memcpy(t.name, name, name_len + 1);
    t.name_len = name_len;
    if (n_bytes) memcpy(t.data, data, (size_t)n_bytes);
    t.n_bytes = n_bytes;
    w->tensors[w->n_tensors++] = t;
    return HL_OK;
}

static hl_status writer_alignment(const gguf_writer *w, uint64_t *out, hl_err *err) {
    *out = GGUF_DEFAULT_ALIGNMENT;
    for (size_t i = 0; i < w->n_kv; i++) {
        const wkv *kv = &w->kv[i];
        if (strcmp(kv->key, "general.alignment") != 0) continue;
        if (kv->type != GGUF_TYPE_UINT32)
            return hl_fail(err, HL_ERR_INVALID, "general.alignment must be a uint32");
        uint32_t a = (uint32_t)kv->val[0] | (uint32_t)kv->val[1] << 8 |
                     (uint32_t)kv->val[2] << 16 | (uint32_t)kv->val[3] << 24;
        if (a == 0 || (a & (a - 1)) != 0)
            return hl_fail(err, HL_ERR_INVALID,
                           "general.alignment is %" PRIu32 ", not a nonzero power of two", a);
        *out = a;
    }
    return HL_OK;
}

static uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

hl_status gguf_writer_write_memory(const gguf_writer *w, uint8_t **out, size_t *out_len,
                                   hl_err *err) {
    *out = NULL;
    *out_len = 0;
    if (w->version != 2 && w->version != 3)
        return hl_fail(err, HL_ERR_INVALID, "cannot write GGUF version %" PRIu32, w->version);
    uint64_t alignment;
    hl_status st = writer_alignment(w, &alignment, err);
    if (st != HL_OK) return st;

    /* Size pass. Every piece is already in memory, so the sum cannot overflow 64 bits. */
    uint64_t size = 4 + 4 + 8 + 8;
    for (size_t i = 0; i < w->n_kv; i++) size += 8 + w->kv[i].key_len + 4 + w->kv[i].val_len;
    for (size_t i = 0; i < w->n_tensors; i++)
        size += 8 + w->tensors[i].name_len + 4 + 8 * (uint64_t)w->tensors[i].n_dims + 4 + 8;
    uint64_t data_start = align_up(size, alignment);
    uint64_t data_size = 0;
    for (size_t i = 0; i < w->n_tensors; i++)
        data_size = align_up(data_size + w->tensors[i].n_bytes, alignment);
    uint64_t total = data_start + data_size;
    if (total > SIZE_MAX) return hl_fail(err, HL_ERR_NOMEM, "GGUF file too large");

    uint8_t *buf = calloc(1, (size_t)total);
    if (!buf) return hl_fail(err, HL_ERR_NOMEM, "out of memory (%" PRIu64 " bytes)", total);
    uint8_t *p = buf;
    memcpy(p, "GGUF", 4);
    put_le(p + 4, w->version, 4);
    put_le(p + 8, w->n_tensors, 8);
    put_le(p + 16, w->n_kv, 8);
    p += 24;
    for (size_t i = 0; i < w->n_kv; i++) {
        const wkv *kv = &w->kv[i];
        put_le(p, kv->key_len, 8);
        memcpy(p + 8, kv->key, kv->key_len);
        p += 8 + kv->key_len;
        put_le(p, (uint64_t)kv->type, 4);
        memcpy(p + 4, kv->val, kv->val_len);
        p += 4 + kv->val_len;
    }
    uint64_t offset = 0;
    for (size_t i = 0; i < w->n_tensors; i++) {
        const wtensor *t = &w->tensors[i];
        put_le(p, t->name_len, 8);
        memcpy(p + 8, t->name, t->name_len);
        p += 8 + t->name_len;
        put_le(p, t->n_dims, 4);
        p += 4;
        for (uint32_t d = 0; d < t->n_dims; d++, p += 8) put_le(p, (uint64_t)t->ne[d], 8);
        put_le(p, t->type, 4);
        put_le(p + 4, offset, 8);
        p += 12;
        if (t->n_bytes) memcpy(buf + data_start + offset, t->data, (size_t)t->n_bytes);
        offset = align_up(offset + t->n_bytes, alignment);
    }
    *out = buf;
    *out_len = (size_t)total;
    return HL_OK;
}

hl_status gguf_writer_write_file(const gguf_writer *w, const char *path, hl_err *err) {
    uint8_t *buf;
    size_t len;
    hl_status st = gguf_writer_write_memory(w, &buf, &len, err);
    if (st != HL_OK) return st;
    st = hl_file_write(path, buf, len, err);
    free(buf);
    return st;
}
