/* registry.c - what pull and push share: the name to URL mapping, libcurl requests with
 * an in-memory response, and the registry's bearer-token challenge (Ollama's registry and
 * Docker's token auth answer 401 with `WWW-Authenticate: Bearer realm=...`). */
#define _GNU_SOURCE
#include "registry/internal.h"

#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc;
static void curl_init(void) { curl_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT); }

int64_t reg_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

bool reg_report(reg_ctx *c, const char *status, const char *digest, uint64_t total,
                uint64_t completed) {
    if (c->cancelled) return false;
    if (!c->o || !c->o->progress) return true;
    reg_progress p = {status, digest, total, completed};
    if (!c->o->progress(c->o->ud, &p)) c->cancelled = true;
    return !c->cancelled;
}

bool reg_poll(reg_ctx *c) {
    if (c->cancelled) return false;
    if (c->o && c->o->progress) {
        reg_progress p = {NULL, NULL, 0, 0};
        if (!c->o->progress(c->o->ud, &p)) c->cancelled = true;
    }
    return !c->cancelled;
}

hl_status reg_cancelled(hl_err *err) { return hl_fail(err, HL_ERR_CANCELLED, "cancelled"); }

hl_status reg_ctx_init(reg_ctx *c, const char *name, const reg_opts *o, hl_err *err) {
    memset(c, 0, sizeof *c);
    c->o = o;
    pthread_once(&curl_once, curl_init);
    if (curl_init_rc != CURLE_OK)
        return hl_fail(err, HL_ERR_IO, "libcurl: %s", curl_easy_strerror(curl_init_rc));
    bool insecure = o && o->insecure;
    const char *scheme = insecure ? "http" : "https";
    if (strncasecmp(name, "http://", 7) == 0 && !insecure)
        return hl_fail(err, HL_ERR_INVALID, "insecure protocol http");
    if (store_name_parse(name, &c->name, err) != HL_OK) return HL_ERR_INVALID;
    int n = snprintf(c->base, sizeof c->base, "%s://%s/v2/%s/%s", scheme, c->name.host,
                     c->name.ns, c->name.model);
    if (n < 0 || (size_t)n >= sizeof c->base) return hl_fail(err, HL_ERR_INVALID, "invalid model name");
    return HL_OK;
}

void reg_ctx_free(reg_ctx *c) {
    free(c->token);
    c->token = NULL;
}

size_t reg_mem_write(char *p, size_t sz, size_t n, void *ud) {
    reg_membuf *m = ud;
    size_t len = sz * n;
    if (m->len + len > m->max) return 0; /* too big: abort */
    if (m->len + len + 1 > m->cap) {
        size_t cap = m->cap ? m->cap * 2 : 4096;
        while (cap < m->len + len + 1) cap *= 2;
        char *d = realloc(m->data, cap);
        if (!d) return 0;
        m->data = d;
        m->cap = cap;
    }
    memcpy(m->data + m->len, p, len);
    m->len += len;
    m->data[m->len] = '\0';
    return len;
}

static void header_value(const char *p, size_t len, size_t skip, char *out, size_t cap) {
    const char *v = p + skip;
    size_t vl = len - skip;
    while (vl && (*v == ' ' || *v == '\t')) v++, vl--;
    while (vl && (v[vl - 1] == '\r' || v[vl - 1] == '\n' || v[vl - 1] == ' ')) vl--;
    if (vl < cap) {
        memcpy(out, v, vl);
        out[vl] = '\0';
    }
}

size_t reg_header_cb(char *p, size_t sz, size_t n, void *ud) {
    reg_headers *h = ud;
    size_t len = sz * n;
    if (len >= 5 && strncmp(p, "HTTP/", 5) == 0) {
        /* a new response (after a redirect or a 100): forget the last one's headers */
        memset(h, 0, sizeof *h);
    } else if (len > 9 && strncasecmp(p, "Location:", 9) == 0) {
        header_value(p, len, 9, h->location, sizeof h->location);
    } else if (len > 17 && strncasecmp(p, "WWW-Authenticate:", 17) == 0) {
        header_value(p, len, 17, h->www_auth, sizeof h->www_auth);
    } else if (len > 14 && strncasecmp(p, "Content-Range:", 14) == 0) {
        header_value(p, len, 14, h->content_range, sizeof h->content_range);
    } else if (len > 6 && strncasecmp(p, "Range:", 6) == 0) {
        header_value(p, len, 6, h->range, sizeof h->range);
    }
    return len;
}

void reg_common_opts(reg_ctx *c, CURL *h, const char *url) {
    bool insecure = c->o && c->o->insecure;
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, insecure ? "http,https" : "https");
    curl_easy_setopt(h, CURLOPT_REDIR_PROTOCOLS_STR, insecure ? "http,https" : "https");
    curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(h, CURLOPT_MAXREDIRS, 10L);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, 30L);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, 60L);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_USERAGENT, "hearth (ollama-compatible)");
    if (c->token) {
        /* CURLAUTH_BEARER: curl keeps it to the original host across redirects (CDNs) */
        curl_easy_setopt(h, CURLOPT_HTTPAUTH, CURLAUTH_BEARER);
        curl_easy_setopt(h, CURLOPT_XOAUTH2_BEARER, c->token);
    }
}

void reg_registry_message(long status, const reg_membuf *b, char *out, size_t cap) {
    json_t *j = b->data ? json_loadb(b->data, b->len, 0, NULL) : NULL;
    json_t *e0 = json_array_get(json_object_get(j, "errors"), 0);
    const char *msg = json_string_value(json_object_get(e0, "message"));
    if (msg)
        snprintf(out, cap, "%s", msg);
    else
        snprintf(out, cap, "registry responded with status %ld", status);
    json_decref(j);
}

void reg_resolve(const reg_ctx *c, const char *loc, char *out, size_t cap) {
    if (strstr(loc, "://")) {
        snprintf(out, cap, "%s", loc);
        return;
    }
    const char *p = strstr(c->base, "://");
    const char *slash = p ? strchr(p + 3, '/') : NULL;
    int origin = slash ? (int)(slash - c->base) : (int)strlen(c->base);
    snprintf(out, cap, "%.*s%s%s", origin, c->base, loc[0] == '/' ? "" : "/", loc);
}

/* ---- bearer auth ---- */

/* The value of key in a challenge's `k="v",k2=v2` list (quoted values may hold commas). */
static bool challenge_param(const char *s, const char *key, char *out, size_t cap) {
    size_t kl = strlen(key);
    while (*s) {
        while (*s == ' ' || *s == ',') s++;
        const char *k = s;
        while (*s && *s != '=' && *s != ',') s++;
        size_t this_kl = (size_t)(s - k);
        if (*s != '=') continue;
        s++;
        char val[AUTH_HDR_CAP];
        size_t vl = 0;
        if (*s == '"') {
            for (s++; *s && *s != '"'; s++) {
                if (*s == '\\' && s[1]) s++;
                if (vl + 1 < sizeof val) val[vl++] = *s;
            }
            if (*s == '"') s++;
        } else {
            while (*s && *s != ',' && *s != ' ')
                if (vl + 1 < sizeof val) val[vl++] = *s++;
                else s++;
        }
        val[vl] = '\0';
        if (this_kl == kl && strncasecmp(k, key, kl) == 0) {
            if (vl >= cap) return false;
            memcpy(out, val, vl + 1);
            return true;
        }
    }
    return false;
}

/* Host part of a URL (no port), lower-cased by curl's parser; false when unparsable. */
static bool url_host(const char *url, char *out, size_t cap) {
    CURLU *u = curl_url();
    char *host = NULL;
    bool ok = u && curl_url_set(u, CURLUPART_URL, url, 0) == CURLUE_OK &&
              curl_url_get(u, CURLUPART_HOST, &host, 0) == CURLUE_OK && strlen(host) < cap;
    if (ok) snprintf(out, cap, "%s", host);
    curl_free(host);
    curl_url_cleanup(u);
    return ok;
}

hl_status reg_auth(reg_ctx *c, const char *challenge, hl_err *err) {
    if (strncasecmp(challenge, "Bearer ", 7) != 0)
        return hl_fail(err, HL_ERR_INVALID, "unauthorized: access denied");
    char realm[URL_CAP], service[512] = "", scope[1024] = "";
    if (!challenge_param(challenge + 7, "realm", realm, sizeof realm))
        return hl_fail(err, HL_ERR_FORMAT, "unauthorized: the registry's challenge has no realm");
    challenge_param(challenge + 7, "service", service, sizeof service);
    challenge_param(challenge + 7, "scope", scope, sizeof scope);
    /* as Ollama: the token comes from the registry's own host, never a third party */
    char rh[256], bh[256];
    if (!url_host(realm, rh, sizeof rh) || !url_host(c->base, bh, sizeof bh) || strcasecmp(rh, bh) != 0)
        return hl_fail(err, HL_ERR_INVALID, "unauthorized: the token realm %s is not on the registry's host",
                       realm);
    CURL *h = curl_easy_init();
    if (!h) return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    char url[URL_CAP * 2];
    char *es = curl_easy_escape(h, service, 0), *esc = curl_easy_escape(h, scope, 0);
    snprintf(url, sizeof url, "%s%sservice=%s%s%s", realm, strchr(realm, '?') ? "&" : "?", es ? es : "",
             scope[0] ? "&scope=" : "", scope[0] && esc ? esc : "");
    curl_free(es);
    curl_free(esc);
    char *saved = c->token;
    c->token = NULL; /* the realm gets no stale token */
    reg_common_opts(c, h, url);
    c->token = saved;
    reg_membuf body = {.max = 1 << 20};
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, reg_mem_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &body);
    CURLcode rc = curl_easy_perform(h);
    long status = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_cleanup(h);
    hl_status st = HL_OK;
    if (rc != CURLE_OK) {
        st = hl_fail(err, HL_ERR_IO, "getting a registry token: %s", curl_easy_strerror(rc));
    } else if (status != 200) {
        st = hl_fail(err, HL_ERR_INVALID, "unauthorized: the token realm responded with status %ld", status);
    } else {
        json_t *j = json_loadb(body.data ? body.data : "", body.len, 0, NULL);
        const char *tok = json_string_value(json_object_get(j, "token"));
        if (!tok || !*tok) tok = json_string_value(json_object_get(j, "access_token"));
        char *copy = tok && *tok ? strdup(tok) : NULL;
        json_decref(j);
        if (!copy) {
            st = hl_fail(err, HL_ERR_FORMAT, "unauthorized: the token realm sent no token");
        } else {
            free(c->token);
            c->token = copy;
            c->token_gen++;
        }
    }
    free(body.data);
    return st;
}

/* ---- one request ---- */

typedef struct body_src {
    reg_ctx *c;
    const reg_req *q;
    uint64_t sent;
    int64_t last_report;
} body_src;

static size_t body_read(char *p, size_t sz, size_t n, void *ud) {
    body_src *b = ud;
    uint64_t left = b->q->body_len - b->sent;
    size_t want = sz * n < left ? sz * n : (size_t)left;
    if (!want) return 0;
    for (;;) {
        ssize_t r = pread(b->q->body_fd, p, want, (off_t)(b->q->body_off + b->sent));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return CURL_READFUNC_ABORT;
        b->sent += (uint64_t)r;
        int64_t t = reg_now_ns();
        if (b->q->progress_status && t - b->last_report >= PROGRESS_NS) {
            b->last_report = t;
            if (!reg_report(b->c, b->q->progress_status, b->q->progress_digest, b->q->progress_total,
                            b->q->progress_base + b->sent))
                return CURL_READFUNC_ABORT;
        }
        return (size_t)r;
    }
}

static int body_seek(void *ud, curl_off_t off, int origin) {
    body_src *b = ud;
    if (origin != SEEK_SET || off < 0 || (uint64_t)off > b->q->body_len) return CURL_SEEKFUNC_CANTSEEK;
    b->sent = (uint64_t)off;
    return CURL_SEEKFUNC_OK;
}

static hl_status request_once(reg_ctx *c, const reg_req *q, reg_resp *r, hl_err *err) {
    memset(r, 0, sizeof *r);
    r->body.max = MANIFEST_MAX;
    CURL *h = curl_easy_init();
    if (!h) return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    reg_common_opts(c, h, q->url);
    if (!q->follow) curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 0L);
    struct curl_slist *hdrs = NULL;
    char line[512];
    if (q->content_type) {
        snprintf(line, sizeof line, "Content-Type: %s", q->content_type);
        hdrs = curl_slist_append(hdrs, line);
    }
    if (q->accept) {
        snprintf(line, sizeof line, "Accept: %s", q->accept);
        hdrs = curl_slist_append(hdrs, line);
    }
    if (q->content_range) {
        snprintf(line, sizeof line, "Content-Range: %s", q->content_range);
        hdrs = curl_slist_append(hdrs, line);
    }
    body_src src = {.c = c, .q = q};
    if (strcmp(q->method, "HEAD") == 0) {
        curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
    } else if (strcmp(q->method, "GET") != 0) {
        if (q->body_from_fd) {
            curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
            curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, (curl_off_t)q->body_len);
            curl_easy_setopt(h, CURLOPT_READFUNCTION, body_read);
            curl_easy_setopt(h, CURLOPT_READDATA, &src);
            curl_easy_setopt(h, CURLOPT_SEEKFUNCTION, body_seek);
            curl_easy_setopt(h, CURLOPT_SEEKDATA, &src);
            hdrs = curl_slist_append(hdrs, "Expect:"); /* no 100-continue round trip */
        } else {
            curl_easy_setopt(h, CURLOPT_POST, 1L);
            curl_easy_setopt(h, CURLOPT_POSTFIELDS, q->body ? q->body : "");
            curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)q->body_len);
        }
        curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, q->method);
    }
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, reg_mem_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &r->body);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, reg_header_cb);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, &r->hdr);
    CURLcode rc = curl_easy_perform(h);
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &r->status);
    curl_easy_cleanup(h);
    curl_slist_free_all(hdrs);
    if (rc != CURLE_OK) {
        free(r->body.data);
        r->body.data = NULL;
        if (c->cancelled) return reg_cancelled(err);
        return hl_fail(err, HL_ERR_IO, "%s %s: %s", q->method, q->url, curl_easy_strerror(rc));
    }
    return HL_OK;
}

hl_status reg_request(reg_ctx *c, const reg_req *q, reg_resp *r, hl_err *err) {
    for (bool fetched = false;;) {
        unsigned gen = c->token_gen;
        hl_status st = request_once(c, q, r, err);
        if (st != HL_OK || r->status != 401 || !r->hdr.www_auth[0]) return st;
        free(r->body.data);
        r->body.data = NULL;
        if (gen != c->token_gen) continue; /* refreshed meanwhile: go again with it */
        if (fetched) return hl_fail(err, HL_ERR_INVALID, "unauthorized: access denied");
        if ((st = reg_auth(c, r->hdr.www_auth, err)) != HL_OK) return st;
        fetched = true;
    }
}
