/*
 * gguf.c - the GGUF reader (versions 2 and 3, little-endian).
 *
 * gguf_open*() validates the whole file before returning it: every count and length
 * read from the file is checked against the bytes that remain before anything is
 * allocated for it, so a hostile header fails fast with a message. Values are not
 * copied: the index (gguf_kv) points into the caller's buffer or the mapping.
 */
#include "gguf/gguf.h"

#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/strmap.h"
#include "tensor/types.h"

/* Smallest possible encodings, used to bound counts before allocating. */
#define KV_MIN_BYTES 13          /* name length (8) + type (4) + a 1-byte value */
#define TENSOR_INFO_MIN_BYTES 32 /* name length (8) + n_dims (4) + ne[0] (8) + type (4) + offset (8) */
#define ARRAY_HEADER_BYTES 12    /* element type (4) + count (8) */
#define MAX_ARRAY_DEPTH 16       /* nested arrays deeper than this are rejected (recursion bound) */
#define SHOW_MAX 80              /* bytes of a file-supplied name quoted in a message */

typedef struct gguf_kv {
    gguf_str key;
    gguf_type type;
    const uint8_t *value; /* scalar: its bytes; STRING: the text; ARRAY: the first element */
    uint64_t len;         /* STRING: byte length; ARRAY: element count */
    gguf_type elem_type;  /* ARRAY only */
    uint64_t *str_pos;    /* ARRAY of STRING: offset in the file of each element's length */
} gguf_kv;

struct gguf_file {
    hl_map map; /* zeroed for gguf_open_memory() */
    const uint8_t *base;
    size_t size;
    uint32_t version;
    uint64_t alignment;
    uint64_t data_offset;
    int64_t n_kv;
    gguf_kv *kv;
    int64_t n_tensors;
    gguf_tensor *tensors;
    hl_strmap *key_index;    /* key bytes -> kv index */
    hl_strmap *tensor_index; /* tensor name -> tensor index */
};

/* ---- little-endian decoding ---- */

static uint16_t le16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

static uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t le64(const uint8_t *p) { return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32; }

typedef struct reader {
    const uint8_t *base;
    size_t size;
    size_t pos;
} reader;

static size_t bytes_left(const reader *r) { return r->size - r->pos; }

static bool rd_u32(reader *r, uint32_t *v) {
    if (bytes_left(r) < 4) return false;
    *v = le32(r->base + r->pos);
    r->pos += 4;
    return true;
}

static bool rd_u64(reader *r, uint64_t *v) {
    if (bytes_left(r) < 8) return false;
    *v = le64(r->base + r->pos);
    r->pos += 8;
    return true;
}

/* ---- names and types for messages ---- */

const char *gguf_type_name(gguf_type t) {
    static const char *const names[GGUF_TYPE_COUNT] = {
        "uint8", "int8",  "uint16", "int16", "uint32", "int32",  "float32",
        "bool",  "string", "array", "uint64", "int64", "float64",
    };
    return (unsigned)t < GGUF_TYPE_COUNT ? names[t] : "unknown";
}

/* Size of a fixed-size value, 0 for STRING/ARRAY (and unknown types). */
size_t gguf_type_size(gguf_type t) {
    switch (t) {
    case GGUF_TYPE_UINT8: case GGUF_TYPE_INT8: case GGUF_TYPE_BOOL: return 1;
    case GGUF_TYPE_UINT16: case GGUF_TYPE_INT16: return 2;
    case GGUF_TYPE_UINT32: case GGUF_TYPE_INT32: case GGUF_TYPE_FLOAT32: return 4;
    case GGUF_TYPE_UINT64: case GGUF_TYPE_INT64: case GGUF_TYPE_FLOAT64: return 8;
    default: return 0;
    }
}

/* A printable copy of a file-supplied name: at most SHOW_MAX bytes, anything outside
 * printable ASCII shown as '?', "..." appended when cut. */
typedef struct shown {
    char s[SHOW_MAX + 4];
} shown;

static shown show(gguf_str str) {
    shown out;
    size_t n = str.len < SHOW_MAX ? (size_t)str.len : SHOW_MAX;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)str.ptr[i];
        out.s[i] = (c >= 0x20 && c < 0x7f) ? (char)c : '?';
    }
    if (str.len > SHOW_MAX) {
        memcpy(out.s + n, "...", 4);
    } else {
        out.s[n] = '\0';
    }
    return out;
}

/* ---- parsing ---- */

/* Walks the elements of an array (whose header is already read) at r, checking that
 * each lies inside the file. str_pos, when given (top-level string arrays), receives
 * the offset of each string. `where` names the key for messages. */
static hl_status walk_array(reader *r, gguf_type elem_type, uint64_t n, int depth,
                            uint64_t *str_pos, const char *where, hl_err *err) {
    size_t esize = gguf_type_size(elem_type);
    if (esize) {
        if (n > bytes_left(r) / esize)
            return hl_fail(err, HL_ERR_FORMAT,
                           "%s: array of %" PRIu64 " %s elements needs more than the %zu bytes "
                           "left in the file",
                           where, n, gguf_type_name(elem_type), bytes_left(r));
        r->pos += (size_t)n * esize;
        return HL_OK;
    }
    size_t min_elem = elem_type == GGUF_TYPE_STRING ? 8 : ARRAY_HEADER_BYTES;
    if (n > bytes_left(r) / min_elem)
        return hl_fail(err, HL_ERR_FORMAT,
                       "%s: array of %" PRIu64 " %s elements needs more than the %zu bytes "
                       "left in the file",
                       where, n, gguf_type_name(elem_type), bytes_left(r));
    for (uint64_t j = 0; j < n; j++) {
        if (elem_type == GGUF_TYPE_STRING) {
            size_t at = r->pos;
            uint64_t len;
            if (!rd_u64(r, &len))
                return hl_fail(err, HL_ERR_FORMAT, "truncated while reading %s (string %" PRIu64
                               " of the array)", where, j);
            if (len > bytes_left(r))
                return hl_fail(err, HL_ERR_FORMAT,
                               "%s: string %" PRIu64 " of the array has length %" PRIu64
                               ", more than the %zu bytes left in the file",
                               where, j, len, bytes_left(r));
            r->pos += (size_t)len;
            if (str_pos) str_pos[j] = at;
        } else {
            uint32_t inner_type;
            uint64_t inner_n;
            if (!rd_u32(r, &inner_type) || !rd_u64(r, &inner_n))
                return hl_fail(err, HL_ERR_FORMAT, "truncated while reading %s (nested array %"
                               PRIu64 ")", where, j);
            if (inner_type >= GGUF_TYPE_COUNT)
                return hl_fail(err, HL_ERR_FORMAT,
                               "%s: nested array %" PRIu64 " has unknown element type %" PRIu32,
                               where, j, inner_type);
            if (depth + 1 > MAX_ARRAY_DEPTH)
                return hl_fail(err, HL_ERR_FORMAT, "%s: arrays nested more than %d deep", where,
                               MAX_ARRAY_DEPTH);
            hl_status st = walk_array(r, (gguf_type)inner_type, inner_n, depth + 1, NULL, where, err);
            if (st != HL_OK) return st;
        }
    }
    return HL_OK;
}

static hl_status read_value(reader *r, gguf_kv *kv, const char *where, hl_err *err) {
    size_t esize = gguf_type_size(kv->type);
    if (esize) {
        if (bytes_left(r) < esize)
            return hl_fail(err, HL_ERR_FORMAT, "truncated while reading %s", where);
        kv->value = r->base + r->pos;
        r->pos += esize;
        return HL_OK;
    }
    if (kv->type == GGUF_TYPE_STRING) {
        uint64_t len;
        if (!rd_u64(r, &len)) return hl_fail(err, HL_ERR_FORMAT, "truncated while reading %s", where);
        if (len > bytes_left(r))
            return hl_fail(err, HL_ERR_FORMAT,
                           "%s: string length %" PRIu64 " exceeds the %zu bytes left in the file",
                           where, len, bytes_left(r));
        kv->value = r->base + r->pos;
        kv->len = len;
        r->pos += (size_t)len;
        return HL_OK;
    }
    /* ARRAY */
    uint32_t elem_type;
    uint64_t n;
    if (!rd_u32(r, &elem_type) || !rd_u64(r, &n))
        return hl_fail(err, HL_ERR_FORMAT, "truncated while reading %s", where);
    if (elem_type >= GGUF_TYPE_COUNT)
        return hl_fail(err, HL_ERR_FORMAT, "%s: unknown array element type %" PRIu32, where,
                       elem_type);
    kv->elem_type = (gguf_type)elem_type;
    kv->len = n;
    kv->value = r->base + r->pos;
    if (elem_type == GGUF_TYPE_STRING) {
        /* Bound n before allocating: every string takes at least its 8-byte length. */
        if (n > bytes_left(r) / 8)
            return hl_fail(err, HL_ERR_FORMAT,
                           "%s: array of %" PRIu64 " string elements needs more than the %zu "
                           "bytes left in the file",
                           where, n, bytes_left(r));
        kv->str_pos = malloc((n ? (size_t)n : 1) * sizeof *kv->str_pos);
        if (!kv->str_pos) return hl_fail(err, HL_ERR_NOMEM, "%s: out of memory", where);
    }
    return walk_array(r, kv->elem_type, n, 1, kv->str_pos, where, err);
}

/* The name of key or tensor i: a u64 length and that many bytes, left in the mapping. */
static hl_status rd_name(reader *r, const char *what, int64_t i, gguf_str *out, hl_err *err) {
    uint64_t len;
    if (!rd_u64(r, &len))
        return hl_fail(err, HL_ERR_FORMAT, "truncated while reading %s %" PRId64, what, i);
    if (len > bytes_left(r))
        return hl_fail(err, HL_ERR_FORMAT,
                       "%s %" PRId64 ": name length %" PRIu64 " exceeds the %zu bytes left in the file",
                       what, i, len, bytes_left(r));
    out->ptr = (const char *)r->base + r->pos;
    out->len = len;
    r->pos += (size_t)len;
    return HL_OK;
}

static hl_status parse_kvs(gguf_file *f, reader *r, hl_err *err) {
    char where[SHOW_MAX + 64];
    /* Sized for what a real file has; it grows if there are more, so a lying count
     * does not cost a large table up front. */
    f->key_index = hl_strmap_create(f->n_kv < 1024 ? (size_t)f->n_kv : 1024);
    if (!f->key_index) return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    for (int64_t i = 0; i < f->n_kv; i++) {
        gguf_kv *kv = &f->kv[i];
        hl_status st = rd_name(r, "key", i, &kv->key, err);
        if (st != HL_OK) return st;
        const uint64_t klen = kv->key.len;
        snprintf(where, sizeof where, "key %" PRId64 " ('%s')", i, show(kv->key).s);
        uint32_t type;
        if (!rd_u32(r, &type))
            return hl_fail(err, HL_ERR_FORMAT, "truncated while reading %s", where);
        if (type >= GGUF_TYPE_COUNT)
            return hl_fail(err, HL_ERR_FORMAT, "%s: unknown value type %" PRIu32, where, type);
        kv->type = (gguf_type)type;
        st = read_value(r, kv, where, err);
        if (st != HL_OK) return st;
        int64_t prev;
        if (hl_strmap_get(f->key_index, kv->key.ptr, (size_t)klen, &prev))
            return hl_fail(err, HL_ERR_FORMAT, "duplicate key '%s' (keys %" PRId64 " and %" PRId64
                           ")", show(kv->key).s, prev, i);
        if (hl_strmap_put(f->key_index, kv->key.ptr, (size_t)klen, i) != HL_OK)
            return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    }
    return HL_OK;
}

static hl_status parse_alignment(gguf_file *f, hl_err *err) {
    f->alignment = GGUF_DEFAULT_ALIGNMENT;
    int64_t i = gguf_find_key(f, "general.alignment");
    if (i < 0) return HL_OK;
    const gguf_kv *kv = &f->kv[i];
    if (kv->type != GGUF_TYPE_UINT32)
        return hl_fail(err, HL_ERR_FORMAT, "general.alignment has type %s, expected uint32",
                       gguf_type_name(kv->type));
    uint32_t a = le32(kv->value);
    if (a == 0 || (a & (a - 1)) != 0)
        return hl_fail(err, HL_ERR_FORMAT,
                       "general.alignment is %" PRIu32 ", not a nonzero power of two", a);
    f->alignment = a;
    return HL_OK;
}

static hl_status parse_tensor_info(gguf_file *f, reader *r, int64_t i, hl_err *err) {
    gguf_tensor *t = &f->tensors[i];
    hl_status st = rd_name(r, "tensor", i, &t->name, err);
    if (st != HL_OK) return st;
    shown name_copy = show(t->name);
    const char *nm = name_copy.s;
    if (!rd_u32(r, &t->n_dims))
        return hl_fail(err, HL_ERR_FORMAT, "truncated while reading tensor %" PRId64 " ('%s')",
                       i, nm);
    if (t->n_dims < 1 || t->n_dims > GGUF_MAX_DIMS)
        return hl_fail(err, HL_ERR_FORMAT, "tensor '%s': n_dims %" PRIu32 " is out of range (1..%d)",
                       nm, t->n_dims, GGUF_MAX_DIMS);
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) {
        t->ne[d] = 1;
        if (d >= t->n_dims) continue;
        uint64_t v;
        if (!rd_u64(r, &v))
            return hl_fail(err, HL_ERR_FORMAT,
                           "truncated while reading tensor %" PRId64 " ('%s')", i, nm);
        t->ne[d] = (int64_t)v;
        if (t->ne[d] < 0)
            return hl_fail(err, HL_ERR_FORMAT, "tensor '%s': dimension %" PRIu32
                           " is negative (%" PRId64 ")", nm, d, t->ne[d]);
    }
    int64_t n_elems = t->ne[0], n_rows = 1;
    for (int d = 1; d < GGUF_MAX_DIMS; d++) {
        if (__builtin_mul_overflow(n_elems, t->ne[d], &n_elems) ||
            __builtin_mul_overflow(n_rows, t->ne[d], &n_rows))
            return hl_fail(err, HL_ERR_FORMAT,
                           "tensor '%s': element count overflows (ne = [%" PRId64 ", %" PRId64
                           ", %" PRId64 ", %" PRId64 "])",
                           nm, t->ne[0], t->ne[1], t->ne[2], t->ne[3]);
    }
    if (!rd_u32(r, &t->type))
        return hl_fail(err, HL_ERR_FORMAT, "truncated while reading tensor %" PRId64 " ('%s')",
                       i, nm);
    const hl_type_traits *tr = hl_type_traits_get(t->type);
    if (!tr || tr->internal)
        return hl_fail(err, HL_ERR_FORMAT, "tensor '%s': unknown tensor type %" PRIu32, nm,
                       t->type);
    if (t->ne[0] % tr->block_size != 0)
        return hl_fail(err, HL_ERR_FORMAT,
                       "tensor '%s': row length %" PRId64
                       " is not a multiple of the block size %" PRId64 " of type %s",
                       nm, t->ne[0], tr->block_size, tr->name);
    uint64_t row_bytes, n_bytes;
    if (__builtin_mul_overflow((uint64_t)(t->ne[0] / tr->block_size), (uint64_t)tr->type_size,
                               &row_bytes) ||
        row_bytes > SIZE_MAX ||
        __builtin_mul_overflow((uint64_t)hl_row_size(t->type, t->ne[0]), (uint64_t)n_rows,
                               &n_bytes))
        return hl_fail(err, HL_ERR_FORMAT, "tensor '%s': data size overflows (ne = [%" PRId64
                       ", %" PRId64 ", %" PRId64 ", %" PRId64 "], type %s)",
                       nm, t->ne[0], t->ne[1], t->ne[2], t->ne[3], tr->name);
    t->n_bytes = n_bytes;
    if (!rd_u64(r, &t->offset))
        return hl_fail(err, HL_ERR_FORMAT, "truncated while reading tensor %" PRId64 " ('%s')",
                       i, nm);
    int64_t prev;
    if (hl_strmap_get(f->tensor_index, t->name.ptr, (size_t)t->name.len, &prev))
        return hl_fail(err, HL_ERR_FORMAT,
                       "duplicate tensor name '%s' (tensors %" PRId64 " and %" PRId64 ")", nm,
                       prev, i);
    if (hl_strmap_put(f->tensor_index, t->name.ptr, (size_t)t->name.len, i) != HL_OK)
        return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    return HL_OK;
}

static hl_status parse(gguf_file *f, hl_err *err) {
    reader r = {f->base, f->size, 0};
    if (f->size < 4)
        return hl_fail(err, HL_ERR_FORMAT, "not a GGUF file: too small (%zu bytes)", f->size);
    if (memcmp(f->base, "GGUF", 4) != 0)
        return hl_fail(err, HL_ERR_FORMAT,
                       "not a GGUF file: bad magic (bytes %02x %02x %02x %02x, expected \"GGUF\")",
                       f->base[0], f->base[1], f->base[2], f->base[3]);
    r.pos = 4;
    if (!rd_u32(&r, &f->version))
        return hl_fail(err, HL_ERR_FORMAT, "truncated while reading the header (version)");
    if (f->version != 2 && f->version != 3) {
        uint32_t swapped = __builtin_bswap32(f->version);
        if ((f->version & 0xffffu) == 0 && swapped != 0)
            return hl_fail(err, HL_ERR_UNSUPPORTED,
                           "big-endian GGUF is not supported (version %" PRIu32 " byte-swapped)",
                           swapped);
        return hl_fail(err, HL_ERR_UNSUPPORTED,
                       "GGUF version %" PRIu32 " is not supported (only versions 2 and 3)",
                       f->version);
    }
    uint64_t n_tensors, n_kv;
    if (!rd_u64(&r, &n_tensors))
        return hl_fail(err, HL_ERR_FORMAT, "truncated while reading the header (tensor count)");
    if (!rd_u64(&r, &n_kv))
        return hl_fail(err, HL_ERR_FORMAT, "truncated while reading the header (key/value count)");
    size_t left = bytes_left(&r);
    if (n_kv > left / KV_MIN_BYTES)
        return hl_fail(err, HL_ERR_FORMAT,
                       "header claims %" PRIu64 " key/value pairs but only %zu bytes follow "
                       "(each needs at least %d)",
                       n_kv, left, KV_MIN_BYTES);
    if (n_tensors > left / TENSOR_INFO_MIN_BYTES ||
        n_kv * KV_MIN_BYTES + n_tensors * TENSOR_INFO_MIN_BYTES > left)
        return hl_fail(err, HL_ERR_FORMAT,
                       "header claims %" PRIu64 " tensors and %" PRIu64
                       " key/value pairs but only %zu bytes follow",
                       n_tensors, n_kv, left);
    f->n_kv = (int64_t)n_kv;
    f->n_tensors = (int64_t)n_tensors;
    f->kv = calloc(n_kv ? (size_t)n_kv : 1, sizeof *f->kv);
    f->tensors = calloc(n_tensors ? (size_t)n_tensors : 1, sizeof *f->tensors);
    f->tensor_index = hl_strmap_create(n_tensors < 4096 ? (size_t)n_tensors : 4096);
    if (!f->kv || !f->tensors || !f->tensor_index)
        return hl_fail(err, HL_ERR_NOMEM, "out of memory");

    hl_status st = parse_kvs(f, &r, err);
    if (st == HL_OK) st = parse_alignment(f, err);
    for (int64_t i = 0; st == HL_OK && i < f->n_tensors; i++) st = parse_tensor_info(f, &r, i, err);
    if (st != HL_OK) return st;

    /* The data section starts at the aligned end of the header. */
    f->data_offset = ((uint64_t)r.pos + f->alignment - 1) / f->alignment * f->alignment;
    for (int64_t i = 0; i < f->n_tensors; i++) {
        gguf_tensor *t = &f->tensors[i];
        shown nm = show(t->name);
        if (t->offset % f->alignment != 0)
            return hl_fail(err, HL_ERR_FORMAT,
                           "tensor '%s': offset %" PRIu64 " is not a multiple of the alignment %"
                           PRIu64, nm.s, t->offset, f->alignment);
        uint64_t start, end;
        if (__builtin_add_overflow(f->data_offset, t->offset, &start) ||
            __builtin_add_overflow(start, t->n_bytes, &end) || end > f->size)
            return hl_fail(err, HL_ERR_FORMAT,
                           "tensor '%s': data (file offset %" PRIu64 " + %" PRIu64 ", %" PRIu64
                           " bytes) extends past end of file (size %zu)",
                           nm.s, f->data_offset, t->offset, t->n_bytes, f->size);
        t->data = f->base + start;
    }
    return HL_OK;
}

static hl_status open_common(gguf_file *f, gguf_file **out, hl_err *err) {
    hl_status st = parse(f, err);
    if (st != HL_OK) {
        gguf_close(f);
        return st;
    }
    *out = f;
    return HL_OK;
}

hl_status gguf_open_memory(const void *data, size_t size, gguf_file **out, hl_err *err) {
    *out = NULL;
    gguf_file *f = calloc(1, sizeof *f);
    if (!f) return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    f->base = data;
    f->size = data ? size : 0;
    return open_common(f, out, err);
}

static hl_status open_path(const char *path, bool read_in, gguf_file **out, hl_err *err) {
    *out = NULL;
    gguf_file *f = calloc(1, sizeof *f);
    if (!f) return hl_fail(err, HL_ERR_NOMEM, "%s: out of memory", path);
    hl_status st = read_in ? hl_map_read(path, &f->map, err) : hl_map_open(path, &f->map, err);
    if (st != HL_OK) {
        free(f);
        return st;
    }
    f->base = f->map.data;
    f->size = f->map.size;
    st = open_common(f, out, err);
    if (st != HL_OK) hl_err_prefix(err, "%s", path);
    return st;
}

hl_status gguf_open(const char *path, gguf_file **out, hl_err *err) {
    return open_path(path, false, out, err);
}

hl_status gguf_open_read(const char *path, gguf_file **out, hl_err *err) {
    return open_path(path, true, out, err);
}

hl_status gguf_set_writable(gguf_file *f, bool writable, hl_err *err) {
    if (!f->map.data) return hl_fail(err, HL_ERR_UNSUPPORTED, "a GGUF in the caller's memory");
    return hl_map_protect(&f->map, writable, err);
}

void gguf_close(gguf_file *f) {
    if (!f) return;
    if (f->kv)
        for (int64_t i = 0; i < f->n_kv; i++) free(f->kv[i].str_pos);
    free(f->kv);
    free(f->tensors);
    hl_strmap_destroy(f->key_index);
    hl_strmap_destroy(f->tensor_index);
    hl_map_close(&f->map);
    free(f);
}

uint32_t gguf_version(const gguf_file *f) { return f->version; }
uint64_t gguf_alignment(const gguf_file *f) { return f->alignment; }
uint64_t gguf_data_offset(const gguf_file *f) { return f->data_offset; }

/* ---- metadata ---- */

int64_t gguf_n_kv(const gguf_file *f) { return f->n_kv; }

int64_t gguf_find_key(const gguf_file *f, const char *key) {
    int64_t i;
    if (!key || !f->key_index || !hl_strmap_get(f->key_index, key, strlen(key), &i)) return -1;
    return i;
}

gguf_str gguf_kv_key(const gguf_file *f, int64_t i) {
    if (i < 0 || i >= f->n_kv) return (gguf_str){NULL, 0};
    return f->kv[i].key;
}

gguf_type gguf_kv_type(const gguf_file *f, int64_t i) {
    if (i < 0 || i >= f->n_kv) return GGUF_TYPE_COUNT;
    return f->kv[i].type;
}

const void *gguf_kv_scalar(const gguf_file *f, int64_t i) {
    if (i < 0 || i >= f->n_kv || gguf_type_size(f->kv[i].type) == 0) return NULL;
    return f->kv[i].value;
}

gguf_str gguf_kv_str(const gguf_file *f, int64_t i) {
    if (i < 0 || i >= f->n_kv || f->kv[i].type != GGUF_TYPE_STRING) return (gguf_str){NULL, 0};
    return (gguf_str){(const char *)f->kv[i].value, f->kv[i].len};
}

static const gguf_kv *kv_get(const gguf_file *f, const char *key) {
    int64_t i = gguf_find_key(f, key);
    return i < 0 ? NULL : &f->kv[i];
}

/* An integer value with its signedness and width; false for non-integer types. */
typedef struct int_value {
    bool is_signed;
    int bits;
    int64_t s;
    uint64_t u;
} int_value;

static bool kv_int(const gguf_kv *kv, int_value *v) {
    const uint8_t *p = kv->value;
    switch (kv->type) {
    case GGUF_TYPE_UINT8: *v = (int_value){false, 8, 0, p[0]}; return true;
    case GGUF_TYPE_UINT16: *v = (int_value){false, 16, 0, le16(p)}; return true;
    case GGUF_TYPE_UINT32: *v = (int_value){false, 32, 0, le32(p)}; return true;
    case GGUF_TYPE_UINT64: *v = (int_value){false, 64, 0, le64(p)}; return true;
    case GGUF_TYPE_INT8: *v = (int_value){true, 8, (int8_t)p[0], 0}; return true;
    case GGUF_TYPE_INT16: *v = (int_value){true, 16, (int16_t)le16(p), 0}; return true;
    case GGUF_TYPE_INT32: *v = (int_value){true, 32, (int32_t)le32(p), 0}; return true;
    case GGUF_TYPE_INT64: *v = (int_value){true, 64, (int64_t)le64(p), 0}; return true;
    default: return false;
    }
}

bool gguf_get_u32(const gguf_file *f, const char *key, uint32_t *out) {
    const gguf_kv *kv = kv_get(f, key);
    int_value v;
    if (!kv || !kv_int(kv, &v) || v.bits > 32) return false;
    if (v.is_signed) {
        if (v.s < 0) return false;
        *out = (uint32_t)v.s;
    } else {
        *out = (uint32_t)v.u;
    }
    return true;
}

bool gguf_get_i32(const gguf_file *f, const char *key, int32_t *out) {
    const gguf_kv *kv = kv_get(f, key);
    int_value v;
    if (!kv || !kv_int(kv, &v) || v.bits > 32) return false;
    if (v.is_signed) {
        *out = (int32_t)v.s;
    } else {
        if (v.u > INT32_MAX) return false;
        *out = (int32_t)v.u;
    }
    return true;
}

bool gguf_get_u64(const gguf_file *f, const char *key, uint64_t *out) {
    const gguf_kv *kv = kv_get(f, key);
    int_value v;
    if (!kv || !kv_int(kv, &v)) return false;
    if (v.is_signed) {
        if (v.s < 0) return false;
        *out = (uint64_t)v.s;
    } else {
        *out = v.u;
    }
    return true;
}

bool gguf_get_f32(const gguf_file *f, const char *key, float *out) {
    const gguf_kv *kv = kv_get(f, key);
    if (!kv) return false;
    if (kv->type == GGUF_TYPE_FLOAT32) {
        uint32_t bits = le32(kv->value);
        memcpy(out, &bits, sizeof *out);
        return true;
    }
    if (kv->type == GGUF_TYPE_FLOAT64) {
        uint64_t bits = le64(kv->value);
        double d;
        memcpy(&d, &bits, sizeof d);
        if (isfinite(d) && fabs(d) > FLT_MAX) return false; /* would become infinity */
        *out = (float)d;
        return true;
    }
    return false;
}

bool gguf_get_bool(const gguf_file *f, const char *key, bool *out) {
    const gguf_kv *kv = kv_get(f, key);
    if (!kv || kv->type != GGUF_TYPE_BOOL) return false;
    *out = kv->value[0] != 0;
    return true;
}

bool gguf_get_str(const gguf_file *f, const char *key, gguf_str *out) {
    const gguf_kv *kv = kv_get(f, key);
    if (!kv || kv->type != GGUF_TYPE_STRING) return false;
    *out = (gguf_str){(const char *)kv->value, kv->len};
    return true;
}

bool gguf_get_arr(const gguf_file *f, const char *key, gguf_type *elem_type, uint64_t *n) {
    const gguf_kv *kv = kv_get(f, key);
    if (!kv || kv->type != GGUF_TYPE_ARRAY) return false;
    if (elem_type) *elem_type = kv->elem_type;
    if (n) *n = kv->len;
    return true;
}

const void *gguf_arr_data(const gguf_file *f, const char *key) {
    const gguf_kv *kv = kv_get(f, key);
    if (!kv || kv->type != GGUF_TYPE_ARRAY || gguf_type_size(kv->elem_type) == 0) return NULL;
    return kv->value;
}

gguf_str gguf_arr_str(const gguf_file *f, const char *key, uint64_t j) {
    const gguf_kv *kv = kv_get(f, key);
    if (!kv || kv->type != GGUF_TYPE_ARRAY || kv->elem_type != GGUF_TYPE_STRING || j >= kv->len)
        return (gguf_str){NULL, 0};
    const uint8_t *p = f->base + kv->str_pos[j];
    return (gguf_str){(const char *)p + 8, le64(p)};
}

bool gguf_str_eq(gguf_str s, const char *cstr) {
    size_t n = strlen(cstr);
    if (s.len != n) return false;
    return n == 0 || memcmp(s.ptr, cstr, n) == 0;
}

/* ---- tensors ---- */

int64_t gguf_n_tensors(const gguf_file *f) { return f->n_tensors; }

const gguf_tensor *gguf_tensor_at(const gguf_file *f, int64_t i) {
    if (i < 0 || i >= f->n_tensors) return NULL;
    return &f->tensors[i];
}

const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name) {
    int64_t i;
    if (!name || !f->tensor_index || !hl_strmap_get(f->tensor_index, name, strlen(name), &i))
        return NULL;
    return &f->tensors[i];
}
