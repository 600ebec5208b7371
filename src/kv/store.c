/*
 * store.c - content-addressed KV blocks on disk and on Redis (see store.h): the record
 * format and its checks, the directory index with LRU deletion, the Redis client with
 * time bounds and back-off, and the write-behind queue.
 */
#include "kv/store.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>
#include <zstd.h>


#define REC_MAGIC "HKVB"
#define REC_VERSION 1u
#define REC_HEADER 64

enum { F_DISK = 1, F_REMOTE = 2, F_QUEUED = 4 };

typedef struct entry {
    kv_hash key;
    uint64_t size;  /* file bytes (F_DISK) */
    uint64_t atime; /* ns: last write or hit (LRU) */
    uint8_t flags;
    bool used;
} entry;

typedef struct item {
    kv_hash key;
    struct item *next;
    uint8_t data[]; /* block_bytes */
} item;

struct kv_store {
    char *dir;
    size_t disk_max, block_bytes, queue_max, redis_max_value;
    char *ns;
    int ttl_s, timeout_ms;
    char *redis_host;
    int redis_port;

    pthread_mutex_t mu; /* index, queue, stats */
    pthread_cond_t cv;  /* queue changed */
    entry *tab;
    size_t cap, n_used;
    item *q_head, *q_tail;
    bool writing; /* the writer holds an item outside the queue */
    bool remote_down; /* Redis failed and is backing off: nothing is published meanwhile */
    bool stop;
    pthread_t writer;
    bool writer_started;
    kv_store_stats st;

    pthread_mutex_t rmu; /* the Redis connection */
    redisContext *rc;
    uint64_t down_until; /* ns: no Redis before this */
};

/* ---- keys ---- */

kv_hash kv_hash_seed(const void *identity, size_t n) {
    XXH128_hash_t h = XXH3_128bits(identity, n);
    return (kv_hash){h.low64, h.high64};
}

kv_hash kv_hash_next(kv_hash parent, const int32_t *tokens, int32_t n) {
    XXH3_state_t st;
    XXH3_128bits_reset(&st);
    uint8_t p[16];
    for (int i = 0; i < 8; i++) {
        p[i] = (uint8_t)(parent.lo >> (8 * i));
        p[8 + i] = (uint8_t)(parent.hi >> (8 * i));
    }
    XXH3_128bits_update(&st, p, sizeof p);
    for (int32_t i = 0; i < n; i++) { /* little-endian, whatever the host */
        uint32_t t = (uint32_t)tokens[i];
        uint8_t b[4] = {(uint8_t)t, (uint8_t)(t >> 8), (uint8_t)(t >> 16), (uint8_t)(t >> 24)};
        XXH3_128bits_update(&st, b, 4);
    }
    XXH128_hash_t h = XXH3_128bits_digest(&st);
    return (kv_hash){h.low64, h.high64};
}

void kv_hash_hex(kv_hash h, char out[33]) {
    snprintf(out, 33, "%016llx%016llx", (unsigned long long)h.hi, (unsigned long long)h.lo);
}

static bool hash_eq(kv_hash a, kv_hash b) { return a.lo == b.lo && a.hi == b.hi; }

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint64_t mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

bool kv_store_parse_size(const char *text, size_t *out) {
    if (!text || !*text) return false;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (end == text || errno || text[0] == '-') return false;
    unsigned shift = 0;
    switch (*end) {
    case 'k': case 'K': shift = 10; end++; break;
    case 'm': case 'M': shift = 20; end++; break;
    case 'g': case 'G': shift = 30; end++; break;
    case 't': case 'T': shift = 40; end++; break;
    default: break;
    }
    if (shift && *end == 'i') end++;
    if (*end == 'b' || *end == 'B') end++;
    if (*end) return false;
    if (shift && v > (SIZE_MAX >> shift)) return false;
    *out = (size_t)(v << shift);
    return true;
}

/* ---- index (open addressing; entries are never removed, only their flags cleared) ---- */

static entry *idx_find(kv_store *s, kv_hash key, bool create) {
    if (create && (s->n_used + 1) * 2 > s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 1024;
        entry *t = calloc(cap, sizeof *t);
        if (!t) return NULL;
        for (size_t i = 0; i < s->cap; i++) {
            if (!s->tab[i].used) continue;
            size_t j = s->tab[i].key.lo & (cap - 1);
            while (t[j].used) j = (j + 1) & (cap - 1);
            t[j] = s->tab[i];
        }
        free(s->tab);
        s->tab = t;
        s->cap = cap;
    }
    if (!s->cap) return NULL;
    size_t j = key.lo & (s->cap - 1);
    while (s->tab[j].used) {
        if (hash_eq(s->tab[j].key, key)) return &s->tab[j];
        j = (j + 1) & (s->cap - 1);
    }
    if (!create) return NULL;
    s->tab[j] = (entry){.key = key, .used = true};
    s->n_used++;
    return &s->tab[j];
}

static void block_path(const kv_store *s, kv_hash key, char *buf, size_t n) {
    char hex[33];
    kv_hash_hex(key, hex);
    snprintf(buf, n, "%s/%s.kvb", s->dir, hex);
}

/* Under mu: forgets a file (deleting it). */
static void idx_drop_file(kv_store *s, entry *e) {
    if (!(e->flags & F_DISK)) return;
    char path[4096];
    block_path(s, e->key, path, sizeof path);
    unlink(path);
    e->flags &= (uint8_t)~F_DISK;
    s->st.disk_bytes -= e->size;
    s->st.disk_files--;
    e->size = 0;
}

static int cmp_atime(const void *a, const void *b) {
    const entry *x = *(entry *const *)a, *y = *(entry *const *)b;
    return x->atime < y->atime ? -1 : x->atime > y->atime;
}

/* Under mu: deletes least recently used files until `incoming` more bytes fit (down to
 * 7/8 of the cap, so a full directory is not trimmed on every write). */
static void idx_make_room(kv_store *s, size_t incoming) {
    if (s->st.disk_bytes + incoming <= s->disk_max) return;
    size_t target = s->disk_max - s->disk_max / 8;
    target = target > incoming ? target - incoming : 0;
    entry **v = malloc(s->st.disk_files * sizeof *v);
    if (!v) return;
    size_t n = 0;
    for (size_t i = 0; i < s->cap && n < s->st.disk_files; i++)
        if (s->tab[i].used && (s->tab[i].flags & F_DISK)) v[n++] = &s->tab[i];
    qsort(v, n, sizeof *v, cmp_atime);
    for (size_t i = 0; i < n && s->st.disk_bytes > target; i++) {
        idx_drop_file(s, v[i]);
        s->st.disk_evictions++;
    }
    free(v);
}

static bool parse_hex_key(const char *name, kv_hash *out) {
    size_t len = strlen(name);
    if (len != 36 || strcmp(name + 32, ".kvb") != 0) return false;
    uint64_t part[2] = {0, 0};
    for (int i = 0; i < 32; i++) {
        char c = name[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0) return false;
        part[i / 16] = part[i / 16] << 4 | (uint64_t)d;
    }
    *out = (kv_hash){.hi = part[0], .lo = part[1]};
    return true;
}

/* Indexes the directory: block files by mtime; temp files of a crashed writer go. */
static void idx_scan(kv_store *s) {
    DIR *d = opendir(s->dir);
    if (!d) return;
    struct dirent *de;
    char path[4096];
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.') {
            if (strncmp(de->d_name, ".tmp-", 5) == 0) {
                snprintf(path, sizeof path, "%s/%s", s->dir, de->d_name);
                unlink(path);
            }
            continue;
        }
        kv_hash key;
        if (!parse_hex_key(de->d_name, &key)) continue;
        snprintf(path, sizeof path, "%s/%s", s->dir, de->d_name);
        struct stat sb;
        if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) continue;
        entry *e = idx_find(s, key, true);
        if (!e) break;
        e->flags |= F_DISK;
        e->size = (uint64_t)sb.st_size;
        e->atime = (uint64_t)sb.st_mtim.tv_sec * 1000000000u + (uint64_t)sb.st_mtim.tv_nsec;
        s->st.disk_bytes += e->size;
        s->st.disk_files++;
    }
    closedir(d);
    idx_make_room(s, 0);
}

/* ---- records ---- */

static void put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get_u32(const uint8_t *p) {
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--) v = v << 8 | p[i];
    return v;
}
static uint64_t get_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

/* f16 keys and values: byte i of every pair together (sign/exponent bytes compress). */
static void shuffle2(const uint8_t *src, uint8_t *dst, size_t n) {
    size_t h = n / 2;
    for (size_t i = 0; i < h; i++) {
        dst[i] = src[2 * i];
        dst[h + i] = src[2 * i + 1];
    }
    if (n & 1) dst[n - 1] = src[n - 1];
}

static void unshuffle2(const uint8_t *src, uint8_t *dst, size_t n) {
    size_t h = n / 2;
    for (size_t i = 0; i < h; i++) {
        dst[2 * i] = src[i];
        dst[2 * i + 1] = src[h + i];
    }
    if (n & 1) dst[n - 1] = src[n - 1];
}

/* A record for a block; *len gets its size. scratch: block_bytes. NULL on failure. */
static uint8_t *record_make(const kv_store *s, kv_hash key, const void *data, uint8_t *scratch,
                            size_t *len) {
    size_t bound = ZSTD_compressBound(s->block_bytes);
    uint8_t *rec = malloc(REC_HEADER + bound);
    if (!rec) return NULL;
    shuffle2(data, scratch, s->block_bytes);
    size_t z = ZSTD_compress(rec + REC_HEADER, bound, scratch, s->block_bytes, 1);
    if (ZSTD_isError(z)) {
        free(rec);
        return NULL;
    }
    memset(rec, 0, REC_HEADER);
    memcpy(rec, REC_MAGIC, 4);
    put_u32(rec + 4, REC_VERSION);
    put_u64(rec + 8, key.lo);
    put_u64(rec + 16, key.hi);
    put_u64(rec + 24, s->block_bytes);
    put_u64(rec + 32, z);
    put_u64(rec + 40, XXH64(rec + REC_HEADER, z, 0));
    *len = REC_HEADER + z;
    return rec;
}

/* Checks a record against key and decodes it into data. scratch: block_bytes. */
static bool record_decode(const kv_store *s, kv_hash key, const uint8_t *rec, size_t len,
                          void *data, uint8_t *scratch) {
    if (len < REC_HEADER || memcmp(rec, REC_MAGIC, 4) != 0 || get_u32(rec + 4) != REC_VERSION)
        return false;
    if (get_u64(rec + 8) != key.lo || get_u64(rec + 16) != key.hi) return false;
    if (get_u64(rec + 24) != s->block_bytes || get_u64(rec + 32) != len - REC_HEADER) return false;
    if (XXH64(rec + REC_HEADER, len - REC_HEADER, 0) != get_u64(rec + 40)) return false;
    size_t n = ZSTD_decompress(scratch, s->block_bytes, rec + REC_HEADER, len - REC_HEADER);
    if (ZSTD_isError(n) || n != s->block_bytes) return false;
    unshuffle2(scratch, data, s->block_bytes);
    return true;
}

/* ---- disk ---- */

static bool disk_write(kv_store *s, kv_hash key, const uint8_t *rec, size_t len) {
    char path[4096], tmp[4096];
    block_path(s, key, path, sizeof path);
    char hex[33];
    kv_hash_hex(key, hex);
    snprintf(tmp, sizeof tmp, "%s/.tmp-%ld-%s", s->dir, (long)getpid(), hex);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return false;
    size_t off = 0;
    while (off < len) {
        ssize_t w = write(fd, rec + off, len - off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) break;
        off += (size_t)w;
    }
    bool ok = off == len;
    if (close(fd) != 0) ok = false;
    if (ok && rename(tmp, path) != 0) ok = false;
    if (!ok) unlink(tmp);
    return ok;
}

/* Reads a whole file (at most max bytes) into a malloc'd buffer. */
static uint8_t *disk_read(const char *path, size_t max, size_t *len) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return NULL;
    struct stat sb;
    uint8_t *buf = NULL;
    if (fstat(fd, &sb) == 0 && sb.st_size > 0 && (uint64_t)sb.st_size <= max) {
        size_t n = (size_t)sb.st_size, off = 0;
        buf = malloc(n);
        while (buf && off < n) {
            ssize_t r = read(fd, buf + off, n - off);
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) break;
            off += (size_t)r;
        }
        if (buf && off != n) {
            free(buf);
            buf = NULL;
        }
        *len = n;
    }
    close(fd);
    return buf;
}

/* ---- Redis ---- */

static void redis_key(const kv_store *s, kv_hash key, char *buf, size_t n) {
    char hex[33];
    kv_hash_hex(key, hex);
    snprintf(buf, n, "hearth:kv:%s:%s", s->ns, hex);
}

/* Under rmu: a connection, or NULL while Redis is down (backing off). */
static redisContext *redis_conn(kv_store *s) {
    if (s->rc) return s->rc;
    if (mono_ns() < s->down_until) return NULL;
    struct timeval tv = {s->timeout_ms / 1000, (s->timeout_ms % 1000) * 1000};
    redisContext *c = redisConnectWithTimeout(s->redis_host, s->redis_port, tv);
    if (!c || c->err || redisSetTimeout(c, tv) != REDIS_OK) {
        if (c) redisFree(c);
        s->down_until = mono_ns() + (uint64_t)KV_STORE_REDIS_BACKOFF_MS * 1000000u;
        pthread_mutex_lock(&s->mu);
        s->st.remote_errors++;
        s->remote_down = true;
        pthread_mutex_unlock(&s->mu);
        return NULL;
    }
    s->rc = c;
    pthread_mutex_lock(&s->mu);
    s->remote_down = false;
    pthread_mutex_unlock(&s->mu);
    return c;
}

/* Under rmu: drops a broken connection and backs off. */
static void redis_fail(kv_store *s) {
    if (s->rc) redisFree(s->rc);
    s->rc = NULL;
    s->down_until = mono_ns() + (uint64_t)KV_STORE_REDIS_BACKOFF_MS * 1000000u;
    pthread_mutex_lock(&s->mu);
    s->st.remote_errors++;
    s->remote_down = true;
    pthread_mutex_unlock(&s->mu);
}

static bool redis_set(kv_store *s, kv_hash key, const uint8_t *rec, size_t len) {
    char k[128];
    redis_key(s, key, k, sizeof k);
    pthread_mutex_lock(&s->rmu);
    bool ok = false;
    redisContext *c = redis_conn(s);
    if (c) {
        redisReply *r = redisCommand(c, "SET %s %b EX %d", k, (const char *)rec, len, s->ttl_s);
        if (!r) redis_fail(s);
        else ok = r->type == REDIS_REPLY_STATUS;
        if (r) freeReplyObject(r);
    }
    pthread_mutex_unlock(&s->rmu);
    return ok;
}

static bool parse_redis_url(const char *url, char **host, int *port) {
    if (strncmp(url, "redis://", 8) == 0) url += 8;
    const char *colon = strrchr(url, ':');
    const char *slash = strchr(url, '/');
    size_t hlen = colon ? (size_t)(colon - url) : slash ? (size_t)(slash - url) : strlen(url);
    if (hlen == 0 || hlen > 255) return false;
    *port = 6379;
    if (colon) {
        char *end;
        long p = strtol(colon + 1, &end, 10);
        if (end == colon + 1 || (*end && *end != '/') || p <= 0 || p > 65535) return false;
        *port = (int)p;
    }
    *host = strndup(url, hlen);
    return *host != NULL;
}

/* ---- the writer ---- */

static void *writer_main(void *arg) {
    kv_store *s = arg;
    uint8_t *scratch = malloc(s->block_bytes);
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->q_head && !s->stop) pthread_cond_wait(&s->cv, &s->mu);
        if (!s->q_head) break; /* stopping and drained */
        item *it = s->q_head;
        s->q_head = it->next;
        if (!s->q_head) s->q_tail = NULL;
        s->writing = true;
        entry *e = idx_find(s, it->key, false);
        uint8_t flags = e ? e->flags : 0;
        pthread_mutex_unlock(&s->mu);

        size_t len = 0;
        uint8_t *rec = scratch ? record_make(s, it->key, it->data, scratch, &len) : NULL;
        bool disk_ok = false, remote_ok = false;
        if (rec && s->dir && !(flags & F_DISK)) {
            pthread_mutex_lock(&s->mu);
            idx_make_room(s, len);
            pthread_mutex_unlock(&s->mu);
            disk_ok = len <= s->disk_max && disk_write(s, it->key, rec, len);
        }
        if (rec && s->redis_host && !(flags & F_REMOTE) && len <= s->redis_max_value)
            remote_ok = redis_set(s, it->key, rec, len);
        free(rec);

        pthread_mutex_lock(&s->mu);
        e = idx_find(s, it->key, true);
        if (e) {
            e->flags &= (uint8_t)~F_QUEUED;
            if (disk_ok && !(e->flags & F_DISK)) {
                e->flags |= F_DISK;
                e->size = len;
                e->atime = now_ns();
                s->st.disk_bytes += len;
                s->st.disk_files++;
                s->st.disk_writes++;
            }
            if (remote_ok) {
                e->flags |= F_REMOTE;
                s->st.remote_writes++;
            }
        }
        s->st.queued_bytes -= s->block_bytes;
        s->writing = false;
        free(it);
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    free(scratch);
    return NULL;
}

/* ---- API ---- */

static hl_status mkdir_p(const char *path, hl_err *err) {
    char buf[4096];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf)
        return hl_fail(err, HL_ERR_INVALID, "KV store path too long: %s", path);
    for (char *p = buf + 1;; p++) {
        if (*p == '/' || *p == '\0') {
            char c = *p;
            *p = '\0';
            if (mkdir(buf, 0755) != 0 && errno != EEXIST)
                return hl_fail(err, HL_ERR_IO, "cannot create %s: %s", buf, strerror(errno));
            *p = c;
            if (!c) break;
        }
    }
    return HL_OK;
}

hl_status kv_store_open(const kv_store_config *cfg, kv_store **out, hl_err *err) {
    *out = NULL;
    if (!cfg->block_bytes) return hl_fail(err, HL_ERR_INVALID, "KV store: block size is 0");
    const bool redis = cfg->redis_url && *cfg->redis_url;
    if (!cfg->dir && !redis) return hl_fail(err, HL_ERR_INVALID, "KV store: no tier configured");
    kv_store *s = calloc(1, sizeof *s);
    if (!s) return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    s->block_bytes = cfg->block_bytes;
    s->disk_max = cfg->disk_max ? cfg->disk_max : KV_STORE_DISK_MAX_DEFAULT;
    s->queue_max = cfg->queue_max ? cfg->queue_max : KV_STORE_QUEUE_MAX_DEFAULT;
    s->redis_max_value = cfg->redis_max_value ? cfg->redis_max_value : (size_t)64 << 20;
    s->ttl_s = cfg->redis_ttl_s > 0 ? cfg->redis_ttl_s : KV_STORE_REDIS_TTL_DEFAULT;
    s->timeout_ms = cfg->redis_timeout_ms > 0 ? cfg->redis_timeout_ms : KV_STORE_REDIS_TIMEOUT_MS;
    s->ns = strdup(cfg->ns && *cfg->ns ? cfg->ns : "default");
    bool locks = false;
    hl_status st = HL_OK;
    if (!s->ns) {
        st = hl_fail(err, HL_ERR_NOMEM, "out of memory");
        goto fail;
    }
    if (redis && !parse_redis_url(cfg->redis_url, &s->redis_host, &s->redis_port)) {
        st = hl_fail(err, HL_ERR_INVALID,
                     "invalid Redis address \"%s\" (expected redis://host:port)", cfg->redis_url);
        goto fail;
    }
    if (cfg->dir) {
        s->dir = strdup(cfg->dir);
        if (!s->dir) {
            st = hl_fail(err, HL_ERR_NOMEM, "out of memory");
            goto fail;
        }
        st = mkdir_p(s->dir, err);
        if (st) goto fail;
    }
    if (pthread_mutex_init(&s->mu, NULL) != 0) {
        st = hl_fail(err, HL_ERR_NOMEM, "cannot create a lock");
        goto fail;
    }
    if (pthread_mutex_init(&s->rmu, NULL) != 0) {
        pthread_mutex_destroy(&s->mu);
        st = hl_fail(err, HL_ERR_NOMEM, "cannot create a lock");
        goto fail;
    }
    if (pthread_cond_init(&s->cv, NULL) != 0) {
        pthread_mutex_destroy(&s->mu);
        pthread_mutex_destroy(&s->rmu);
        st = hl_fail(err, HL_ERR_NOMEM, "cannot create a condition variable");
        goto fail;
    }
    locks = true;
    if (s->dir) idx_scan(s);
    if (pthread_create(&s->writer, NULL, writer_main, s) != 0) {
        st = hl_fail(err, HL_ERR_NOMEM, "cannot start the KV writer thread");
        goto fail;
    }
    s->writer_started = true;
    *out = s;
    return HL_OK;
fail:
    if (locks) {
        pthread_mutex_destroy(&s->mu);
        pthread_mutex_destroy(&s->rmu);
        pthread_cond_destroy(&s->cv);
    }
    free(s->tab);
    free(s->dir);
    free(s->ns);
    free(s->redis_host);
    free(s);
    return st;
}

void kv_store_close(kv_store *s) {
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    s->stop = true;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    if (s->writer_started) pthread_join(s->writer, NULL);
    while (s->q_head) { /* the writer could not start */
        item *n = s->q_head->next;
        free(s->q_head);
        s->q_head = n;
    }
    if (s->rc) redisFree(s->rc);
    pthread_mutex_destroy(&s->mu);
    pthread_mutex_destroy(&s->rmu);
    pthread_cond_destroy(&s->cv);
    free(s->tab);
    free(s->dir);
    free(s->ns);
    free(s->redis_host);
    free(s);
}

bool kv_store_has_disk(const kv_store *s) { return s->dir != NULL; }
bool kv_store_has_remote(const kv_store *s) { return s->redis_host != NULL; }

static bool known_locked(kv_store *s, kv_hash key) {
    entry *e = idx_find(s, key, false);
    if (!e) return !s->dir && s->redis_host && s->remote_down;
    if (e->flags & F_QUEUED) return true;
    /* while Redis is down, blocks are not copied and compressed only to fail there */
    return (!s->dir || (e->flags & F_DISK)) &&
           (!s->redis_host || (e->flags & F_REMOTE) || s->remote_down);
}

bool kv_store_known(kv_store *s, kv_hash key) {
    pthread_mutex_lock(&s->mu);
    bool k = known_locked(s, key);
    pthread_mutex_unlock(&s->mu);
    return k;
}

bool kv_store_on_disk(kv_store *s, kv_hash key) {
    pthread_mutex_lock(&s->mu);
    const entry *e = s->dir ? idx_find(s, key, false) : NULL;
    bool on = e && (e->flags & F_DISK);
    pthread_mutex_unlock(&s->mu);
    return on;
}

bool kv_store_put(kv_store *s, kv_hash key, const void *data) {
    pthread_mutex_lock(&s->mu);
    bool ok = false;
    if (known_locked(s, key) || s->stop) goto out;
    if (s->st.queued_bytes + s->block_bytes > s->queue_max) {
        s->st.dropped++;
        goto out;
    }
    entry *e = idx_find(s, key, true);
    item *it = e ? malloc(sizeof *it + s->block_bytes) : NULL;
    if (!it) {
        s->st.dropped++;
        goto out;
    }
    it->key = key;
    it->next = NULL;
    memcpy(it->data, data, s->block_bytes);
    if (s->q_tail) s->q_tail->next = it;
    else s->q_head = it;
    s->q_tail = it;
    e->flags |= F_QUEUED;
    s->st.queued_bytes += s->block_bytes;
    pthread_cond_broadcast(&s->cv);
    ok = true;
out:
    pthread_mutex_unlock(&s->mu);
    return ok;
}

void kv_store_flush(kv_store *s) {
    pthread_mutex_lock(&s->mu);
    while ((s->q_head || s->writing) && s->writer_started) pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
}

static kv_source get_disk(kv_store *s, kv_hash key, void *data, uint8_t *scratch) {
    char path[4096];
    block_path(s, key, path, sizeof path);
    size_t len = 0;
    /* the file itself, indexed or not (another process may share the directory) */
    uint8_t *rec = disk_read(path, REC_HEADER + ZSTD_compressBound(s->block_bytes), &len);
    bool ok = rec && record_decode(s, key, rec, len, data, scratch);
    free(rec);
    pthread_mutex_lock(&s->mu);
    entry *e = idx_find(s, key, ok);
    if (ok && e) {
        if (!(e->flags & F_DISK)) {
            e->flags |= F_DISK;
            e->size = len;
            s->st.disk_bytes += len;
            s->st.disk_files++;
        }
        e->atime = now_ns();
        s->st.disk_hits++;
    } else if (!ok) {
        s->st.disk_misses++;
        if (rec || (e && (e->flags & F_DISK))) {
            if (rec) s->st.corrupt++; /* torn or damaged: never used, deleted */
            if (e && (e->flags & F_DISK)) idx_drop_file(s, e);
            else unlink(path);
        }
    }
    pthread_mutex_unlock(&s->mu);
    if (ok) utimensat(AT_FDCWD, path, NULL, 0); /* LRU order that survives a restart */
    return ok ? KV_SRC_DISK : KV_SRC_NONE;
}

/* GETs keys[0..n) in one pipelined round trip; recs[i] gets a malloc'd copy of each value
 * (NULL: missing, or Redis unreachable). */
static void redis_get_many(kv_store *s, const kv_hash *keys, int32_t n, uint8_t **recs,
                           size_t *lens) {
    pthread_mutex_lock(&s->rmu);
    redisContext *c = redis_conn(s);
    bool ok = c != NULL;
    char k[128];
    for (int32_t i = 0; i < n && ok; i++) {
        redis_key(s, keys[i], k, sizeof k);
        ok = redisAppendCommand(c, "GET %s", k) == REDIS_OK;
    }
    for (int32_t i = 0; i < n && ok; i++) { /* every reply, to keep the connection in step */
        redisReply *r = NULL;
        ok = redisGetReply(c, (void **)&r) == REDIS_OK && r;
        if (ok && r->type == REDIS_REPLY_STRING && r->len > 0 && (recs[i] = malloc(r->len))) {
            memcpy(recs[i], r->str, r->len);
            lens[i] = r->len;
        }
        if (r) freeReplyObject(r);
    }
    if (c && !ok) redis_fail(s);
    pthread_mutex_unlock(&s->rmu);
}

int32_t kv_store_get_run(kv_store *s, const kv_hash *keys, int32_t n, void *const *data,
                         kv_source *src) {
    uint8_t *scratch = malloc(s->block_bytes);
    if (!scratch) return 0;
    int32_t i = 0;
    if (s->dir)
        while (i < n && get_disk(s, keys[i], data[i], scratch)) src[i++] = KV_SRC_DISK;
    if (i < n && s->redis_host) {
        const int32_t m = n - i;
        uint8_t **recs = calloc((size_t)m, sizeof *recs);
        size_t *lens = calloc((size_t)m, sizeof *lens);
        int32_t j = 0;
        if (recs && lens) {
            redis_get_many(s, keys + i, m, recs, lens);
            for (; j < m; j++) {
                const bool ok =
                    recs[j] && record_decode(s, keys[i + j], recs[j], lens[j], data[i + j], scratch);
                pthread_mutex_lock(&s->mu);
                if (ok) {
                    s->st.remote_hits++;
                    entry *e = idx_find(s, keys[i + j], true);
                    if (e) e->flags |= F_REMOTE;
                } else {
                    s->st.remote_misses++;
                    if (recs[j]) s->st.corrupt++;
                }
                pthread_mutex_unlock(&s->mu);
                if (!ok) break;
                src[i + j] = KV_SRC_REMOTE;
            }
            for (int32_t k = 0; k < m; k++) free(recs[k]);
        }
        free(recs);
        free(lens);
        if (s->dir) /* keep local copies */
            for (int32_t k = 0; k < j; k++) kv_store_put(s, keys[i + k], data[i + k]);
        i += j;
    }
    free(scratch);
    return i;
}

kv_source kv_store_get(kv_store *s, kv_hash key, void *data) {
    kv_source src = KV_SRC_NONE;
    void *d[1] = {data};
    return kv_store_get_run(s, &key, 1, d, &src) == 1 ? src : KV_SRC_NONE;
}

kv_store_stats kv_store_get_stats(kv_store *s) {
    pthread_mutex_lock(&s->mu);
    kv_store_stats st = s->st;
    pthread_mutex_unlock(&s->mu);
    if (s->redis_host) {
        pthread_mutex_lock(&s->rmu);
        st.remote_up = s->rc != NULL || mono_ns() >= s->down_until;
        pthread_mutex_unlock(&s->rmu);
    }
    return st;
}
