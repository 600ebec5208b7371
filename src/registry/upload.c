/* upload.c - reg_push: every blob of the model the registry lacks (HEAD), each through
 * an upload session (POST, then PATCH chunks of HEARTH_PUSH_CHUNK_SIZE bytes, default
 * 64 MiB, with Content-Range, then PUT ?digest=), or mounted from another repository of
 * the same registry when a local model of that host holds the blob (POST
 * ?mount=<digest>&from=<ns/model>: 201 means mounted, 202 opens an ordinary session);
 * the manifest last. A chunk that breaks off is retried from what the session says it
 * holds (GET on the session: "Range: 0-<last>"), or from the start in a new session when
 * the registry gave that one up. */
#define _GNU_SOURCE
#include "registry/internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "base/file.h"

#define DEFAULT_CHUNK (64ull << 20)

static uint64_t chunk_size(void) {
    const char *e = getenv("HEARTH_PUSH_CHUNK_SIZE");
    if (e && *e) {
        char *end;
        unsigned long long v = strtoull(e, &end, 10);
        if (*end == '\0' && v >= 1) return v;
    }
    return DEFAULT_CHUNK;
}

static hl_status not_authorized(hl_err *err) {
    return hl_fail(err, HL_ERR_INVALID, "you are not authorized to push to this namespace, "
                                        "create the model under a namespace you own");
}

/* Another repository of this registry that may hold the blob: a local model of the same
 * host (pulled from or pushed to it) with that layer. */
static bool mount_source(reg_ctx *c, store *s, const char *digest, char *out, size_t cap) {
    store_entry *es;
    size_t n;
    if (store_list(s, &es, &n, NULL) != HL_OK) return false;
    bool found = false;
    for (size_t i = 0; i < n && !found; i++) {
        const store_name *nm = &es[i].name;
        if (strcasecmp(nm->host, c->name.host) != 0) continue;
        if (strcasecmp(nm->ns, c->name.ns) == 0 && strcasecmp(nm->model, c->name.model) == 0) continue;
        const store_manifest *m = &es[i].manifest;
        bool has = strcmp(m->config.digest, digest) == 0;
        for (size_t k = 0; k < m->n_layers && !has; k++) has = strcmp(m->layers[k].digest, digest) == 0;
        if (has) {
            snprintf(out, cap, "%s/%s", nm->ns, nm->model);
            found = true;
        }
    }
    store_list_free(es, n);
    return found;
}

static void with_query(char *url, size_t cap, const char *kv) {
    size_t l = strlen(url);
    snprintf(url + l, cap - l, "%s%s", strchr(url, '?') ? "&" : "?", kv);
}

/* POST an upload session (a mount when `mount`): *mounted when the registry mounted
 * the blob (201), else loc gets the session's URL (202). */
static hl_status open_session(reg_ctx *c, store *s, const store_layer *l, bool mount, bool *mounted,
                              char *loc, size_t cap, hl_err *err) {
    char url[URL_CAP];
    snprintf(url, sizeof url, "%s/blobs/uploads/", c->base);
    char from[2 * STORE_NAME_PART_MAX + 2];
    if (mount && mount_source(c, s, l->digest, from, sizeof from)) {
        char kv[512];
        snprintf(kv, sizeof kv, "mount=%s&from=%s", l->digest, from);
        with_query(url, sizeof url, kv);
    }
    reg_req q = {.method = "POST", .url = url};
    reg_resp r;
    hl_status st = reg_request(c, &q, &r, err);
    if (st != HL_OK) return st == HL_ERR_INVALID ? not_authorized(err) : st;
    *mounted = r.status == 201;
    if (r.status == 401 || r.status == 403) {
        st = not_authorized(err);
    } else if (r.status != 201 && (r.status != 202 || !r.hdr.location[0])) {
        char msg[256];
        reg_registry_message(r.status, &r.body, msg, sizeof msg);
        st = hl_fail(err, HL_ERR_IO, "upload %s: %s", l->digest, msg);
    } else if (r.status == 202) {
        reg_resolve(c, r.hdr.location, loc, cap);
    }
    free(r.body.data);
    return st;
}

/* After a chunk broke off: how much the session holds (*off), or false when the registry
 * gave the session up (the reference registry cancels one whose bytes and state differ). */
static bool session_offset(reg_ctx *c, const store_layer *l, char *loc, size_t cap, uint64_t *off) {
    reg_req q = {.method = "GET", .url = loc};
    reg_resp r;
    if (reg_request(c, &q, &r, NULL) != HL_OK) return false;
    unsigned long long first, last;
    bool ok = r.status == 204 && sscanf(r.hdr.range, "%llu-%llu", &first, &last) == 2 && first == 0 &&
              last < l->size;
    if (ok) {
        *off = last ? last + 1 : 0; /* "0-0" is an empty session (the registry's convention) */
        if (r.hdr.location[0]) reg_resolve(c, r.hdr.location, loc, cap);
    }
    free(r.body.data);
    return ok;
}

static hl_status push_blob(reg_ctx *c, store *s, const store_layer *l, hl_err *err) {
    char status[32], url[URL_CAP];
    snprintf(status, sizeof status, "pushing %.12s", l->digest + 7);
    snprintf(url, sizeof url, "%s/blobs/%s", c->base, l->digest);
    reg_req q = {.method = "HEAD", .url = url, .follow = true};
    reg_resp r;
    hl_status st = reg_request(c, &q, &r, err);
    if (st != HL_OK) return st == HL_ERR_INVALID ? not_authorized(err) : st;
    free(r.body.data);
    if (r.status == 200) {
        reg_report(c, status, l->digest, l->size, l->size);
        return c->cancelled ? reg_cancelled(err) : HL_OK;
    }
    if (!reg_report(c, status, l->digest, l->size, 0)) return reg_cancelled(err);
    char loc[URL_CAP];
    bool mounted = false;
    st = open_session(c, s, l, true, &mounted, loc, sizeof loc, err);
    if (st != HL_OK) return st;
    if (mounted) { /* the registry had it in another repository */
        reg_report(c, status, l->digest, l->size, l->size);
        return c->cancelled ? reg_cancelled(err) : HL_OK;
    }

    char path[URL_CAP];
    st = store_blob_path(s, l->digest, path, sizeof path, err);
    if (st != HL_OK) return st;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return hl_fail(err, HL_ERR_IO, "%s: %s", path, strerror(errno));
    uint64_t chunk = chunk_size();
    int attempts = 0;
    for (uint64_t off = 0; off < l->size && st == HL_OK;) {
        uint64_t len = l->size - off < chunk ? l->size - off : chunk;
        char range[64];
        snprintf(range, sizeof range, "%llu-%llu", (unsigned long long)off, (unsigned long long)(off + len - 1));
        q = (reg_req){.method = "PATCH", .url = loc, .content_type = "application/octet-stream",
                      .content_range = range, .body_from_fd = true, .body_fd = fd, .body_off = off,
                      .body_len = len, .progress_status = status, .progress_digest = l->digest,
                      .progress_total = l->size, .progress_base = off};
        st = reg_request(c, &q, &r, err);
        bool server_error = st == HL_OK && r.status >= 500;
        if (st == HL_OK && !server_error) {
            if (r.status != 202 && r.status != 204) {
                char msg[256];
                reg_registry_message(r.status, &r.body, msg, sizeof msg);
                st = hl_fail(err, HL_ERR_IO, "upload %s: %s", l->digest, msg);
            } else {
                if (r.hdr.location[0]) reg_resolve(c, r.hdr.location, loc, sizeof loc); /* next URL */
                off += len;
            }
            free(r.body.data);
            if (st == HL_OK && !reg_report(c, status, l->digest, l->size, off)) st = reg_cancelled(err);
            continue;
        }
        if (server_error) {
            free(r.body.data);
            st = hl_fail(err, HL_ERR_IO, "upload %s: registry responded with status %ld", l->digest, r.status);
        }
        if (st != HL_ERR_IO || ++attempts >= 5) break;
        /* the chunk broke off: go on from what the session holds, or in a new session */
        struct timespec ts = {0, 200000000L * attempts};
        nanosleep(&ts, NULL);
        st = HL_OK;
        if (!session_offset(c, l, loc, sizeof loc, &off)) {
            off = 0;
            st = open_session(c, s, l, false, &mounted, loc, sizeof loc, err);
        }
    }
    close(fd);
    if (st != HL_OK) return st;
    char kv[128];
    snprintf(kv, sizeof kv, "digest=%s", l->digest);
    with_query(loc, sizeof loc, kv);
    q = (reg_req){.method = "PUT", .url = loc, .content_type = "application/octet-stream"};
    st = reg_request(c, &q, &r, err);
    if (st != HL_OK) return st;
    if (r.status != 201) {
        char msg[256];
        reg_registry_message(r.status, &r.body, msg, sizeof msg);
        st = hl_fail(err, HL_ERR_IO, "upload %s: %s", l->digest, msg);
    } else {
        reg_report(c, status, l->digest, l->size, l->size);
    }
    free(r.body.data);
    return st;
}

hl_status reg_push(store *s, const char *name, const reg_opts *o, hl_err *err) {
    reg_ctx c;
    hl_status st = reg_ctx_init(&c, name, o, err);
    if (st != HL_OK) return st;
    char *raw = NULL;
    store_manifest m = {0};
    if (!reg_report(&c, "retrieving manifest", NULL, 0, 0)) {
        st = reg_cancelled(err);
        goto out;
    }
    store_name canon;
    if (!store_find(s, &c.name, &canon)) {
        st = hl_fail(err, HL_ERR_FORMAT, "open %s: file does not exist", name);
        goto out;
    }
    char path[URL_CAP];
    st = store_manifest_path(s, &canon, path, sizeof path, err);
    size_t raw_len = 0;
    if (st == HL_OK) st = hl_file_read(path, &raw, &raw_len, err);
    if (st == HL_OK) st = store_manifest_parse(raw, raw_len, &m, err);
    for (size_t i = 0; i <= m.n_layers && st == HL_OK; i++)
        st = push_blob(&c, s, i < m.n_layers ? &m.layers[i] : &m.config, err);
    if (st == HL_OK && !reg_report(&c, "pushing manifest", NULL, 0, 0)) st = reg_cancelled(err);
    if (st == HL_OK) {
        char url[URL_CAP];
        snprintf(url, sizeof url, "%s/manifests/%s", c.base, c.name.tag);
        reg_req q = {.method = "PUT", .url = url, .content_type = STORE_MT_MANIFEST,
                     .body = raw, .body_len = raw_len};
        reg_resp r;
        st = reg_request(&c, &q, &r, err);
        if (st == HL_OK && r.status != 201 && r.status != 200) {
            char msg[256];
            reg_registry_message(r.status, &r.body, msg, sizeof msg);
            st = hl_fail(err, HL_ERR_IO, "push manifest: %s", msg);
        }
        free(r.body.data); /* NULL when the request failed */
    }
    if (st == HL_OK) reg_report(&c, "success", NULL, 0, 0);
out:
    store_manifest_free(&m);
    free(raw);
    reg_ctx_free(&c);
    return st;
}
