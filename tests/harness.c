/*
 * harness.c - the test runner: `hearth-tests [-n] [-v] [FILTER...]`.
 *
 * Runs every registered test whose name or file contains one of the FILTER strings
 * (all when none). Each test runs in a forked child (-n: in-process, for gdb), with
 * a per-test time limit ($HEARTH_TEST_TIMEOUT seconds, default 120). The last line
 * printed is "N passed, N failed, N skipped"; the exit status is nonzero on failure.
 */
#define _GNU_SOURCE
#include "test.h"

#include <stdarg.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <ftw.h>

typedef struct test_case {
    const char *name;
    test_fn fn;
    const char *file;
} test_case;

static test_case *g_tests;
static size_t g_n_tests, g_cap_tests;
static bool g_failed;
static bool g_skipped;
static char g_skip_why[512];
static char g_tmpdir[256];

void test_register(const char *name, test_fn fn, const char *file) {
    if (g_n_tests == g_cap_tests) {
        g_cap_tests = g_cap_tests ? g_cap_tests * 2 : 256;
        g_tests = realloc(g_tests, g_cap_tests * sizeof *g_tests);
        if (!g_tests) abort();
    }
    g_tests[g_n_tests++] = (test_case){name, fn, file};
}

void test_fail_at(const char *file, int line, const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "    %s:%d: ", file, line);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    g_failed = true;
}

void test_skip(const char *why) {
    g_skipped = true;
    snprintf(g_skip_why, sizeof g_skip_why, "%s", why);
}

bool test_failed(void) { return g_failed; }

const char *test_shared_path(const char *rel) {
    static char bufs[4][1024];
    static int next;
    const char *root = getenv("HEARTH_SHARED");
    if (!root || !*root) root = "../shared";
    char *b = bufs[next++ & 3];
    snprintf(b, sizeof bufs[0], "%s/%s", root, rel);
    struct stat st;
    return stat(b, &st) == 0 ? b : NULL;
}

const char *test_tmpdir(void) {
    if (!g_tmpdir[0]) {
        const char *base = getenv("TMPDIR");
        snprintf(g_tmpdir, sizeof g_tmpdir, "%s/hearth-test-XXXXXX", base && *base ? base : "/tmp");
        if (!mkdtemp(g_tmpdir)) {
            g_tmpdir[0] = '\0';
            return "/tmp";
        }
    }
    return g_tmpdir;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb; (void)flag; (void)ftw;
    return remove(path);
}

static void cleanup_tmpdir(void) {
    if (g_tmpdir[0]) nftw(g_tmpdir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    g_tmpdir[0] = '\0';
}

/* 0 = pass, 1 = fail, 2 = skip */
static int run_in_process(const test_case *t) {
    g_failed = g_skipped = false;
    t->fn();
    cleanup_tmpdir();
    if (g_failed) return 1;
    return g_skipped ? 2 : 0;
}

static int run_forked(const test_case *t, int timeout_s) {
    int pipefd[2];
    if (pipe(pipefd) != 0) return run_in_process(t);
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) return run_in_process(t);
    if (pid == 0) {
        close(pipefd[0]);
        alarm((unsigned)timeout_s);
        int r = run_in_process(t);
        if (r == 2) {
            ssize_t w = write(pipefd[1], g_skip_why, strlen(g_skip_why));
            (void)w;
        }
        close(pipefd[1]);
        fflush(stdout);
        fflush(stderr);
        _exit(r);
    }
    close(pipefd[1]);
    ssize_t n = read(pipefd[0], g_skip_why, sizeof g_skip_why - 1);
    g_skip_why[n > 0 ? n : 0] = '\0';
    close(pipefd[0]);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0) {
    }
    if (WIFEXITED(status)) {
        int code = WEXITSTATUS(status);
        return code <= 2 ? code : 1;
    }
    if (WIFSIGNALED(status)) {
        int sig = WTERMSIG(status);
        fprintf(stderr, "    %s: %s\n", t->name,
                sig == SIGALRM ? "timed out" : strsignal(sig));
    }
    return 1;
}

static bool matches(const test_case *t, int n_filters, char **filters) {
    if (n_filters == 0) return true;
    for (int i = 0; i < n_filters; i++)
        if (strstr(t->name, filters[i]) || strstr(t->file, filters[i])) return true;
    return false;
}

int main(int argc, char **argv) {
    bool fork_tests = true, verbose = false;
    char **filters = calloc((size_t)argc, sizeof *filters);
    int n_filters = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-n") == 0) fork_tests = false;
        else if (strcmp(argv[i], "-v") == 0) verbose = true;
        else filters[n_filters++] = argv[i];
    }
    const char *to = getenv("HEARTH_TEST_TIMEOUT");
    int timeout_s = to && atoi(to) > 0 ? atoi(to) : 120;
    int passed = 0, failed = 0, skipped = 0;
    for (size_t i = 0; i < g_n_tests; i++) {
        const test_case *t = &g_tests[i];
        if (!matches(t, n_filters, filters)) continue;
        if (verbose) {
            printf("  run  %s\n", t->name);
            fflush(stdout);
        }
        g_skip_why[0] = '\0';
        int r = fork_tests ? run_forked(t, timeout_s) : run_in_process(t);
        if (r == 0) {
            passed++;
            if (verbose) printf("  ok   %s\n", t->name);
        } else if (r == 2) {
            skipped++;
            printf("  skip %s: %s\n", t->name, g_skip_why);
        } else {
            failed++;
            printf("  FAIL %s (%s)\n", t->name, t->file);
        }
        fflush(stdout);
    }
    free(filters);
    printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
    return failed ? 1 : 0;
}
