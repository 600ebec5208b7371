/* engine_remote.c - the engine seam over a runner process (engine_remote.h). */
#define _GNU_SOURCE
#include "server/engine_remote.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/random.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/log.h"
#include "base/file.h"
#include "gguf/gguf.h"
#include "net/http_client.h"
#include "server/options.h"
#include "server/runner_srv.h"

#define LAST_LINE_MAX 256
#define DIED_MSG                                                                          \
    "model runner has unexpectedly stopped, this may be due to resource limitations or " \
    "an internal error, check the server logs for details"

struct eremote {
    pid_t pid;
    net_host host;
    tok_vocab *vocab;
    char *chat_template;
    engine_info info;
    _Atomic uint64_t mem_bytes;
    _Atomic uint64_t kv_ram, kv_comp, kv_disk; /* reported with mem_bytes */
    atomic_int inflight; /* generations and embeddings sent to the runner, not yet ended */
    int out_fd;      /* read end of the child's stdout+stderr */
    int lifeline_fd; /* write end of the child's stdin: it exits when this closes */
    pthread_t out_th, reap_th;
    bool out_started, reap_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool exited; /* guarded by mu; cv broadcast when set */
    int exit_status;
    char last_line[LAST_LINE_MAX + 1]; /* guarded by mu */
    atomic_bool dead;
    atomic_llong next_id; /* completion ids, for POST /stop */
    int64_t stall_ns;     /* a request with no runner output for this long fails; 0: none */
    /* this start's secret: the runner answers only paths under "/<secret>/" (it gets
     * the secret in its environment, never on its command line) */
    char secret[RUNNER_SECRET_LEN + 1];
};

/* "/<secret><route>" */
static const char *rpath(const eremote *r, const char *route, char *buf, size_t cap) {
    snprintf(buf, cap, "/%s%s", r->secret, route);
    return buf;
}

static bool make_secret(char out[RUNNER_SECRET_LEN + 1]) {
    static const char hex[] = "0123456789abcdef";
    unsigned char raw[RUNNER_SECRET_LEN / 2];
    size_t got = 0;
    while (got < sizeof raw) {
        ssize_t n = getrandom(raw + got, sizeof raw - got, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return false;
        got += (size_t)n;
    }
    for (size_t i = 0; i < sizeof raw; i++) {
        out[2 * i] = hex[raw[i] >> 4];
        out[2 * i + 1] = hex[raw[i] & 15];
    }
    out[RUNNER_SECRET_LEN] = '\0';
    return true;
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* ---- output capture ---- */

static void write_all(int fd, const char *p, size_t n) {
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return; /* stderr gone: keep draining the pipe anyway */
        p += w;
        n -= (size_t)w;
    }
}

static void keep_line(eremote *r, const char *line, size_t n) {
    while (n > 0 && (line[0] == ' ' || line[0] == '\t' || line[0] == '\r')) line++, n--;
    while (n > 0 && (line[n - 1] == ' ' || line[n - 1] == '\t' || line[n - 1] == '\r')) n--;
    if (n == 0) return;
    pthread_mutex_lock(&r->mu);
    memcpy(r->last_line, line, n);
    r->last_line[n] = '\0';
    pthread_mutex_unlock(&r->mu);
}

static void *out_main(void *arg) {
    eremote *r = arg;
    char buf[65536], cur[LAST_LINE_MAX];
    size_t cur_len = 0;
    for (;;) {
        ssize_t n = read(r->out_fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        write_all(STDERR_FILENO, buf, (size_t)n);
        for (ssize_t i = 0; i < n; i++) {
            if (buf[i] == '\n') {
                keep_line(r, cur, cur_len);
                cur_len = 0;
            } else if (cur_len < sizeof cur) {
                cur[cur_len++] = buf[i]; /* the rest of a long line is not kept */
            }
        }
    }
    keep_line(r, cur, cur_len);
    return NULL;
}

static void *reap_main(void *arg) {
    eremote *r = arg;
    int status = 0;
    while (waitpid(r->pid, &status, 0) < 0 && errno == EINTR) {}
    pthread_mutex_lock(&r->mu);
    r->exited = true;
    r->exit_status = status;
    atomic_store(&r->dead, true);
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

/* Waits up to ms for the child to exit; returns whether it has. */
static bool wait_exit(eremote *r, int ms) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += ms / 1000;
    ts.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
    pthread_mutex_lock(&r->mu);
    while (!r->exited)
        if (pthread_cond_timedwait(&r->cv, &r->mu, &ts) == ETIMEDOUT) break;
    bool ex = r->exited;
    pthread_mutex_unlock(&r->mu);
    return ex;
}

static void describe_exit(int status, char *buf, size_t cap) {
    if (WIFEXITED(status)) snprintf(buf, cap, "exit status %d", WEXITSTATUS(status));
    else if (WIFSIGNALED(status)) snprintf(buf, cap, "signal: %s", strsignal(WTERMSIG(status)));
    else snprintf(buf, cap, "status %d", status);
}

static void last_line(eremote *r, char *buf, size_t cap) {
    pthread_mutex_lock(&r->mu);
    snprintf(buf, cap, "%s", r->last_line);
    pthread_mutex_unlock(&r->mu);
}

/* The runner failed under a request: kill it, let the output drain, describe. */
static hl_status runner_died(eremote *r, hl_err *err) {
    atomic_store(&r->dead, true);
    if (!wait_exit(r, 300)) kill(r->pid, SIGKILL);
    wait_exit(r, 2000);
    sleep_ms(20); /* the output thread copies what the child wrote last */
    char line[LAST_LINE_MAX + 1];
    last_line(r, line, sizeof line);
    /* the startup line names the runner's port and file: for the log, not for clients */
    if (line[0] && strncmp(line, "runner: serving ", 16) != 0)
        return hl_fail(err, HL_ERR_IO, "%s: %s", DIED_MSG, line);
    return hl_fail(err, HL_ERR_IO, "%s", DIED_MSG);
}

/* The runner stopped answering (a health check or a stream went silent): it is killed
 * at once, without the grace runner_died gives a process that is already exiting. */
static void runner_kill(eremote *r) {
    atomic_store(&r->dead, true);
    pthread_mutex_lock(&r->mu);
    bool ex = r->exited;
    pthread_mutex_unlock(&r->mu);
    if (!ex) kill(r->pid, SIGKILL);
    wait_exit(r, 2000);
}

static hl_status runner_stalled(eremote *r, hl_err *err) {
    runner_kill(r);
    HL_WARN("runner pid %d sent nothing for %.1f s: killed", (int)r->pid,
            (double)r->stall_ns / 1e9);
    return hl_fail(err, HL_ERR_IO, "%s: the runner sent nothing for %.1f s", DIED_MSG,
                   (double)r->stall_ns / 1e9);
}

/* ---- spawning ---- */

static hl_status free_port(int *port, hl_err *err) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return hl_fail(err, HL_ERR_IO, "socket: %s", strerror(errno));
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
        close(fd);
        return hl_fail(err, HL_ERR_IO, "cannot find a free port: %s", strerror(errno));
    }
    close(fd);
    *port = ntohs(a.sin_port);
    return HL_OK;
}

/* $a (else $b, may be NULL): integer seconds or a Go duration ("250ms"); dflt when unset
 * or malformed. <= 0 gives 0 ("none"). */
static int64_t env_duration_ns(const char *a, const char *b, int64_t dflt) {
    const char *names[] = {a, b};
    for (int i = 0; i < 2; i++) {
        const char *v = names[i] ? getenv(names[i]) : NULL;
        if (!v || !*v) continue;
        char *end;
        errno = 0;
        long long secs = strtoll(v, &end, 10);
        if (end != v && !*end && !errno)
            return secs <= 0 ? 0 : secs > INT64_MAX / 1000000000LL ? INT64_MAX
                                                                    : secs * 1000000000LL;
        int64_t ns;
        if (opt_parse_duration(v, &ns, NULL) == HL_OK) return ns <= 0 ? 0 : ns;
    }
    return dflt;
}

static int64_t load_timeout_ns(void) {
    int64_t ns = env_duration_ns("HEARTH_LOAD_TIMEOUT", "OLLAMA_LOAD_TIMEOUT",
                                 5LL * 60 * 1000000000LL);
    return ns == 0 ? INT64_MAX : ns;
}

static hl_status spawn(eremote *r, const char *path, const engine_config *cfg, int port,
                       hl_err *err) {
    char exe[PATH_MAX];
    const char *bin = getenv("HEARTH_RUNNER_BIN");
    if (!bin || !*bin) {
        ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
        if (n <= 0) return hl_fail(err, HL_ERR_IO, "cannot find the hearth executable");
        exe[n] = '\0';
        bin = exe;
    }
    char sport[16], sctx[16], sbatch[16], sthr[16];
    snprintf(sport, sizeof sport, "%d", port);
    snprintf(sctx, sizeof sctx, "%d", (int)cfg->num_ctx);
    snprintf(sbatch, sizeof sbatch, "%d", (int)cfg->num_batch);
    snprintf(sthr, sizeof sthr, "%d", cfg->n_threads);
    char *argv[] = {(char *)bin, "runner", "--model", (char *)path, "--port", sport, "--ctx",
                    sctx, "--batch", sbatch, "--threads", sthr, "--mmap",
                    cfg->use_mmap ? "1" : "0", "--kv-type",
                    (char *)(cfg->kv_type && *cfg->kv_type ? cfg->kv_type : "f16"), NULL};
    /* the environment plus the secret (built before fork: the child may not allocate) */
    extern char **environ;
    size_t n_env = 0;
    while (environ[n_env]) n_env++;
    char **envp = malloc((n_env + 2) * sizeof *envp);
    char secret_var[sizeof RUNNER_SECRET_ENV + RUNNER_SECRET_LEN + 2];
    if (!envp) return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    size_t k = 0;
    for (size_t i = 0; i < n_env; i++)
        if (strncmp(environ[i], RUNNER_SECRET_ENV "=", sizeof RUNNER_SECRET_ENV) != 0)
            envp[k++] = environ[i];
    snprintf(secret_var, sizeof secret_var, "%s=%s", RUNNER_SECRET_ENV, r->secret);
    envp[k++] = secret_var;
    envp[k] = NULL;
    int out[2], life[2];
    if (pipe2(out, O_CLOEXEC) != 0) {
        free(envp);
        return hl_fail(err, HL_ERR_IO, "pipe: %s", strerror(errno));
    }
    if (pipe2(life, O_CLOEXEC) != 0) {
        close(out[0]);
        close(out[1]);
        free(envp);
        return hl_fail(err, HL_ERR_IO, "pipe: %s", strerror(errno));
    }
    struct rlimit rl;
    int max_fd = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < 65536 ? (int)rl.rlim_cur
                                                                          : 65536;
    sigset_t all;
    sigfillset(&all);
    pid_t pid = fork();
    if (pid < 0) {
        int e = errno;
        free(envp);
        close(out[0]), close(out[1]), close(life[0]), close(life[1]);
        return hl_fail(err, HL_ERR_IO, "cannot start the runner: %s", strerror(e));
    }
    if (pid == 0) { /* async-signal-safe calls only until exec */
        sigprocmask(SIG_UNBLOCK, &all, NULL); /* serve blocks SIGTERM for sigwait */
        dup2(life[0], STDIN_FILENO);
        dup2(out[1], STDOUT_FILENO);
        dup2(out[1], STDERR_FILENO);
#ifdef SYS_close_range
        if (syscall(SYS_close_range, 3U, ~0U, 0U) != 0)
#endif
            for (int fd = 3; fd < max_fd; fd++) close(fd);
        execve(bin, argv, envp);
        static const char msg[] = "Error: cannot execute the runner\n";
        if (write(STDERR_FILENO, msg, sizeof msg - 1) < 0) {}
        _exit(127);
    }
    free(envp);
    close(out[1]);
    close(life[0]);
    r->pid = pid;
    r->out_fd = out[0];
    r->lifeline_fd = life[1];
    if (pthread_create(&r->reap_th, NULL, reap_main, r) == 0) r->reap_started = true;
    if (pthread_create(&r->out_th, NULL, out_main, r) == 0) r->out_started = true;
    if (!r->reap_started || !r->out_started)
        return hl_fail(err, HL_ERR_NOMEM, "cannot start the runner's threads");
    return HL_OK;
}

/* The memory figures a runner sends at load (health) and after each request. */
static void apply_mem(eremote *r, const json_t *j) {
    atomic_store(&r->mem_bytes, (uint64_t)json_integer_value(json_object_get(j, "mem_bytes")));
    atomic_store(&r->kv_ram, (uint64_t)json_integer_value(json_object_get(j, "kv_ram")));
    atomic_store(&r->kv_comp, (uint64_t)json_integer_value(json_object_get(j, "kv_compressed")));
    atomic_store(&r->kv_disk, (uint64_t)json_integer_value(json_object_get(j, "kv_disk")));
}

static void apply_health(eremote *r, const json_t *j) {
    r->info.n_ctx = (int32_t)json_integer_value(json_object_get(j, "n_ctx"));
    r->info.n_ctx_train = (int32_t)json_integer_value(json_object_get(j, "n_ctx_train"));
    r->info.n_embd = (int32_t)json_integer_value(json_object_get(j, "n_embd"));
    r->info.n_vocab = (int32_t)json_integer_value(json_object_get(j, "n_vocab"));
    r->info.pooling = (int)json_integer_value(json_object_get(j, "pooling"));
    r->info.embedding_only = json_is_true(json_object_get(j, "embedding_only"));
    r->info.n_parallel = (int32_t)json_integer_value(json_object_get(j, "n_parallel"));
    apply_mem(r, j);
}

/* One GET /health with a short timeout: 1 ready, 0 not (yet) answering. */
static int health_once(eremote *r) {
    net_http *h;
    char path[64];
    if (net_http_open(&r->host, "GET", rpath(r, "/health", path, sizeof path), NULL, -1, &h,
                      NULL) != HL_OK)
        return 0;
    net_http_set_timeout(h, 1000);
    int ready = 0;
    char *body = NULL;
    size_t len;
    if (net_http_finish(h, NULL) == HL_OK && net_http_status(h) == 200 &&
        net_http_read_all(h, 1 << 20, &body, &len, NULL) == HL_OK) {
        json_t *j = json_loadb(body, len, 0, NULL);
        if (j && !strcmp(json_string_value(json_object_get(j, "status")) ?: "", "ok")) {
            apply_health(r, j);
            ready = 1;
        }
        json_decref(j);
    }
    free(body);
    net_http_close(h);
    return ready;
}

static hl_status wait_ready(eremote *r, const engine_config *cfg, hl_err *err) {
    int64_t limit = load_timeout_ns();
    uint64_t t0 = hl_time_ns();
    for (;;) {
        if (health_once(r)) return HL_OK;
        pthread_mutex_lock(&r->mu);
        bool ex = r->exited;
        int status = r->exit_status;
        pthread_mutex_unlock(&r->mu);
        if (ex) {
            if (r->out_started) { /* all the child wrote is read once the pipe closes */
                pthread_join(r->out_th, NULL);
                r->out_started = false;
            }
            char how[64], line[LAST_LINE_MAX + 1];
            describe_exit(status, how, sizeof how);
            last_line(r, line, sizeof line);
            return hl_fail(err, HL_ERR_IO, "llama runner process has terminated: %s%s%s", how,
                           line[0] ? ": " : "", line);
        }
        if (cfg->abort && atomic_load(cfg->abort))
            return hl_fail(err, HL_ERR_CANCELLED, "server shutting down");
        if ((int64_t)(hl_time_ns() - t0) > limit) {
            char line[LAST_LINE_MAX + 1];
            last_line(r, line, sizeof line);
            return hl_fail(err, HL_ERR_TIMEOUT, "timed out waiting for llama runner to start%s%s",
                           line[0] ? ": " : "", line);
        }
        sleep_ms(50);
    }
}

static char *read_template(const gguf_file *f) {
    gguf_str s;
    if (!gguf_get_str(f, "tokenizer.chat_template", &s) || s.len == 0) return NULL;
    char *t = malloc(s.len + 1);
    if (t) {
        memcpy(t, s.ptr, s.len);
        t[s.len] = '\0';
    }
    return t;
}

hl_status eremote_open(const char *gguf_path, const engine_config *cfg, eremote **out,
                       hl_err *err) {
    *out = NULL;
    eremote *r = calloc(1, sizeof *r);
    if (!r) return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    r->out_fd = r->lifeline_fd = -1;
    /* generous: the runner beats only between prefill chunks, and one chunk of a large
     * model on a small CPU can take minutes; this catches a runner that is stuck */
    r->stall_ns = env_duration_ns("HEARTH_RUNNER_STALL_TIMEOUT", NULL, 20LL * 60 * 1000000000LL);
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    /* the tokenizer lives here too: requests are tokenized and rendered in the server */
    gguf_file *f = NULL;
    hl_status st = gguf_open(gguf_path, &f, err);
    if (!st) {
        st = tok_vocab_load_gguf(f, &r->vocab, err);
        r->chat_template = read_template(f);
        gguf_close(f);
    }
    int port = 0;
    if (!st && !make_secret(r->secret))
        st = hl_fail(err, HL_ERR_IO, "cannot draw the runner's secret: %s", strerror(errno));
    if (!st) st = free_port(&port, err);
    if (!st) {
        net_host_parse("127.0.0.1", &r->host, NULL);
        r->host.port = port;
        st = spawn(r, gguf_path, cfg, port, err);
    }
    if (!st) st = wait_ready(r, cfg, err);
    if (st) {
        eremote_close(r);
        return st;
    }
    *out = r;
    return HL_OK;
}

void eremote_close(eremote *r) {
    if (!r) return;
    if (r->pid > 0) {
        pthread_mutex_lock(&r->mu);
        bool ex = r->exited;
        pthread_mutex_unlock(&r->mu);
        if (!ex) kill(r->pid, SIGKILL);
    }
    if (r->lifeline_fd >= 0) close(r->lifeline_fd);
    if (r->reap_started) pthread_join(r->reap_th, NULL);
    if (r->out_started) pthread_join(r->out_th, NULL);
    if (r->out_fd >= 0) close(r->out_fd);
    tok_vocab_destroy(r->vocab);
    free(r->chat_template);
    pthread_cond_destroy(&r->cv);
    pthread_mutex_destroy(&r->mu);
    free(r);
}

const tok_vocab *eremote_vocab(const eremote *r) { return r->vocab; }
const char *eremote_chat_template(const eremote *r) { return r->chat_template; }

void eremote_get_info(const eremote *r, engine_info *out) {
    *out = r->info;
    eremote *rw = (eremote *)r; /* the atomics are not part of the observable state */
    out->mem_bytes = atomic_load(&rw->mem_bytes);
    out->kv_ram_bytes = atomic_load(&rw->kv_ram);
    out->kv_compressed_bytes = atomic_load(&rw->kv_comp);
    out->kv_disk_bytes = atomic_load(&rw->kv_disk);
    /* the runner's queue: what was sent to it past its slots (the requests in flight
     * are in the runner but for the moment they take to cross loopback) */
    int n = atomic_load(&rw->inflight);
    out->queued = r->info.n_parallel > 0 && n > r->info.n_parallel ? n - r->info.n_parallel : 0;
}

/* GET /health on a raw non-blocking socket, every step (connect included: a runner whose
 * listen queue is full would otherwise block it for minutes) bounded by one deadline. */
static bool health_within(eremote *r, int timeout_ms) {
    uint64_t deadline = hl_time_ns() + (uint64_t)timeout_ms * 1000000ULL;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return false;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)r->host.port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    char req[192], resp[4096];
    int req_len = snprintf(req, sizeof req,
                           "GET /%s/health HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n"
                           "Connection: close\r\n\r\n", r->secret, r->host.port);
    size_t sent = 0, got = 0;
    bool ok = false, connected = false;
    if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0) connected = true;
    else if (errno != EINPROGRESS) goto done;
    for (;;) {
        int64_t left_ms = ((int64_t)deadline - (int64_t)hl_time_ns()) / 1000000;
        if (left_ms <= 0) goto done;
        bool writing = !connected || sent < (size_t)req_len;
        struct pollfd pfd = {.fd = fd, .events = writing ? POLLOUT : POLLIN};
        int pr = poll(&pfd, 1, (int)(left_ms > 1000 ? 1000 : left_ms));
        if (pr < 0 && errno != EINTR) goto done;
        if (pr <= 0) continue;
        if (!connected) {
            int e = 0;
            socklen_t el = sizeof e;
            if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &el) != 0 || e != 0) goto done;
            connected = true;
            continue;
        }
        if (writing) {
            ssize_t w = send(fd, req + sent, (size_t)req_len - sent, MSG_NOSIGNAL);
            if (w < 0 && errno != EAGAIN && errno != EINTR) goto done;
            if (w > 0) sent += (size_t)w;
            continue;
        }
        ssize_t n = recv(fd, resp + got, sizeof resp - 1 - got, 0);
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
        if (n < 0) goto done;
        got += (size_t)n;
        if (n == 0 || got == sizeof resp - 1) break; /* closed, or more than a health reply */
    }
    resp[got] = '\0';
    const char *body = strstr(resp, "\r\n\r\n");
    if (body && (!strncmp(resp, "HTTP/1.1 200", 12) || !strncmp(resp, "HTTP/1.0 200", 12))) {
        json_t *j = json_loads(body + 4, 0, NULL);
        ok = j && !strcmp(json_string_value(json_object_get(j, "status")) ?: "", "ok");
        json_decref(j);
    }
done:
    close(fd);
    return ok;
}

bool eremote_ping(eremote *r, int timeout_ms) {
    if (!eremote_alive(r)) return false;
    if (health_within(r, timeout_ms)) return true;
    if (!eremote_alive(r)) return false; /* it exited meanwhile: the crash path unloads it */
    HL_WARN("runner pid %d did not answer its health check within %d ms: killed", (int)r->pid,
            timeout_ms);
    runner_kill(r);
    return false;
}

bool eremote_alive(const eremote *r) { return !atomic_load(&((eremote *)r)->dead); }
int eremote_pid(const eremote *r) { return (int)r->pid; }

/* ---- requests ---- */

static json_t *request_json(const engine_request *req, long long id) {
    json_t *toks = json_array();
    for (size_t i = 0; i < req->n_prompt; i++) json_array_append_new(toks, json_integer(req->prompt[i]));
    const sampler_opts *sp = &req->sp;
    json_t *o = json_pack("{s:f, s:i, s:f, s:f, s:f, s:i, s:f, s:f, s:I, s:b, s:i, s:i}",
                          "temperature", (double)sp->temperature, "top_k", sp->top_k, "top_p",
                          (double)sp->top_p, "min_p", (double)sp->min_p, "repeat_penalty",
                          (double)sp->repeat_penalty, "repeat_last_n", sp->repeat_last_n,
                          "presence_penalty", (double)sp->presence_penalty,
                          "frequency_penalty", (double)sp->frequency_penalty, "seed",
                          (json_int_t)sp->seed, "logprobs", sp->logprobs, "top_logprobs",
                          sp->top_logprobs, "order", (int)sp->order);
    json_t *snaps = json_array();
    for (size_t i = 0; i < req->n_snapshot_at; i++)
        json_array_append_new(snaps, json_integer(req->snapshot_at[i]));
    json_t *body = json_pack("{s:o, s:I, s:o, s:I, s:o}", "prompt", toks, "num_predict",
                             (json_int_t)req->num_predict, "options", o, "id", (json_int_t)id,
                             "snapshot_at", snaps);
    if (req->format) { /* the runner masks: the logits never come back here */
        json_object_set_new(body, "format", json_string(req->format));
        if (req->think_open) json_object_set_new(body, "think_open", json_string(req->think_open));
        if (req->think_close)
            json_object_set_new(body, "think_close", json_string(req->think_close));
        json_object_set_new(body, "in_think", json_boolean(req->in_think));
        if (req->trigger) json_object_set_new(body, "trigger", json_string(req->trigger));
        if (req->trigger_end)
            json_object_set_new(body, "trigger_end", json_string(req->trigger_end));
        json_object_set_new(body, "trigger_now", json_boolean(req->trigger_now));
    }
    return body;
}

/* Every read from the runner waits in slices (net_http_set_waiter): between them the
 * request may be cancelled, the runner may have exited, or it may have been silent for
 * the stall timeout. `why` says which ended the read. */
enum { WAIT_NONE, WAIT_CANCELLED, WAIT_DIED, WAIT_STALLED };

typedef struct read_wait {
    eremote *r;
    const engine_request *req; /* NULL: not cancellable */
    uint64_t last_out;         /* the runner's last line (or the request's start) */
    int why;
} read_wait;

static hl_status read_waiter(void *ud, hl_err *err) {
    read_wait *w = ud;
    if (w->req && w->req->cancelled && w->req->cancelled(w->req->ud)) {
        w->why = WAIT_CANCELLED;
        return hl_fail(err, HL_ERR_CANCELLED, "request cancelled");
    }
    if (!eremote_alive(w->r)) {
        w->why = WAIT_DIED;
        return hl_fail(err, HL_ERR_IO, "the runner exited");
    }
    /* the runner sends a line per token and a heartbeat while queued or in prefill:
     * silence this long means it is stuck */
    if (w->r->stall_ns > 0 && (int64_t)(hl_time_ns() - w->last_out) > w->r->stall_ns) {
        w->why = WAIT_STALLED;
        return hl_fail(err, HL_ERR_TIMEOUT, "the runner stalled");
    }
    return HL_OK;
}

/* A read from the runner failed with st: a cancellation stays one; otherwise the runner
 * is killed and the request fails with the runner-stopped message. */
static hl_status read_failed(eremote *r, const read_wait *w, hl_status st, hl_err *err) {
    if (w->why == WAIT_CANCELLED) return st;
    if (w->why == WAIT_STALLED) return runner_stalled(r, err);
    return runner_died(r, err);
}

/* POSTs text and reads the response headers, waiting as w says. */
static hl_status post_text(eremote *r, const char *path, const char *text, read_wait *w,
                           net_http **out, hl_err *err) {
    size_t len = strlen(text);
    net_http *h = NULL;
    char full[128];
    hl_status st = net_http_open(&r->host, "POST", rpath(r, path, full, sizeof full),
                                 "application/json", (int64_t)len, &h, err);
    if (!st) {
        net_http_set_waiter(h, read_waiter, w);
        /* sending a large body must not block forever either */
        if (r->stall_ns > 0)
            net_http_set_timeout(h, r->stall_ns / 1000000 > INT_MAX ? INT_MAX
                                                                    : (int)(r->stall_ns / 1000000));
        st = net_http_send(h, text, len, err);
    }
    if (!st) st = net_http_finish(h, err);
    if (st) {
        net_http_close(h);
        return read_failed(r, w, st, err);
    }
    *out = h;
    return HL_OK;
}

static hl_status post_json(eremote *r, const char *path, json_t *body, read_wait *w,
                           net_http **out, hl_err *err) {
    char *text = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    if (!text) return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    hl_status st = post_text(r, path, text, w, out, err);
    free(text);
    return st;
}

static hl_status error_line(const json_t *j, hl_err *err) {
    int code = (int)json_integer_value(json_object_get(j, "code"));
    if (code >= 0 || code < HL_ERR_BUSY) code = HL_ERR_IO;
    return hl_fail(err, (hl_status)code, "%s", json_string_value(json_object_get(j, "error")) ?: "");
}

static hl_status generate(eremote *r, const engine_request *req, engine_stats *stats,
                          hl_err *err) {
    *stats = (engine_stats){0};
    if (!eremote_alive(r)) return runner_died(r, err);
    net_http *h;
    long long id = atomic_fetch_add(&r->next_id, 1) + 1;
    read_wait w = {.r = r, .req = req, .last_out = hl_time_ns()};
    hl_status st = post_json(r, "/completion", request_json(req, id), &w, &h, err);
    if (st) return st;
    int32_t n_tok = 0;
    bool finished = false, stopped = false;
    while (!finished) {
        if (req->cancelled && req->cancelled(req->ud)) {
            st = hl_fail(err, HL_ERR_CANCELLED, "request cancelled");
            break;
        }
        char *line;
        size_t len;
        st = net_http_read_line(h, &line, &len, err);
        if (st || !line) { /* the stream broke (or went silent) before its final line */
            st = st ? read_failed(r, &w, st, err) : runner_died(r, err);
            break;
        }
        w.last_out = hl_time_ns();
        json_t *j = json_loadb(line, len, 0, NULL);
        if (!j) {
            st = hl_fail(err, HL_ERR_FORMAT, "bad line from the runner: %.80s", line);
            break;
        }
        json_t *t = json_object_get(j, "t");
        if (json_is_integer(t)) {
            sampler_out so = {.token = (int32_t)json_integer_value(t)};
            if (req->sp.logprobs) {
                so.logprob = (float)json_number_value(json_object_get(j, "l"));
                size_t i;
                json_t *pair;
                json_array_foreach(json_object_get(j, "k"), i, pair) {
                    if (i >= SAMPLER_MAX_TOP_LOGPROBS) break;
                    so.top_tokens[i] = (int32_t)json_integer_value(json_array_get(pair, 0));
                    so.top_logprobs[i] = (float)json_number_value(json_array_get(pair, 1));
                    so.n_top = (int32_t)i + 1;
                }
            }
            if (stopped) { /* sampled before the runner saw the stop: dropped */
                json_decref(j);
                continue;
            }
            n_tok++;
            if (req->on_token(req->ud, so.token, &so)) {
                /* a stop string: the runner ends the sequence and still sends the stats */
                stopped = true;
                char body[64];
                snprintf(body, sizeof body, "{\"id\":%lld}", id);
                net_http *sh;
                read_wait sw = {.r = r, .last_out = hl_time_ns()};
                if (post_text(r, "/stop", body, &sw, &sh, NULL) == HL_OK) {
                    char *resp = NULL;
                    size_t rlen;
                    net_http_read_all(sh, 1 << 16, &resp, &rlen, NULL);
                    free(resp);
                    net_http_close(sh);
                }
            }
        } else if (json_is_true(json_object_get(j, "done"))) {
            json_t *s = json_object_get(j, "stats");
            stats->prompt_eval_count = (int32_t)json_integer_value(json_object_get(s, "prompt_eval_count"));
            stats->prompt_eval_ns = (uint64_t)json_integer_value(json_object_get(s, "prompt_eval_ns"));
            stats->cached_tokens = (int32_t)json_integer_value(json_object_get(s, "cached_tokens"));
            stats->cached_disk = (int32_t)json_integer_value(json_object_get(s, "cached_disk"));
            stats->cached_remote = (int32_t)json_integer_value(json_object_get(s, "cached_remote"));
            stats->eval_count = (int32_t)json_integer_value(json_object_get(s, "eval_count"));
            stats->eval_ns = (uint64_t)json_integer_value(json_object_get(s, "eval_ns"));
            stats->done = json_integer_value(json_object_get(s, "done")) == ENGINE_DONE_LENGTH
                              ? ENGINE_DONE_LENGTH
                              : ENGINE_DONE_STOP;
            apply_mem(r, j);
            if (stopped) {
                stats->eval_count = n_tok;
                stats->done = ENGINE_DONE_STOP;
            }
            finished = true;
        } else if (json_object_get(j, "error")) {
            st = error_line(j, err);
            finished = true;
        }
        json_decref(j);
    }
    net_http_close(h); /* early: the runner sees the connection go and cancels */
    return st;
}

static hl_status embed(eremote *r, const int32_t *tokens, size_t n, float *out, hl_err *err) {
    if (!eremote_alive(r)) return runner_died(r, err);
    json_t *toks = json_array();
    for (size_t i = 0; i < n; i++) json_array_append_new(toks, json_integer(tokens[i]));
    net_http *h;
    read_wait w = {.r = r, .last_out = hl_time_ns()};
    hl_status st = post_json(r, "/embedding", json_pack("{s:o}", "tokens", toks), &w, &h, err);
    if (st) return st;
    char *body = NULL;
    size_t len;
    st = net_http_read_all(h, (size_t)1 << 30, &body, &len, err);
    net_http_close(h);
    if (st) {
        free(body);
        return read_failed(r, &w, st, err);
    }
    json_t *j = json_loadb(body, len, 0, NULL);
    free(body);
    json_t *e = json_object_get(j, "embedding");
    if (json_is_array(e) && json_array_size(e) == (size_t)r->info.n_embd) {
        for (size_t i = 0; i < json_array_size(e); i++)
            out[i] = (float)json_number_value(json_array_get(e, i));
        apply_mem(r, j);
    } else if (j && json_object_get(j, "error")) {
        st = error_line(j, err);
    } else {
        st = hl_fail(err, HL_ERR_FORMAT, "bad embedding reply from the runner");
    }
    json_decref(j);
    return st;
}

/* Both count as in flight for the queue depth (eremote_get_info). */
hl_status eremote_generate(eremote *r, const engine_request *req, engine_stats *stats,
                           hl_err *err) {
    atomic_fetch_add(&r->inflight, 1);
    hl_status st = generate(r, req, stats, err);
    atomic_fetch_sub(&r->inflight, 1);
    return st;
}

hl_status eremote_embed(eremote *r, const int32_t *tokens, size_t n, float *out, hl_err *err) {
    atomic_fetch_add(&r->inflight, 1);
    hl_status st = embed(r, tokens, n, out, err);
    atomic_fetch_sub(&r->inflight, 1);
    return st;
}
