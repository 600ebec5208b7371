/*
 * test.h - hearth's test harness.
 *
 *   TEST(gguf_reads_header) { CHECK(x == 1); CHECK_EQ_INT(a, b); }
 *
 * Tests register themselves at load time. The runner (tests/harness.c) runs each in
 * a forked child with a time limit, so a crash or hang is one failure, not the end
 * of the run; it ends with "N passed, N failed, N skipped". A failing CHECK prints
 * file:line and the values, marks the test failed, and returns from it.
 *
 * Test data from ../shared is found with test_shared_path(); when it is absent a
 * test calls SKIP("...") with a message saying what is missing. The harness owns the
 * strings it returns (test_shared_path: rotating static buffers; test_tmpdir: removed
 * with its contents after each test); a test frees what it allocates.
 */
#ifndef HL_TEST_H
#define HL_TEST_H

#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "base/status.h"

typedef void (*test_fn)(void);
void test_register(const char *name, test_fn fn, const char *file);
void test_fail_at(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void test_skip(const char *why);
bool test_failed(void);

/* Path of a file under the shared data directory ($HEARTH_SHARED, else ../shared
 * relative to the working directory), or NULL if it does not exist. The returned
 * string is valid until the next call (a few rotating static buffers). */
const char *test_shared_path(const char *rel);
/* A fresh temporary directory for this test (removed after the test). */
const char *test_tmpdir(void);

#define TEST(name)                                                                       \
    static void test_##name(void);                                                      \
    __attribute__((constructor)) static void test_register_##name(void) {              \
        test_register(#name, test_##name, __FILE__);                                   \
    }                                                                                   \
    static void test_##name(void)

#define CHECK(cond)                                                                      \
    do {                                                                                \
        if (!(cond)) {                                                                  \
            test_fail_at(__FILE__, __LINE__, "CHECK(%s)", #cond);                        \
            return;                                                                     \
        }                                                                               \
    } while (0)

#define CHECK_MSG(cond, ...)                                                             \
    do {                                                                                \
        if (!(cond)) {                                                                  \
            test_fail_at(__FILE__, __LINE__, __VA_ARGS__);                               \
            return;                                                                     \
        }                                                                               \
    } while (0)

#define CHECK_EQ_INT(a, b)                                                               \
    do {                                                                                \
        long long check_a_ = (long long)(a), check_b_ = (long long)(b);                 \
        if (check_a_ != check_b_) {                                                     \
            test_fail_at(__FILE__, __LINE__, "%s == %s: %lld != %lld", #a, #b, check_a_, \
                         check_b_);                                                     \
            return;                                                                     \
        }                                                                               \
    } while (0)

#define CHECK_NEAR(a, b, tol)                                                            \
    do {                                                                                \
        double check_a_ = (double)(a), check_b_ = (double)(b);                          \
        if (!(fabs(check_a_ - check_b_) <= (double)(tol))) {                            \
            test_fail_at(__FILE__, __LINE__, "%s ~= %s: %.9g vs %.9g (tol %g)", #a, #b,  \
                         check_a_, check_b_, (double)(tol));                             \
            return;                                                                     \
        }                                                                               \
    } while (0)

#define CHECK_STR(a, b)                                                                  \
    do {                                                                                \
        const char *check_a_ = (a), *check_b_ = (b);                                    \
        if (!check_a_ || !check_b_ || strcmp(check_a_, check_b_) != 0) {                \
            test_fail_at(__FILE__, __LINE__, "%s == %s: \"%s\" != \"%s\"", #a, #b,       \
                         check_a_ ? check_a_ : "(null)", check_b_ ? check_b_ : "(null)");\
            return;                                                                     \
        }                                                                               \
    } while (0)

/* Checks an hl_status is HL_OK, printing the hl_err message otherwise. */
#define CHECK_OK(status, errp)                                                           \
    do {                                                                                \
        int check_s_ = (int)(status);                                                   \
        if (check_s_ != 0) {                                                            \
            const hl_err *check_e_ = (errp);                                            \
            test_fail_at(__FILE__, __LINE__, "%s failed (%d): %s", #status, check_s_,    \
                         check_e_ ? check_e_->msg : "");                                \
            return;                                                                     \
        }                                                                               \
    } while (0)

#define SKIP(why)                                                                        \
    do {                                                                                \
        test_skip(why);                                                                 \
        return;                                                                         \
    } while (0)

#endif
