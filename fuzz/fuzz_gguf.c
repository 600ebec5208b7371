/*
 * fuzz_gguf.c - libFuzzer target for the GGUF reader. Every input goes through
 * gguf_open_memory(); when it opens, every accessor is walked and every byte the
 * reader points at (strings, arrays, tensor data) is read, so ASan catches any
 * pointer that escapes the buffer. Build with `make fuzz`; seeds in fuzz/corpus/gguf.
 *   build-fuzz/fuzz/fuzz_gguf -max_total_time=180 fuzz/corpus/gguf
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static volatile uint8_t g_sink;

static void touch(const void *p, uint64_t n) {
    const uint8_t *b = p;
    uint8_t acc = 0;
    for (uint64_t i = 0; i < n; i++) acc = (uint8_t)(acc + b[i]);
    g_sink = acc;
}

static void walk_key(const gguf_file *f, const char *key) {
    uint32_t u32;
    int32_t i32;
    uint64_t u64;
    float f32;
    bool b;
    gguf_str s;
    (void)gguf_get_u32(f, key, &u32);
    (void)gguf_get_i32(f, key, &i32);
    (void)gguf_get_u64(f, key, &u64);
    (void)gguf_get_f32(f, key, &f32);
    (void)gguf_get_bool(f, key, &b);
    if (gguf_get_str(f, key, &s)) touch(s.ptr, s.len);
    gguf_type et;
    uint64_t n;
    if (!gguf_get_arr(f, key, &et, &n)) return;
    const void *p = gguf_arr_data(f, key);
    if (p) touch(p, n * gguf_type_size(et));
    if (et == GGUF_TYPE_STRING) {
        for (uint64_t j = 0; j < n; j++) {
            gguf_str e = gguf_arr_str(f, key, j);
            touch(e.ptr, e.len);
            (void)gguf_str_eq(e, "x");
        }
        if (gguf_arr_str(f, key, n).ptr) abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    gguf_file *f = NULL;
    hl_err err;
    if (gguf_open_memory(data, size, &f, &err) != HL_OK) {
        if (f || !err.msg[0]) abort(); /* a failure always explains itself */
        return 0;
    }
    (void)gguf_version(f);
    (void)gguf_alignment(f);
    (void)gguf_data_offset(f);
    char name[256];
    for (int64_t i = 0; i < gguf_n_kv(f); i++) {
        gguf_str k = gguf_kv_key(f, i);
        (void)gguf_type_name(gguf_kv_type(f, i));
        touch(k.ptr, k.len);
        size_t n = k.len < sizeof name - 1 ? (size_t)k.len : sizeof name - 1;
        memcpy(name, k.ptr, n);
        name[n] = '\0';
        walk_key(f, name);
        /* keys without NUL bytes must be found again by name */
        if (n == k.len && strlen(name) == n && gguf_find_key(f, name) != i) abort();
    }
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        touch(t->name.ptr, t->name.len);
        touch(t->data, t->n_bytes);
        size_t n = t->name.len < sizeof name - 1 ? (size_t)t->name.len : sizeof name - 1;
        memcpy(name, t->name.ptr, n);
        name[n] = '\0';
        if (n == t->name.len && strlen(name) == n && gguf_find_tensor(f, name) != t) abort();
    }
    gguf_close(f);
    return 0;
}
