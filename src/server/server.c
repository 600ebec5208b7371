#define _GNU_SOURCE
#include "server/internal.h"
#include "server/sched.h"
#include "server/webui.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "base/file.h"
#include "base/log.h"
#include "server/metrics.h"

#define DEFAULT_MAX_BODY ((size_t)64 << 20)
#define DEFAULT_CONN_TIMEOUT 30u   /* seconds; HEARTH_CONN_TIMEOUT */
#define DEFAULT_MAX_CONNS 512u     /* HEARTH_MAX_CONNECTIONS */
/* libmicrohttpd accepts up to twice max_conns: the connections past max_conns are there
 * to be answered 503 (a burst, or idle sockets hogging the slots until their timeout) */
/* The most body bytes read and dropped to deliver an early error reply: larger uploads
 * (declared, or chunked ones that run past it) are answered at once / dropped. */
#define MIN_DISCARD_LIMIT ((uint64_t)128 << 20)

/* ---- DNS-rebinding guard: on a loopback listener, the Host must name this machine ---- */

static bool ip_is_local_interface(int family, const void *addr) {
    struct ifaddrs *ifs = NULL;
    if (getifaddrs(&ifs) != 0) return false;
    bool found = false;
    for (struct ifaddrs *i = ifs; i && !found; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != family) continue;
        if (family == AF_INET)
            found = memcmp(&((struct sockaddr_in *)i->ifa_addr)->sin_addr, addr, 4) == 0;
        else
            found = memcmp(&((struct sockaddr_in6 *)i->ifa_addr)->sin6_addr, addr, 16) == 0;
    }
    freeifaddrs(ifs);
    return found;
}

static bool ends_with_ci(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcasecmp(s + n - m, suffix) == 0;
}

static bool host_allowed(const char *host_hdr) {
    if (!host_hdr || !*host_hdr) return true;
    char h[256];
    snprintf(h, sizeof h, "%s", host_hdr);
    char *name = h;
    if (h[0] == '[') { /* [v6]:port */
        char *close = strchr(h, ']');
        if (!close) return false;
        *close = '\0';
        name = h + 1;
    } else {
        char *colon = strchr(h, ':');
        if (colon && !strchr(colon + 1, ':')) *colon = '\0';
    }
    if (!*name || strcasecmp(name, "localhost") == 0 || ends_with_ci(name, ".localhost") ||
        ends_with_ci(name, ".local") || ends_with_ci(name, ".internal"))
        return true;
    char self[256];
    if (gethostname(self, sizeof self) == 0 && strcasecmp(self, name) == 0) return true;
    unsigned char a[16];
    if (inet_pton(AF_INET, name, a) == 1) {
        if (a[0] == 127 || a[0] == 10 || (a[0] == 172 && (a[1] & 0xF0) == 16) ||
            (a[0] == 192 && a[1] == 168) || (a[0] | a[1] | a[2] | a[3]) == 0)
            return true;
        return ip_is_local_interface(AF_INET, a);
    }
    if (inet_pton(AF_INET6, name, a) == 1) {
        static const unsigned char loop[16] = {[15] = 1}, any[16] = {0};
        if (memcmp(a, loop, 16) == 0 || memcmp(a, any, 16) == 0 || (a[0] & 0xFE) == 0xFC) return true;
        return ip_is_local_interface(AF_INET6, a);
    }
    return false;
}

static bool is_loopback_bind(const char *host) {
    unsigned char a[16];
    if (strcasecmp(host, "localhost") == 0) return true;
    if (inet_pton(AF_INET, host, a) == 1) return a[0] == 127;
    static const unsigned char loop[16] = {[15] = 1};
    return inet_pton(AF_INET6, host, a) == 1 && memcmp(a, loop, 16) == 0;
}

/* ---- CORS (Ollama's allowed origins; HEARTH_ORIGINS, else OLLAMA_ORIGINS, adds more) ---- */

static const char *const k_default_origins[] = {
    "http://localhost", "https://localhost", "http://localhost:*", "https://localhost:*",
    "http://127.0.0.1", "https://127.0.0.1", "http://127.0.0.1:*", "https://127.0.0.1:*",
    "http://0.0.0.0", "https://0.0.0.0", "http://0.0.0.0:*", "https://0.0.0.0:*",
    "app://*", "file://*", "tauri://*", "vscode-webview://*", "vscode-file://*",
    "chrome-extension://*", "moz-extension://*", "safari-web-extension://*",
};

static bool glob_match(const char *pat, const char *s) {
    if (*pat == '\0') return *s == '\0';
    if (*pat == '*') {
        for (const char *t = s;; t++) {
            if (glob_match(pat + 1, t)) return true;
            if (*t == '\0') return false;
        }
    }
    return *s && *pat == *s && glob_match(pat + 1, s + 1);
}

static bool origin_allowed(const hl_server *srv, const char *origin) {
    for (size_t i = 0; i < sizeof k_default_origins / sizeof k_default_origins[0]; i++)
        if (glob_match(k_default_origins[i], origin)) return true;
    for (size_t i = 0; i < srv->n_origins; i++)
        if (glob_match(srv->origins[i], origin)) return true;
    return false;
}

static void load_origins(hl_server *srv) {
    const char *env = getenv("HEARTH_ORIGINS");
    if (!env || !*env) env = getenv("OLLAMA_ORIGINS");
    if (!env || !*env) return;
    char *copy = strdup(env);
    if (!copy) return;
    char *save = NULL;
    for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        while (*tok == ' ' || *tok == '"') tok++;
        size_t n = strlen(tok);
        while (n && (tok[n - 1] == ' ' || tok[n - 1] == '"')) tok[--n] = '\0';
        if (!n) continue;
        char **nv = realloc(srv->origins, (srv->n_origins + 1) * sizeof *nv);
        if (!nv) break;
        srv->origins = nv;
        if ((nv[srv->n_origins] = strdup(tok)) != NULL) srv->n_origins++;
    }
    free(copy);
}

/* The page served at / (webui.c) calls the API from its own origin, which is the Host it
 * was loaded from: on a LAN address that origin is not in the list above. A same-origin
 * request is allowed when that Host names this machine or a private network (as the
 * DNS-rebinding guard checks), so a rebound public name still gets 403. */
static bool same_origin_allowed(const char *origin, const char *host) {
    if (!host || !*host) return false;
    const char *rest = strncasecmp(origin, "http://", 7) == 0    ? origin + 7
                       : strncasecmp(origin, "https://", 8) == 0 ? origin + 8
                                                                 : NULL;
    return rest && strcasecmp(rest, host) == 0 && host_allowed(host);
}

void srv_add_cors(const srv_request *r, struct MHD_Response *resp) {
    if (!r->cors_origin[0]) return;
    MHD_add_response_header(resp, "Access-Control-Allow-Origin", r->cors_origin);
    MHD_add_response_header(resp, "Vary", "Origin");
}

/* ---- replies ---- */

static enum MHD_Result queue(srv_request *r, unsigned status, const char *ctype, const void *data,
                             size_t len) {
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(len, (void *)data, MHD_RESPMEM_MUST_COPY);
    if (!resp) return MHD_NO;
    if (ctype) MHD_add_response_header(resp, "Content-Type", ctype);
    return srv_reply_response(r, status, resp);
}

void srv_set_status(srv_request *r, unsigned status) {
    /* counted here, before the client can read the reply: a scrape that follows a
     * reply sees it (request_completed runs only after the reply has been sent) */
    if (!r->status) metrics_request(r->srv->metrics, r->route ? r->route->path : NULL, (int)status);
    r->status = (int)status;
}

enum MHD_Result srv_reply_response(srv_request *r, unsigned status, struct MHD_Response *resp) {
    if (status == 503) MHD_add_response_header(resp, "Retry-After", "1");
    srv_add_cors(r, resp);
    r->replied = true;
    srv_set_status(r, status);
    if (!r->body_read && !r->reply_now) { /* sent once the body is read (access_handler) */
        r->pending = resp;
        r->pending_status = status;
        return MHD_YES;
    }
    if (!r->body_read) MHD_add_response_header(resp, "Connection", "close");
    enum MHD_Result ret = MHD_queue_response(r->conn, status, resp);
    MHD_destroy_response(resp);
    return ret;
}

static uint64_t discard_limit(const hl_server *srv) {
    uint64_t twice = (uint64_t)srv->max_body * 2;
    return twice > MIN_DISCARD_LIMIT ? twice : MIN_DISCARD_LIMIT;
}

enum MHD_Result srv_reply_json(srv_request *r, unsigned status, json_t *obj) {
    char *s = obj ? json_dumps(obj, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_ENCODE_ANY | JSON_REAL_PRECISION(15)) : NULL;
    json_decref(obj);
    if (!s) return queue(r, 500, "application/json; charset=utf-8", "{\"error\":\"out of memory\"}", 25);
    enum MHD_Result ret = queue(r, status, "application/json; charset=utf-8", s, strlen(s));
    free(s);
    return ret;
}

void srv_encoder_free(srv_encoder *e) {
    if (e && e->destroy) e->destroy(e);
}

/* Length of the valid UTF-8 sequence at p (0: invalid). */
static size_t utf8_seq(const unsigned char *p) {
    if (p[0] < 0x80) return 1;
    size_t n = p[0] >= 0xF0 && p[0] <= 0xF4 ? 4 : p[0] >= 0xE0 ? 3 : p[0] >= 0xC2 && p[0] < 0xE0 ? 2 : 0;
    if (!n || (n == 3 && p[0] > 0xEF)) return 0;
    for (size_t i = 1; i < n; i++)
        if ((p[i] & 0xC0) != 0x80) return 0;
    if (n == 3 && ((p[0] == 0xE0 && p[1] < 0xA0) || (p[0] == 0xED && p[1] >= 0xA0))) return 0;
    if (n == 4 && ((p[0] == 0xF0 && p[1] < 0x90) || (p[0] == 0xF4 && p[1] >= 0x90))) return 0;
    return n;
}

void srv_msg_clean(const hl_server *srv, char *msg) {
    const char *root = srv && srv->st ? store_root(srv->st) : NULL;
    size_t rl = root ? strlen(root) : 0;
    if (rl > 1) {
        for (char *at = strstr(msg, root); at; at = strstr(at, root)) {
            if (at[rl] != '/') {
                at += rl;
                continue;
            }
            memmove(at, at + rl + 1, strlen(at + rl + 1) + 1);
        }
    }
    for (unsigned char *p = (unsigned char *)msg; *p;) {
        size_t n = utf8_seq(p);
        if (n) {
            p += n;
        } else {
            *p++ = '?';
        }
    }
}

enum MHD_Result srv_reply_error(srv_request *r, unsigned status, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    srv_msg_clean(r->srv, msg);
    if (r->enc && r->enc->error_body)
        return srv_reply_json(r, status, r->enc->error_body(r->enc, status, msg));
    return srv_reply_json(r, status, json_pack("{s:s}", "error", msg));
}

enum MHD_Result srv_reply_text(srv_request *r, unsigned status, const char *content_type,
                               const char *text) {
    return queue(r, status, content_type, text, strlen(text));
}

/* ---- JSON helpers ---- */

const char *srv_json_kind(const json_t *v) {
    switch (v ? json_typeof(v) : JSON_NULL) {
    case JSON_OBJECT: return "object";
    case JSON_ARRAY: return "array";
    case JSON_STRING: return "string";
    case JSON_INTEGER: case JSON_REAL: return "number";
    case JSON_TRUE: case JSON_FALSE: return "bool";
    default: return "null";
    }
}

bool srv_err_set(srv_err *e, unsigned status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    e->status = status;
    return false;
}

json_t *srv_parse_body(srv_request *r, enum MHD_Result *ret) {
    if (r->body_len == 0) {
        *ret = srv_reply_error(r, 400, "missing request body");
        return NULL;
    }
    json_error_t je;
    json_t *j = json_loadb(r->body, r->body_len, JSON_DECODE_ANY, &je);
    if (!j) {
        *ret = srv_reply_error(r, 400, "invalid JSON at line %d, column %d: %s", je.line,
                               je.column, je.text);
        return NULL;
    }
    if (!json_is_object(j)) {
        *ret = srv_reply_error(r, 400, "json: cannot unmarshal %s into a request object",
                               srv_json_kind(j));
        json_decref(j);
        return NULL;
    }
    return j;
}

bool srv_get_string(srv_request *r, json_t *obj, const char *key, const char **out,
                    enum MHD_Result *ret) {
    json_t *v = json_object_get(obj, key);
    *out = NULL;
    if (!v || json_is_null(v)) return true;
    if (!json_is_string(v)) {
        *ret = srv_reply_error(r, 400, "json: cannot unmarshal %s into field \"%s\" of type string",
                               srv_json_kind(v), key);
        return false;
    }
    *out = json_string_value(v);
    return true;
}

bool srv_get_bool(srv_request *r, json_t *obj, const char *key, bool dflt, bool *out,
                  enum MHD_Result *ret) {
    json_t *v = json_object_get(obj, key);
    *out = dflt;
    if (!v || json_is_null(v)) return true;
    if (!json_is_boolean(v)) {
        *ret = srv_reply_error(r, 400, "json: cannot unmarshal %s into field \"%s\" of type bool",
                               srv_json_kind(v), key);
        return false;
    }
    *out = json_is_true(v);
    return true;
}

void srv_format_time(int64_t ns, char *buf, size_t cap) {
    time_t secs = (time_t)(ns / 1000000000);
    long frac = (long)(ns % 1000000000);
    struct tm tm;
    localtime_r(&secs, &tm);
    char base[32], fr[16] = "", zone[8];
    strftime(base, sizeof base, "%Y-%m-%dT%H:%M:%S", &tm);
    if (frac) { /* Go's RFC3339Nano trims trailing zeros */
        snprintf(fr, sizeof fr, ".%09ld", frac);
        size_t n = strlen(fr);
        while (n > 1 && fr[n - 1] == '0') fr[--n] = '\0';
    }
    long off = tm.tm_gmtoff;
    if (off == 0)
        strcpy(zone, "Z");
    else
        snprintf(zone, sizeof zone, "%c%02ld:%02ld", off < 0 ? '-' : '+', labs(off) / 3600,
                 (labs(off) % 3600) / 60);
    snprintf(buf, cap, "%s%s%s", base, fr, zone);
}

void srv_now(char *buf, size_t cap) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    time_t secs = ts.tv_sec;
    struct tm tm;
    gmtime_r(&secs, &tm);
    char base[32];
    strftime(base, sizeof base, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(buf, cap, "%s.%09ldZ", base, (long)ts.tv_nsec);
}

/* ---- routing ---- */

static enum MHD_Result handle_version(srv_request *r) {
    return srv_reply_json(r, 200, json_pack("{s:s}", "version", HEARTH_VERSION));
}

static const srv_route k_routes[] = {
    {"/", false, "GET HEAD", webui_handle_root, false},
    {"/webui/", true, "GET HEAD", webui_handle_asset, false},
    {"/api/version", false, "GET HEAD", handle_version, false},
    {"/health", false, "GET HEAD", srv_handle_health, false},
    {"/metrics", false, "GET HEAD", srv_handle_metrics, false},
    {"/api/tags", false, "GET HEAD", srv_handle_tags, false},
    {"/api/ps", false, "GET", srv_handle_ps, false},
    {"/api/show", false, "POST", srv_handle_show, false},
    {"/api/create", false, "POST", srv_handle_create, false},
    {"/api/copy", false, "POST", srv_handle_copy, false},
    {"/api/delete", false, "DELETE", srv_handle_delete, false},
    {"/api/blobs/", true, "HEAD POST", srv_handle_blobs, true},
    {"/api/pull", false, "POST", srv_handle_pull, false},
    {"/api/push", false, "POST", srv_handle_push, false},
    {"/api/generate", false, "POST", srv_handle_generate, false},
    {"/api/chat", false, "POST", srv_handle_chat, false},
    {"/api/embed", false, "POST", srv_handle_embed, false},
    {"/api/embeddings", false, "POST", srv_handle_embeddings, false},
    {"/v1/chat/completions", false, "POST", srv_handle_oai_chat, false},
    {"/v1/completions", false, "POST", srv_handle_oai_completions, false},
    {"/v1/models", false, "GET", srv_handle_oai_models, false},
    {"/v1/models/", true, "GET", srv_handle_oai_model, false},
    {"/v1/embeddings", false, "POST", srv_handle_oai_embeddings, false},
    {"/v1/responses", false, "POST", srv_handle_oai_responses, false},
    {"/v1/messages", false, "POST", srv_handle_anth_messages, false},
    {"/v1/messages/count_tokens", false, "POST", srv_handle_anth_count_tokens, false},
};

static const srv_route *find_route(const hl_server *srv, const char *path) {
    size_t n_extra = srv->n_extra_routes, n_builtin = sizeof k_routes / sizeof k_routes[0];
    if (srv->route_secret) n_builtin = 0; /* a runner: its own routes only */
    for (size_t i = 0; i < n_extra + n_builtin; i++) {
        const srv_route *rt = i < n_extra ? &srv->extra_routes[i] : &k_routes[i - n_extra];
        if (rt->prefix ? strncmp(path, rt->path, strlen(rt->path)) == 0 && path[strlen(rt->path)]
                       : strcmp(path, rt->path) == 0)
            return rt;
    }
    return NULL;
}

static bool method_allowed(const srv_route *rt, const char *method) {
    size_t n = strlen(method);
    for (const char *p = rt->methods; *p;) {
        const char *e = strchr(p, ' ');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == n && strncmp(p, method, n) == 0) return true;
        if (!e) break;
        p = e + 1;
    }
    return false;
}

/* Appends to the JSON body. 413: past max_body; 503: the bodies buffered by all
 * requests together would pass body_budget. The buffer never grows past max_body + 1. */
static unsigned append_body(srv_request *r, const char *data, size_t len) {
    hl_server *srv = r->srv;
    if (r->body_len + len > srv->max_body) return 413;
    if (r->body_len + len + 1 > r->body_cap) {
        size_t nc = r->body_cap ? r->body_cap : 4096;
        while (nc < r->body_len + len + 1) nc *= 2;
        if (nc > srv->max_body + 1) nc = srv->max_body + 1;
        size_t grow = nc - r->body_cap;
        if (atomic_fetch_add(&srv->body_bytes, grow) + grow > srv->body_budget) {
            atomic_fetch_sub(&srv->body_bytes, grow);
            return 503;
        }
        char *nb = realloc(r->body, nc);
        if (!nb) {
            atomic_fetch_sub(&srv->body_bytes, grow);
            return 503;
        }
        r->body = nb;
        r->body_cap = nc;
    }
    memcpy(r->body + r->body_len, data, len);
    r->body_len += len;
    r->body[r->body_len] = '\0';
    return 0;
}

static void free_body(srv_request *r) {
    atomic_fetch_sub(&r->srv->body_bytes, r->body_cap);
    free(r->body);
    r->body = NULL;
    r->body_len = r->body_cap = 0;
}

/* A runner's request path is "/<secret>/route": true (and path becomes "/route") when
 * the secret matches, compared in constant time. */
static bool strip_secret(const char *secret, char *path) {
    size_t n = strlen(secret);
    if (path[0] != '/' || strnlen(path + 1, n) < n || path[1 + n] != '/') return false;
    unsigned char diff = 0;
    for (size_t i = 0; i < n; i++) diff |= (unsigned char)(path[1 + i] ^ secret[i]);
    if (diff) return false;
    memmove(path, path + 1 + n, strlen(path + 1 + n) + 1);
    return true;
}

/* First call for a request: route it, check the method and the declared size. Returns
 * true when a reply was made already. Such an early reply waits until the body has been
 * read and dropped (see queue()), unless the client waits for "100 Continue" before it
 * sends the body, or the declared body is too large to read for nothing: then the
 * reply goes out at once, with "Connection: close". */
static bool first_call(srv_request *r, enum MHD_Result *ret) {
    const char *cl = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "Content-Length");
    unsigned long long declared = cl ? strtoull(cl, NULL, 10) : 0;
    const char *expect = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "Expect");
    r->reply_now = declared > discard_limit(r->srv) ||
                   (expect && strcasecmp(expect, "100-continue") == 0);
    if ((unsigned)atomic_load(&r->srv->n_conns) > r->srv->max_conns) {
        r->reply_now = true; /* and the connection closes: it is one too many */
        *ret = srv_reply_error(r, 503, "server busy: too many connections, retry later");
        return true;
    }
    if (r->srv->loopback_listener &&
        !host_allowed(MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "Host"))) {
        *ret = srv_reply_text(r, 403, NULL, "");
        return true;
    }
    const char *origin = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "Origin");
    if (origin && *origin) {
        if (!origin_allowed(r->srv, origin) &&
            !same_origin_allowed(origin,
                                 MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "Host"))) {
            *ret = srv_reply_text(r, 403, NULL, "");
            return true;
        }
        snprintf(r->cors_origin, sizeof r->cors_origin, "%s", origin);
    }
    if (strcmp(r->method, "OPTIONS") == 0) { /* CORS preflight */
        struct MHD_Response *resp = MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT);
        if (!resp) {
            *ret = MHD_NO;
            return true;
        }
        srv_add_cors(r, resp);
        MHD_add_response_header(resp, "Access-Control-Allow-Methods",
                                "GET, POST, PUT, PATCH, DELETE, HEAD, OPTIONS");
        MHD_add_response_header(resp, "Access-Control-Allow-Headers",
                                "Authorization, Content-Type, User-Agent, Accept, X-Requested-With, "
                                "OpenAI-Beta, x-stainless-arch, x-stainless-async, "
                                "x-stainless-custom-poll-interval, x-stainless-helper-method, "
                                "x-stainless-lang, x-stainless-os, x-stainless-package-version, "
                                "x-stainless-poll-helper, x-stainless-retry-count, "
                                "x-stainless-runtime, x-stainless-runtime-version, "
                                "x-stainless-timeout");
        MHD_add_response_header(resp, "Access-Control-Max-Age", "43200");
        srv_set_status(r, 204);
        *ret = MHD_queue_response(r->conn, 204, resp);
        MHD_destroy_response(resp);
        r->replied = true;
        return true;
    }
    if (r->srv->route_secret && !strip_secret(r->srv->route_secret, r->path)) {
        *ret = srv_reply_text(r, 403, "text/plain", "403 forbidden");
        return true;
    }
    r->route = find_route(r->srv, r->path);
    if (!r->route) {
        *ret = srv_reply_text(r, 404, "text/plain", "404 page not found");
        return true;
    }
    if (!method_allowed(r->route, r->method)) {
        *ret = srv_reply_text(r, 405, "text/plain", "405 method not allowed");
        return true;
    }
    if (!r->route->raw_body && declared > r->srv->max_body) {
        *ret = srv_reply_error(r, 413, "request body too large (limit %zu bytes)", r->srv->max_body);
        return true;
    }
    if (r->route->raw_body) {
        /* Blob uploads: validate and answer HEAD before the body. */
        const char *digest = r->path + strlen(r->route->path);
        if (!store_digest_parse(digest, r->blob_digest)) {
            *ret = srv_reply_error(r, 400, "invalid digest format");
            return true;
        }
        bool exists = store_blob_exists(r->srv->st, r->blob_digest, NULL);
        if (strcmp(r->method, "HEAD") == 0) {
            *ret = exists ? srv_reply_text(r, 200, NULL, "")
                          : srv_reply_error(r, 404, "blob \"%s\" not found", digest);
            return true;
        }
        /* An existing blob is answered 200 by srv_handle_blobs once the body is read:
         * answering now would close the connection with the upload unread. */
        if (exists) return false;
        hl_err err;
        if (store_blob_writer_open(r->srv->st, &r->blob, &err) != HL_OK) {
            *ret = srv_reply_error(r, 500, "%s", err.msg);
            return true;
        }
    }
    return false;
}

static enum MHD_Result access_handler(void *cls, struct MHD_Connection *conn, const char *url,
                                      const char *method, const char *version,
                                      const char *upload_data, size_t *upload_data_size,
                                      void **con_cls) {
    (void)version;
    hl_server *srv = cls;
    srv_request *r = *con_cls;
    if (!r) {
        r = calloc(1, sizeof *r);
        if (!r) return MHD_NO;
        *con_cls = r;
        r->srv = srv;
        r->conn = conn;
        r->method = method;
        r->start_ns = hl_time_ns();
        snprintf(r->path, sizeof r->path, "%s", url);
        enum MHD_Result ret;
        if (first_call(r, &ret)) return ret;
        return MHD_YES;
    }
    if (r->replied) { /* an early reply: drop the body, then send it */
        if (*upload_data_size > 0) {
            r->discarded += *upload_data_size;
            *upload_data_size = 0;
            /* a chunked upload that does not end: no reply can go out mid-body */
            return r->discarded > discard_limit(srv) ? MHD_NO : MHD_YES;
        }
        r->body_read = true;
        if (!r->pending) return MHD_YES;
        struct MHD_Response *resp = r->pending;
        r->pending = NULL;
        enum MHD_Result ret = MHD_queue_response(conn, r->pending_status, resp);
        MHD_destroy_response(resp);
        return ret;
    }
    if (*upload_data_size > 0) {
        if (r->blob) {
            hl_err err;
            if (store_blob_writer_write(r->blob, upload_data, *upload_data_size, &err) != HL_OK) {
                store_blob_writer_abort(r->blob);
                r->blob = NULL;
                *upload_data_size = 0;
                return srv_reply_error(r, 500, "%s", err.msg); /* sent after the body */
            }
        } else if (r->route->raw_body) {
            /* the blob exists already: the upload is read and dropped */
        } else {
            unsigned refused = append_body(r, upload_data, *upload_data_size);
            if (refused) {
                /* answered once the rest is read and dropped (up to discard_limit: an
                 * upload that does not end is cut there) */
                free_body(r);
                *upload_data_size = 0;
                if (refused == 503)
                    return srv_reply_error(r, 503, "server busy: too many large requests at "
                                                   "once, retry later");
                return srv_reply_error(r, 413, "request body too large (limit %zu bytes)",
                                       srv->max_body);
            }
        }
        *upload_data_size = 0;
        return MHD_YES;
    }
    r->body_read = true;
    /* the request is in: its handling and reply may take long (a generation), the
     * idle timeout applies again between requests (request_completed) */
    if (srv->conn_timeout) MHD_set_connection_option(conn, MHD_CONNECTION_OPTION_TIMEOUT, 0u);
    return r->route->handler(r);
}

static void request_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                              enum MHD_RequestTerminationCode toe) {
    (void)toe;
    hl_server *srv = cls;
    srv_request *r = *con_cls;
    if (srv->conn_timeout && conn)
        MHD_set_connection_option(conn, MHD_CONNECTION_OPTION_TIMEOUT, srv->conn_timeout);
    if (!r) return;
    if (!srv->quiet && hl_log_enabled(HL_LOG_INFO)) {
        /* the logger escapes the client's method and path */
        char status[16], dur[32];
        snprintf(status, sizeof status, "%d", r->status);
        snprintf(dur, sizeof dur, "%.3fms", (double)(hl_time_ns() - r->start_ns) / 1e6);
        HL_LOG_ATTRS(HL_LOG_INFO, "request", "status", status, "duration", dur, "method",
                     r->method, "path", r->path);
    }
    store_blob_writer_abort(r->blob);
    if (r->pending) MHD_destroy_response(r->pending);
    srv_encoder_free(r->enc);
    free_body(r);
    free(r);
    *con_cls = NULL;
}

/* ---- start / stop ---- */

static void notify_connection(void *cls, struct MHD_Connection *conn, void **socket_ctx,
                              enum MHD_ConnectionNotificationCode code) {
    (void)conn;
    (void)socket_ctx;
    hl_server *srv = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) atomic_fetch_add(&srv->n_conns, 1);
    else if (code == MHD_CONNECTION_NOTIFY_CLOSED) atomic_fetch_sub(&srv->n_conns, 1);
}

static unsigned env_unsigned(const char *name, unsigned dflt, unsigned max) {
    const char *v = getenv(name);
    if (!v || !*v) return dflt;
    char *end;
    errno = 0;
    unsigned long n = strtoul(v, &end, 10);
    if (errno || *end || n > max) {
        HL_WARN("ignoring %s=%s (not a number up to %u)", name, v, max);
        return dflt;
    }
    return (unsigned)n;
}

/* libmicrohttpd's own messages; a client that left mid-stream is routine, not news. */
static void mhd_log(void *cls, const char *fmt, va_list ap) {
    const hl_server *srv = cls;
    if (srv->quiet || strstr(fmt, "Application reported internal error")) return;
    char msg[1024];
    vsnprintf(msg, sizeof msg, fmt, ap);
    HL_WARN("http: %s", msg);
}

static hl_status listen_socket(const net_host *h, int *fd_out, int *port_out, hl_err *err) {
    char port[16];
    snprintf(port, sizeof port, "%d", h->port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE},
                    *res = NULL;
    int gai = getaddrinfo(h->host[0] ? h->host : NULL, port, &hints, &res);
    if (gai != 0)
        return hl_fail(err, HL_ERR_IO, "cannot resolve listen address '%s': %s", h->host,
                       gai_strerror(gai));
    int fd = -1, last = 0;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) {
            last = errno;
            continue;
        }
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, 128) == 0) break;
        last = errno;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0)
        return hl_fail(err, HL_ERR_IO, "listen tcp %s:%d: %s", h->host, h->port, strerror(last));
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    int p = h->port;
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0) {
        char hostbuf[NI_MAXHOST], portbuf[NI_MAXSERV];
        if (getnameinfo((struct sockaddr *)&ss, sl, hostbuf, sizeof hostbuf, portbuf,
                        sizeof portbuf, NI_NUMERICHOST | NI_NUMERICSERV) == 0)
            p = atoi(portbuf);
    }
    *fd_out = fd;
    *port_out = p;
    return HL_OK;
}

hl_status server_start(const server_config *cfg, hl_server **out, hl_err *err) {
    *out = NULL;
    hl_server *s = calloc(1, sizeof *s);
    if (!s) return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    s->max_body = cfg->max_body ? cfg->max_body : DEFAULT_MAX_BODY;
    s->body_budget = s->max_body * 4;
    s->quiet = cfg->quiet;
    s->extra_routes = cfg->extra_routes;
    s->n_extra_routes = cfg->extra_routes ? cfg->n_extra_routes : 0;
    load_origins(s);
    s->loopback_listener = is_loopback_bind(cfg->bind.host);
    pthread_mutex_init(&s->producers_lock, NULL);
    pthread_cond_init(&s->producers_cv, NULL);
    hl_status st = HL_OK;
    if (cfg->route_secret && !(s->route_secret = strdup(cfg->route_secret)))
        st = hl_fail(err, HL_ERR_NOMEM, "out of memory");
    if (st == HL_OK && !cfg->route_secret) st = store_open(cfg->models_dir, &s->st, err);
    if (st == HL_OK && !cfg->route_secret) st = sched_create(&s->sched, err);
    if (st == HL_OK && !cfg->route_secret) st = metrics_create(&s->metrics, err);
    if (st == HL_OK && s->st && !store_noprune()) {
        size_t removed = 0;
        hl_err gerr;
        if (store_gc(s->st, &removed, &gerr) != HL_OK)
            HL_WARN("store cleanup: %s", gerr.msg);
        else if (removed && !s->quiet)
            HL_INFO("store cleanup: removed %zu unused or partial blob files", removed);
    }
    if (st != HL_OK) {
        server_stop(s);
        return st;
    }
    int fd = -1;
    st = listen_socket(&cfg->bind, &fd, &s->port, err);
    if (st != HL_OK) {
        server_stop(s);
        return st;
    }
    s->conn_timeout = env_unsigned("HEARTH_CONN_TIMEOUT", DEFAULT_CONN_TIMEOUT, 86400);
    s->max_conns = env_unsigned("HEARTH_MAX_CONNECTIONS", DEFAULT_MAX_CONNS, 65536);
    if (s->max_conns == 0) s->max_conns = DEFAULT_MAX_CONNS;
    s->mhd = MHD_start_daemon(
        MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL |
            MHD_USE_ERROR_LOG,
        0, NULL, NULL, access_handler, s,
        /* first: libmicrohttpd warns on stderr about options before the logger */
        MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s, MHD_OPTION_LISTEN_SOCKET, fd,
        MHD_OPTION_NOTIFY_COMPLETED, request_completed, s,
        MHD_OPTION_NOTIFY_CONNECTION, notify_connection, s, MHD_OPTION_CONNECTION_LIMIT,
        s->max_conns * 2, MHD_OPTION_CONNECTION_TIMEOUT, s->conn_timeout,
        MHD_OPTION_END);
    if (!s->mhd) {
        close(fd);
        server_stop(s);
        return hl_fail(err, HL_ERR_IO, "cannot start the HTTP server");
    }
    *out = s;
    return HL_OK;
}

int server_port(const hl_server *s) { return s->port; }

void server_stop(hl_server *s) {
    if (!s) return;
    atomic_store(&s->stopping, true);
    sched_abort_loads(s->sched);
    if (s->mhd) MHD_stop_daemon(s->mhd);
    pthread_mutex_lock(&s->producers_lock);
    while (s->n_producers > 0) pthread_cond_wait(&s->producers_cv, &s->producers_lock);
    pthread_mutex_unlock(&s->producers_lock);
    sched_destroy(s->sched);
    metrics_destroy(s->metrics);
    store_close(s->st);
    free(s->route_secret);
    for (size_t i = 0; i < s->n_origins; i++) free(s->origins[i]);
    free(s->origins);
    pthread_mutex_destroy(&s->producers_lock);
    pthread_cond_destroy(&s->producers_cv);
    free(s);
}
