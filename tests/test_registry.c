/* test_registry.c - pull and push against a real OCI registry: Debian's docker-registry
 * (the reference distribution server) started on loopback with its storage in the
 * test's temp dir, and `hearth serve`. A small loopback proxy between the two counts
 * blob requests and Range headers and can cut a blob transfer or flip a byte in it. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pty.h>
#include <pthread.h>
#include <stdatomic.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/file.h"
#include "net/http_client.h"
#include "srvproc.h"
#include "store/sha256.h"
#include "test.h"

#define REGISTRY_BIN "/usr/bin/docker-registry"

static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    int port = -1;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0) close(fd);
    return port;
}

/* ---- the registry ---- */

typedef struct registry {
    pid_t pid;
    int port;
} registry;

static bool registry_start(registry *r) {
    r->pid = -1;
    r->port = free_port();
    char cfg[1024], root[1024], log[1024];
    snprintf(root, sizeof root, "%s/registry", test_tmpdir());
    snprintf(cfg, sizeof cfg, "%s/registry.yml", test_tmpdir());
    snprintf(log, sizeof log, "%s/registry.log", test_tmpdir());
    char text[4096];
    snprintf(text, sizeof text,
             "version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\n"
             "storage:\n  filesystem:\n    rootdirectory: %s\n"
             "http:\n  addr: 127.0.0.1:%d\n",
             root, r->port);
    if (hl_file_write(cfg, text, strlen(text), NULL) != HL_OK) return false;
    r->pid = fork();
    if (r->pid == 0) {
        FILE *f = freopen(log, "w", stdout);
        (void)f;
        dup2(STDOUT_FILENO, STDERR_FILENO);
        execl(REGISTRY_BIN, REGISTRY_BIN, "serve", cfg, (char *)NULL);
        _exit(127);
    }
    if (r->pid < 0) return false;
    net_host h = {0};
    snprintf(h.host, sizeof h.host, "127.0.0.1");
    h.port = r->port;
    for (int i = 0; i < 200; i++) { /* up to 10 s */
        int status = 0;
        char *resp = NULL;
        if (net_http_request(&h, "GET", "/v2/", NULL, 0, &status, &resp, NULL, NULL) == HL_OK &&
            status == 200) {
            free(resp);
            return true;
        }
        free(resp);
        sp_sleep_ms(50);
    }
    return false;
}

static void registry_stop(registry *r) {
    if (r->pid <= 0) return;
    kill(r->pid, SIGTERM);
    int st;
    waitpid(r->pid, &st, 0);
    r->pid = -1;
}

/* ---- the proxy ---- */

enum { PROXY_PASS, PROXY_CUT_ONCE, PROXY_CUT_ALWAYS, PROXY_FLIP, PROXY_STALL, PROXY_AUTH, PROXY_AUTH_DENY,
       PROXY_CUT_UPLOAD /* the first PATCH body bigger than cut_at breaks off there */ };



typedef struct proxy {
    int listen_fd, port, target_port;
    int mode;
    size_t cut_at;
    pthread_t thread;
    pthread_mutex_t lock;
    int blob_gets;     /* GET .../blobs/... requests */
    int range_gets;    /* of which with a Range header */
    char last_range[128];
    char ranges[4096];     /* every blob GET's Range, ";"-terminated ("-" for none) */
    long cut_from, cut_to; /* CUT_*: when cut_to > 0, only responses to a Range starting in [from, to) */
    int patches;           /* PATCH requests (chunked uploads) */
    size_t upload_bytes;   /* request body bytes of PATCH/PUT/POST to blobs/uploads */
    int mounts;            /* POST ?mount= answered 201 */
    int token_gets;        /* AUTH: requests to the token realm; the valid token is "tok-<that>" */
    int token_uses;        /* AUTH: requests let through with the current token */
    int expire_after;      /* AUTH: > 0: the token expires after that many uses */
    int unauthorized;      /* AUTH: requests answered 401 */
    char token_query[512];
    bool cut_done;
    atomic_bool stalled;   /* STALL: the first bytes are out and the proxy waits */
    atomic_bool peer_gone; /* STALL: the puller closed its connection */
    atomic_bool stop;
} proxy;

static bool send_all(int fd, const char *p, size_t n) {
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w <= 0) return false;
        p += w;
        n -= (size_t)w;
    }
    return true;
}

/* One exchange: the request (head and Content-Length body), forwarded with
 * "Connection: close"; the whole response read, then passed on (maybe cut or flipped). */
static void proxy_one(proxy *px, int cfd) {
    char req[16384];
    size_t n = 0;
    char *end = NULL;
    while (n < sizeof req - 1 && !end) {
        ssize_t r = recv(cfd, req + n, sizeof req - 1 - n, 0);
        if (r <= 0) return;
        n += (size_t)r;
        req[n] = '\0';
        end = strstr(req, "\r\n\r\n");
    }
    if (!end) return;
    size_t head_len = (size_t)(end - req) + 4;
    const char *cl = strcasestr(req, "\r\nContent-Length:");
    size_t body_len_in = cl && cl < end ? (size_t)strtoul(cl + 17, NULL, 10) : 0;
    bool upload = strstr(req, "/blobs/uploads/") && strstr(req, "/blobs/uploads/") < strchr(req, '\n');
    if (px->mode == PROXY_AUTH || px->mode == PROXY_AUTH_DENY) {
        if (strncmp(req, "GET /token", 10) == 0) {
            pthread_mutex_lock(&px->lock);
            px->token_gets++;
            px->token_uses = 0;
            const char *q = strchr(req, '?');
            size_t ql = q ? strcspn(q + 1, " ") : 0;
            snprintf(px->token_query, sizeof px->token_query, "%.*s", (int)ql, q ? q + 1 : "");
            char tok[32];
            if (px->mode == PROXY_AUTH) snprintf(tok, sizeof tok, "tok-%d", px->token_gets);
            else snprintf(tok, sizeof tok, "not-the-token");
            pthread_mutex_unlock(&px->lock);
            char resp[256], js[64];
            snprintf(js, sizeof js, "{\"token\":\"%s\"}", tok);
            snprintf(resp, sizeof resp, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                     "Content-Length: %zu\r\nConnection: close\r\n\r\n%s", strlen(js), js);
            send_all(cfd, resp, strlen(resp));
            return;
        }
        pthread_mutex_lock(&px->lock);
        char want[96];
        snprintf(want, sizeof want, "\r\nAuthorization: Bearer tok-%d\r\n", px->token_gets);
        const char *a = strcasestr(req, want);
        bool ok = a && a < end && (px->expire_after <= 0 || px->token_uses < px->expire_after);
        if (ok) px->token_uses++;
        else px->unauthorized++;
        pthread_mutex_unlock(&px->lock);
        if (!ok) {
            char resp[1024];
            const char *js = "{\"errors\":[{\"code\":\"UNAUTHORIZED\",\"message\":\"authentication required\"}]}";
            snprintf(resp, sizeof resp, "HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Bearer "
                     "realm=\"http://127.0.0.1:%d/token\",service=\"hearth-test\","
                     "scope=\"repository:library/stories:pull\"\r\nContent-Type: application/json\r\n"
                     "Content-Length: %zu\r\nConnection: close\r\n\r\n%s", px->port, strlen(js), js);
            send_all(cfd, resp, strlen(resp));
            return;
        }
    }
    bool blob_get = strncmp(req, "GET ", 4) == 0 && strstr(req, "/blobs/sha256:") &&
                    strstr(req, "/blobs/sha256:") < strchr(req, '\n');
    const char *range = strcasestr(req, "\r\nRange:");
    pthread_mutex_lock(&px->lock);
    if (strncmp(req, "PATCH ", 6) == 0) px->patches++;
    if (upload) px->upload_bytes += body_len_in;
    if (blob_get) {
        size_t rl = strlen(px->ranges);
        if (range && range < end) {
            const char *v = range + 8;
            while (*v == ' ') v++;
            snprintf(px->ranges + rl, sizeof px->ranges - rl, "%.*s;", (int)strcspn(v, "\r"), v);
        } else {
            snprintf(px->ranges + rl, sizeof px->ranges - rl, "-;");
        }
        px->blob_gets++;
        if (range && range < end) {
            px->range_gets++;
            const char *v = range + 8;
            while (*v == ' ') v++;
            size_t vl = strcspn(v, "\r");
            snprintf(px->last_range, sizeof px->last_range, "%.*s", (int)vl, v);
        }
    }
    pthread_mutex_unlock(&px->lock);
    /* forward */
    int sfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)px->target_port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (sfd < 0 || connect(sfd, (struct sockaddr *)&a, sizeof a) != 0) {
        if (sfd >= 0) close(sfd);
        return;
    }
    char *line_end = strstr(req, "\r\n");
    size_t first = (size_t)(line_end - req) + 2;
    if (!send_all(sfd, req, first) || !send_all(sfd, "Connection: close\r\n", 19) ||
        !send_all(sfd, req + first, n - first)) {
        close(sfd);
        return;
    }
    /* the rest of a request body (pushes) */
    size_t body_have = n - head_len;
    size_t body_stop = body_len_in;
    pthread_mutex_lock(&px->lock);
    if (px->mode == PROXY_CUT_UPLOAD && !px->cut_done && strncmp(req, "PATCH ", 6) == 0 &&
        body_len_in > px->cut_at && body_have < px->cut_at) {
        px->cut_done = true;
        body_stop = px->cut_at;
    }
    pthread_mutex_unlock(&px->lock);
    char buf[65536];
    while (body_have < body_stop) {
        size_t want = body_stop - body_have < sizeof buf ? body_stop - body_have : sizeof buf;
        ssize_t r = recv(cfd, buf, want, 0);
        if (r <= 0 || !send_all(sfd, buf, (size_t)r)) {
            close(sfd);
            return;
        }
        body_have += (size_t)r;
    }
    if (body_stop < body_len_in) { /* the cut: both sides see the connection drop */
        sp_sleep_ms(100);
        close(sfd);
        return;
    }
    size_t cap = 1 << 16, len = 0;
    char *resp = malloc(cap);
    for (;;) {
        if (len == cap) {
            char *p = realloc(resp, cap *= 2);
            if (!p) break;
            resp = p;
        }
        ssize_t r = recv(sfd, resp + len, cap - len, 0);
        if (r <= 0) break;
        len += (size_t)r;
    }
    close(sfd);
    char *hend = memmem(resp, len, "\r\n\r\n", 4);
    size_t body_off = hend ? (size_t)(hend - resp) + 4 : len;
    size_t body_len = len - body_off;
    size_t out_len = len;
    if (upload && strstr(req, "mount=") && strstr(req, "mount=") < strchr(req, '\n') &&
        len > 12 && strncmp(resp + 9, "201", 3) == 0) {
        pthread_mutex_lock(&px->lock);
        px->mounts++;
        pthread_mutex_unlock(&px->lock);
    }
    if (blob_get && body_len > 4096 && px->mode == PROXY_STALL) {
        /* some bytes, then nothing until the puller gives up (or the test ends) */
        send_all(cfd, resp, body_off + px->cut_at);
        free(resp);
        atomic_store(&px->stalled, true);
        while (!atomic_load(&px->stop)) {
            struct pollfd pfd = {.fd = cfd, .events = POLLIN};
            char b;
            if (poll(&pfd, 1, 20) > 0 && recv(cfd, &b, 1, MSG_DONTWAIT) <= 0) {
                atomic_store(&px->peer_gone, true);
                break;
            }
        }
        return;
    }
    if (blob_get && body_len > 4096) {
        pthread_mutex_lock(&px->lock);
        long rstart = range && range < end && strncmp(range + 9, "bytes=", 6) == 0 ? atol(range + 15) : -1;
        bool picked = px->cut_to <= 0 || (rstart >= px->cut_from && rstart < px->cut_to);
        if ((px->mode == PROXY_CUT_ALWAYS || (px->mode == PROXY_CUT_ONCE && !px->cut_done)) &&
            body_len > px->cut_at && picked) {
            px->cut_done = true;
            out_len = body_off + px->cut_at;
        } else if (px->mode == PROXY_FLIP) {
            resp[body_off + body_len / 2] ^= 0x5a;
        }
        pthread_mutex_unlock(&px->lock);
    }
    send_all(cfd, resp, out_len);
    free(resp);
}

static void *proxy_main(void *arg) {
    proxy *px = arg;
    for (;;) {
        int cfd = accept(px->listen_fd, NULL, NULL);
        if (cfd < 0) {
            if (errno == EINTR) continue;
            break; /* shut down */
        }
        proxy_one(px, cfd);
        close(cfd);
    }
    return NULL;
}

static bool proxy_start(proxy *px, int target_port, int mode) {
    memset(px, 0, sizeof *px);
    px->target_port = target_port;
    px->mode = mode;
    px->cut_at = 300000;
    pthread_mutex_init(&px->lock, NULL);
    px->listen_fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    if (px->listen_fd < 0 || bind(px->listen_fd, (struct sockaddr *)&a, sizeof a) != 0 ||
        listen(px->listen_fd, 16) != 0 || getsockname(px->listen_fd, (struct sockaddr *)&a, &len) != 0)
        return false;
    px->port = ntohs(a.sin_port);
    return pthread_create(&px->thread, NULL, proxy_main, px) == 0;
}

static void proxy_stop(proxy *px) {
    atomic_store(&px->stop, true);
    shutdown(px->listen_fd, SHUT_RDWR); /* accept() returns */
    pthread_join(px->thread, NULL);
    close(px->listen_fd);
    pthread_mutex_destroy(&px->lock);
}

/* ---- shared setup: a model pushed to the registry, then removed locally ---- */

static registry g_reg;
static char g_pushed[128]; /* the name pushed (registry port) */
static char g_text[4096];  /* what it generates at temperature 0 */
static char g_digest[80];  /* its manifest digest (/api/tags) */

/* The "digest" /api/tags lists for a model name, or "". */
static void tags_digest(const srv_proc *p, const char *name, char *out, size_t cap) {
    out[0] = '\0';
    json_t *j = NULL;
    if (sp_req(p, "GET", "/api/tags", NULL, &j) != 200) return;
    size_t i;
    json_t *m;
    json_array_foreach(json_object_get(j, "models"), i, m) {
        const char *n = json_string_value(json_object_get(m, "name"));
        const char *d = json_string_value(json_object_get(m, "digest"));
        if (n && d && strcmp(n, name) == 0) snprintf(out, cap, "%s", d);
    }
    json_decref(j);
}

static const char *const g_env[] = {"NO_PROXY=127.0.0.1,localhost", "no_proxy=127.0.0.1,localhost",
                                    NULL};
/* Parts and chunks of 256 KiB: the 1.1 MB test weights travel in five of them. */
#define SMALL_PART 262144
static const char *const g_env_parts[] = {"NO_PROXY=127.0.0.1,localhost", "no_proxy=127.0.0.1,localhost",
                                          "HEARTH_PULL_PART_SIZE=262144", "HEARTH_PUSH_CHUNK_SIZE=262144",
                                          NULL};

static bool generate(const srv_proc *p, const char *model, char *out, size_t cap) {
    char body[512];
    snprintf(body, sizeof body,
             "{\"model\":\"%s\",\"prompt\":\"Once upon a time\",\"stream\":false,"
             "\"options\":{\"temperature\":0,\"seed\":42,\"num_predict\":24}}",
             model);
    json_t *j = NULL;
    int st = sp_req(p, "POST", "/api/generate", body, &j);
    const char *text = json_string_value(json_object_get(j, "response"));
    bool ok = st == 200 && text && *text;
    if (ok) snprintf(out, cap, "%s", text);
    json_decref(j);
    return ok;
}

static bool push_and_remove(const srv_proc *p) {
    const char *gguf = test_shared_path("models/stories260K/stories260K.gguf");
    snprintf(g_pushed, sizeof g_pushed, "127.0.0.1:%d/library/stories:latest", g_reg.port);
    if (!sp_create_model(p, g_pushed, gguf, "")) return false;
    if (!generate(p, g_pushed, g_text, sizeof g_text)) return false;
    tags_digest(p, g_pushed, g_digest, sizeof g_digest);
    if (!g_digest[0]) return false;
    const char *args[] = {"push", g_pushed, "--insecure", NULL};
    char out[4096], err[8192];
    int rc = sp_run_cli(p->port, "", args, out, sizeof out, err, sizeof err);
    if (rc != 0 || !strstr(err, "pushing manifest") || !strstr(err, "success")) {
        fprintf(stderr, "push failed (%d): %s %s\n", rc, out, err);
        return false;
    }
    char body[256];
    snprintf(body, sizeof body, "{\"model\":\"%s\"}", g_pushed);
    return sp_req(p, "DELETE", "/api/delete", body, NULL) == 200;
}

/* Files under dir (recursively), as one sorted-by-readdir string, for before/after checks. */
static void list_files(const char *dir, char *out, size_t cap) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.' && (!e->d_name[1] || (e->d_name[1] == '.' && !e->d_name[2]))) continue;
        char path[2048];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        struct stat sb;
        if (stat(path, &sb) != 0) continue;
        size_t l = strlen(out);
        snprintf(out + l, cap - l, "%s;", path);
        if (S_ISDIR(sb.st_mode)) list_files(path, out, cap);
    }
    closedir(d);
}

/* Entries of a list_files string: blobs in the store, and partial downloads. */
static void count_blobs(const char *files, int *complete, int *partial) {
    *complete = *partial = 0;
    for (const char *q = files; (q = strstr(q, "/sha256-")) != NULL; q++) {
        const char *semi = strchr(q, ';');
        bool part = semi && semi - q > 8 && memmem(q, (size_t)(semi - q), "-partial", 8);
        ++*(part ? partial : complete);
    }
}

/* Drops the partial downloads from a list_files string. */
static void strip_partials(char *files) {
    char *w = files;
    for (char *q = files; *q;) {
        char *semi = strchr(q, ';');
        size_t l = semi ? (size_t)(semi - q) + 1 : strlen(q);
        if (!memmem(q, l, "-partial", 8)) {
            memmove(w, q, l);
            w += l;
        }
        q += l;
    }
    *w = '\0';
}

/* The weights' digest (the GGUF the tests push). */
static bool weights_digest(char digest[80]) {
    char *gguf;
    size_t glen;
    if (hl_file_read(test_shared_path("models/stories260K/stories260K.gguf"), &gguf, &glen, NULL) != HL_OK)
        return false;
    strcpy(digest, "sha256:");
    bool ok = sha256_hex(gguf, glen, digest + 7);
    free(gguf);
    return ok;
}

static bool file_has_digest(const char *models, const char *digest) {
    char path[2048];
    snprintf(path, sizeof path, "%s/blobs/sha256-%s", models, digest + 7);
    char *data;
    size_t len;
    if (hl_file_read(path, &data, &len, NULL) != HL_OK) return false;
    char hex[65];
    bool ok = sha256_hex(data, len, hex) && strcmp(hex, digest + 7) == 0;
    free(data);
    return ok;
}

#define WITH_REGISTRY(body_fn) WITH_REGISTRY_ENV(g_env, body_fn)
#define WITH_REGISTRY_ENV(env, body_fn)                                                  \
    do {                                                                                 \
        if (access(REGISTRY_BIN, X_OK) != 0)                                             \
            SKIP(REGISTRY_BIN " not found (apt-get install docker-registry)");           \
        if (!test_shared_path("models/stories260K/stories260K.gguf"))                    \
            SKIP("models/stories260K/stories260K.gguf not found");                       \
        bool up_ = registry_start(&g_reg);                                               \
        if (up_) SP_WITH_SERVER("reg", env, push_and_remove, body_fn);                   \
        registry_stop(&g_reg);                                                           \
        CHECK_MSG(up_, "docker-registry did not start");                                 \
    } while (0)

/* ---- tests ---- */

static void roundtrip_body(const srv_proc *p) {
    proxy px;
    CHECK(proxy_start(&px, g_reg.port, PROXY_PASS));
    char name[128];
    snprintf(name, sizeof name, "127.0.0.1:%d/library/stories:latest", px.port);
    const char *args[] = {"pull", name, "--insecure", NULL};
    char out[4096], err[8192];
    int rc = sp_run_cli(p->port, "", args, out, sizeof out, err, sizeof err);
    int gets_first = px.blob_gets;
    bool ok = rc == 0 && strstr(err, "pulling manifest") && strstr(err, "verifying sha256 digest") &&
              strstr(err, "writing manifest") && strstr(err, "success");
    char text[4096] = "";
    bool gen = ok && generate(p, name, text, sizeof text);
    /* a second pull (the API, streamed) transfers nothing */
    char body[256];
    snprintf(body, sizeof body, "{\"model\":\"%s\",\"insecure\":true,\"stream\":false}", name);
    json_t *j = NULL;
    int st2 = sp_req(p, "POST", "/api/pull", body, &j);
    const char *status2 = json_string_value(json_object_get(j, "status"));
    bool second_ok = st2 == 200 && status2 && strcmp(status2, "success") == 0;
    json_decref(j);
    int gets_second = px.blob_gets - gets_first;
    /* a missing tag */
    snprintf(body, sizeof body, "{\"model\":\"127.0.0.1:%d/library/stories:nope\",\"insecure\":true,\"stream\":false}",
             px.port);
    int st3 = sp_req(p, "POST", "/api/pull", body, &j);
    char missing[256] = "";
    snprintf(missing, sizeof missing, "%s", json_string_value(json_object_get(j, "error")) ?: "");
    json_decref(j);
    /* without insecure, plain http is never tried: https to a plain-http port fails */
    snprintf(body, sizeof body, "{\"model\":\"http://%s\",\"stream\":false}", name);
    int st4 = sp_req(p, "POST", "/api/pull", body, &j);
    char insecure_err[256] = "";
    snprintf(insecure_err, sizeof insecure_err, "%s", json_string_value(json_object_get(j, "error")) ?: "");
    json_decref(j);
    proxy_stop(&px);

    CHECK_MSG(ok, "pull failed (%d): %s", rc, err);
    CHECK_EQ_INT(gets_first, 2); /* the model layer and the config */
    CHECK(gen);
    CHECK_STR(text, g_text);
    /* the manifest is stored as the registry serves it: the same bytes, the same ID */
    char digest[80];
    tags_digest(p, name, digest, sizeof digest);
    CHECK_STR(digest, g_digest);
    CHECK(second_ok);
    CHECK_EQ_INT(gets_second, 0);
    CHECK_EQ_INT(st3, 500);
    CHECK_STR(missing, "pull model manifest: file does not exist");
    CHECK_EQ_INT(st4, 500);
    CHECK_STR(insecure_err, "insecure protocol http");
}

TEST(registry_push_pull_roundtrip_same_tokens) { WITH_REGISTRY(roundtrip_body); }

static void resume_body(const srv_proc *p) {
    proxy px;
    CHECK(proxy_start(&px, g_reg.port, PROXY_CUT_ONCE));
    char name[128], body[256];
    snprintf(name, sizeof name, "127.0.0.1:%d/library/stories", px.port);
    snprintf(body, sizeof body, "{\"model\":\"%s\",\"insecure\":true,\"stream\":false}", name);
    json_t *j = NULL;
    int st = sp_req(p, "POST", "/api/pull", body, &j);
    const char *status = json_string_value(json_object_get(j, "status"));
    bool ok = st == 200 && status && strcmp(status, "success") == 0;
    json_decref(j);
    bool cut = px.cut_done;
    int ranges = px.range_gets;
    char range[128];
    snprintf(range, sizeof range, "%s", px.last_range);
    proxy_stop(&px);
    CHECK(ok);
    CHECK(cut);
    CHECK_EQ_INT(ranges, 1);
    /* it resumed exactly where the cut left the partial file */
    CHECK_STR(range, "bytes=300000-");
    json_t *show = NULL;
    snprintf(body, sizeof body, "{\"model\":\"%s\"}", name);
    CHECK_EQ_INT(sp_req(p, "POST", "/api/show", body, &show), 200);
    json_decref(show);
    /* the blob in the store has the right digest; no partial file is left */
    char files[16384] = "", blobs[1100];
    snprintf(blobs, sizeof blobs, "%s/blobs", p->models);
    list_files(blobs, files, sizeof files);
    CHECK_MSG(!strstr(files, "partial"), "left over: %s", files);
    char *gguf;
    size_t glen;
    CHECK(hl_file_read(test_shared_path("models/stories260K/stories260K.gguf"), &gguf, &glen, NULL) == HL_OK);
    char digest[80] = "sha256:";
    bool hashed = sha256_hex(gguf, glen, digest + 7);
    free(gguf);
    CHECK(hashed);
    CHECK(file_has_digest(p->models, digest));
    char text[4096];
    CHECK(generate(p, name, text, sizeof text));
    CHECK_STR(text, g_text);
}

TEST(registry_pull_resumes_after_a_cut_connection) { WITH_REGISTRY(resume_body); }

/* Every connection cut: the pull gives up after its retries, leaving only the partial
 * file; the next pull resumes from it. */
static void resume_later_body(const srv_proc *p) {
    char before[16384] = "", after[16384] = "";
    char manifests[1100];
    snprintf(manifests, sizeof manifests, "%s/manifests", p->models);
    list_files(manifests, before, sizeof before);
    proxy px;
    CHECK(proxy_start(&px, g_reg.port, PROXY_CUT_ALWAYS));
    px.cut_at = 100000;
    char name[128], body[256];
    snprintf(name, sizeof name, "127.0.0.1:%d/library/stories", px.port);
    snprintf(body, sizeof body, "{\"model\":\"%s\",\"insecure\":true,\"stream\":false}", name);
    json_t *j = NULL;
    int st1 = sp_req(p, "POST", "/api/pull", body, &j);
    json_decref(j);
    int gets1 = px.blob_gets;
    pthread_mutex_lock(&px.lock);
    px.mode = PROXY_PASS;
    px.range_gets = 0;
    pthread_mutex_unlock(&px.lock);
    char blobs[1100], files[16384] = "";
    snprintf(blobs, sizeof blobs, "%s/blobs", p->models);
    list_files(blobs, files, sizeof files);
    list_files(manifests, after, sizeof after);
    int st2 = sp_req(p, "POST", "/api/pull", body, &j);
    const char *status = json_string_value(json_object_get(j, "status"));
    bool ok = st2 == 200 && status && strcmp(status, "success") == 0;
    json_decref(j);
    int ranges = px.range_gets;
    char range[128];
    snprintf(range, sizeof range, "%s", px.last_range);
    proxy_stop(&px);
    CHECK_EQ_INT(st1, 500);
    CHECK_EQ_INT(gets1, 6); /* the weights: the first try and four resumed retries; the config */
    char wd[80], wpart[200];
    CHECK(weights_digest(wd));
    snprintf(wpart, sizeof wpart, "sha256-%s-partial;", wd + 7);
    CHECK_MSG(strstr(files, wpart), "no partial file: %s", files);
    int complete, partial;
    count_blobs(files, &complete, &partial);
    CHECK_MSG(complete == 0, "a blob entered the store: %s", files);
    CHECK_STR(after, before); /* no manifest */
    CHECK(ok);
    CHECK_EQ_INT(ranges, 1);
    CHECK_STR(range, "bytes=500000-");
    char text[4096];
    CHECK(generate(p, name, text, sizeof text));
    CHECK_STR(text, g_text);
}

TEST(registry_failed_pull_resumes_on_the_next_pull) { WITH_REGISTRY(resume_later_body); }

static void corrupt_body(const srv_proc *p) {
    char before[16384] = "", after[16384] = "";
    list_files(p->models, before, sizeof before);
    proxy px;
    CHECK(proxy_start(&px, g_reg.port, PROXY_FLIP));
    char body[256];
    snprintf(body, sizeof body, "{\"model\":\"127.0.0.1:%d/library/stories\",\"insecure\":true}", px.port);
    /* streamed: the error is the last line after the progress */
    char *resp = NULL;
    size_t len = 0;
    int status = 0;
    hl_status rs = net_http_request(&p->host, "POST", "/api/pull", body, strlen(body), &status, &resp,
                                    &len, NULL);
    proxy_stop(&px);
    CHECK(rs == HL_OK);
    CHECK_EQ_INT(status, 200);
    CHECK_MSG(resp && strstr(resp, "{\"status\":\"pulling manifest\"}"), "%s", resp ? resp : "");
    const char *last = resp ? strstr(resp, "{\"error\":\"digest mismatch") : NULL;
    CHECK_MSG(last, "no digest mismatch error in: %s", resp ? resp : "");
    free(resp);
    list_files(p->models, after, sizeof after);
    /* the corrupt blob's bytes are gone; the config's verified partial may stay for later */
    char wd[80], wpart[200];
    CHECK(weights_digest(wd));
    snprintf(wpart, sizeof wpart, "sha256-%s-partial", wd + 7);
    CHECK_MSG(!strstr(after, wpart), "the corrupt partial is left: %s", after);
    strip_partials(after);
    CHECK_STR(after, before);
}

TEST(registry_corrupt_blob_is_rejected_and_the_store_unchanged) { WITH_REGISTRY(corrupt_body); }

static void run_body(const srv_proc *p) {
    char name[128];
    snprintf(name, sizeof name, "127.0.0.1:%d/library/stories", g_reg.port);
    const char *args[] = {"run", name, "Once upon a time", "--insecure", NULL};
    char out[8192], err[8192];
    int rc = sp_run_cli(p->port, "", args, out, sizeof out, err, sizeof err);
    CHECK_MSG(rc == 0, "run failed (%d): %s", rc, err);
    CHECK_MSG(strstr(err, "pulling manifest") && strstr(err, "success"), "no pull: %s", err);
    CHECK_MSG(strlen(out) > 8, "no output: %s", out);
    json_t *show = NULL;
    char body[256];
    snprintf(body, sizeof body, "{\"model\":\"%s\"}", name);
    CHECK_EQ_INT(sp_req(p, "POST", "/api/show", body, &show), 200);
    json_decref(show);
}

TEST(registry_run_pulls_a_missing_model) { WITH_REGISTRY(run_body); }

/* A client that goes away mid-download (Ctrl-C in `hearth pull`) cancels the transfer:
 * no blob and no manifest enter the store, the bytes so far stay in the partial file, and
 * the next pull resumes from them. */
static void cancel_body(const srv_proc *p) {
    char manifests[1100], blobs[1100], before[16384] = "", after[16384] = "", files[16384] = "";
    snprintf(manifests, sizeof manifests, "%s/manifests", p->models);
    snprintf(blobs, sizeof blobs, "%s/blobs", p->models);
    list_files(manifests, before, sizeof before);
    proxy px;
    CHECK(proxy_start(&px, g_reg.port, PROXY_STALL));
    px.cut_at = 200000;
    char name[128], body[256];
    snprintf(name, sizeof name, "127.0.0.1:%d/library/stories", px.port);
    snprintf(body, sizeof body, "{\"model\":\"%s\",\"insecure\":true}", name);
    net_http *h = NULL;
    bool progressed = false;
    if (net_http_open(&p->host, "POST", "/api/pull", "application/json", (int64_t)strlen(body), &h,
                      NULL) == HL_OK &&
        net_http_send(h, body, strlen(body), NULL) == HL_OK && net_http_finish(h, NULL) == HL_OK) {
        char *line;
        size_t len;
        while (!progressed && net_http_read_line(h, &line, &len, NULL) == HL_OK && line)
        {
            /* bytes of the weights (the config is far smaller) */
            json_t *pj = json_loadb(line, len, 0, NULL);
            progressed = json_integer_value(json_object_get(pj, "total")) > 100000 &&
                         json_integer_value(json_object_get(pj, "completed")) > 0;
            json_decref(pj);
        }
    }
    net_http_close(h); /* the client is gone */
    for (int i = 0; i < 200 && !atomic_load(&px.peer_gone); i++) sp_sleep_ms(50);
    bool gone = atomic_load(&px.peer_gone);
    if (!gone) { /* the proxy still serves the stalled exchange: stop before pulling again */
        proxy_stop(&px);
        CHECK_MSG(false, "the server kept the stalled download open after the client left");
    }
    sp_sleep_ms(200); /* let the producer finish */
    list_files(blobs, files, sizeof files);
    list_files(manifests, after, sizeof after);
    pthread_mutex_lock(&px.lock);
    px.mode = PROXY_PASS;
    pthread_mutex_unlock(&px.lock);
    snprintf(body, sizeof body, "{\"model\":\"%s\",\"insecure\":true,\"stream\":false}", name);
    json_t *j = NULL;
    int st = sp_req(p, "POST", "/api/pull", body, &j);
    const char *status = json_string_value(json_object_get(j, "status"));
    bool ok = st == 200 && status && strcmp(status, "success") == 0;
    json_decref(j);
    int ranges = px.range_gets;
    char range[128];
    snprintf(range, sizeof range, "%s", px.last_range);
    proxy_stop(&px);
    CHECK(progressed);
    int complete, partial;
    count_blobs(files, &complete, &partial);
    char wd[80], wpart[200];
    CHECK(weights_digest(wd));
    snprintf(wpart, sizeof wpart, "sha256-%s-partial;", wd + 7);
    CHECK_MSG(complete == 0 && strstr(files, wpart), "blobs after the cancel: %s", files);
    CHECK_STR(after, before);
    CHECK(ok);
    CHECK_EQ_INT(ranges, 1);
    long from = strncmp(range, "bytes=", 6) == 0 ? atol(range + 6) : -1;
    CHECK_MSG(from > 0 && from <= 200000, "range %s", range);
    char text[4096];
    CHECK(generate(p, name, text, sizeof text));
    CHECK_STR(text, g_text);
}

TEST(registry_cancelled_pull_leaves_only_a_partial_and_resumes) { WITH_REGISTRY(cancel_body); }

/* Parts of 256 KiB: the weights come in five ranged GETs at once; one part whose
 * connection is always cut fails the pull after its retries, and the next pull fetches
 * only the rest of that part (the other parts and the config are kept on disk). */
static void parts_body(const srv_proc *p) {
    proxy px;
    CHECK(proxy_start(&px, g_reg.port, PROXY_CUT_ALWAYS));
    px.cut_at = 30000;
    px.cut_from = 2 * SMALL_PART; /* the third part, and its resumed retries */
    px.cut_to = 3 * SMALL_PART;
    char name[128], body[256];
    snprintf(name, sizeof name, "127.0.0.1:%d/library/stories", px.port);
    snprintf(body, sizeof body, "{\"model\":\"%s\",\"insecure\":true,\"stream\":false}", name);
    json_t *j = NULL;
    int st1 = sp_req(p, "POST", "/api/pull", body, &j);
    char err1[512];
    snprintf(err1, sizeof err1, "%s", json_string_value(json_object_get(j, "error")) ?: "");
    json_decref(j);
    pthread_mutex_lock(&px.lock);
    char ranges1[4096];
    snprintf(ranges1, sizeof ranges1, "%s", px.ranges);
    px.ranges[0] = '\0';
    px.mode = PROXY_PASS;
    pthread_mutex_unlock(&px.lock);
    int st2 = sp_req(p, "POST", "/api/pull", body, &j);
    const char *status = json_string_value(json_object_get(j, "status"));
    bool ok = st2 == 200 && status && strcmp(status, "success") == 0;
    json_decref(j);
    char ranges2[4096];
    snprintf(ranges2, sizeof ranges2, "%s", px.ranges);
    proxy_stop(&px);
    CHECK_EQ_INT(st1, 500);
    CHECK_MSG(strstr(err1, "ended early") || strstr(err1, "pull blob"), "%s", err1);
    /* every part asked for by range (the last one open-ended), the config whole */
    const char *want[] = {"bytes=0-262143;", "bytes=262144-524287;", "bytes=786432-1048575;",
                          "bytes=1048576-;", "bytes=524288-786431;", "bytes=554288-786431;",
                          "bytes=584288-786431;", "bytes=614288-786431;", "bytes=644288-786431;", "-;"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        CHECK_MSG(strstr(ranges1, want[i]), "no %s in %s", want[i], ranges1);
    CHECK_MSG(!strstr(ranges1, "bytes=674288-"), "a sixth try: %s", ranges1);
    CHECK(ok);
    CHECK_STR(ranges2, "bytes=674288-786431;"); /* only what the cut part lacked */
    char wd[80];
    CHECK(weights_digest(wd));
    CHECK(file_has_digest(p->models, wd));
    char files[16384] = "", blobs[1100];
    snprintf(blobs, sizeof blobs, "%s/blobs", p->models);
    list_files(blobs, files, sizeof files);
    CHECK_MSG(!strstr(files, "partial"), "left over: %s", files);
    char text[4096];
    CHECK(generate(p, name, text, sizeof text));
    CHECK_STR(text, g_text);
}

TEST(registry_pull_in_parallel_parts_resumes_only_the_missing_part) {
    WITH_REGISTRY_ENV(g_env_parts, parts_body);
}

/* Pushes go in PATCH chunks; a model sharing its weights with one already pushed to
 * another repository of the registry gets them by a cross-repository mount. */
static void mount_body(const srv_proc *p) {
    proxy px;
    CHECK(proxy_start(&px, g_reg.port, PROXY_PASS));
    const char *gguf = test_shared_path("models/stories260K/stories260K.gguf");
    char a[128], b[128];
    snprintf(a, sizeof a, "127.0.0.1:%d/ns/a:latest", px.port);
    snprintf(b, sizeof b, "127.0.0.1:%d/ns/b:latest", px.port);
    bool created = sp_create_model(p, a, gguf, "") &&
                   sp_create_model(p, b, gguf, "\"system\":\"You are model b.\"");
    char out[4096], err[8192];
    const char *args_a[] = {"push", a, "--insecure", NULL};
    int rc_a = created ? sp_run_cli(p->port, "", args_a, out, sizeof out, err, sizeof err) : -1;
    pthread_mutex_lock(&px.lock);
    int patches_a = px.patches, mounts_a = px.mounts;
    size_t bytes_a = px.upload_bytes;
    px.patches = px.mounts = 0;
    px.upload_bytes = 0;
    pthread_mutex_unlock(&px.lock);
    const char *args_b[] = {"push", b, "--insecure", NULL};
    int rc_b = created ? sp_run_cli(p->port, "", args_b, out, sizeof out, err, sizeof err) : -1;
    int mounts_b = px.mounts;
    size_t bytes_b = px.upload_bytes;
    proxy_stop(&px);
    CHECK(created);
    CHECK_MSG(rc_a == 0, "push a: %s", err);
    CHECK_MSG(rc_b == 0, "push b: %s", err);
    CHECK_EQ_INT(mounts_a, 0);
    CHECK_MSG(patches_a >= 5, "%d PATCH requests", patches_a); /* five chunks of the weights */
    CHECK_MSG(bytes_a >= 1185376, "pushed %zu bytes", bytes_a);
    CHECK_MSG(mounts_b >= 1, "no mount");
    CHECK_MSG(bytes_b < 100000, "pushed %zu bytes: the weights were sent again", bytes_b);
    /* the registry has the weights under ns/b */
    char wd[80], path[256];
    CHECK(weights_digest(wd));
    snprintf(path, sizeof path, "/v2/ns/b/blobs/%s", wd);
    net_host h = {0};
    snprintf(h.host, sizeof h.host, "127.0.0.1");
    h.port = g_reg.port;
    int status = 0;
    char *resp = NULL;
    CHECK(net_http_request(&h, "HEAD", path, NULL, 0, &status, &resp, NULL, NULL) == HL_OK);
    free(resp);
    CHECK_EQ_INT(status, 200);
}

TEST(registry_push_in_chunks_mounts_shared_weights) { WITH_REGISTRY_ENV(g_env_parts, mount_body); }

/* A registry that answers 401 with a bearer challenge: the token comes from the realm
 * (asked for with the challenge's service and scope) and every request carries it; a
 * token the registry refuses ends in "unauthorized". */
static void auth_body(const srv_proc *p) {
    proxy px;
    CHECK(proxy_start(&px, g_reg.port, PROXY_AUTH));
    char name[128], body[256];
    snprintf(name, sizeof name, "127.0.0.1:%d/library/stories", px.port);
    snprintf(body, sizeof body, "{\"model\":\"%s\",\"insecure\":true,\"stream\":false}", name);
    json_t *j = NULL;
    int st = sp_req(p, "POST", "/api/pull", body, &j);
    const char *status = json_string_value(json_object_get(j, "status"));
    bool ok = st == 200 && status && strcmp(status, "success") == 0;
    char err1[256];
    snprintf(err1, sizeof err1, "%s", json_string_value(json_object_get(j, "error")) ?: "");
    json_decref(j);
    int tokens = px.token_gets, unauth = px.unauthorized, gets = px.blob_gets;
    char query[512];
    snprintf(query, sizeof query, "%s", px.token_query);
    char text[4096] = "";
    bool gen = ok && generate(p, name, text, sizeof text);
    /* refused tokens */
    char del[256];
    snprintf(del, sizeof del, "{\"model\":\"%s\"}", name);
    int st_del = sp_req(p, "DELETE", "/api/delete", del, NULL);
    pthread_mutex_lock(&px.lock);
    px.mode = PROXY_AUTH_DENY;
    pthread_mutex_unlock(&px.lock);
    int st2 = sp_req(p, "POST", "/api/pull", body, &j);
    char err2[256];
    snprintf(err2, sizeof err2, "%s", json_string_value(json_object_get(j, "error")) ?: "");
    json_decref(j);
    proxy_stop(&px);
    CHECK_MSG(ok, "pull failed: %s", err1);
    CHECK_EQ_INT(tokens, 1);
    CHECK_EQ_INT(unauth, 1); /* the manifest's first try; the blobs came with the token */
    CHECK_EQ_INT(gets, 2);
    CHECK_MSG(strstr(query, "service=hearth-test"), "%s", query);
    CHECK_MSG(strstr(query, "scope=repository%3Alibrary%2Fstories%3Apull"), "%s", query);
    CHECK(gen);
    CHECK_STR(text, g_text);
    CHECK_EQ_INT(st_del, 200);
    CHECK_EQ_INT(st2, 500);
    CHECK_MSG(strstr(err2, "unauthorized"), "%s", err2);
}

/* Tokens that expire after two requests: the parts refused mid-pull fetch a new token
 * (or go again with one another part fetched) and the pull still succeeds. */
static void auth_expire_body(const srv_proc *p) {
    proxy px;
    CHECK(proxy_start(&px, g_reg.port, PROXY_AUTH));
    px.expire_after = 2;
    char name[128], body[256];
    snprintf(name, sizeof name, "127.0.0.1:%d/library/stories", px.port);
    snprintf(body, sizeof body, "{\"model\":\"%s\",\"insecure\":true,\"stream\":false}", name);
    json_t *j = NULL;
    int st = sp_req(p, "POST", "/api/pull", body, &j);
    const char *status = json_string_value(json_object_get(j, "status"));
    bool ok = st == 200 && status && strcmp(status, "success") == 0;
    char err1[256];
    snprintf(err1, sizeof err1, "%s", json_string_value(json_object_get(j, "error")) ?: "");
    json_decref(j);
    int tokens = px.token_gets;
    proxy_stop(&px);
    CHECK_MSG(ok, "pull failed: %s", err1);
    CHECK_MSG(tokens >= 2, "%d tokens", tokens);
    char text[4096];
    CHECK(generate(p, name, text, sizeof text));
    CHECK_STR(text, g_text);
}

TEST(registry_expired_token_is_renewed_mid_pull) { WITH_REGISTRY_ENV(g_env_parts, auth_expire_body); }

TEST(registry_bearer_token_challenge_is_answered) { WITH_REGISTRY(auth_body); }

/* Runs `hearth args...` on a terminal of `cols` columns; out gets what it drew. Returns
 * the exit status (-1 when it could not run or ran over 30 s). */
static int run_on_pty_int(int port, const char *const *args, int cols, const char *interrupt_on,
                          char *out, size_t cap);
static int run_on_pty(int port, const char *const *args, int cols, char *out, size_t cap) {
    return run_on_pty_int(port, args, cols, NULL, out, cap);
}

/* ... and with interrupt_on: a SIGINT (Ctrl-C) once that text shows; a death by a signal
 * returns 128 + the signal. */
static int run_on_pty_int(int port, const char *const *args, int cols, const char *interrupt_on,
                          char *out, size_t cap) {
    struct winsize ws = {.ws_row = 40, .ws_col = (unsigned short)cols};
    char hostv[64];
    snprintf(hostv, sizeof hostv, "127.0.0.1:%d", port);
    const char *bin = getenv("HEARTH_BIN");
    if (!bin) return -1;
    fflush(stdout);
    fflush(stderr);
    int master;
    pid_t pid = forkpty(&master, NULL, NULL, &ws);
    if (pid == 0) {
        setenv("HEARTH_HOST", hostv, 1);
        setenv("TERM", "xterm", 1);
        char *argv[16];
        int n = 0;
        argv[n++] = (char *)bin;
        for (; args[n - 1] && n < 15; n++) argv[n] = (char *)args[n - 1];
        argv[n] = NULL;
        execv(bin, argv);
        _exit(127);
    }
    if (pid < 0) return -1;
    size_t len = 0;
    out[0] = '\0';
    for (int i = 0; i < 600; i++) { /* the child's output until it exits (EOF/EIO) */
        struct pollfd pfd = {.fd = master, .events = POLLIN};
        if (poll(&pfd, 1, 50) <= 0) continue;
        char buf[4096];
        ssize_t r = read(master, buf, sizeof buf);
        if (r <= 0) break;
        size_t k = (size_t)r < cap - 1 - len ? (size_t)r : cap - 1 - len;
        memcpy(out + len, buf, k);
        len += k;
        out[len] = '\0';
        if (interrupt_on && strstr(out, interrupt_on)) {
            kill(pid, SIGINT);
            interrupt_on = NULL;
        }
    }
    close(master);
    int st;
    pid_t w = 0;
    for (int i = 0; i < 100 && (w = waitpid(pid, &st, WNOHANG)) == 0; i++) sp_sleep_ms(50);
    if (w != pid) {
        kill(pid, SIGKILL);
        waitpid(pid, &st, 0);
        return -1;
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : WIFSIGNALED(st) ? 128 + WTERMSIG(st) : -1;
}

/* Longest line (in display columns) of what a terminal was sent, escapes left out. */
static int widest_line(const char *s) {
    int w = 0, best = 0;
    for (const char *p = s; *p; p++) {
        if (*p == '\033') { /* CSI: ESC [ params final */
            if (p[1] == '[') {
                p += 2;
                while (*p && !(*p >= '@' && *p <= '~')) p++;
                if (!*p) break;
            }
            continue;
        }
        if (*p == '\r' || *p == '\n') {
            w = 0;
            continue;
        }
        if (((unsigned char)*p & 0xC0) == 0x80) continue;
        if (++w > best) best = w;
    }
    return best;
}

/* On a terminal, pull and create draw per-layer bars (cut to the terminal's width) and
 * hide the cursor while they redraw. */
static void bars_body(const srv_proc *p) {
    static char out[65536];
    char name[128];
    snprintf(name, sizeof name, "127.0.0.1:%d/library/stories", g_reg.port);
    const char *pull[] = {"pull", name, "--insecure", NULL};
    int rc = run_on_pty(p->port, pull, 60, out, sizeof out);
    CHECK_MSG(rc == 0, "pull on a pty: %d: %s", rc, out);
    CHECK_MSG(strstr(out, "pulling manifest") && strstr(out, "success"), "%s", out);
    char wd[80], row[64];
    CHECK(weights_digest(wd));
    snprintf(row, sizeof row, "pulling %.12s: 100%% \xe2\x96\x95", wd + 7);
    CHECK_MSG(strstr(out, row), "no bar %s in %s", row, out);
    CHECK(strstr(out, "\033[?25l") && strstr(out, "\033[?25h"));
    CHECK_MSG(widest_line(out) <= 59, "a line of %d columns on a 60-column terminal", widest_line(out));

    /* Ctrl-C mid-pull: the cursor is shown again before the CLI dies of the signal */
    CHECK_EQ_INT(sp_req(p, "DELETE", "/api/delete", (snprintf(row, sizeof row, "{\"model\":\"%s\"}", name), row),
                        NULL), 200);
    proxy px;
    CHECK(proxy_start(&px, g_reg.port, PROXY_STALL));
    px.cut_at = 200000;
    char stalled[128], needle[64];
    snprintf(stalled, sizeof stalled, "127.0.0.1:%d/library/stories", px.port);
    snprintf(needle, sizeof needle, "pulling %.12s", wd + 7);
    const char *pull2[] = {"pull", stalled, "--insecure", NULL};
    rc = run_on_pty_int(p->port, pull2, 100, needle, out, sizeof out);
    for (int i = 0; i < 100 && !atomic_load(&px.peer_gone); i++) sp_sleep_ms(50);
    proxy_stop(&px);
    CHECK_EQ_INT(rc, 128 + SIGINT);
    const char *hide = strstr(out, "\033[?25l");
    CHECK_MSG(hide && strstr(hide, "\033[?25h"), "the cursor stays hidden: %s", out);

    char dir[1100], mf[1200], abs[4096], text[4200];
    snprintf(dir, sizeof dir, "%s/bars", test_tmpdir());
    CHECK(mkdir(dir, 0755) == 0);
    CHECK(realpath(test_shared_path("models/stories260K/stories260K.gguf"), abs) != NULL);
    snprintf(mf, sizeof mf, "%s/Modelfile", dir);
    snprintf(text, sizeof text, "FROM %s\nSYSTEM fresh blob\n", abs);
    CHECK(hl_file_write(mf, text, strlen(text), NULL) == HL_OK);
    /* (the store lacks the weights now, so that they are copied) */
    const char *create[] = {"create", "barred", "-f", mf, "-q", "q8_0", NULL};
    rc = run_on_pty(p->port, create, 200, out, sizeof out);
    CHECK_MSG(rc == 0, "create on a pty: %d: %s", rc, out);
    CHECK_MSG(strstr(out, "gathering model components: 100% \xe2\x96\x95"), "%s", out);
    char copying[128];
    snprintf(copying, sizeof copying, "copying file %s: 100%% \xe2\x96\x95", wd);
    CHECK_MSG(strstr(out, copying), "no %s in %s", copying, out);
    CHECK_MSG(strstr(out, "quantizing F32 model to Q8_0: 100% \xe2\x96\x95"), "%s", out);
    CHECK_MSG(strstr(out, "writing manifest") && strstr(out, "success"), "%s", out);
    /* the API streams the quantize step as Ollama does: placeholder digest, total, completed */
    char body[512], *resp = NULL;
    snprintf(body, sizeof body, "{\"model\":\"barred2\",\"from\":\"barred\",\"quantize\":\"q4_K_M\"}");
    size_t len = 0;
    int status = 0;
    CHECK(net_http_request(&p->host, "POST", "/api/create", body, strlen(body), &status, &resp, &len,
                           NULL) == HL_OK);
    CHECK_EQ_INT(status, 200);
    const char *q = resp ? strstr(resp, "{\"status\":\"quantizing Q8_0 model to Q4_K_M\",\"digest\":\"0000000000000000000\",\"total\":") : NULL;
    CHECK_MSG(q && strstr(q, "\"completed\":"), "%s", resp ? resp : "");
    CHECK_MSG(resp && strstr(resp, "{\"status\":\"success\"}"), "%s", resp ? resp : "");
    free(resp);
}

TEST(registry_pull_and_create_draw_bars_on_a_terminal) { WITH_REGISTRY(bars_body); }

/* A chunk whose connection breaks off mid-body: the push asks the upload session how much
 * it holds and goes on from there, or (the reference registry cancels a session whose
 * bytes and state differ) sends the blob again in a new session; the registry accepts
 * the blob's digest. */
static void upload_cut_body(const srv_proc *p) {
    proxy px;
    CHECK(proxy_start(&px, g_reg.port, PROXY_CUT_UPLOAD));
    px.cut_at = 100000;
    char name[128];
    snprintf(name, sizeof name, "127.0.0.1:%d/ns/cut:latest", px.port);
    bool created = sp_create_model(p, name, test_shared_path("models/stories260K/stories260K.gguf"), "");
    const char *args[] = {"push", name, "--insecure", NULL};
    char out[4096], err[8192];
    int rc = created ? sp_run_cli(p->port, "", args, out, sizeof out, err, sizeof err) : -1;
    bool cut = px.cut_done;
    int patches = px.patches;
    proxy_stop(&px);
    CHECK(created);
    CHECK_MSG(rc == 0, "push: %s", err);
    CHECK(cut);
    CHECK_MSG(patches >= 6, "%d PATCH requests", patches); /* five chunks and a retry */
    char wd[80], path[256];
    CHECK(weights_digest(wd));
    snprintf(path, sizeof path, "/v2/ns/cut/blobs/%s", wd);
    net_host h = {0};
    snprintf(h.host, sizeof h.host, "127.0.0.1");
    h.port = g_reg.port;
    int status = 0;
    char *resp = NULL;
    CHECK(net_http_request(&h, "HEAD", path, NULL, 0, &status, &resp, NULL, NULL) == HL_OK);
    free(resp);
    CHECK_EQ_INT(status, 200);
}

TEST(registry_push_recovers_from_a_chunk_that_broke_off) { WITH_REGISTRY_ENV(g_env_parts, upload_cut_body); }
