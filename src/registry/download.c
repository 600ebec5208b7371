/* download.c - reg_pull: the manifest, then every missing blob in parts fetched in
 * parallel over one curl multi handle on the calling thread (so progress callbacks and
 * cancellation stay on the caller's thread).
 *
 * A blob of S bytes is cut into parts of HEARTH_PULL_PART_SIZE bytes (default 64 MiB),
 * each one ranged GET; up to MAX_CONNS transfers run at once across all blobs. Its bytes
 * go to <store>/blobs/sha256-<hex>-partial at their offsets; the same file holds, after
 * byte S, the part table (magic, S, part size, part count, bytes done per part), updated
 * after every write, so an interrupted pull (a cut, a crash, Ctrl-C) resumes each part
 * where it stopped. The sha256 runs behind the download over the contiguous prefix the
 * parts have filled (read back from the page cache, a few MiB per loop round); when every
 * part is in, the rest is hashed, the file cut to S bytes (a partial of exactly S bytes
 * is complete and only needs the hash) and, once every blob of the manifest is verified,
 * renamed into place; the manifest is written last. */
#define _GNU_SOURCE
#include "registry/internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "store/sha256.h"

#define ATTEMPTS 5 /* per part */
#define MAX_CONNS 8
#define DEFAULT_PART (64ull << 20)
#define STATE_MAGIC "HLPART01"
#define STATE_HDR 32 /* magic, S, part size, part count (u32) + pad */

typedef struct pblob {
    const store_layer *l;
    char path[URL_CAP]; /* the partial */
    int fd;
    bool fetch; /* not in the store: this pull fetches it */
    bool reset; /* the registry disowned our range: drop the partial on failure */
    uint64_t psize;
    uint32_t nparts;
    uint64_t *done; /* per part */
    uint64_t completed;
    int64_t last_report;
    char status[32];
    /* the hash runs behind the download over the blob's contiguous prefix */
    sha256_ctx sha;
    bool sha_on;
    uint64_t hashed;
} pblob;

typedef struct ppart {
    pblob *b;
    uint32_t idx;
    int attempts;
    int auth_fetches;  /* tokens fetched for this part since its bytes last flowed */
    unsigned token_gen; /* the token its transfer was sent with */
    int64_t not_before;
    bool queued, finished;
    CURL *h;
    /* per transfer */
    reg_headers hdr;
    long http_status;
    bool status_seen;
    uint64_t stream_pos; /* blob offset of the next byte the response delivers */
    bool complete;       /* the part's bytes are all in (a longer body is cut short) */
    bool write_failed;
    int write_errno;
    reg_membuf errbody; /* a non-2xx response's body */
} ppart;

static uint64_t part_size(void) {
    const char *e = getenv("HEARTH_PULL_PART_SIZE");
    if (e && *e) {
        char *end;
        unsigned long long v = strtoull(e, &end, 10);
        if (*end == '\0' && v >= 1) return v;
    }
    return DEFAULT_PART;
}

static uint64_t part_start(const pblob *b, uint32_t i) { return (uint64_t)i * b->psize; }
static uint64_t part_len(const pblob *b, uint32_t i) {
    uint64_t s = part_start(b, i), e = s + b->psize;
    return (e > b->l->size ? b->l->size : e) - s;
}
static off_t state_off(const pblob *b) { return (off_t)b->l->size; }

static bool pwrite_all(int fd, const void *p, size_t n, off_t off) {
    const char *q = p;
    while (n) {
        ssize_t w = pwrite(fd, q, n, off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return false;
        q += w;
        n -= (size_t)w;
        off += w;
    }
    return true;
}

static bool pread_all(int fd, void *p, size_t n, off_t off) {
    char *q = p;
    while (n) {
        ssize_t r = pread(fd, q, n, off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return false;
        q += r;
        n -= (size_t)r;
        off += r;
    }
    return true;
}

/* Reads the part table from the partial, or starts a fresh one. */
static hl_status blob_state(pblob *b, hl_err *err) {
    uint64_t S = b->l->size;
    struct stat sb;
    if (fstat(b->fd, &sb) != 0) return hl_fail(err, HL_ERR_IO, "%s: %s", b->path, strerror(errno));
    uint64_t have = (uint64_t)sb.st_size;
    char hdr[STATE_HDR];
    if (have == S) { /* complete: only the hash is left */
        b->psize = S ? S : 1;
        b->nparts = 1;
        b->done = calloc(1, sizeof *b->done);
        if (!b->done) return hl_fail(err, HL_ERR_NOMEM, "out of memory");
        b->done[0] = S;
        b->completed = S;
        return HL_OK;
    }
    if (have > S + STATE_HDR && pread_all(b->fd, hdr, sizeof hdr, state_off(b)) &&
        memcmp(hdr, STATE_MAGIC, 8) == 0) {
        uint64_t s2, ps;
        uint32_t np;
        memcpy(&s2, hdr + 8, 8);
        memcpy(&ps, hdr + 16, 8);
        memcpy(&np, hdr + 24, 4);
        if (s2 == S && ps >= 1 && np == (S + ps - 1) / ps && have == S + STATE_HDR + 8ull * np) {
            b->psize = ps;
            b->nparts = np;
            b->done = calloc(np, sizeof *b->done);
            if (!b->done) return hl_fail(err, HL_ERR_NOMEM, "out of memory");
            if (!pread_all(b->fd, b->done, 8ull * np, state_off(b) + STATE_HDR))
                return hl_fail(err, HL_ERR_IO, "%s: %s", b->path, strerror(errno));
            bool sane = true;
            for (uint32_t i = 0; i < np; i++) {
                sane &= b->done[i] <= part_len(b, i);
                b->completed += b->done[i];
            }
            if (sane) return HL_OK;
            free(b->done);
            b->done = NULL;
            b->completed = 0;
        }
    }
    /* nothing usable (or a partial from another layout): start over */
    b->psize = part_size();
    b->nparts = (uint32_t)((S + b->psize - 1) / b->psize);
    if (b->nparts == 0) b->nparts = 1;
    if ((S + b->psize - 1) / b->psize > 1u << 20) /* a tiny part size on a huge blob */
        b->psize = (S + (1u << 20) - 1) >> 20, b->nparts = (uint32_t)((S + b->psize - 1) / b->psize);
    b->done = calloc(b->nparts, sizeof *b->done);
    if (!b->done) return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    memcpy(hdr, STATE_MAGIC, 8);
    memcpy(hdr + 8, &S, 8);
    memcpy(hdr + 16, &b->psize, 8);
    memcpy(hdr + 24, &b->nparts, 4);
    memset(hdr + 28, 0, 4);
    if (ftruncate(b->fd, 0) != 0 || ftruncate(b->fd, (off_t)(S + STATE_HDR + 8ull * b->nparts)) != 0 ||
        !pwrite_all(b->fd, hdr, sizeof hdr, state_off(b)))
        return hl_fail(err, HL_ERR_IO, "%s: %s", b->path, strerror(errno));
    return HL_OK;
}

/* ---- one part's transfer ---- */

static size_t part_header(char *p, size_t sz, size_t n, void *ud) {
    ppart *q = ud;
    size_t len = sz * n;
    if (len >= 5 && strncmp(p, "HTTP/", 5) == 0) {
        const char *sp = memchr(p, ' ', len);
        q->http_status = sp ? strtol(sp + 1, NULL, 10) : 0;
        q->status_seen = true;
    }
    return reg_header_cb(p, sz, n, &q->hdr);
}

static size_t part_write(char *p, size_t sz, size_t n, void *ud) {
    ppart *q = ud;
    pblob *b = q->b;
    size_t len = sz * n;
    if (q->http_status < 200 || q->http_status >= 300) { /* an error's body, for its message */
        q->errbody.max = 1 << 16;
        reg_mem_write(p, sz, n, &q->errbody);
        return len;
    }
    if (q->status_seen) { /* first body bytes: where in the blob do they start? */
        q->status_seen = false;
        q->stream_pos = 0;
        unsigned long long from;
        if (q->http_status == 206 && sscanf(q->hdr.content_range, "bytes %llu-", &from) == 1)
            q->stream_pos = from;
    }
    uint64_t start = part_start(b, q->idx) + b->done[q->idx];
    uint64_t end = part_start(b, q->idx) + part_len(b, q->idx);
    uint64_t lo = q->stream_pos, hi = q->stream_pos + len;
    q->stream_pos = hi;
    if (hi <= start) return len; /* before what we need (a 200 to a range: skip) */
    if (lo > start) { /* a gap: not the range we asked for */
        q->write_failed = true;
        q->write_errno = 0;
        return 0;
    }
    uint64_t take_to = hi < end ? hi : end;
    size_t off_in = (size_t)(start - lo), take = (size_t)(take_to - start);
    if (take && !pwrite_all(b->fd, p + off_in, take, (off_t)start)) {
        q->write_failed = true;
        q->write_errno = errno;
        return 0;
    }
    b->done[q->idx] += take;
    if (take) q->auth_fetches = 0;
    b->completed += take;
    if (!pwrite_all(b->fd, &b->done[q->idx], 8, state_off(b) + STATE_HDR + 8 * (off_t)q->idx)) {
        q->write_failed = true;
        q->write_errno = errno;
        return 0;
    }
    if (b->done[q->idx] == part_len(b, q->idx)) {
        q->complete = true;
        if (hi > end) return 0; /* the rest belongs to other parts: stop here */
    }
    return len;
}

static hl_status part_start_xfer(reg_ctx *c, CURLM *m, ppart *q, hl_err *err) {
    pblob *b = q->b;
    char url[URL_CAP];
    snprintf(url, sizeof url, "%s/blobs/%s", c->base, b->l->digest);
    CURL *h = curl_easy_init();
    if (!h) return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    reg_common_opts(c, h, url);
    uint64_t from = part_start(b, q->idx) + b->done[q->idx];
    uint64_t end = part_start(b, q->idx) + part_len(b, q->idx);
    char range[64];
    if (from > 0 || end < b->l->size) {
        if (end == b->l->size) snprintf(range, sizeof range, "%llu-", (unsigned long long)from);
        else snprintf(range, sizeof range, "%llu-%llu", (unsigned long long)from, (unsigned long long)end - 1);
        curl_easy_setopt(h, CURLOPT_RANGE, range);
    }
    memset(&q->hdr, 0, sizeof q->hdr);
    q->http_status = 0;
    q->status_seen = false;
    q->complete = false;
    q->write_failed = false;
    q->stream_pos = 0;
    free(q->errbody.data);
    memset(&q->errbody, 0, sizeof q->errbody);
    curl_easy_setopt(h, CURLOPT_BUFFERSIZE, 256L * 1024);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, part_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, q);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, part_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, q);
    curl_easy_setopt(h, CURLOPT_PRIVATE, q);
    if (curl_multi_add_handle(m, h) != CURLM_OK) {
        curl_easy_cleanup(h);
        return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    }
    q->h = h;
    q->queued = false;
    q->token_gen = c->token_gen;
    return HL_OK;
}

/* A finished transfer: done, to retry (HL_ERR_IO with *retry), or fatal. */
static hl_status part_finish(reg_ctx *c, ppart *q, CURLcode rc, bool *retry, hl_err *err) {
    pblob *b = q->b;
    *retry = false;
    const char *d = b->l->digest;
    bool all_in = b->done[q->idx] == part_len(b, q->idx);
    if (c->cancelled) return reg_cancelled(err);
    if (q->write_failed) {
        if (q->write_errno)
            return hl_fail(err, HL_ERR_IO, "writing %s: %s", b->path, strerror(q->write_errno));
        *retry = true;
        return hl_fail(err, HL_ERR_IO, "pull blob %s: the registry sent another range than asked", d);
    }
    if (all_in && (rc == CURLE_OK || (rc == CURLE_WRITE_ERROR && q->complete))) return HL_OK;
    if (rc == CURLE_OK && q->http_status == 401 && q->hdr.www_auth[0]) {
        /* a token is no failed attempt; a token refused right after its fetch is the end */
        hl_status st = HL_OK;
        if (q->token_gen == c->token_gen) {
            if (q->auth_fetches++ >= 1) return hl_fail(err, HL_ERR_INVALID, "unauthorized: access denied");
            st = reg_auth(c, q->hdr.www_auth, err);
        }
        if (st != HL_OK) return st;
        *retry = true;
        q->attempts--;
        return hl_fail(err, HL_ERR_IO, "pull blob %s: unauthorized", d);
    }
    if (rc == CURLE_OK && q->http_status == 404)
        return hl_fail(err, HL_ERR_FORMAT, "pull blob %s: file does not exist", d);
    if (rc == CURLE_OK && q->http_status == 416) {
        b->reset = true; /* the blob is shorter than the manifest says */
        return hl_fail(err, HL_ERR_FORMAT, "pull blob %s: registry responded with status 416", d);
    }
    if (rc == CURLE_OK && q->http_status >= 400 && q->http_status < 500) {
        char msg[256];
        reg_registry_message(q->http_status, &q->errbody, msg, sizeof msg);
        return hl_fail(err, HL_ERR_FORMAT, "pull blob %s: %s", d, msg);
    }
    *retry = true;
    if (rc == CURLE_OK && q->http_status >= 300)
        return hl_fail(err, HL_ERR_IO, "pull blob %s: registry responded with status %ld", d, q->http_status);
    if (rc == CURLE_OK) return hl_fail(err, HL_ERR_IO, "pull blob %s: the transfer ended early", d);
    return hl_fail(err, HL_ERR_IO, "pull blob %s: %s", d, curl_easy_strerror(rc));
}

#define HASH_BUF (1u << 20)

/* Hashes up to `budget` more bytes of the prefix the parts have filled. */
static hl_status hash_ahead(pblob *b, uint64_t budget, char *buf, hl_err *err) {
    uint64_t S = b->l->size;
    while (budget && b->hashed < S) {
        uint32_t k = (uint32_t)(b->hashed / b->psize);
        uint64_t avail = part_start(b, k) + b->done[k];
        if (b->hashed >= avail) break;
        uint64_t n = avail - b->hashed;
        if (n > budget) n = budget;
        if (n > HASH_BUF) n = HASH_BUF;
        if (!pread_all(b->fd, buf, (size_t)n, (off_t)b->hashed))
            return hl_fail(err, HL_ERR_IO, "reading %s: %s", b->path, strerror(errno));
        sha256_update(&b->sha, buf, (size_t)n);
        b->hashed += n;
        budget -= n;
    }
    return HL_OK;
}

/* Runs every queued part to completion (or the first fatal error, or a cancel). */
static hl_status run_parts(reg_ctx *c, ppart *parts, size_t n, char *buf, hl_err *err) {
    CURLM *m = curl_multi_init();
    if (!m) return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    hl_status st = HL_OK;
    int active = 0;
    for (;;) {
        if (!reg_poll(c)) {
            st = reg_cancelled(err);
            break;
        }
        int64_t now = reg_now_ns();
        bool waiting = false;
        for (size_t i = 0; i < n && st == HL_OK; i++) {
            if (!parts[i].queued) continue;
            waiting = true;
            if (active >= MAX_CONNS || parts[i].not_before > now) continue;
            if ((st = part_start_xfer(c, m, &parts[i], err)) == HL_OK) active++;
        }
        if (st != HL_OK || (!active && !waiting)) break;
        int running;
        curl_multi_perform(m, &running);
        CURLMsg *msg;
        int left;
        while (st == HL_OK && (msg = curl_multi_info_read(m, &left)) != NULL) {
            if (msg->msg != CURLMSG_DONE) continue;
            ppart *q;
            curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&q);
            CURLcode rc = msg->data.result;
            curl_multi_remove_handle(m, q->h);
            curl_easy_cleanup(q->h);
            q->h = NULL;
            active--;
            bool retry;
            hl_err perr;
            hl_status ps = part_finish(c, q, rc, &retry, &perr);
            if (ps == HL_OK) {
                q->finished = true;
                pblob *b = q->b;
                if (!reg_report(c, b->status, b->l->digest, b->l->size, b->completed)) st = reg_cancelled(err);
            } else if (retry && ++q->attempts < ATTEMPTS) {
                q->queued = true; /* resume from what arrived */
                q->not_before = reg_now_ns() + 200000000LL * q->attempts;
            } else {
                st = ps;
                if (err) *err = perr;
            }
        }
        if (st != HL_OK) break;
        /* progress: one line per blob at most every 100 ms */
        now = reg_now_ns();
        for (size_t i = 0; i < n && st == HL_OK; i++) {
            pblob *b = parts[i].b;
            if (now - b->last_report < PROGRESS_NS) continue;
            b->last_report = now;
            if (!reg_report(c, b->status, b->l->digest, b->l->size, b->completed)) st = reg_cancelled(err);
        }
        /* a few MiB of hashing per round keeps the loop responsive and the final check short */
        for (size_t i = 0; i < n && st == HL_OK; i++)
            if (i == 0 || parts[i].b != parts[i - 1].b) st = hash_ahead(parts[i].b, 4u << 20, buf, err);
        if (st != HL_OK) break;
        curl_multi_poll(m, NULL, 0, active ? 100 : 20, NULL);
    }
    for (size_t i = 0; i < n; i++) {
        if (!parts[i].h) continue;
        curl_multi_remove_handle(m, parts[i].h);
        curl_easy_cleanup(parts[i].h);
        parts[i].h = NULL;
    }
    curl_multi_cleanup(m);
    return st;
}

/* Hashes what the download left unhashed and checks the digest; cuts the part table off
 * when it matches. */
static hl_status verify_blob(reg_ctx *c, pblob *b, char *buf, hl_err *err) {
    hl_status st = HL_OK;
    uint64_t S = b->l->size;
    while (st == HL_OK && b->hashed < S) {
        uint64_t before = b->hashed;
        st = hash_ahead(b, 64u << 20, buf, err);
        if (st == HL_OK && b->hashed == before)
            st = hl_fail(err, HL_ERR_IO, "pull blob %s: a part is missing", b->l->digest);
        if (st == HL_OK && !reg_poll(c)) st = reg_cancelled(err);
    }
    if (st != HL_OK) return st;
    char got[STORE_DIGEST_LEN];
    memcpy(got, "sha256:", 7);
    sha256_final_hex(&b->sha, got + 7);
    b->sha_on = false;
    if (strcmp(got, b->l->digest) != 0) {
        unlink(b->path); /* corrupt bytes: they must never be resumed from */
        return hl_fail(err, HL_ERR_FORMAT, "digest mismatch, file must be downloaded again: want %s, got %s",
                       b->l->digest, got);
    }
    if (ftruncate(b->fd, (off_t)S) != 0 || fsync(b->fd) != 0)
        return hl_fail(err, HL_ERR_IO, "%s: %s", b->path, strerror(errno));
    return HL_OK;
}

static bool layer_in(const store_manifest *m, const char *digest) {
    if (strcmp(m->config.digest, digest) == 0) return true;
    for (size_t i = 0; i < m->n_layers; i++)
        if (strcmp(m->layers[i].digest, digest) == 0) return true;
    return false;
}

static int cmp_digest(const void *a, const void *b) {
    const pblob *x = *(pblob *const *)a, *y = *(pblob *const *)b;
    return strcmp(x->l->digest, y->l->digest);
}

/* Fetches and verifies every blob of m not in the store (left as complete partials). */
static hl_status fetch_blobs(reg_ctx *c, store *s, pblob *bl, size_t n, hl_err *err) {
    hl_status st = HL_OK;
    /* lock the partials in digest order: two pulls sharing blobs never wait in a cycle */
    pblob **order = calloc(n, sizeof *order);
    if (!order) return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    size_t nf = 0;
    for (size_t i = 0; i < n; i++)
        if (bl[i].fetch) order[nf++] = &bl[i];
    qsort(order, nf, sizeof *order, cmp_digest);
    size_t total_parts = 0;
    for (size_t k = 0; k < nf && st == HL_OK; k++) {
        pblob *b = order[k];
        b->fd = open(b->path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (b->fd < 0) {
            st = hl_fail(err, HL_ERR_IO, "%s: %s", b->path, strerror(errno));
            break;
        }
        /* another pull of the same blob holds it: wait for it, then see what it left */
        while (flock(b->fd, LOCK_EX) != 0 && errno == EINTR) {}
        if (store_blob_exists(s, b->l->digest, NULL)) {
            close(b->fd);
            b->fd = -1;
            b->fetch = false;
            continue;
        }
        st = blob_state(b, err);
        if (st == HL_OK && !(b->sha_on = sha256_init(&b->sha))) st = hl_fail(err, HL_ERR_NOMEM, "out of memory");
        total_parts += b->nparts;
    }
    free(order);
    ppart *parts = NULL;
    size_t np = 0;
    if (st == HL_OK && !(parts = calloc(total_parts ? total_parts : 1, sizeof *parts)))
        st = hl_fail(err, HL_ERR_NOMEM, "out of memory");
    /* the progress lines in manifest order, then the missing parts */
    for (size_t i = 0; i < n && st == HL_OK; i++) {
        pblob *b = &bl[i];
        uint64_t shown = b->fetch ? b->completed : b->l->size;
        if (!reg_report(c, b->status, b->l->digest, b->l->size, shown)) st = reg_cancelled(err);
        for (uint32_t k = 0; b->fetch && k < b->nparts; k++)
            if (b->done[k] < part_len(b, k)) parts[np++] = (ppart){.b = b, .idx = k, .queued = true};
    }
    char *buf = st == HL_OK ? malloc(HASH_BUF) : NULL;
    if (st == HL_OK && !buf) st = hl_fail(err, HL_ERR_NOMEM, "out of memory");
    if (st == HL_OK && np) st = run_parts(c, parts, np, buf, err);
    for (size_t i = 0; i < np; i++) free(parts[i].errbody.data);
    free(parts);
    if (st != HL_OK) {
        free(buf);
        return st;
    }
    for (size_t i = 0; i < n && st == HL_OK; i++)
        if (bl[i].fetch && !reg_report(c, bl[i].status, bl[i].l->digest, bl[i].l->size, bl[i].l->size))
            st = reg_cancelled(err);
    if (st == HL_OK && !reg_report(c, "verifying sha256 digest", NULL, 0, 0)) st = reg_cancelled(err);
    for (size_t i = 0; i < n && st == HL_OK; i++)
        if (bl[i].fetch) st = verify_blob(c, &bl[i], buf, err);
    free(buf);
    return st;
}

hl_status reg_pull(store *s, const char *name, const reg_opts *o, hl_err *err) {
    reg_ctx c;
    hl_status st = reg_ctx_init(&c, name, o, err);
    if (st != HL_OK) return st;
    if (!reg_report(&c, "pulling manifest", NULL, 0, 0)) return reg_cancelled(err);
    char url[URL_CAP];
    snprintf(url, sizeof url, "%s/manifests/%s", c.base, c.name.tag);
    reg_req q = {.method = "GET", .url = url, .accept = STORE_MT_MANIFEST, .follow = true};
    reg_resp r;
    st = reg_request(&c, &q, &r, err);
    if (st != HL_OK) {
        hl_err_prefix(err, "pull model manifest");
        reg_ctx_free(&c);
        return st;
    }
    if (r.status == 404 || r.status != 200) {
        char msg[256] = "file does not exist";
        if (r.status != 404) reg_registry_message(r.status, &r.body, msg, sizeof msg);
        free(r.body.data);
        reg_ctx_free(&c);
        return hl_fail(err, HL_ERR_FORMAT, "pull model manifest: %s", msg);
    }
    store_manifest m;
    st = store_manifest_parse(r.body.data ? r.body.data : "", r.body.len, &m, err);
    if (st != HL_OK) {
        free(r.body.data);
        reg_ctx_free(&c);
        hl_err_prefix(err, "pull model manifest");
        return st;
    }
    /* layers, then the config, as Ollama orders them; a digest listed twice once */
    size_t n = 0;
    pblob *bl = calloc(m.n_layers + 1, sizeof *bl);
    if (!bl) {
        st = hl_fail(err, HL_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (size_t i = 0; i <= m.n_layers && st == HL_OK; i++) {
        const store_layer *l = i < m.n_layers ? &m.layers[i] : &m.config;
        bool dup = false;
        for (size_t k = 0; k < n; k++) dup |= strcmp(bl[k].l->digest, l->digest) == 0;
        if (dup) continue;
        pblob *b = &bl[n++];
        b->l = l;
        b->fd = -1;
        snprintf(b->status, sizeof b->status, "pulling %.12s", l->digest + 7);
        b->fetch = !store_blob_exists(s, l->digest, NULL);
        char final_path[URL_CAP];
        st = store_blob_path(s, l->digest, final_path, sizeof final_path, err);
        if (st == HL_OK) snprintf(b->path, sizeof b->path, "%s-partial", final_path);
    }
    if (st == HL_OK) st = fetch_blobs(&c, s, bl, n, err);
    /* every blob verified: move them into the store, then the manifest */
    for (size_t i = 0; i < n && st == HL_OK; i++) {
        if (!bl[i].fetch) continue;
        char final_path[URL_CAP];
        st = store_blob_path(s, bl[i].l->digest, final_path, sizeof final_path, err);
        if (st == HL_OK && rename(bl[i].path, final_path) != 0 &&
            !(errno == ENOENT && store_blob_exists(s, bl[i].l->digest, NULL)))
            st = hl_fail(err, HL_ERR_IO, "cannot move %s into place: %s", final_path, strerror(errno));
    }
    for (size_t i = 0; i < n; i++) {
        if (st != HL_OK && bl[i].reset) unlink(bl[i].path);
        if (bl[i].fd >= 0) close(bl[i].fd);
        free(bl[i].done);
        if (bl[i].sha_on) sha256_discard(&bl[i].sha);
    }
    if (st != HL_OK) goto done;
    if (!reg_report(&c, "writing manifest", NULL, 0, 0)) {
        st = reg_cancelled(err);
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
            reg_report(&c, "removing unused layers", NULL, 0, 0);
            store_prune(s, &old, NULL);
        }
    }
    store_manifest_free(&old);
    if (st == HL_OK) reg_report(&c, "success", NULL, 0, 0);
done:
    free(bl);
    store_manifest_free(&m);
    free(r.body.data);
    reg_ctx_free(&c);
    return st;
}
