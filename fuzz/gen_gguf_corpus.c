/*
 * gen_gguf_corpus.c - writes the seed corpus in fuzz/corpus/gguf (tiny valid files
 * made with the writer, plus a few hand-made invalid ones; no .gguf extension, which
 * .gitignore excludes). Not part of any build:
 *   cc -std=c11 -Isrc fuzz/gen_gguf_corpus.c build/libhearth.a -lxxhash -lz -lm \
 *       -o /tmp/gen && /tmp/gen fuzz/corpus/gguf
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "gguf/gguf.h"
#include "tensor/types.h"

static const char *g_dir;

static void save(const char *name, const void *buf, size_t len) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    hl_err err;
    if (hl_file_write(path, buf, len, &err) != HL_OK) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
}

static void save_writer(const char *name, gguf_writer *w, uint8_t **keep, size_t *keep_len) {
    uint8_t *buf;
    size_t len;
    hl_err err;
    if (gguf_writer_write_memory(w, &buf, &len, &err) != HL_OK) {
        fprintf(stderr, "%s: %s\n", name, err.msg);
        exit(1);
    }
    save(name, buf, len);
    if (keep) {
        *keep = buf;
        *keep_len = len;
    } else {
        free(buf);
    }
}

static void put_le(uint8_t *p, uint64_t v, int n) {
    for (int i = 0; i < n; i++) p[i] = (uint8_t)(v >> (8 * i));
}

int main(int argc, char **argv) {
    g_dir = argc > 1 ? argv[1] : "fuzz/corpus/gguf";

    /* every scalar type and some arrays */
    gguf_writer *w = gguf_writer_create();
    gguf_writer_set_u8(w, "u8", 1);
    gguf_writer_set_i8(w, "i8", -1);
    gguf_writer_set_u16(w, "u16", 2);
    gguf_writer_set_i16(w, "i16", -2);
    gguf_writer_set_u32(w, "u32", 3);
    gguf_writer_set_i32(w, "i32", -3);
    gguf_writer_set_u64(w, "u64", 4);
    gguf_writer_set_i64(w, "i64", -4);
    gguf_writer_set_f32(w, "f32", 0.5f);
    gguf_writer_set_f64(w, "f64", 0.25);
    gguf_writer_set_bool(w, "b", true);
    gguf_writer_set_str(w, "s", "hi");
    const char *const toks[] = {"<s>", "a", ""};
    const float scores[] = {0, -1, -2};
    gguf_writer_set_arr_str(w, "toks", toks, 3);
    gguf_writer_set_arr(w, "scores", GGUF_TYPE_FLOAT32, scores, 3);
    save_writer("valid_all_types", w, NULL, NULL);
    gguf_writer_destroy(w);

    /* tensors of several types */
    w = gguf_writer_create();
    gguf_writer_set_str(w, "general.architecture", "llama");
    uint8_t data[64];
    for (int i = 0; i < 64; i++) data[i] = (uint8_t)(i * 3);
    int64_t ne_f32[2] = {4, 2}, ne_q8[1] = {32}, ne_q4[1] = {32}, ne_f16[1] = {6};
    gguf_writer_add_tensor(w, "a", HL_TYPE_F32, 2, ne_f32, data, 32, NULL);
    gguf_writer_add_tensor(w, "b", HL_TYPE_Q8_0, 1, ne_q8, data, 34, NULL);
    gguf_writer_add_tensor(w, "c", HL_TYPE_Q4_0, 1, ne_q4, data, 18, NULL);
    gguf_writer_add_tensor(w, "d", HL_TYPE_F16, 1, ne_f16, data, 12, NULL);
    uint8_t *tens;
    size_t tens_len;
    save_writer("valid_tensors", w, &tens, &tens_len);
    gguf_writer_set_version(w, 2);
    gguf_writer_set_u32(w, "general.alignment", 8);
    save_writer("valid_v2_align8", w, NULL, NULL);
    gguf_writer_destroy(w);

    /* invalid: truncated, version 1, big-endian, tensor past the end */
    save("bad_truncated", tens, tens_len - 5);
    uint8_t *bad = malloc(tens_len);
    memcpy(bad, tens, tens_len);
    put_le(bad + 4, 1, 4);
    save("bad_version1", bad, tens_len);
    put_le(bad + 4, 0x03000000u, 4);
    save("bad_bigendian", bad, tens_len);
    free(bad);
    free(tens);

    /* hand-made: a nested array (valid), a huge key count, a duplicate key */
    uint8_t raw[128];
    size_t n = 0;
    memcpy(raw, "GGUF", 4);
    put_le(raw + 4, 3, 4);
    put_le(raw + 8, 0, 8);
    put_le(raw + 16, 1, 8);
    n = 24;
    put_le(raw + n, 1, 8), raw[n + 8] = 'n', n += 9;
    put_le(raw + n, GGUF_TYPE_ARRAY, 4), n += 4;
    put_le(raw + n, GGUF_TYPE_ARRAY, 4), put_le(raw + n + 4, 2, 8), n += 12;
    put_le(raw + n, GGUF_TYPE_UINT8, 4), put_le(raw + n + 4, 2, 8), n += 12;
    raw[n++] = 7, raw[n++] = 8;
    put_le(raw + n, GGUF_TYPE_STRING, 4), put_le(raw + n + 4, 1, 8), n += 12;
    put_le(raw + n, 1, 8), raw[n + 8] = 'z', n += 9;
    save("valid_nested_array", raw, n);

    put_le(raw + 16, 1ull << 60, 8);
    save("bad_huge_kv_count", raw, n);

    n = 24;
    put_le(raw + 16, 2, 8);
    for (int k = 0; k < 2; k++) {
        put_le(raw + n, 1, 8), raw[n + 8] = 'k', n += 9;
        put_le(raw + n, GGUF_TYPE_UINT8, 4), raw[n + 4] = (uint8_t)k, n += 5;
    }
    save("bad_duplicate_key", raw, n);
    return 0;
}
