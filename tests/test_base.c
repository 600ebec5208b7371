#include "test.h"

#include <stdlib.h>

#include "base/file.h"
#include "base/pool.h"
#include "base/status.h"
#include "base/strmap.h"

TEST(base_err_fail_and_prefix) {
    hl_err err;
    hl_err_clear(&err);
    CHECK_EQ_INT(hl_fail(&err, HL_ERR_FORMAT, "bad %s", "magic"), HL_ERR_FORMAT);
    CHECK_EQ_INT(err.code, HL_ERR_FORMAT);
    hl_err_prefix(&err, "model.gguf");
    CHECK_STR(err.msg, "model.gguf: bad magic");
    CHECK_EQ_INT(hl_fail(NULL, HL_ERR_IO, "ignored"), HL_ERR_IO);
}

TEST(base_strmap_put_get_grow) {
    hl_strmap *m = hl_strmap_create(4);
    CHECK(m);
    char key[32];
    for (int i = 0; i < 5000; i++) {
        int n = snprintf(key, sizeof key, "k%d", i);
        CHECK_OK(hl_strmap_put(m, key, (size_t)n, i * 3), (hl_err *)NULL);
    }
    CHECK_EQ_INT(hl_strmap_count(m), 5000);
    for (int i = 0; i < 5000; i++) {
        int n = snprintf(key, sizeof key, "k%d", i);
        int64_t v = -1;
        CHECK(hl_strmap_get(m, key, (size_t)n, &v));
        CHECK_EQ_INT(v, i * 3);
    }
    CHECK(!hl_strmap_get(m, "nope", 4, NULL));
    /* keys with NUL bytes and empty keys are distinct keys */
    CHECK_OK(hl_strmap_put(m, "a\0b", 3, 7), (hl_err *)NULL);
    CHECK_OK(hl_strmap_put(m, "", 0, 8), (hl_err *)NULL);
    int64_t v = 0;
    CHECK(hl_strmap_get(m, "a\0b", 3, &v) && v == 7);
    CHECK(!hl_strmap_get(m, "a", 1, &v));
    CHECK(hl_strmap_get(m, "", 0, &v) && v == 8);
    hl_strmap_destroy(m);
}

typedef struct pool_ctx {
    int hits[64];
    long sum[64];
} pool_ctx;

static void pool_work(void *ctx, int ith, int nth) {
    pool_ctx *c = ctx;
    c->hits[ith]++;
    for (int i = ith; i < 1000; i += nth) c->sum[ith] += i;
}

TEST(base_pool_runs_every_worker) {
    hl_pool *p = NULL;
    hl_err err;
    CHECK_OK(hl_pool_create(4, &p, &err), &err);
    CHECK_EQ_INT(hl_pool_n_threads(p), 4);
    for (int round = 0; round < 200; round++) {
        pool_ctx c;
        memset(&c, 0, sizeof c);
        hl_pool_run(p, pool_work, &c);
        long total = 0;
        for (int i = 0; i < 4; i++) {
            CHECK_EQ_INT(c.hits[i], 1);
            total += c.sum[i];
        }
        CHECK_EQ_INT(total, 999 * 1000 / 2);
    }
    hl_pool_destroy(p);
    pool_ctx c;
    memset(&c, 0, sizeof c);
    hl_pool_run(NULL, pool_work, &c);
    CHECK_EQ_INT(c.sum[0], 999 * 1000 / 2);
}

TEST(base_file_read_write_and_missing) {
    char path[512];
    snprintf(path, sizeof path, "%s/x.bin", test_tmpdir());
    hl_err err;
    CHECK_OK(hl_file_write(path, "hello", 5, &err), &err);
    char *buf = NULL;
    size_t len = 0;
    CHECK_OK(hl_file_read(path, &buf, &len, &err), &err);
    CHECK_EQ_INT(len, 5);
    CHECK_STR(buf, "hello");
    free(buf);
    CHECK_EQ_INT(hl_file_read("/nonexistent/x", &buf, &len, &err), HL_ERR_IO);
    CHECK(strstr(err.msg, "/nonexistent/x") != NULL);
    hl_map m;
    CHECK_OK(hl_map_open(path, &m, &err), &err);
    CHECK_EQ_INT(m.size, 5);
    CHECK(memcmp(m.data, "hello", 5) == 0);
    hl_map_close(&m);
}

TEST(base_file_reads_gzip) {
    const char *p = test_shared_path("models/hf-tokenizers/llama3/tokenizer.json.gz");
    if (!p) SKIP("../shared/models/hf-tokenizers/llama3/tokenizer.json.gz not found");
    char *buf = NULL;
    size_t len = 0;
    hl_err err;
    CHECK_OK(hl_file_read(p, &buf, &len, &err), &err);
    CHECK(len > 1000000);
    CHECK(buf[0] == '{');
    free(buf);
}
