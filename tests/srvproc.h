/*
 * srvproc.h - test helper: `$HEARTH_BIN serve` as a child process on a free loopback
 * port with its own store under the test's temp dir and extra environment, plus small
 * request helpers (used by test_server.c, test_api.c, test_compat.c, test_sched.c and
 * test_load.c). Every function is safe to call after a failed spawn; sp_stop() always
 * reaps the child.
 */
#ifndef HL_TESTS_SRVPROC_H
#define HL_TESTS_SRVPROC_H

#include <jansson.h>
#include <stdbool.h>
#include <sys/types.h>

#include "net/host.h"
#include "server/server.h"

typedef struct srv_proc {
    pid_t pid;
    int port;
    net_host host;
    char models[1024];
    char log[1024];
} srv_proc;

/* A loopback port nothing listens on just now (for a child server to bind), or -1. */
int sp_free_port(void);

/* env: NULL-terminated "NAME=value" list (may be NULL). Returns 0, 1 when HEARTH_BIN is
 * not set, -1 when the server did not come up. */
int sp_spawn(srv_proc *p, const char *tag, const char *const *env);
/* SIGTERM, wait (10 s), then SIGKILL. Returns the exit code (128+signal), -2 if killed. */
int sp_stop(srv_proc *p);
void sp_dump_log(const srv_proc *p);

/* Runs body_fn(&p) with a fresh server (tag names its store and log; env as for
 * sp_spawn) and always stops it. setup (NULL for none) runs first: false fails the test and skips the body. A
 * server that does not start or exits nonzero (e.g. a sanitizer report) fails the test;
 * on any failure the server log is dumped. */
#define SP_WITH_SERVER(tag, env, setup, body_fn)                                         \
    do {                                                                                 \
        srv_proc p_;                                                                     \
        int rc_ = sp_spawn(&p_, tag, env);                                               \
        if (rc_ == 1) SKIP("HEARTH_BIN not set (run through make test)");                \
        if (rc_ != 0) {                                                                  \
            sp_dump_log(&p_);                                                            \
            sp_stop(&p_);                                                                \
            CHECK_MSG(false, "server did not start");                                    \
        }                                                                                \
        bool (*setup_)(const srv_proc *) = (setup);                                      \
        if (!setup_ || setup_(&p_)) body_fn(&p_);                                        \
        else test_fail_at(__FILE__, __LINE__, "could not create the test models");       \
        bool failed_ = test_failed();                                                    \
        int exit_ = sp_stop(&p_);                                                        \
        if (failed_ || exit_ != 0) sp_dump_log(&p_);                                     \
        CHECK_EQ_INT(exit_, 0);                                                          \
    } while (0)

/* Starts the server in this process on a free loopback port, with its store in the
 * test's temp dir (sets cfg's models_dir, which points into p, and bind); p gets the
 * port and host (pid 0: stop it with server_stop, not sp_stop). */
hl_status sp_start_in_process(server_config *cfg, hl_server **srv, srv_proc *p, hl_err *err);

/* A whole request; *out (may be NULL) gets the parsed JSON body or NULL. Returns the
 * HTTP status or -1. */
int sp_req(const srv_proc *p, const char *method, const char *path, const char *body,
           json_t **out);
/* Uploads a file as a blob the way the CLI does (HEAD first, POST only when the server
 * lacks it); digest gets "sha256:<hex>". Returns the last HTTP status or -1. */
int sp_upload_file(const srv_proc *p, const char *path, char digest[80]);
/* Creates `name` from a GGUF (extra: a JSON fragment of create fields, or ""). */
bool sp_create_model(const srv_proc *p, const char *name, const char *gguf, const char *extra);
/* The prefix cache's directory of the only model in p's store (models/kvcache/sha256-...),
 * with "/sub" appended when sub is not NULL. False when there is none yet. */
bool sp_kv_dir(const srv_proc *p, const char *sub, char *out, size_t n);
/* /api/ps "models" entries: count, and whether `name` is listed. */
int sp_ps_count(const srv_proc *p);
bool sp_ps_has(const srv_proc *p, const char *name);
/* Runs `$HEARTH_BIN args...` (args: NULL-terminated, 14 at most) with HEARTH_HOST set to
 * the server on port. stdin_text: piped in (NULL: the CLI inherits this process's stdin).
 * Its stdout and stderr land in out and err (cut to their caps). Returns its exit code
 * (128 when a signal ended it). */
int sp_run_cli(int port, const char *stdin_text, const char *const *args, char *out,
               size_t out_cap, char *err, size_t err_cap);
/* The pids of the direct children of pid (runner processes), up to cap; returns count. */
int sp_children(pid_t pid, pid_t *out, int cap);
/* Resident set size of a process in bytes (0 if unknown). */
long sp_rss(pid_t pid);
void sp_sleep_ms(int ms);

/* Whether a `node` executable is on PATH (the npm client tests skip without it). */
bool sp_node_available(void);
/* Runs `node SCRIPT ARG1 [ARG2]` from the repository root with HEARTH_URL pointing at the
 * server, for at most 60 s (then killed). Returns true when it exited 0; *output (may be
 * NULL) gets its combined stdout/stderr, malloc'd, for the failure message. */
bool sp_run_node(const srv_proc *p, const char *script, const char *arg1, const char *arg2,
                 char **output);

#endif
