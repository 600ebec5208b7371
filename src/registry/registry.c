#define _GNU_SOURCE
#include "registry/registry.h"

#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/file.h"
#include "store/sha256.h"

#define URL_CAP 4096
#define MANIFEST_MAX (4u << 20)
#define ATTEMPTS 5
#define PROGRESS_NS 100000000LL /* at most one progress line per blob per 100 ms */

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc;
static void curl_init(void) { curl_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT); }

typedef struct reg_ctx {
    const reg_opts *o;
    store_name name;
    char base[URL_CAP]; /* scheme://host/v2/ns/model */
    bool cancelled;
} reg_ctx;

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static bool report(reg_ctx *c, const char *status, const char *digest, uint64_t total,
                   uint64_t completed) {
    if (c->cancelled) return false;
    if (!c->o || !c->o->progress) return true;
    reg_progress p = {status, digest, total, completed};
    if (!c->o->progress(c->o->ud, &p)) c->cancelled = true;
    return !c->cancelled;
}

static hl_status cancelled(hl_err *err) { return hl_fail(err, HL_ERR_CANCELLED, "cancelled"); }

static hl_status ctx_init(reg_ctx *c, const char *name, const reg_opts *o, hl_err *err) {
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

/* ---- one request with an in-memory response ---- */

typedef struct membuf {
    char *data;
    size_t len, cap, max;
} membuf;

static size_t mem_write(char *p, size_t sz, size_t n, void *ud) {
    membuf *m = ud;
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

typedef struct header_cap {
    char location[URL_CAP];
} header_cap;

static size_t header_cb(char *p, size_t sz, size_t n, void *ud) {
    header_cap *h = ud;
    size_t len = sz * n;
    if (len > 9 && strncasecmp(p, "Location:", 9) == 0) {
        const char *v = p + 9;
        size_t vl = len - 9;
        while (vl && (*v == ' ' || *v == '\t')) v++, vl--;
        while (vl && (v[vl - 1] == '\r' || v[vl - 1] == '\n' || v[vl - 1] == ' ')) vl--;
        if (vl < sizeof h->location) {
            memcpy(h->location, v, vl);
            h->location[vl] = '\0';
        }
    }
    return len;
}

/* Common options: protocols (https only unless insecure), redirects, stall detection. */
static void common_opts(reg_ctx *c, CURL *h, const char *url) {
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
}

/* The registry's error message ({"errors":[{"message":...}]}) or the status line. */
static void registry_message(long status, const membuf *b, char *out, size_t cap) {
    json_t *j = b->data ? json_loadb(b->data, b->len, 0, NULL) : NULL;
    json_t *e0 = json_array_get(json_object_get(j, "errors"), 0);
    const char *msg = json_string_value(json_object_get(e0, "message"));
    if (msg)
        snprintf(out, cap, "%s", msg);
    else
        snprintf(out, cap, "registry responded with status %ld", status);
    json_decref(j);
}

typedef struct req_spec {
    const char *method; /* GET, HEAD, POST, PUT */
    const char *url;
    const char *content_type; /* request body's, or NULL */
    const char *accept;       /* or NULL */
    const void *body;         /* PUT/POST in-memory body (may be NULL) */
    size_t body_len;
    bool follow; /* follow redirects */
} req_spec;

typedef struct req_result {
    long status;
    membuf body;
    header_cap hdr;
} req_result;

static hl_status do_request(reg_ctx *c, const req_spec *q, req_result *r, hl_err *err) {
    memset(r, 0, sizeof *r);
    r->body.max = MANIFEST_MAX;
    CURL *h = curl_easy_init();
    if (!h) return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    common_opts(c, h, q->url);
    if (!q->follow) curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 0L);
    struct curl_slist *hdrs = NULL;
    char line[256];
    if (q->content_type) {
        snprintf(line, sizeof line, "Content-Type: %s", q->content_type);
        hdrs = curl_slist_append(hdrs, line);
    }
    if (q->accept) {
        snprintf(line, sizeof line, "Accept: %s", q->accept);
        hdrs = curl_slist_append(hdrs, line);
    }
    if (strcmp(q->method, "HEAD") == 0) {
        curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
    } else if (strcmp(q->method, "POST") == 0 || strcmp(q->method, "PUT") == 0) {
        curl_easy_setopt(h, CURLOPT_POST, 1L);
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, q->body ? q->body : "");
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)q->body_len);
        if (strcmp(q->method, "PUT") == 0) curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, "PUT");
    }
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, mem_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &r->body);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, header_cb);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, &r->hdr);
    CURLcode rc = curl_easy_perform(h);
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &r->status);
    curl_easy_cleanup(h);
    curl_slist_free_all(hdrs);
    if (rc != CURLE_OK) {
        free(r->body.data);
        r->body.data = NULL;
        return hl_fail(err, HL_ERR_IO, "%s %s: %s", q->method, q->url, curl_easy_strerror(rc));
    }
    return HL_OK;
}

/* ---- pull ---- */

typedef struct dl {
    reg_ctx *c;
    int fd;
    sha256_ctx sha;
    uint64_t have;  /* bytes in the partial file (and hashed) */
    uint64_t total; /* the layer's size */
    const char *digest;
    char status[32];
    int64_t last_report;
    long http_status;
    bool write_failed;
    bool too_big;  /* the server sent more than the layer's size */
    bool restart; /* the server ignored our Range: start over */
    bool range_sent;
} dl;

static size_t dl_write(char *p, size_t sz, size_t n, void *ud) {
    dl *d = ud;
    size_t len = sz * n;
    if (d->restart) {
        /* 200 to a ranged request: the whole blob follows; drop what we had */
        if (ftruncate(d->fd, 0) != 0 || lseek(d->fd, 0, SEEK_SET) != 0) {
            d->write_failed = true;
            return 0;
        }
        sha256_discard(&d->sha);
        if (!sha256_init(&d->sha)) {
            d->write_failed = true;
            return 0;
        }
        d->have = 0;
        d->restart = false;
    }
    if (d->have + len > d->total) { /* more than the manifest says: wrong blob */
        d->too_big = true;
        return 0;
    }
    const char *q = p;
    size_t left = len;
    while (left) {
        ssize_t w = write(d->fd, q, left);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            d->write_failed = true;
            return 0;
        }
        q += w;
        left -= (size_t)w;
    }
    sha256_update(&d->sha, p, len);
    d->have += len;
    int64_t t = now_ns();
    if (t - d->last_report >= PROGRESS_NS) {
        d->last_report = t;
        if (!report(d->c, d->status, d->digest, d->total, d->have)) return 0;
    }
    return len;
}

/* Decides, once the headers are in, whether a ranged request got its range. */
static size_t dl_header(char *p, size_t sz, size_t n, void *ud) {
    dl *d = ud;
    size_t len = sz * n;
    if (len >= 5 && strncmp(p, "HTTP/", 5) == 0) {
        const char *sp = memchr(p, ' ', len);
        d->http_status = sp ? strtol(sp + 1, NULL, 10) : 0;
        d->restart = d->range_sent && d->http_status == 200;
    }
    return len;
}

static int xfer_cb(void *ud, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal,
                   curl_off_t ulnow) {
    (void)dltotal, (void)dlnow, (void)ultotal, (void)ulnow;
    reg_ctx *c = ud;
    if (c->cancelled) return 1;
    if (c->o && c->o->progress) {
        /* a zero-progress poll so that a disconnected client cancels a stalled transfer */
        reg_progress p = {NULL, NULL, 0, 0};
        if (!c->o->progress(c->o->ud, &p)) c->cancelled = true;
    }
    return c->cancelled ? 1 : 0;
}

/* Hashes the bytes already in the partial file. */
static hl_status hash_existing(dl *d, hl_err *err) {
    char *buf = malloc(1 << 20);
    if (!buf) return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    if (lseek(d->fd, 0, SEEK_SET) != 0) {
        free(buf);
        return hl_fail(err, HL_ERR_IO, "seek: %s", strerror(errno));
    }
    uint64_t got = 0;
    while (got < d->have) {
        ssize_t r = read(d->fd, buf, 1 << 20);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        if (got + (uint64_t)r > d->have) r = (ssize_t)(d->have - got);
        sha256_update(&d->sha, buf, (size_t)r);
        got += (uint64_t)r;
        int64_t t = now_ns();
        if (t - d->last_report >= PROGRESS_NS) {
            d->last_report = t;
            if (!report(d->c, d->status, d->digest, d->total, got)) break;
        }
    }
    free(buf);
    if (d->c->cancelled) return cancelled(err);
    if (got != d->have) return hl_fail(err, HL_ERR_IO, "reading the partial download failed");
    if (lseek(d->fd, (off_t)d->have, SEEK_SET) < 0)
        return hl_fail(err, HL_ERR_IO, "seek: %s", strerror(errno));
    return HL_OK;
}

/* One GET of the rest of the blob into d. Transport errors: HL_ERR_IO (retryable). */
static hl_status dl_get(dl *d, hl_err *err) {
    reg_ctx *c = d->c;
    char url[URL_CAP];
    snprintf(url, sizeof url, "%s/blobs/%s", c->base, d->digest);
    CURL *h = curl_easy_init();
    if (!h) return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    common_opts(c, h, url);
    char range[64];
    d->range_sent = d->have > 0;
    d->http_status = 0;
    d->restart = false;
    if (d->range_sent) {
        snprintf(range, sizeof range, "%llu-", (unsigned long long)d->have);
        curl_easy_setopt(h, CURLOPT_RANGE, range);
    }
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, dl_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, d);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, dl_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, d);
    curl_easy_setopt(h, CURLOPT_FAILONERROR, 1L);
    curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, xfer_cb);
    curl_easy_setopt(h, CURLOPT_XFERINFODATA, c);
    d->write_failed = false;
    d->too_big = false;
    CURLcode rc = curl_easy_perform(h);
    long status = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_cleanup(h);
    if (c->cancelled) return cancelled(err);
    if (rc == CURLE_OK) return HL_OK;
    if (d->too_big)
        return hl_fail(err, HL_ERR_FORMAT, "pull blob %s: the registry sent more than %llu bytes",
                       d->digest, (unsigned long long)d->total);
    if (d->write_failed) return hl_fail(err, HL_ERR_IO, "writing %s: %s", d->digest, strerror(errno));
    if (rc == CURLE_HTTP_RETURNED_ERROR && status == 416) {
        /* our partial is no prefix the server knows: start over */
        d->restart = false;
        if (ftruncate(d->fd, 0) != 0 || lseek(d->fd, 0, SEEK_SET) != 0)
            return hl_fail(err, HL_ERR_IO, "truncate: %s", strerror(errno));
        sha256_discard(&d->sha);
        if (!sha256_init(&d->sha)) return hl_fail(err, HL_ERR_NOMEM, "out of memory");
        d->have = 0;
        return hl_fail(err, HL_ERR_IO, "range not satisfiable");
    }
    if (rc == CURLE_HTTP_RETURNED_ERROR) {
        hl_status code = status >= 500 ? HL_ERR_IO : HL_ERR_FORMAT; /* 5xx: retry */
        if (status == 404)
            return hl_fail(err, HL_ERR_FORMAT, "pull blob %s: file does not exist", d->digest);
        return hl_fail(err, code, "pull blob %s: registry responded with status %ld", d->digest,
                       status);
    }
    return hl_fail(err, HL_ERR_IO, "pull blob %s: %s", d->digest, curl_easy_strerror(rc));
}

/* Fetches one blob into its verified partial file (not yet in the store).
 * *partial_path receives the partial's path. Already in the store: *present = true. */
static hl_status fetch_blob(reg_ctx *c, store *s, const store_layer *l, char *partial_path,
                            size_t cap, hl_err *err) {
    char final_path[URL_CAP];
    hl_status st = store_blob_path(s, l->digest, final_path, sizeof final_path, err);
    if (st != HL_OK) return st;
    snprintf(partial_path, cap, "%s-partial", final_path);
    dl d = {0};
    d.c = c;
    d.total = l->size;
    d.digest = l->digest;
    snprintf(d.status, sizeof d.status, "pulling %.12s", l->digest + 7);
    d.fd = open(partial_path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (d.fd < 0) return hl_fail(err, HL_ERR_IO, "%s: %s", partial_path, strerror(errno));
    /* another pull of the same blob holds it: wait for it, then see what it left */
    while (flock(d.fd, LOCK_EX) != 0 && errno == EINTR) {}
    if (store_blob_exists(s, l->digest, NULL)) {
        close(d.fd);
        partial_path[0] = '\0';
        report(c, d.status, l->digest, l->size, l->size);
        return HL_OK;
    }
    struct stat sb;
    if (fstat(d.fd, &sb) != 0) {
        close(d.fd);
        return hl_fail(err, HL_ERR_IO, "%s: %s", partial_path, strerror(errno));
    }
    d.have = (uint64_t)sb.st_size;
    if (!sha256_init(&d.sha)) {
        close(d.fd);
        return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    }
    if (d.have > d.total) { /* not a prefix of this blob */
        if (ftruncate(d.fd, 0) != 0) {
            st = hl_fail(err, HL_ERR_IO, "truncate: %s", strerror(errno));
            goto out;
        }
        d.have = 0;
    }
    report(c, d.status, l->digest, l->size, d.have);
    if (d.have > 0 && (st = hash_existing(&d, err)) != HL_OK) goto out;
    for (int attempt = 0; d.have < d.total; attempt++) {
        st = dl_get(&d, err);
        if (st == HL_OK && d.have < d.total)
            st = hl_fail(err, HL_ERR_IO, "pull blob %s: the transfer ended early", l->digest);
        if (st == HL_OK || st != HL_ERR_IO || attempt + 1 >= ATTEMPTS) break;
        struct timespec ts = {0, 200000000L * (attempt + 1)};
        nanosleep(&ts, NULL); /* then resume from what arrived */
    }
    if (st != HL_OK) goto out;
    char got[STORE_DIGEST_LEN];
    memcpy(got, "sha256:", 7);
    sha256_final_hex(&d.sha, got + 7);
    if (strcmp(got, l->digest) != 0) {
        /* corrupt bytes: they must never be resumed from */
        unlink(partial_path);
        st = hl_fail(err, HL_ERR_FORMAT,
                     "digest mismatch, file must be downloaded again: want %s, got %s", l->digest, got);
        goto out;
    }
    if (fsync(d.fd) != 0) {
        st = hl_fail(err, HL_ERR_IO, "%s: %s", partial_path, strerror(errno));
        goto out;
    }
    report(c, d.status, l->digest, l->size, l->size);
out:
    sha256_discard(&d.sha);
    close(d.fd);
    return st;
}

static bool layer_in(const store_manifest *m, const char *digest) {
    if (strcmp(m->config.digest, digest) == 0) return true;
    for (size_t i = 0; i < m->n_layers; i++)
        if (strcmp(m->layers[i].digest, digest) == 0) return true;
    return false;
}

hl_status reg_pull(store *s, const char *name, const reg_opts *o, hl_err *err) {
    reg_ctx c;
    hl_status st = ctx_init(&c, name, o, err);
    if (st != HL_OK) return st;
    if (!report(&c, "pulling manifest", NULL, 0, 0)) return cancelled(err);
    char url[URL_CAP];
    snprintf(url, sizeof url, "%s/manifests/%s", c.base, c.name.tag);
    req_spec q = {.method = "GET", .url = url, .accept = STORE_MT_MANIFEST, .follow = true};
    req_result r;
    st = do_request(&c, &q, &r, err);
    if (st != HL_OK) {
        hl_err_prefix(err, "pull model manifest");
        return st;
    }
    if (r.status == 404) {
        free(r.body.data);
        return hl_fail(err, HL_ERR_FORMAT, "pull model manifest: file does not exist");
    }
    if (r.status != 200) {
        char msg[256];
        registry_message(r.status, &r.body, msg, sizeof msg);
        free(r.body.data);
        return hl_fail(err, HL_ERR_FORMAT, "pull model manifest: %s", msg);
    }
    store_manifest m;
    st = store_manifest_parse(r.body.data ? r.body.data : "", r.body.len, &m, err);
    if (st != HL_OK) {
        free(r.body.data);
        hl_err_prefix(err, "pull model manifest");
        return st;
    }
    /* layers, then the config, as Ollama orders them */
    size_t n = m.n_layers + 1;
    const store_layer **ls = calloc(n, sizeof *ls);
    char (*partials)[URL_CAP] = calloc(n, sizeof *partials);
    if (!ls || !partials) {
        st = hl_fail(err, HL_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (size_t i = 0; i < m.n_layers; i++) ls[i] = &m.layers[i];
    ls[m.n_layers] = &m.config;
    for (size_t i = 0; i < n && st == HL_OK; i++) {
        partials[i][0] = '\0';
        if (store_blob_exists(s, ls[i]->digest, NULL)) {
            char status[32];
            snprintf(status, sizeof status, "pulling %.12s", ls[i]->digest + 7);
            if (!report(&c, status, ls[i]->digest, ls[i]->size, ls[i]->size)) st = cancelled(err);
            continue;
        }
        st = fetch_blob(&c, s, ls[i], partials[i], URL_CAP, err);
    }
    if (st != HL_OK) goto done;
    if (!report(&c, "verifying sha256 digest", NULL, 0, 0)) {
        st = cancelled(err);
        goto done;
    }
    /* every blob verified: move them into the store, then the manifest */
    for (size_t i = 0; i < n && st == HL_OK; i++) {
        if (!partials[i][0]) continue;
        char final_path[URL_CAP];
        st = store_blob_path(s, ls[i]->digest, final_path, sizeof final_path, err);
        if (st == HL_OK && rename(partials[i], final_path) != 0 &&
            !(errno == ENOENT && store_blob_exists(s, ls[i]->digest, NULL)))
            st = hl_fail(err, HL_ERR_IO, "cannot move %s into place: %s", final_path, strerror(errno));
    }
    if (st != HL_OK) goto done;
    if (!report(&c, "writing manifest", NULL, 0, 0)) {
        st = cancelled(err);
        goto done;
    }
    store_name canon = c.name;
    store_manifest old = {0};
    bool had_old = false;
    if (store_find(s, &c.name, &canon))
        had_old = store_manifest_read(s, &canon, &old, NULL, NULL, NULL) == HL_OK;
    st = store_manifest_write_raw(s, &canon, r.body.data, r.body.len, err);
    if (st == HL_OK && had_old) {
        bool unused = !layer_in(&m, old.config.digest);
        for (size_t i = 0; i < old.n_layers; i++) unused |= !layer_in(&m, old.layers[i].digest);
        if (unused) {
            report(&c, "removing unused layers", NULL, 0, 0);
            store_prune(s, &old, NULL);
        }
    }
    store_manifest_free(&old);
    if (st == HL_OK) report(&c, "success", NULL, 0, 0);
done:
    free(ls);
    free(partials);
    store_manifest_free(&m);
    free(r.body.data);
    return st;
}

/* ---- push ---- */

typedef struct ul {
    reg_ctx *c;
    int fd;
    uint64_t total, sent;
    const char *digest;
    char status[32];
    int64_t last_report;
} ul;

static size_t ul_read(char *p, size_t sz, size_t n, void *ud) {
    ul *u = ud;
    for (;;) {
        ssize_t r = read(u->fd, p, sz * n);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return CURL_READFUNC_ABORT;
        u->sent += (uint64_t)r;
        int64_t t = now_ns();
        if (t - u->last_report >= PROGRESS_NS) {
            u->last_report = t;
            if (!report(u->c, u->status, u->digest, u->total, u->sent)) return CURL_READFUNC_ABORT;
        }
        return (size_t)r;
    }
}

/* Resolves a Location header against the registry's base URL. */
static void resolve(const reg_ctx *c, const char *loc, char *out, size_t cap) {
    if (strstr(loc, "://")) {
        snprintf(out, cap, "%s", loc);
        return;
    }
    const char *p = strstr(c->base, "://");
    const char *slash = p ? strchr(p + 3, '/') : NULL;
    int origin = slash ? (int)(slash - c->base) : (int)strlen(c->base);
    snprintf(out, cap, "%.*s%s%s", origin, c->base, loc[0] == '/' ? "" : "/", loc);
}

static hl_status push_blob(reg_ctx *c, store *s, const store_layer *l, hl_err *err) {
    char status[32], url[URL_CAP];
    snprintf(status, sizeof status, "pushing %.12s", l->digest + 7);
    snprintf(url, sizeof url, "%s/blobs/%s", c->base, l->digest);
    req_spec q = {.method = "HEAD", .url = url, .follow = true};
    req_result r;
    hl_status st = do_request(c, &q, &r, err);
    if (st != HL_OK) return st;
    free(r.body.data);
    if (r.status == 200) {
        report(c, status, l->digest, l->size, l->size);
        return c->cancelled ? cancelled(err) : HL_OK;
    }
    if (!report(c, status, l->digest, l->size, 0)) return cancelled(err);
    snprintf(url, sizeof url, "%s/blobs/uploads/", c->base);
    q = (req_spec){.method = "POST", .url = url};
    st = do_request(c, &q, &r, err);
    if (st != HL_OK) return st;
    if (r.status == 401 || r.status == 403) {
        free(r.body.data);
        return hl_fail(err, HL_ERR_INVALID, "you are not authorized to push to this namespace, "
                                            "create the model under a namespace you own");
    }
    if (r.status != 202 || !r.hdr.location[0]) {
        char msg[256];
        registry_message(r.status, &r.body, msg, sizeof msg);
        free(r.body.data);
        return hl_fail(err, HL_ERR_IO, "upload %s: %s", l->digest, msg);
    }
    free(r.body.data);
    char put_url[URL_CAP];
    resolve(c, r.hdr.location, put_url, sizeof put_url);
    size_t ul_len = strlen(put_url);
    snprintf(put_url + ul_len, sizeof put_url - ul_len, "%sdigest=%s",
             strchr(put_url, '?') ? "&" : "?", l->digest);

    char path[URL_CAP];
    st = store_blob_path(s, l->digest, path, sizeof path, err);
    if (st != HL_OK) return st;
    ul u = {.c = c, .total = l->size, .digest = l->digest};
    memcpy(u.status, status, sizeof status);
    u.fd = open(path, O_RDONLY | O_CLOEXEC);
    if (u.fd < 0) return hl_fail(err, HL_ERR_IO, "%s: %s", path, strerror(errno));
    CURL *h = curl_easy_init();
    if (!h) {
        close(u.fd);
        return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    }
    common_opts(c, h, put_url);
    curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 0L);
    struct curl_slist *hdrs = curl_slist_append(NULL, "Content-Type: application/octet-stream");
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
    curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, (curl_off_t)l->size);
    curl_easy_setopt(h, CURLOPT_READFUNCTION, ul_read);
    curl_easy_setopt(h, CURLOPT_READDATA, &u);
    membuf body = {.max = MANIFEST_MAX};
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, mem_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &body);
    CURLcode rc = curl_easy_perform(h);
    long code = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
    curl_easy_cleanup(h);
    curl_slist_free_all(hdrs);
    close(u.fd);
    if (c->cancelled) st = cancelled(err);
    else if (rc != CURLE_OK)
        st = hl_fail(err, HL_ERR_IO, "upload %s: %s", l->digest, curl_easy_strerror(rc));
    else if (code != 201) {
        char msg[256];
        registry_message(code, &body, msg, sizeof msg);
        st = hl_fail(err, HL_ERR_IO, "upload %s: %s", l->digest, msg);
    } else {
        report(c, status, l->digest, l->size, l->size);
    }
    free(body.data);
    return st;
}

hl_status reg_push(store *s, const char *name, const reg_opts *o, hl_err *err) {
    reg_ctx c;
    hl_status st = ctx_init(&c, name, o, err);
    if (st != HL_OK) return st;
    if (!report(&c, "retrieving manifest", NULL, 0, 0)) return cancelled(err);
    store_name canon;
    if (!store_find(s, &c.name, &canon))
        return hl_fail(err, HL_ERR_FORMAT, "open %s: file does not exist", name);
    char path[URL_CAP];
    st = store_manifest_path(s, &canon, path, sizeof path, err);
    if (st != HL_OK) return st;
    char *raw;
    size_t raw_len;
    st = hl_file_read(path, &raw, &raw_len, err);
    if (st != HL_OK) return st;
    store_manifest m;
    st = store_manifest_parse(raw, raw_len, &m, err);
    if (st != HL_OK) {
        free(raw);
        return st;
    }
    for (size_t i = 0; i <= m.n_layers && st == HL_OK; i++)
        st = push_blob(&c, s, i < m.n_layers ? &m.layers[i] : &m.config, err);
    if (st == HL_OK && !report(&c, "pushing manifest", NULL, 0, 0)) st = cancelled(err);
    if (st == HL_OK) {
        char url[URL_CAP];
        snprintf(url, sizeof url, "%s/manifests/%s", c.base, c.name.tag);
        req_spec q = {.method = "PUT", .url = url, .content_type = STORE_MT_MANIFEST,
                      .body = raw, .body_len = raw_len};
        req_result r;
        st = do_request(&c, &q, &r, err);
        if (st == HL_OK && r.status != 201 && r.status != 200) {
            char msg[256];
            registry_message(r.status, &r.body, msg, sizeof msg);
            st = hl_fail(err, HL_ERR_IO, "push manifest: %s", msg);
        }
        free(r.body.data); /* NULL when the request failed */
    }
    if (st == HL_OK) report(&c, "success", NULL, 0, 0);
    store_manifest_free(&m);
    free(raw);
    return st;
}
