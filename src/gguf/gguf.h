/*
 * gguf.h - reading and writing GGUF files (versions 2 and 3).
 *
 * Reader: gguf_open() maps a file read-only and validates everything before
 * returning: header, every key/value (all 13 metadata types, nested arrays), the
 * tensor table, alignment (general.alignment), and that every tensor's data lies
 * inside the file. Nothing read from the file is trusted: a corrupt, truncated or
 * hostile file yields HL_ERR_FORMAT with a message naming what is wrong, never a
 * crash or an unbounded allocation. gguf_open_memory() does the same over a caller
 * buffer (the caller keeps it alive until gguf_close()).
 *
 * Strings returned by the accessors point into the mapping and are NOT
 * NUL-terminated: use the (ptr, len) pair (gguf_str). Tensor data pointers point
 * into the mapping too. All of it lives until gguf_close().
 *
 * Writer: build a file in memory with gguf_writer_*, then write it to a path or a
 * malloc'd buffer. The writer copies keys, strings and tensor data it is given.
 * Tests use it to make their own tiny models; `hearth quantize` uses it too.
 */
#ifndef HL_GGUF_H
#define HL_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

#define GGUF_MAGIC 0x46554747u /* "GGUF" little-endian */
#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_DIMS 4

typedef enum gguf_type {
    GGUF_TYPE_UINT8 = 0,
    GGUF_TYPE_INT8 = 1,
    GGUF_TYPE_UINT16 = 2,
    GGUF_TYPE_INT16 = 3,
    GGUF_TYPE_UINT32 = 4,
    GGUF_TYPE_INT32 = 5,
    GGUF_TYPE_FLOAT32 = 6,
    GGUF_TYPE_BOOL = 7,
    GGUF_TYPE_STRING = 8,
    GGUF_TYPE_ARRAY = 9,
    GGUF_TYPE_UINT64 = 10,
    GGUF_TYPE_INT64 = 11,
    GGUF_TYPE_FLOAT64 = 12,
    GGUF_TYPE_COUNT
} gguf_type;

/* "uint8", "string", ... ("unknown" out of range), and the size of a fixed-size
 * value (0 for STRING, ARRAY and unknown types). */
const char *gguf_type_name(gguf_type t);
size_t gguf_type_size(gguf_type t);

typedef struct gguf_str {
    const char *ptr; /* not NUL-terminated */
    uint64_t len;
} gguf_str;

typedef struct gguf_tensor {
    gguf_str name;
    uint32_t n_dims;
    int64_t ne[GGUF_MAX_DIMS]; /* ne[0] is the row length (contiguous); unused dims are 1 */
    uint32_t type;             /* a tensor type id (see tensor/types.h: HL_TYPE_*) */
    uint64_t offset;           /* relative to the start of the data section */
    const void *data;          /* points into the mapping */
    uint64_t n_bytes;
} gguf_tensor;

typedef struct gguf_file gguf_file;

hl_status gguf_open(const char *path, gguf_file **out, hl_err *err);
/* The same, with the file read into private memory (hl_map_read) instead of mapped:
 * for weights that the forward pass streams every token. */
hl_status gguf_open_read(const char *path, gguf_file **out, hl_err *err);
hl_status gguf_open_memory(const void *data, size_t size, gguf_file **out, hl_err *err);
void gguf_close(gguf_file *f); /* accepts NULL */
/* Lets the owner rewrite tensor data in place (weights repacked at load: kern_repack), or
 * makes it read-only again. The file itself never changes (private mappings).
 * HL_ERR_UNSUPPORTED for gguf_open_memory() files: their buffer is the caller's. */
hl_status gguf_set_writable(gguf_file *f, bool writable, hl_err *err);

uint32_t gguf_version(const gguf_file *f);
uint64_t gguf_alignment(const gguf_file *f);
uint64_t gguf_data_offset(const gguf_file *f); /* file offset of the tensor data section */

/* ---- metadata ---- */
int64_t gguf_n_kv(const gguf_file *f);
int64_t gguf_find_key(const gguf_file *f, const char *key); /* index, or -1 */
gguf_str gguf_kv_key(const gguf_file *f, int64_t i);
gguf_type gguf_kv_type(const gguf_file *f, int64_t i);
/* The little-endian bytes (gguf_type_size() of them) of a fixed-size scalar value, by
 * index; NULL for STRING, ARRAY or an index out of range. For copying metadata. */
const void *gguf_kv_scalar(const gguf_file *f, int64_t i);
/* A STRING value by index ({NULL, 0} if not a string). */
gguf_str gguf_kv_str(const gguf_file *f, int64_t i);

/* Typed getters by key. Return false when the key is absent or has a type that
 * cannot be converted losslessly (any integer type converts to a wider or equal
 * signed/unsigned type when the value fits; FLOAT32 and FLOAT64 convert to each
 * other; integers do not become floats). A BOOL is read as true for any nonzero
 * byte. *out is untouched on false. */
bool gguf_get_u32(const gguf_file *f, const char *key, uint32_t *out);
bool gguf_get_i32(const gguf_file *f, const char *key, int32_t *out);
bool gguf_get_u64(const gguf_file *f, const char *key, uint64_t *out);
bool gguf_get_f32(const gguf_file *f, const char *key, float *out);
bool gguf_get_bool(const gguf_file *f, const char *key, bool *out);
bool gguf_get_str(const gguf_file *f, const char *key, gguf_str *out);

/* Arrays. gguf_get_arr() gives the element type and count of an array-valued key.
 * For numeric element types, gguf_arr_data() points at the packed little-endian
 * elements in the file (may be unaligned: memcpy out). For string arrays use
 * gguf_arr_str(). Nested arrays are validated but not exposed. */
bool gguf_get_arr(const gguf_file *f, const char *key, gguf_type *elem_type, uint64_t *n);
const void *gguf_arr_data(const gguf_file *f, const char *key);
gguf_str gguf_arr_str(const gguf_file *f, const char *key, uint64_t j); /* {NULL,0} if out of range */

/* Compares a gguf_str to a C string. */
bool gguf_str_eq(gguf_str s, const char *cstr);

/* ---- tensors ---- */
int64_t gguf_n_tensors(const gguf_file *f);
const gguf_tensor *gguf_tensor_at(const gguf_file *f, int64_t i);
const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name); /* NULL if absent */

/* ---- writer ---- */
typedef struct gguf_writer gguf_writer;

gguf_writer *gguf_writer_create(void); /* NULL on OOM */
void gguf_writer_destroy(gguf_writer *w);

/* Setting a key that already exists replaces its value. Return HL_ERR_NOMEM on OOM. */
hl_status gguf_writer_set_u8(gguf_writer *w, const char *key, uint8_t v);
hl_status gguf_writer_set_i8(gguf_writer *w, const char *key, int8_t v);
hl_status gguf_writer_set_u16(gguf_writer *w, const char *key, uint16_t v);
hl_status gguf_writer_set_i16(gguf_writer *w, const char *key, int16_t v);
hl_status gguf_writer_set_u32(gguf_writer *w, const char *key, uint32_t v);
hl_status gguf_writer_set_i32(gguf_writer *w, const char *key, int32_t v);
hl_status gguf_writer_set_u64(gguf_writer *w, const char *key, uint64_t v);
hl_status gguf_writer_set_i64(gguf_writer *w, const char *key, int64_t v);
hl_status gguf_writer_set_f32(gguf_writer *w, const char *key, float v);
hl_status gguf_writer_set_f64(gguf_writer *w, const char *key, double v);
hl_status gguf_writer_set_bool(gguf_writer *w, const char *key, bool v);
hl_status gguf_writer_set_str(gguf_writer *w, const char *key, const char *v);
/* Numeric array: n elements of elem_type packed little-endian at data (copied). */
hl_status gguf_writer_set_arr(gguf_writer *w, const char *key, gguf_type elem_type,
                              const void *data, uint64_t n);
hl_status gguf_writer_set_arr_str(gguf_writer *w, const char *key, const char *const *v,
                                  uint64_t n);

/* Adds a tensor; data (n_bytes, which must equal the row size for type times the
 * row count) is copied. Tensors are written in the order added. */
hl_status gguf_writer_add_tensor(gguf_writer *w, const char *name, uint32_t type,
                                 uint32_t n_dims, const int64_t *ne, const void *data,
                                 uint64_t n_bytes, hl_err *err);

/* Version (2 or 3) and alignment default to 3 and 32 (or general.alignment if set). */
void gguf_writer_set_version(gguf_writer *w, uint32_t version);

hl_status gguf_writer_write_file(const gguf_writer *w, const char *path, hl_err *err);
/* *out is malloc'd; the caller frees it. */
hl_status gguf_writer_write_memory(const gguf_writer *w, uint8_t **out, size_t *out_len,
                                   hl_err *err);

#endif
