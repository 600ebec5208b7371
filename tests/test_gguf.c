/*
 * test_gguf.c - the GGUF reader and writer: round trips through the writer, the
 * typed-getter conversion rules, a hand-built set of malformed files (each must be
 * rejected with a message naming the problem), the real model files in ../shared,
 * and a replay of the fuzz corpus.
 */
#include "test.h"

#include <dirent.h>
#include <stdlib.h>

#include "base/file.h"
#include "gguf/gguf.h"
#include "tensor/types.h"

/* ---- a byte builder for hand-made (often hostile) files ---- */

typedef struct bytes {
    uint8_t *p;
    size_t len, cap;
} bytes;

static void bb_raw(bytes *b, const void *src, size_t n) {
    if (b->len + n > b->cap) {
        b->cap = (b->len + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        if (!b->p) abort();
    }
    if (n) memcpy(b->p + b->len, src, n);
    b->len += n;
}

static void bb_le(bytes *b, uint64_t v, int n) {
    uint8_t tmp[8];
    for (int i = 0; i < n; i++) tmp[i] = (uint8_t)(v >> (8 * i));
    bb_raw(b, tmp, (size_t)n);
}

static void bb_u32(bytes *b, uint32_t v) { bb_le(b, v, 4); }
static void bb_u64(bytes *b, uint64_t v) { bb_le(b, v, 8); }

static void bb_str(bytes *b, const char *s) {
    bb_u64(b, strlen(s));
    bb_raw(b, s, strlen(s));
}

static void bb_header(bytes *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    bb_raw(b, "GGUF", 4);
    bb_u32(b, version);
    bb_u64(b, n_tensors);
    bb_u64(b, n_kv);
}

/* A key followed by its type; the caller appends the value. */
static void bb_key(bytes *b, const char *key, gguf_type type) {
    bb_str(b, key);
    bb_u32(b, (uint32_t)type);
}

static void bb_tensor_info(bytes *b, const char *name, uint32_t n_dims, const int64_t *ne,
                           uint32_t type, uint64_t offset) {
    bb_str(b, name);
    bb_u32(b, n_dims);
    for (uint32_t d = 0; d < n_dims; d++) bb_u64(b, (uint64_t)ne[d]);
    bb_u32(b, type);
    bb_u64(b, offset);
}

static void bb_pad(bytes *b, size_t align) {
    while (b->len % align) bb_raw(b, "", 1);
}

static void bb_zeros(bytes *b, size_t n) {
    for (size_t i = 0; i < n; i++) bb_raw(b, "", 1);
}

/* A file with one tensor (and no keys), its data padded from the aligned header end. */
static bytes one_tensor_file(uint32_t n_dims, const int64_t *ne, uint32_t type, uint64_t offset,
                             size_t data_len) {
    bytes b = {0};
    bb_header(&b, 3, 1, 0);
    bb_tensor_info(&b, "t", n_dims, ne, type, offset);
    bb_pad(&b, GGUF_DEFAULT_ALIGNMENT);
    bb_zeros(&b, data_len);
    return b;
}

/* Opens buf and expects a failure whose message contains needle. On mismatch, fills
 * got with what happened. */
static bool fails_with(const void *buf, size_t len, const char *needle, char *got, size_t got_size) {
    gguf_file *f = NULL;
    hl_err err;
    hl_err_clear(&err);
    hl_status st = gguf_open_memory(buf, len, &f, &err);
    if (st == HL_OK) {
        snprintf(got, got_size, "(opened fine)");
        gguf_close(f);
        return false;
    }
    snprintf(got, got_size, "%s", err.msg);
    return f == NULL && err.msg[0] != '\0' && strstr(err.msg, needle) != NULL;
}

#define EXPECT_FAIL(buf, len, needle)                                                    \
    do {                                                                                 \
        char got_[HL_ERR_MSG_LEN + 32];                                                  \
        CHECK_MSG(fails_with((buf), (len), (needle), got_, sizeof got_),                 \
                  "expected an error containing \"%s\", got \"%s\"", (needle), got_);    \
    } while (0)

static bool str_is(gguf_str s, const char *want) { return s.ptr && gguf_str_eq(s, want); }

/* ---- round trips ---- */

TEST(gguf_roundtrip_all_types) {
    gguf_writer *w = gguf_writer_create();
    CHECK(w);
    CHECK_OK(gguf_writer_set_u8(w, "a.u8", 200), (hl_err *)NULL);
    CHECK_OK(gguf_writer_set_i8(w, "a.i8", -100), (hl_err *)NULL);
    CHECK_OK(gguf_writer_set_u16(w, "a.u16", 60000), (hl_err *)NULL);
    CHECK_OK(gguf_writer_set_i16(w, "a.i16", -30000), (hl_err *)NULL);
    CHECK_OK(gguf_writer_set_u32(w, "a.u32", 4000000000u), (hl_err *)NULL);
    CHECK_OK(gguf_writer_set_i32(w, "a.i32", -2000000000), (hl_err *)NULL);
    CHECK_OK(gguf_writer_set_u64(w, "a.u64", 1ull << 60), (hl_err *)NULL);
    CHECK_OK(gguf_writer_set_i64(w, "a.i64", -(1ll << 60)), (hl_err *)NULL);
    CHECK_OK(gguf_writer_set_f32(w, "a.f32", 1.5f), (hl_err *)NULL);
    CHECK_OK(gguf_writer_set_f64(w, "a.f64", -0.125), (hl_err *)NULL);
    CHECK_OK(gguf_writer_set_bool(w, "a.bool", true), (hl_err *)NULL);
    CHECK_OK(gguf_writer_set_str(w, "a.str", "h\xc3\xa9llo"), (hl_err *)NULL);
    CHECK_OK(gguf_writer_set_str(w, "a.empty", ""), (hl_err *)NULL);
    const int32_t i32s[] = {1, -2, 3, INT32_MIN};
    const float f32s[] = {0.5f, -1.25f, 3e38f};
    const uint8_t u8s[] = {0, 255, 7};
    const double f64s[] = {1e300, -2.5};
    const char *const strs[] = {"<unk>", "", "\xe2\x96\x81the", "x y z"};
    CHECK_OK(gguf_writer_set_arr(w, "arr.i32", GGUF_TYPE_INT32, i32s, 4), (hl_err *)NULL);
    CHECK_OK(gguf_writer_set_arr(w, "arr.f32", GGUF_TYPE_FLOAT32, f32s, 3), (hl_err *)NULL);
    CHECK_OK(gguf_writer_set_arr(w, "arr.u8", GGUF_TYPE_UINT8, u8s, 3), (hl_err *)NULL);
    CHECK_OK(gguf_writer_set_arr(w, "arr.f64", GGUF_TYPE_FLOAT64, f64s, 2), (hl_err *)NULL);
    CHECK_OK(gguf_writer_set_arr(w, "arr.empty", GGUF_TYPE_UINT32, NULL, 0), (hl_err *)NULL);
    CHECK_OK(gguf_writer_set_arr_str(w, "arr.str", strs, 4), (hl_err *)NULL);
    /* replacing a key keeps its position and changes its type */
    CHECK_OK(gguf_writer_set_str(w, "a.u16", "replaced"), (hl_err *)NULL);
    CHECK_OK(gguf_writer_set_u16(w, "a.u16", 60001), (hl_err *)NULL);
    CHECK_EQ_INT(gguf_writer_set_arr(w, "bad", GGUF_TYPE_STRING, strs, 1), HL_ERR_INVALID);
    CHECK_EQ_INT(gguf_writer_set_arr(w, "bad", GGUF_TYPE_ARRAY, strs, 1), HL_ERR_INVALID);

    for (uint32_t version = 2; version <= 3; version++) {
        gguf_writer_set_version(w, version);
        uint8_t *buf = NULL;
        size_t len = 0;
        hl_err err;
        CHECK_OK(gguf_writer_write_memory(w, &buf, &len, &err), &err);
        gguf_file *f = NULL;
        hl_status st = gguf_open_memory(buf, len, &f, &err);
        if (st != HL_OK) free(buf);
        CHECK_OK(st, &err);
        CHECK_EQ_INT(gguf_version(f), version);
        CHECK_EQ_INT(gguf_n_kv(f), 19);
        CHECK_EQ_INT(gguf_n_tensors(f), 0);
        CHECK_EQ_INT(gguf_alignment(f), 32);
        CHECK(str_is(gguf_kv_key(f, 0), "a.u8"));
        CHECK(str_is(gguf_kv_key(f, 2), "a.u16"));
        CHECK_EQ_INT(gguf_kv_type(f, 2), GGUF_TYPE_UINT16);
        CHECK_EQ_INT(gguf_find_key(f, "arr.str"), 18);
        CHECK_EQ_INT(gguf_find_key(f, "arr.st"), -1);
        CHECK(gguf_kv_key(f, 19).ptr == NULL && gguf_kv_key(f, -1).ptr == NULL);
        CHECK_EQ_INT(gguf_kv_type(f, 19), GGUF_TYPE_COUNT);
        const gguf_type want_types[] = {
            GGUF_TYPE_UINT8,  GGUF_TYPE_INT8,   GGUF_TYPE_UINT16,  GGUF_TYPE_INT16,
            GGUF_TYPE_UINT32, GGUF_TYPE_INT32,  GGUF_TYPE_UINT64,  GGUF_TYPE_INT64,
            GGUF_TYPE_FLOAT32, GGUF_TYPE_FLOAT64, GGUF_TYPE_BOOL, GGUF_TYPE_STRING,
            GGUF_TYPE_STRING, GGUF_TYPE_ARRAY,  GGUF_TYPE_ARRAY,   GGUF_TYPE_ARRAY,
            GGUF_TYPE_ARRAY,  GGUF_TYPE_ARRAY,  GGUF_TYPE_ARRAY,
        };
        for (int i = 0; i < 19; i++) CHECK_EQ_INT(gguf_kv_type(f, i), want_types[i]);

        uint32_t u32 = 0;
        int32_t i32 = 0;
        uint64_t u64 = 0;
        float f32 = 0;
        bool b = false;
        gguf_str s;
        CHECK(gguf_get_u32(f, "a.u8", &u32) && u32 == 200);
        CHECK(gguf_get_i32(f, "a.i8", &i32) && i32 == -100);
        CHECK(gguf_get_u32(f, "a.u16", &u32) && u32 == 60001);
        CHECK(gguf_get_i32(f, "a.i16", &i32) && i32 == -30000);
        CHECK(gguf_get_u32(f, "a.u32", &u32) && u32 == 4000000000u);
        CHECK(gguf_get_i32(f, "a.i32", &i32) && i32 == -2000000000);
        CHECK(gguf_get_u64(f, "a.u64", &u64) && u64 == 1ull << 60);
        CHECK(!gguf_get_u64(f, "a.i64", &u64)); /* negative */
        CHECK(gguf_get_f32(f, "a.f32", &f32) && f32 == 1.5f);
        CHECK(gguf_get_f32(f, "a.f64", &f32) && f32 == -0.125f);
        CHECK(gguf_get_bool(f, "a.bool", &b) && b);
        CHECK(gguf_get_str(f, "a.str", &s) && s.len == 6 && memcmp(s.ptr, "h\xc3\xa9llo", 6) == 0);
        CHECK(gguf_get_str(f, "a.empty", &s) && s.len == 0);

        gguf_type et = GGUF_TYPE_COUNT;
        uint64_t n = 0;
        CHECK(gguf_get_arr(f, "arr.i32", &et, &n) && et == GGUF_TYPE_INT32 && n == 4);
        int32_t i32_back[4];
        memcpy(i32_back, gguf_arr_data(f, "arr.i32"), sizeof i32_back);
        CHECK(memcmp(i32_back, i32s, sizeof i32s) == 0);
        CHECK(gguf_get_arr(f, "arr.f32", &et, &n) && et == GGUF_TYPE_FLOAT32 && n == 3);
        CHECK(memcmp(gguf_arr_data(f, "arr.f32"), f32s, sizeof f32s) == 0);
        CHECK(gguf_get_arr(f, "arr.u8", &et, &n) && et == GGUF_TYPE_UINT8 && n == 3);
        CHECK(memcmp(gguf_arr_data(f, "arr.u8"), u8s, sizeof u8s) == 0);
        CHECK(gguf_get_arr(f, "arr.f64", &et, &n) && et == GGUF_TYPE_FLOAT64 && n == 2);
        CHECK(memcmp(gguf_arr_data(f, "arr.f64"), f64s, sizeof f64s) == 0);
        CHECK(gguf_get_arr(f, "arr.empty", &et, &n) && et == GGUF_TYPE_UINT32 && n == 0);
        CHECK(gguf_get_arr(f, "arr.str", &et, &n) && et == GGUF_TYPE_STRING && n == 4);
        CHECK(gguf_arr_data(f, "arr.str") == NULL);
        for (uint64_t j = 0; j < 4; j++) CHECK(str_is(gguf_arr_str(f, "arr.str", j), strs[j]));
        CHECK(gguf_arr_str(f, "arr.str", 4).ptr == NULL);
        CHECK(gguf_arr_str(f, "arr.i32", 0).ptr == NULL);
        CHECK(gguf_arr_str(f, "a.str", 0).ptr == NULL);
        CHECK(gguf_arr_data(f, "a.u32") == NULL);
        CHECK(!gguf_get_arr(f, "a.str", &et, &n));
        gguf_close(f);
        free(buf);
    }
    gguf_writer_destroy(w);
}

/* Fills n bytes with a pattern that differs per tensor. */
static uint8_t *pattern(size_t n, int seed) {
    uint8_t *p = malloc(n ? n : 1);
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)(i * 31 + (size_t)seed * 7 + 1);
    return p;
}

typedef struct tensor_spec {
    const char *name;
    uint32_t type;
    uint32_t n_dims;
    int64_t ne[4];
} tensor_spec;

static const tensor_spec g_specs[] = {
    {"f32.weight", HL_TYPE_F32, 2, {8, 3, 1, 1}},
    {"f16.weight", HL_TYPE_F16, 1, {5, 1, 1, 1}},
    {"q8_0.weight", HL_TYPE_Q8_0, 3, {64, 2, 2, 1}},
    {"q4_0.weight", HL_TYPE_Q4_0, 4, {32, 3, 1, 2}},
};
#define N_SPECS (sizeof g_specs / sizeof g_specs[0])

static size_t spec_bytes(const tensor_spec *s) {
    return hl_row_size(s->type, s->ne[0]) * (size_t)(s->ne[1] * s->ne[2] * s->ne[3]);
}

static bool check_tensors(gguf_file *f, uint64_t alignment, size_t file_len) {
    if (gguf_n_tensors(f) != (int64_t)N_SPECS || gguf_alignment(f) != alignment) return false;
    if (gguf_data_offset(f) % alignment != 0 || gguf_data_offset(f) > file_len) return false;
    for (size_t i = 0; i < N_SPECS; i++) {
        const tensor_spec *s = &g_specs[i];
        const gguf_tensor *t = gguf_tensor_at(f, (int64_t)i);
        if (!t || gguf_find_tensor(f, s->name) != t || !str_is(t->name, s->name)) return false;
        if (t->type != s->type || t->n_dims != s->n_dims || t->offset % alignment != 0) return false;
        for (int d = 0; d < 4; d++)
            if (t->ne[d] != s->ne[d]) return false;
        size_t n = spec_bytes(s);
        uint8_t *want = pattern(n, (int)i);
        bool same = t->n_bytes == n && memcmp(t->data, want, n) == 0;
        free(want);
        if (!same) return false;
    }
    return gguf_tensor_at(f, (int64_t)N_SPECS) == NULL && gguf_tensor_at(f, -1) == NULL &&
           gguf_find_tensor(f, "nope") == NULL;
}

static gguf_writer *tensor_writer(void) {
    gguf_writer *w = gguf_writer_create();
    if (!w) return NULL;
    gguf_writer_set_str(w, "general.architecture", "test");
    for (size_t i = 0; i < N_SPECS; i++) {
        const tensor_spec *s = &g_specs[i];
        size_t n = spec_bytes(s);
        uint8_t *data = pattern(n, (int)i);
        hl_status st = gguf_writer_add_tensor(w, s->name, s->type, s->n_dims, s->ne, data, n, NULL);
        free(data);
        if (st != HL_OK) {
            gguf_writer_destroy(w);
            return NULL;
        }
    }
    return w;
}

TEST(gguf_roundtrip_tensors) {
    gguf_writer *w = tensor_writer();
    CHECK(w);
    uint8_t *buf;
    size_t len;
    hl_err err;
    CHECK_OK(gguf_writer_write_memory(w, &buf, &len, &err), &err);
    gguf_file *f;
    CHECK_OK(gguf_open_memory(buf, len, &f, &err), &err);
    CHECK(check_tensors(f, 32, len));
    /* F32 tensor first: 96 bytes of data, so the next starts at the next multiple of 32 */
    CHECK_EQ_INT(gguf_tensor_at(f, 1)->offset, 96);
    gguf_close(f);
    free(buf);

    /* general.alignment moves every offset; write through a file this time */
    CHECK_OK(gguf_writer_set_u32(w, "general.alignment", 256), (hl_err *)NULL);
    char path[512];
    snprintf(path, sizeof path, "%s/t.gguf", test_tmpdir());
    CHECK_OK(gguf_writer_write_file(w, path, &err), &err);
    CHECK_OK(gguf_open(path, &f, &err), &err);
    CHECK(check_tensors(f, 256, 1u << 20));
    CHECK_EQ_INT(gguf_tensor_at(f, 1)->offset, 256);
    uint32_t a = 0;
    CHECK(gguf_get_u32(f, "general.alignment", &a) && a == 256);
    gguf_close(f);
    gguf_writer_destroy(w);
}

TEST(gguf_writer_rejects_bad_input) {
    gguf_writer *w = gguf_writer_create();
    CHECK(w);
    float data[64] = {0};
    int64_t ne[2] = {8, 2};
    hl_err err;
    CHECK_OK(gguf_writer_add_tensor(w, "a", HL_TYPE_F32, 2, ne, data, 64, &err), &err);
    CHECK_EQ_INT(gguf_writer_add_tensor(w, "a", HL_TYPE_F32, 2, ne, data, 64, &err),
                 HL_ERR_INVALID);
    CHECK(strstr(err.msg, "duplicate tensor name 'a'"));
    CHECK_EQ_INT(gguf_writer_add_tensor(w, "b", HL_TYPE_F32, 2, ne, data, 60, &err),
                 HL_ERR_INVALID);
    CHECK(strstr(err.msg, "'b'"));
    CHECK_EQ_INT(gguf_writer_add_tensor(w, "c", HL_TYPE_Q8_0, 2, ne, data, 64, &err),
                 HL_ERR_INVALID);
    CHECK(strstr(err.msg, "block size"));
    CHECK_EQ_INT(gguf_writer_add_tensor(w, "d", HL_TYPE_F32, 0, ne, data, 64, &err),
                 HL_ERR_INVALID);
    CHECK_EQ_INT(gguf_writer_add_tensor(w, "e", 99, 2, ne, data, 64, &err), HL_ERR_INVALID);
    CHECK(strstr(err.msg, "unknown type"));
    gguf_writer_set_version(w, 1);
    uint8_t *buf = NULL;
    size_t len = 0;
    CHECK_EQ_INT(gguf_writer_write_memory(w, &buf, &len, &err), HL_ERR_INVALID);
    CHECK(buf == NULL);
    gguf_writer_set_version(w, 3);
    CHECK_OK(gguf_writer_set_u32(w, "general.alignment", 48), (hl_err *)NULL);
    CHECK_EQ_INT(gguf_writer_write_memory(w, &buf, &len, &err), HL_ERR_INVALID);
    CHECK(strstr(err.msg, "power of two"));
    CHECK_OK(gguf_writer_set_u64(w, "general.alignment", 64), (hl_err *)NULL);
    CHECK_EQ_INT(gguf_writer_write_memory(w, &buf, &len, &err), HL_ERR_INVALID);
    CHECK(strstr(err.msg, "uint32"));
    gguf_writer_destroy(w);
}

/* ---- typed getters ---- */

TEST(gguf_getter_conversions) {
    gguf_writer *w = gguf_writer_create();
    CHECK(w);
    gguf_writer_set_u8(w, "u8", 250);
    gguf_writer_set_i8(w, "i8.neg", -1);
    gguf_writer_set_i8(w, "i8.pos", 5);
    gguf_writer_set_u16(w, "u16", 65535);
    gguf_writer_set_i16(w, "i16.neg", -300);
    gguf_writer_set_u32(w, "u32.big", 3000000000u);
    gguf_writer_set_u32(w, "u32.small", 7);
    gguf_writer_set_i32(w, "i32.neg", -7);
    gguf_writer_set_u64(w, "u64.small", 9);
    gguf_writer_set_i64(w, "i64.pos", 11);
    gguf_writer_set_i64(w, "i64.neg", -11);
    gguf_writer_set_f32(w, "f32", 2.5f);
    gguf_writer_set_f64(w, "f64", 0.1);
    gguf_writer_set_f64(w, "f64.huge", 1e300);
    gguf_writer_set_bool(w, "bool", false);
    gguf_writer_set_str(w, "str", "12");
    uint8_t *buf;
    size_t len;
    hl_err err;
    CHECK_OK(gguf_writer_write_memory(w, &buf, &len, &err), &err);
    gguf_writer_destroy(w);
    gguf_file *f;
    CHECK_OK(gguf_open_memory(buf, len, &f, &err), &err);

    uint32_t u32 = 12345;
    int32_t i32 = 12345;
    uint64_t u64 = 12345;
    float f32 = 123.0f;
    bool b = true;
    gguf_str s = {"x", 1};
    /* widening and same-width conversions that fit */
    CHECK(gguf_get_u32(f, "u8", &u32) && u32 == 250);
    CHECK(gguf_get_i32(f, "u8", &i32) && i32 == 250);
    CHECK(gguf_get_u64(f, "u8", &u64) && u64 == 250);
    CHECK(gguf_get_u32(f, "i8.pos", &u32) && u32 == 5);
    CHECK(gguf_get_i32(f, "u16", &i32) && i32 == 65535);
    CHECK(gguf_get_i32(f, "i16.neg", &i32) && i32 == -300);
    CHECK(gguf_get_i32(f, "u32.small", &i32) && i32 == 7);
    CHECK(gguf_get_u64(f, "u32.big", &u64) && u64 == 3000000000u);
    CHECK(gguf_get_u64(f, "i64.pos", &u64) && u64 == 11);
    CHECK(gguf_get_u64(f, "u64.small", &u64) && u64 == 9);
    CHECK(gguf_get_f32(f, "f32", &f32) && f32 == 2.5f);
    CHECK(gguf_get_f32(f, "f64", &f32) && f32 == 0.1f);
    CHECK(gguf_get_bool(f, "bool", &b) && !b);
    CHECK(gguf_get_str(f, "str", &s) && str_is(s, "12"));

    /* refused: *out stays untouched */
    u32 = 12345, i32 = 12345, u64 = 12345, f32 = 123.0f, b = true;
    CHECK(!gguf_get_u32(f, "i8.neg", &u32));     /* negative */
    CHECK(!gguf_get_u32(f, "i32.neg", &u32));
    CHECK(!gguf_get_u64(f, "i64.neg", &u64));
    CHECK(!gguf_get_i32(f, "u32.big", &i32));    /* does not fit */
    CHECK(!gguf_get_u32(f, "u64.small", &u32));  /* narrower, even though it fits */
    CHECK(!gguf_get_i32(f, "i64.pos", &i32));
    CHECK(!gguf_get_f32(f, "u32.small", &f32));  /* integers do not become floats */
    CHECK(!gguf_get_f32(f, "f64.huge", &f32));   /* out of float range */
    CHECK(!gguf_get_u32(f, "f32", &u32));        /* floats do not become integers */
    CHECK(!gguf_get_u32(f, "bool", &u32));
    CHECK(!gguf_get_bool(f, "u8", &b));
    CHECK(!gguf_get_u32(f, "str", &u32));
    CHECK(!gguf_get_str(f, "u8", &s));
    CHECK(!gguf_get_u32(f, "missing", &u32));
    CHECK(!gguf_get_str(f, "missing", &s));
    CHECK(u32 == 12345 && i32 == 12345 && u64 == 12345 && f32 == 123.0f && b);
    CHECK(str_is(s, "12"));
    gguf_close(f);
    free(buf);
}

TEST(gguf_str_eq_compares_bytes) {
    gguf_str s = {"abc\0d", 5};
    CHECK(!gguf_str_eq(s, "abc"));
    CHECK(gguf_str_eq((gguf_str){"abc", 3}, "abc"));
    CHECK(!gguf_str_eq((gguf_str){"abd", 3}, "abc"));
    CHECK(gguf_str_eq((gguf_str){NULL, 0}, ""));
}

/* ---- malformed files ---- */

/* A small valid file: some keys (including a string array), two tensors, and the last
 * tensor's data ending exactly at the end of the file (no padding after it). */
static bool small_valid_file(uint8_t **buf, size_t *len) {
    gguf_writer *w = gguf_writer_create();
    if (!w) return false;
    const char *const toks[] = {"a", "bc", ""};
    const float scores[] = {1, 2, 3};
    int64_t ne_a[2] = {4, 2}, ne_b[1] = {32};
    float data_a[8] = {1, 2, 3, 4, 5, 6, 7, 8}, data_b[32] = {0};
    hl_status st = HL_OK;
    st |= gguf_writer_set_str(w, "general.name", "tiny");
    st |= gguf_writer_set_u32(w, "n", 3);
    st |= gguf_writer_set_arr_str(w, "toks", toks, 3);
    st |= gguf_writer_set_arr(w, "scores", GGUF_TYPE_FLOAT32, scores, 3);
    st |= gguf_writer_add_tensor(w, "a", HL_TYPE_F32, 2, ne_a, data_a, sizeof data_a, NULL);
    st |= gguf_writer_add_tensor(w, "b", HL_TYPE_F32, 1, ne_b, data_b, sizeof data_b, NULL);
    if (st == HL_OK) st = gguf_writer_write_memory(w, buf, len, NULL);
    gguf_writer_destroy(w);
    return st == HL_OK;
}

TEST(gguf_rejects_every_truncation) {
    uint8_t *buf;
    size_t len;
    CHECK(small_valid_file(&buf, &len));
    gguf_file *f;
    hl_err err;
    CHECK_OK(gguf_open_memory(buf, len, &f, &err), &err);
    gguf_close(f);
    for (size_t n = 0; n < len; n++) {
        /* a fresh copy of exactly n bytes, so ASan sees any read past the end */
        uint8_t *prefix = malloc(n ? n : 1);
        memcpy(prefix, buf, n);
        f = NULL;
        hl_err_clear(&err);
        hl_status st = gguf_open_memory(prefix, n, &f, &err);
        free(prefix);
        CHECK_MSG(st != HL_OK && f == NULL, "prefix of %zu of %zu bytes was accepted", n, len);
        CHECK_MSG(err.msg[0] != '\0', "prefix of %zu bytes: empty message", n);
        bool named = strstr(err.msg, "truncated") || strstr(err.msg, "too small") ||
                     strstr(err.msg, "past end of file") || strstr(err.msg, "bytes left") ||
                     strstr(err.msg, "bytes follow");
        CHECK_MSG(named, "prefix of %zu bytes: unexpected message \"%s\"", n, err.msg);
    }
    /* a few messages name exactly where */
    char got[HL_ERR_MSG_LEN + 32];
    CHECK_MSG(fails_with(buf, 6, "truncated while reading the header (version)", got, sizeof got),
              "%s", got);
    CHECK_MSG(fails_with(buf, len - 1, "tensor 'b': data", got, sizeof got), "%s", got);
    CHECK_MSG(fails_with(buf, len - 1, "extends past end of file", got, sizeof got), "%s", got);
    /* cut inside key 3's type: header (24), key 0 (36 bytes), key 1 (17), key 2 (55), then
     * key 3's name (8 + 6) */
    CHECK_MSG(fails_with(buf, 24 + 36 + 17 + 55 + 14 + 2, "truncated while reading key 3 ('scores')",
                         got, sizeof got), "%s", got);
    free(buf);
}

TEST(gguf_rejects_bad_magic_and_versions) {
    uint8_t *buf;
    size_t len;
    CHECK(small_valid_file(&buf, &len));
    buf[0] = 'X';
    EXPECT_FAIL(buf, len, "bad magic");
    buf[0] = 'G';
    buf[4] = 1;
    EXPECT_FAIL(buf, len, "GGUF version 1 is not supported");
    buf[4] = 4;
    EXPECT_FAIL(buf, len, "GGUF version 4 is not supported");
    /* a big-endian v3 file stores its version as 00 00 00 03 */
    buf[4] = 0, buf[7] = 3;
    EXPECT_FAIL(buf, len, "big-endian GGUF is not supported");
    buf[4] = 2, buf[7] = 0;
    gguf_file *f;
    hl_err err;
    CHECK_OK(gguf_open_memory(buf, len, &f, &err), &err);
    CHECK_EQ_INT(gguf_version(f), 2);
    gguf_close(f);
    EXPECT_FAIL(NULL, 0, "too small");
    EXPECT_FAIL("GGU", 3, "too small");
    free(buf);
}

TEST(gguf_rejects_huge_counts_and_lengths) {
    /* 2^60 keys: fails at once, without trying to allocate */
    bytes b = {0};
    bb_header(&b, 3, 0, 1ull << 60);
    bb_zeros(&b, 100);
    EXPECT_FAIL(b.p, b.len, "header claims 1152921504606846976 key/value pairs");
    b.len = 0;
    bb_header(&b, 3, 1ull << 60, 0);
    bb_zeros(&b, 100);
    EXPECT_FAIL(b.p, b.len, "1152921504606846976 tensors");

    /* key name length */
    b.len = 0;
    bb_header(&b, 3, 0, 1);
    bb_u64(&b, 1ull << 62);
    bb_zeros(&b, 16);
    EXPECT_FAIL(b.p, b.len, "key 0: name length 4611686018427387904 exceeds");

    /* string value length */
    b.len = 0;
    bb_header(&b, 3, 0, 1);
    bb_key(&b, "general.name", GGUF_TYPE_STRING);
    bb_u64(&b, UINT64_MAX);
    bb_raw(&b, "abc", 3);
    EXPECT_FAIL(b.p, b.len, "key 0 ('general.name'): string length 18446744073709551615 exceeds");

    /* numeric array length: n * 4 would overflow 64 bits */
    b.len = 0;
    bb_header(&b, 3, 0, 1);
    bb_key(&b, "scores", GGUF_TYPE_ARRAY);
    bb_u32(&b, GGUF_TYPE_FLOAT32);
    bb_u64(&b, 1ull << 62);
    bb_zeros(&b, 16);
    EXPECT_FAIL(b.p, b.len, "key 0 ('scores'): array of 4611686018427387904 float32 elements");

    /* string array length */
    b.len = 0;
    bb_header(&b, 3, 0, 1);
    bb_key(&b, "tokens", GGUF_TYPE_ARRAY);
    bb_u32(&b, GGUF_TYPE_STRING);
    bb_u64(&b, 1ull << 60);
    bb_zeros(&b, 16);
    EXPECT_FAIL(b.p, b.len, "key 0 ('tokens'): array of 1152921504606846976 string elements");

    /* one string inside a string array lies about its length */
    b.len = 0;
    bb_header(&b, 3, 0, 1);
    bb_key(&b, "tokens", GGUF_TYPE_ARRAY);
    bb_u32(&b, GGUF_TYPE_STRING);
    bb_u64(&b, 2);
    bb_str(&b, "ok");
    bb_u64(&b, 1000);
    bb_raw(&b, "short", 5);
    EXPECT_FAIL(b.p, b.len, "key 0 ('tokens'): string 1 of the array has length 1000");

    /* tensor name length */
    b.len = 0;
    bb_header(&b, 3, 1, 0);
    bb_u64(&b, 1ull << 40);
    bb_zeros(&b, 40);
    EXPECT_FAIL(b.p, b.len, "tensor 0: name length 1099511627776 exceeds");
    free(b.p);
}

TEST(gguf_rejects_bad_value_types) {
    bytes b = {0};
    bb_header(&b, 3, 0, 2);
    bb_key(&b, "fine", GGUF_TYPE_UINT8);
    bb_raw(&b, "\x01", 1);
    bb_key(&b, "weird", (gguf_type)13);
    bb_zeros(&b, 8);
    EXPECT_FAIL(b.p, b.len, "key 1 ('weird'): unknown value type 13");
    b.len = 0;
    bb_header(&b, 3, 0, 1);
    bb_key(&b, "arr", GGUF_TYPE_ARRAY);
    bb_u32(&b, 99);
    bb_u64(&b, 1);
    bb_zeros(&b, 8);
    EXPECT_FAIL(b.p, b.len, "key 0 ('arr'): unknown array element type 99");
    /* key names with control bytes are shown escaped */
    b.len = 0;
    bb_header(&b, 3, 0, 1);
    bb_key(&b, "a\nb", (gguf_type)0x7fffffff);
    bb_zeros(&b, 8);
    EXPECT_FAIL(b.p, b.len, "key 0 ('a?b'): unknown value type");
    /* a bool byte other than 0/1 is accepted and reads as true */
    b.len = 0;
    bb_header(&b, 3, 0, 1);
    bb_key(&b, "flag", GGUF_TYPE_BOOL);
    bb_raw(&b, "\x02", 1);
    gguf_file *f;
    hl_err err;
    CHECK_OK(gguf_open_memory(b.p, b.len, &f, &err), &err);
    bool v = false;
    CHECK(gguf_get_bool(f, "flag", &v) && v);
    gguf_close(f);
    free(b.p);
}

TEST(gguf_nested_arrays) {
    /* valid: an array of two arrays (u8 x3, string x1); validated, not exposed */
    bytes b = {0};
    bb_header(&b, 3, 0, 2);
    bb_key(&b, "nested", GGUF_TYPE_ARRAY);
    bb_u32(&b, GGUF_TYPE_ARRAY);
    bb_u64(&b, 2);
    bb_u32(&b, GGUF_TYPE_UINT8);
    bb_u64(&b, 3);
    bb_raw(&b, "xyz", 3);
    bb_u32(&b, GGUF_TYPE_STRING);
    bb_u64(&b, 1);
    bb_str(&b, "hi");
    bb_key(&b, "after", GGUF_TYPE_UINT32);
    bb_u32(&b, 77);
    gguf_file *f;
    hl_err err;
    CHECK_OK(gguf_open_memory(b.p, b.len, &f, &err), &err);
    gguf_type et;
    uint64_t n;
    CHECK(gguf_get_arr(f, "nested", &et, &n) && et == GGUF_TYPE_ARRAY && n == 2);
    CHECK(gguf_arr_data(f, "nested") == NULL);
    CHECK(gguf_arr_str(f, "nested", 0).ptr == NULL);
    uint32_t v;
    CHECK(gguf_get_u32(f, "after", &v) && v == 77);
    gguf_close(f);

    /* an inner array that claims more elements than the file holds */
    b.len = 0;
    bb_header(&b, 3, 0, 1);
    bb_key(&b, "nested", GGUF_TYPE_ARRAY);
    bb_u32(&b, GGUF_TYPE_ARRAY);
    bb_u64(&b, 2);
    bb_u32(&b, GGUF_TYPE_UINT32);
    bb_u64(&b, 1);
    bb_u32(&b, 5);
    bb_u32(&b, GGUF_TYPE_UINT32);
    bb_u64(&b, 1000);
    bb_u32(&b, 5);
    EXPECT_FAIL(b.p, b.len, "key 0 ('nested'): array of 1000 uint32 elements needs more");
    /* an inner array with a bad element type */
    b.len = 0;
    bb_header(&b, 3, 0, 1);
    bb_key(&b, "nested", GGUF_TYPE_ARRAY);
    bb_u32(&b, GGUF_TYPE_ARRAY);
    bb_u64(&b, 1);
    bb_u32(&b, 42);
    bb_u64(&b, 0);
    EXPECT_FAIL(b.p, b.len, "key 0 ('nested'): nested array 0 has unknown element type 42");
    /* nesting deeper than the limit */
    b.len = 0;
    bb_header(&b, 3, 0, 1);
    bb_key(&b, "deep", GGUF_TYPE_ARRAY);
    for (int d = 0; d < 40; d++) {
        bb_u32(&b, GGUF_TYPE_ARRAY);
        bb_u64(&b, 1);
    }
    bb_u32(&b, GGUF_TYPE_UINT8);
    bb_u64(&b, 0);
    EXPECT_FAIL(b.p, b.len, "key 0 ('deep'): arrays nested more than");
    free(b.p);
}

static bytes alignment_file(gguf_type type, uint64_t value) {
    bytes b = {0};
    bb_header(&b, 3, 0, 1);
    bb_key(&b, "general.alignment", type);
    bb_le(&b, value, (int)gguf_type_size(type));
    return b;
}

TEST(gguf_rejects_bad_alignment) {
    bytes b = alignment_file(GGUF_TYPE_UINT32, 0);
    EXPECT_FAIL(b.p, b.len, "general.alignment is 0, not a nonzero power of two");
    free(b.p);
    b = alignment_file(GGUF_TYPE_UINT32, 3);
    EXPECT_FAIL(b.p, b.len, "general.alignment is 3, not a nonzero power of two");
    free(b.p);
    b = alignment_file(GGUF_TYPE_UINT64, 32);
    EXPECT_FAIL(b.p, b.len, "general.alignment has type uint64, expected uint32");
    free(b.p);
    b = alignment_file(GGUF_TYPE_UINT32, 64);
    gguf_file *f;
    hl_err err;
    CHECK_OK(gguf_open_memory(b.p, b.len, &f, &err), &err);
    CHECK_EQ_INT(gguf_alignment(f), 64);
    CHECK_EQ_INT(gguf_data_offset(f), 64);
    gguf_close(f);
    free(b.p);
}

TEST(gguf_rejects_bad_tensor_infos) {
    int64_t ne[5] = {32, 1, 1, 1, 1};
    bytes b = one_tensor_file(0, ne, HL_TYPE_F32, 0, 128);
    EXPECT_FAIL(b.p, b.len, "tensor 't': n_dims 0 is out of range (1..4)");
    free(b.p);
    b = one_tensor_file(5, ne, HL_TYPE_F32, 0, 128);
    EXPECT_FAIL(b.p, b.len, "tensor 't': n_dims 5 is out of range");
    free(b.p);
    int64_t neg[2] = {32, -4};
    b = one_tensor_file(2, neg, HL_TYPE_F32, 0, 128);
    EXPECT_FAIL(b.p, b.len, "tensor 't': dimension 1 is negative (-4)");
    free(b.p);
    int64_t big[3] = {1ll << 31, 1ll << 31, 1ll << 2};
    b = one_tensor_file(3, big, HL_TYPE_F32, 0, 128);
    EXPECT_FAIL(b.p, b.len, "tensor 't': element count overflows");
    free(b.p);
    /* an empty row must not hide an overflowing row count */
    int64_t zero_row[4] = {0, 1ll << 40, 1ll << 40, 1};
    b = one_tensor_file(4, zero_row, HL_TYPE_F32, 0, 0);
    EXPECT_FAIL(b.p, b.len, "tensor 't': element count overflows");
    free(b.p);
    /* fits in int64 elements, but not in bytes */
    int64_t wide[2] = {1ll << 61, 2};
    b = one_tensor_file(2, wide, HL_TYPE_F32, 0, 128);
    EXPECT_FAIL(b.p, b.len, "tensor 't': data size overflows");
    free(b.p);
    b = one_tensor_file(1, ne, 5 /* Q4_2, removed */, 0, 128);
    EXPECT_FAIL(b.p, b.len, "tensor 't': unknown tensor type 5");
    free(b.p);
    b = one_tensor_file(1, ne, HL_TYPE_Q4_0_X8, 0, 128); /* hearth's in-memory layout */
    EXPECT_FAIL(b.p, b.len, "tensor 't': unknown tensor type 40");
    free(b.p);
    int64_t odd[2] = {48, 2};
    b = one_tensor_file(2, odd, HL_TYPE_Q4_0, 0, 128);
    EXPECT_FAIL(b.p, b.len, "tensor 't': row length 48 is not a multiple of the block size 32");
    free(b.p);
    b = one_tensor_file(1, ne, HL_TYPE_F32, 16, 256);
    EXPECT_FAIL(b.p, b.len, "tensor 't': offset 16 is not a multiple of the alignment 32");
    free(b.p);
    b = one_tensor_file(1, ne, HL_TYPE_F32, 64, 128);
    EXPECT_FAIL(b.p, b.len, "tensor 't': data (file offset");
    EXPECT_FAIL(b.p, b.len, "128 bytes) extends past end of file");
    free(b.p);
    b = one_tensor_file(1, ne, HL_TYPE_F32, UINT64_MAX - 31, 128);
    EXPECT_FAIL(b.p, b.len, "extends past end of file");
    free(b.p);
    /* and the same file with a good offset opens */
    b = one_tensor_file(1, ne, HL_TYPE_F32, 0, 128);
    gguf_file *f;
    hl_err err;
    CHECK_OK(gguf_open_memory(b.p, b.len, &f, &err), &err);
    CHECK_EQ_INT(gguf_tensor_at(f, 0)->n_bytes, 128);
    gguf_close(f);
    free(b.p);
}

TEST(gguf_rejects_duplicates) {
    bytes b = {0};
    bb_header(&b, 3, 0, 3);
    bb_key(&b, "general.name", GGUF_TYPE_STRING);
    bb_str(&b, "a");
    bb_key(&b, "other", GGUF_TYPE_UINT8);
    bb_raw(&b, "\x00", 1);
    bb_key(&b, "general.name", GGUF_TYPE_UINT32);
    bb_u32(&b, 1);
    EXPECT_FAIL(b.p, b.len, "duplicate key 'general.name' (keys 0 and 2)");
    b.len = 0;
    int64_t ne[1] = {8};
    bb_header(&b, 3, 2, 0);
    bb_tensor_info(&b, "blk.0.w", 1, ne, HL_TYPE_F32, 0);
    bb_tensor_info(&b, "blk.0.w", 1, ne, HL_TYPE_F32, 32);
    bb_pad(&b, 32);
    bb_zeros(&b, 64);
    EXPECT_FAIL(b.p, b.len, "duplicate tensor name 'blk.0.w' (tensors 0 and 1)");
    free(b.p);
}

TEST(gguf_open_reports_path) {
    gguf_file *f = (gguf_file *)1;
    hl_err err;
    char path[512];
    snprintf(path, sizeof path, "%s/missing.gguf", test_tmpdir());
    CHECK_EQ_INT(gguf_open(path, &f, &err), HL_ERR_IO);
    CHECK(f == NULL);
    CHECK(strstr(err.msg, "missing.gguf"));
    snprintf(path, sizeof path, "%s/bad.gguf", test_tmpdir());
    CHECK_OK(hl_file_write(path, "GGUF\x01\0\0\0", 8, &err), &err);
    CHECK_EQ_INT(gguf_open(path, &f, &err), HL_ERR_UNSUPPORTED);
    CHECK(strstr(err.msg, "bad.gguf: GGUF version 1 is not supported"));
    snprintf(path, sizeof path, "%s/empty.gguf", test_tmpdir());
    CHECK_OK(hl_file_write(path, "", 0, &err), &err);
    CHECK_EQ_INT(gguf_open(path, &f, &err), HL_ERR_FORMAT);
    CHECK(strstr(err.msg, "too small"));
    gguf_close(NULL);
}

/* ---- real files ---- */

TEST(gguf_reads_stories260k) {
    const char *path = test_shared_path("models/stories260K/stories260K.gguf");
    if (!path) SKIP("models/stories260K/stories260K.gguf not found");
    gguf_file *f;
    hl_err err;
    CHECK_OK(gguf_open(path, &f, &err), &err);
    CHECK_EQ_INT(gguf_version(f), 3);
    CHECK_EQ_INT(gguf_n_tensors(f), 48);
    CHECK_EQ_INT(gguf_alignment(f), 32);
    gguf_str s;
    CHECK(gguf_get_str(f, "general.architecture", &s) && gguf_str_eq(s, "llama"));
    CHECK(gguf_get_str(f, "tokenizer.ggml.model", &s) && gguf_str_eq(s, "llama"));
    uint32_t u;
    CHECK(gguf_get_u32(f, "llama.embedding_length", &u) && u == 64);
    CHECK(gguf_get_u32(f, "llama.block_count", &u) && u == 5);
    CHECK(gguf_get_u32(f, "llama.attention.head_count_kv", &u) && u == 4);
    CHECK(gguf_get_u32(f, "llama.context_length", &u) && u == 2048);
    CHECK(gguf_get_u32(f, "tokenizer.ggml.seperator_token_id", &u) && u == UINT32_MAX);
    float eps;
    CHECK(gguf_get_f32(f, "llama.attention.layer_norm_rms_epsilon", &eps));
    CHECK_NEAR(eps, 1e-5, 1e-9);
    gguf_type et;
    uint64_t n;
    CHECK(gguf_get_arr(f, "tokenizer.ggml.tokens", &et, &n) && et == GGUF_TYPE_STRING && n == 512);
    CHECK(gguf_str_eq(gguf_arr_str(f, "tokenizer.ggml.tokens", 0), "<unk>"));
    CHECK(gguf_str_eq(gguf_arr_str(f, "tokenizer.ggml.tokens", 3), "<0x00>"));
    CHECK(gguf_get_arr(f, "tokenizer.ggml.scores", &et, &n) && et == GGUF_TYPE_FLOAT32 && n == 512);
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        CHECK_EQ_INT(t->type, HL_TYPE_F32);
        CHECK_EQ_INT(t->offset % 32, 0);
    }
    const gguf_tensor *t = gguf_find_tensor(f, "token_embd.weight");
    CHECK(t && t->n_dims == 2 && t->ne[0] == 64 && t->ne[1] == 512 && t->n_bytes == 131072);
    CHECK(gguf_find_tensor(f, "blk.4.ffn_down.weight"));
    CHECK(!gguf_find_tensor(f, "blk.5.ffn_down.weight"));
    gguf_close(f);
}

TEST(gguf_reads_llama2_tiny_random) {
    const char *path = test_shared_path("models/llama-2-tiny-random.gguf");
    if (!path) SKIP("models/llama-2-tiny-random.gguf not found");
    gguf_file *f;
    hl_err err;
    CHECK_OK(gguf_open(path, &f, &err), &err);
    gguf_str s;
    CHECK(gguf_get_str(f, "general.architecture", &s) && gguf_str_eq(s, "llama"));
    uint32_t u;
    CHECK(gguf_get_u32(f, "general.file_type", &u) && u == 1);
    CHECK(gguf_get_u32(f, "llama.embedding_length", &u) && u == 8);
    gguf_type et;
    uint64_t n;
    CHECK(gguf_get_arr(f, "tokenizer.ggml.tokens", &et, &n) && et == GGUF_TYPE_STRING && n == 32000);
    CHECK(gguf_get_arr(f, "tokenizer.ggml.token_type", &et, &n) && et == GGUF_TYPE_INT32 &&
          n == 32000);
    CHECK_EQ_INT(gguf_n_tensors(f), 12);
    const gguf_tensor *t = gguf_find_tensor(f, "token_embd.weight");
    CHECK(t && t->type == HL_TYPE_F16 && t->ne[0] == 8 && t->ne[1] == 32000);
    CHECK_EQ_INT(t->n_bytes, 8 * 32000 * 2);
    gguf_close(f);
}

TEST(gguf_reads_vocab_files) {
    static const struct {
        const char *file, *arch, *model;
        uint64_t n_tokens;
    } vocabs[] = {
        {"ggml-vocab-baichuan.gguf", "baichuan", "llama", 64000},
        {"ggml-vocab-bert-bge.gguf", "bert", "bert", 30522},
        {"ggml-vocab-deepseek-coder.gguf", "llama", "gpt2", 32256},
        {"ggml-vocab-deepseek-llm.gguf", "llama", "gpt2", 102400},
        {"ggml-vocab-falcon.gguf", "falcon", "gpt2", 65024},
        {"ggml-vocab-gpt-2.gguf", "gpt2", "gpt2", 50257},
        {"ggml-vocab-gpt-neox.gguf", "gptneox", "gpt2", 50432},
        {"ggml-vocab-llama-spm.gguf", "llama", "llama", 32000},
        {"ggml-vocab-mpt.gguf", "mpt", "gpt2", 50432},
        {"ggml-vocab-phi-3.gguf", "phi3", "llama", 32064},
        {"ggml-vocab-refact.gguf", "refact", "gpt2", 49216},
        {"ggml-vocab-starcoder.gguf", "starcoder2", "gpt2", 49152},
    };
    const char *dir = test_shared_path("models/ggml-vocab");
    if (!dir) SKIP("models/ggml-vocab not found");
    /* every .gguf in the folder opens, including any not listed above */
    char dir_copy[1024];
    snprintf(dir_copy, sizeof dir_copy, "%s", dir);
    DIR *d = opendir(dir_copy);
    CHECK(d);
    int n_files = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        size_t nl = strlen(e->d_name);
        if (nl < 5 || strcmp(e->d_name + nl - 5, ".gguf") != 0) continue;
        char path[2048];
        snprintf(path, sizeof path, "%s/%s", dir_copy, e->d_name);
        gguf_file *f;
        hl_err err;
        hl_status st = gguf_open(path, &f, &err);
        if (st != HL_OK) closedir(d);
        CHECK_OK(st, &err);
        CHECK_EQ_INT(gguf_n_tensors(f), 0);
        gguf_close(f);
        n_files++;
    }
    closedir(d);
    CHECK(n_files >= 12);
    for (size_t i = 0; i < sizeof vocabs / sizeof vocabs[0]; i++) {
        char path[2048];
        snprintf(path, sizeof path, "%s/%s", dir_copy, vocabs[i].file);
        gguf_file *f;
        hl_err err;
        CHECK_OK(gguf_open(path, &f, &err), &err);
        gguf_str s;
        CHECK_MSG(gguf_get_str(f, "general.architecture", &s) && gguf_str_eq(s, vocabs[i].arch),
                  "%s: architecture", vocabs[i].file);
        CHECK_MSG(gguf_get_str(f, "tokenizer.ggml.model", &s) && gguf_str_eq(s, vocabs[i].model),
                  "%s: tokenizer model", vocabs[i].file);
        gguf_type et;
        uint64_t n = 0;
        CHECK_MSG(gguf_get_arr(f, "tokenizer.ggml.tokens", &et, &n) && et == GGUF_TYPE_STRING &&
                      n == vocabs[i].n_tokens,
                  "%s: %" PRIu64 " tokens", vocabs[i].file, n);
        /* the last token is reachable and lies inside the file */
        CHECK(gguf_arr_str(f, "tokenizer.ggml.tokens", n - 1).ptr != NULL);
        if (strcmp(vocabs[i].model, "gpt2") == 0)
            CHECK_MSG(gguf_get_arr(f, "tokenizer.ggml.merges", &et, &n) &&
                          et == GGUF_TYPE_STRING && n > 1000,
                      "%s: merges", vocabs[i].file);
        gguf_close(f);
    }
}

/* ---- fuzz corpus replay ---- */

TEST(gguf_fuzz_corpus_replay) {
    const char *dir = "fuzz/corpus/gguf";
    DIR *d = opendir(dir);
    if (!d) SKIP("fuzz/corpus/gguf not found (run from the repository root)");
    int n_files = 0, n_valid = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        char *buf;
        size_t len;
        hl_err err;
        if (hl_file_read(path, &buf, &len, &err) != HL_OK) continue;
        /* an exact-size copy so reading past the end is caught under ASan */
        uint8_t *exact = malloc(len ? len : 1);
        memcpy(exact, buf, len);
        free(buf);
        gguf_file *f = NULL;
        hl_err_clear(&err);
        hl_status st = gguf_open_memory(exact, len, &f, &err);
        if (st == HL_OK) {
            n_valid++;
            for (int64_t i = 0; i < gguf_n_kv(f); i++) (void)gguf_kv_type(f, i);
            for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
                const gguf_tensor *t = gguf_tensor_at(f, i);
                const uint8_t *p = t->data;
                volatile uint8_t sum = 0;
                for (uint64_t j = 0; j < t->n_bytes; j++) sum = (uint8_t)(sum + p[j]);
            }
            gguf_close(f);
        } else if (err.msg[0] == '\0') {
            free(exact);
            closedir(d);
            CHECK_MSG(false, "%s: rejected without a message", path);
        }
        free(exact);
        n_files++;
    }
    closedir(d);
    CHECK_MSG(n_files >= 5 && n_valid >= 1, "%d corpus files, %d valid", n_files, n_valid);
}
