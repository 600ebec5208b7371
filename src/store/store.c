#define _GNU_SOURCE
#include "store/store.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/file.h"
#include "store/sha256.h"

#define PATH_CAP 4096

struct store {
    char *root;
    pthread_mutex_t lock;
};

static hl_status mkdir_p(const char *path, hl_err *err) {
    char buf[PATH_CAP];
    size_t n = strlen(path);
    if (n >= sizeof buf) return hl_fail(err, HL_ERR_INVALID, "path too long: %s", path);
    memcpy(buf, path, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (buf[i] == '/' || buf[i] == '\0') {
            char c = buf[i];
            buf[i] = '\0';
            if (mkdir(buf, 0755) != 0 && errno != EEXIST)
                return hl_fail(err, HL_ERR_IO, "cannot create directory %s: %s", buf,
                               strerror(errno));
            buf[i] = c;
        }
    }
    return HL_OK;
}

hl_status store_open(const char *root, store **out, hl_err *err) {
    *out = NULL;
    char buf[PATH_CAP];
    if (!root || !*root) {
        const char *env = getenv("HEARTH_MODELS");
        if (env && *env) {
            snprintf(buf, sizeof buf, "%s", env);
        } else {
            const char *home = getenv("HOME");
            if (!home || !*home)
                return hl_fail(err, HL_ERR_INVALID, "cannot find the model store: set HOME or HEARTH_MODELS");
            snprintf(buf, sizeof buf, "%s/.hearth/models", home);
        }
        root = buf;
    }
    store *s = calloc(1, sizeof *s);
    if (!s || !(s->root = strdup(root))) {
        free(s);
        return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    }
    size_t rl = strlen(s->root);
    while (rl > 1 && s->root[rl - 1] == '/') s->root[--rl] = '\0';
    pthread_mutex_init(&s->lock, NULL);
    char sub[PATH_CAP];
    snprintf(sub, sizeof sub, "%s/blobs", s->root);
    hl_status st = mkdir_p(sub, err);
    if (st == HL_OK) {
        snprintf(sub, sizeof sub, "%s/manifests", s->root);
        st = mkdir_p(sub, err);
    }
    if (st != HL_OK) {
        store_close(s);
        return st;
    }
    *out = s;
    return HL_OK;
}

void store_close(store *s) {
    if (!s) return;
    pthread_mutex_destroy(&s->lock);
    free(s->root);
    free(s);
}

const char *store_root(const store *s) { return s->root; }

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

bool store_digest_parse(const char *s, char out[STORE_DIGEST_LEN]) {
    if (!s || strncmp(s, "sha256", 6) != 0 || (s[6] != ':' && s[6] != '-')) return false;
    const char *h = s + 7;
    if (strlen(h) != 64) return false;
    for (int i = 0; i < 64; i++)
        if (hexval(h[i]) < 0) return false;
    memcpy(out, "sha256:", 7);
    for (int i = 0; i < 64; i++) {
        char c = h[i];
        out[7 + i] = (c >= 'A' && c <= 'F') ? (char)(c - 'A' + 'a') : c;
    }
    out[71] = '\0';
    return true;
}

hl_status store_blob_path(const store *s, const char *digest, char *buf, size_t cap, hl_err *err) {
    char d[STORE_DIGEST_LEN];
    if (!store_digest_parse(digest, d)) return hl_fail(err, HL_ERR_INVALID, "invalid digest format");
    int n = snprintf(buf, cap, "%s/blobs/sha256-%s", s->root, d + 7);
    if (n < 0 || (size_t)n >= cap) return hl_fail(err, HL_ERR_INVALID, "blob path too long");
    return HL_OK;
}

bool store_blob_exists(const store *s, const char *digest, uint64_t *size_out) {
    char path[PATH_CAP];
    if (store_blob_path(s, digest, path, sizeof path, NULL) != HL_OK) return false;
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) return false;
    if (size_out) *size_out = (uint64_t)st.st_size;
    return true;
}

/* ---- blob writer ---- */

struct store_blob_writer {
    const store *s;
    int fd;
    char tmp_path[PATH_CAP];
    sha256_ctx sha;
    uint64_t size;
};

hl_status store_blob_writer_open(const store *s, store_blob_writer **out, hl_err *err) {
    *out = NULL;
    store_blob_writer *w = calloc(1, sizeof *w);
    if (!w) return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    w->s = s;
    snprintf(w->tmp_path, sizeof w->tmp_path, "%s/blobs/.partial-XXXXXX", s->root);
    w->fd = mkstemp(w->tmp_path);
    if (w->fd < 0) {
        hl_fail(err, HL_ERR_IO, "cannot create a temp file in %s/blobs: %s", s->root, strerror(errno));
        free(w);
        return HL_ERR_IO;
    }
    fchmod(w->fd, 0644);
    if (!sha256_init(&w->sha)) {
        close(w->fd);
        unlink(w->tmp_path);
        free(w);
        return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    }
    *out = w;
    return HL_OK;
}

hl_status store_blob_writer_write(store_blob_writer *w, const void *data, size_t len, hl_err *err) {
    const char *p = data;
    sha256_update(&w->sha, data, len);
    w->size += len;
    while (len > 0) {
        ssize_t n = write(w->fd, p, len);
        if (n < 0) {
            if (errno == EINTR) continue;
            return hl_fail(err, HL_ERR_IO, "writing blob: %s", strerror(errno));
        }
        p += n;
        len -= (size_t)n;
    }
    return HL_OK;
}

void store_blob_writer_abort(store_blob_writer *w) {
    if (!w) return;
    if (w->fd >= 0) close(w->fd);
    unlink(w->tmp_path);
    sha256_discard(&w->sha);
    free(w);
}

hl_status store_blob_writer_commit(store_blob_writer *w, const char *expected,
                                   char digest_out[STORE_DIGEST_LEN], uint64_t *size_out,
                                   hl_err *err) {
    char got[STORE_DIGEST_LEN];
    memcpy(got, "sha256:", 7);
    sha256_final_hex(&w->sha, got + 7);
    if (expected) {
        char exp[STORE_DIGEST_LEN];
        if (!store_digest_parse(expected, exp)) {
            store_blob_writer_abort(w);
            return hl_fail(err, HL_ERR_INVALID, "invalid digest format");
        }
        if (strcmp(exp, got) != 0) {
            store_blob_writer_abort(w);
            return hl_fail(err, HL_ERR_INVALID, "digest mismatch, expected \"%s\", got \"%s\"",
                           exp, got);
        }
    }
    if (fsync(w->fd) != 0 || close(w->fd) != 0) {
        w->fd = -1;
        hl_fail(err, HL_ERR_IO, "writing blob: %s", strerror(errno));
        store_blob_writer_abort(w);
        return HL_ERR_IO;
    }
    w->fd = -1;
    char path[PATH_CAP];
    hl_status st = store_blob_path(w->s, got, path, sizeof path, err);
    if (st == HL_OK && rename(w->tmp_path, path) != 0)
        st = hl_fail(err, HL_ERR_IO, "cannot rename blob to %s: %s", path, strerror(errno));
    if (st != HL_OK) {
        store_blob_writer_abort(w);
        return st;
    }
    if (digest_out) memcpy(digest_out, got, STORE_DIGEST_LEN);
    if (size_out) *size_out = w->size;
    free(w);
    return HL_OK;
}

hl_status store_blob_put(const store *s, const void *data, size_t len,
                         char digest_out[STORE_DIGEST_LEN], hl_err *err) {
    char d[STORE_DIGEST_LEN];
    memcpy(d, "sha256:", 7);
    if (!sha256_hex(data, len, d + 7)) return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    memcpy(digest_out, d, STORE_DIGEST_LEN);
    if (store_blob_exists(s, d, NULL)) return HL_OK;
    store_blob_writer *w;
    hl_status st = store_blob_writer_open(s, &w, err);
    if (st != HL_OK) return st;
    st = store_blob_writer_write(w, data, len, err);
    if (st != HL_OK) {
        store_blob_writer_abort(w);
        return st;
    }
    return store_blob_writer_commit(w, d, NULL, NULL, err);
}

hl_status store_blob_import_file(const store *s, const char *path, char digest_out[STORE_DIGEST_LEN],
                                 uint64_t *size_out, bool *existed, hl_err *err) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return hl_fail(err, HL_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    store_blob_writer *w;
    hl_status st = store_blob_writer_open(s, &w, err);
    if (st != HL_OK) {
        close(fd);
        return st;
    }
    char *buf = malloc(1 << 20);
    if (!buf) {
        close(fd);
        store_blob_writer_abort(w);
        return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    }
    for (;;) {
        ssize_t n = read(fd, buf, 1 << 20);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            st = hl_fail(err, HL_ERR_IO, "%s: read error: %s", path, strerror(errno));
            break;
        }
        if (n == 0) break;
        st = store_blob_writer_write(w, buf, (size_t)n, err);
        if (st != HL_OK) break;
    }
    free(buf);
    close(fd);
    if (st != HL_OK) {
        store_blob_writer_abort(w);
        return st;
    }
    /* Peek at the digest: if the blob already exists, keep the existing file. */
    sha256_ctx copy;
    if (!sha256_copy(&copy, &w->sha)) {
        store_blob_writer_abort(w);
        return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    }
    char d[STORE_DIGEST_LEN];
    memcpy(d, "sha256:", 7);
    sha256_final_hex(&copy, d + 7);
    if (size_out) *size_out = w->size;
    memcpy(digest_out, d, STORE_DIGEST_LEN);
    if (store_blob_exists(s, d, NULL)) {
        if (existed) *existed = true;
        store_blob_writer_abort(w);
        return HL_OK;
    }
    if (existed) *existed = false;
    return store_blob_writer_commit(w, d, NULL, NULL, err);
}

/* ---- manifests ---- */

void store_manifest_free(store_manifest *m) {
    if (!m) return;
    free(m->layers);
    memset(m, 0, sizeof *m);
}

hl_status store_manifest_add_layer(store_manifest *m, const char *media_type, const char *digest,
                                   uint64_t size, hl_err *err) {
    store_layer *nl = realloc(m->layers, (m->n_layers + 1) * sizeof *nl);
    if (!nl) return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    m->layers = nl;
    store_layer *l = &nl[m->n_layers++];
    memset(l, 0, sizeof *l);
    snprintf(l->media_type, sizeof l->media_type, "%s", media_type);
    snprintf(l->digest, sizeof l->digest, "%s", digest);
    l->size = size;
    return HL_OK;
}

void store_manifest_remove_layers(store_manifest *m, const char *media_type) {
    size_t j = 0;
    for (size_t i = 0; i < m->n_layers; i++)
        if (strcmp(m->layers[i].media_type, media_type) != 0) m->layers[j++] = m->layers[i];
    m->n_layers = j;
}

const store_layer *store_manifest_find(const store_manifest *m, const char *media_type) {
    for (size_t i = 0; i < m->n_layers; i++)
        if (strcmp(m->layers[i].media_type, media_type) == 0) return &m->layers[i];
    return NULL;
}

uint64_t store_manifest_size(const store_manifest *m) {
    uint64_t total = m->config.size;
    for (size_t i = 0; i < m->n_layers; i++) total += m->layers[i].size;
    return total;
}

static hl_status parse_layer(json_t *j, store_layer *l, hl_err *err) {
    memset(l, 0, sizeof *l);
    const char *mt = json_string_value(json_object_get(j, "mediaType"));
    const char *dg = json_string_value(json_object_get(j, "digest"));
    json_t *sz = json_object_get(j, "size");
    if (!json_is_object(j) || !mt || !dg || !json_is_integer(sz) || json_integer_value(sz) < 0)
        return hl_fail(err, HL_ERR_FORMAT, "manifest layer lacks mediaType, digest or size");
    if (strlen(mt) >= sizeof l->media_type)
        return hl_fail(err, HL_ERR_FORMAT, "manifest layer media type too long");
    if (!store_digest_parse(dg, l->digest))
        return hl_fail(err, HL_ERR_FORMAT, "manifest layer has an invalid digest '%s'", dg);
    strcpy(l->media_type, mt);
    l->size = (uint64_t)json_integer_value(sz);
    return HL_OK;
}

hl_status store_manifest_parse(const char *json, size_t len, store_manifest *out, hl_err *err) {
    memset(out, 0, sizeof *out);
    json_error_t je;
    json_t *root = json_loadb(json, len, 0, &je);
    if (!root) return hl_fail(err, HL_ERR_FORMAT, "manifest: %s", je.text);
    hl_status st = HL_OK;
    json_t *layers = json_object_get(root, "layers");
    if (!json_is_object(root) || !json_is_array(layers)) {
        st = hl_fail(err, HL_ERR_FORMAT, "manifest: not an object with a layers array");
        goto done;
    }
    st = parse_layer(json_object_get(root, "config"), &out->config, err);
    size_t i;
    json_t *lj;
    json_array_foreach(layers, i, lj) {
        if (st != HL_OK) break;
        store_layer l;
        st = parse_layer(lj, &l, err);
        if (st == HL_OK) st = store_manifest_add_layer(out, l.media_type, l.digest, l.size, err);
    }
done:
    json_decref(root);
    if (st != HL_OK) store_manifest_free(out);
    return st;
}

static json_t *layer_json(const store_layer *l) {
    return json_pack("{s:s, s:s, s:I}", "mediaType", l->media_type, "digest", l->digest, "size",
                     (json_int_t)l->size);
}

hl_status store_manifest_serialize(const store_manifest *m, char **out, size_t *out_len,
                                   hl_err *err) {
    *out = NULL;
    json_t *layers = json_array();
    for (size_t i = 0; layers && i < m->n_layers; i++)
        json_array_append_new(layers, layer_json(&m->layers[i]));
    json_t *root = json_pack("{s:i, s:s, s:o, s:o}", "schemaVersion", 2, "mediaType",
                             STORE_MT_MANIFEST, "config", layer_json(&m->config), "layers", layers);
    char *s = root ? json_dumps(root, JSON_PRESERVE_ORDER | JSON_COMPACT) : NULL;
    json_decref(root);
    if (!s) return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    *out = s;
    if (out_len) *out_len = strlen(s);
    return HL_OK;
}

hl_status store_manifest_path(const store *s, const store_name *n, char *buf, size_t cap,
                              hl_err *err) {
    int k = snprintf(buf, cap, "%s/manifests/%s/%s/%s/%s", s->root, n->host, n->ns, n->model, n->tag);
    if (k < 0 || (size_t)k >= cap) return hl_fail(err, HL_ERR_INVALID, "manifest path too long");
    return HL_OK;
}

/* Finds an entry of dir matching want case-insensitively; exact match preferred. */
static bool find_ci(const char *dir, const char *want, char *found, size_t cap, bool want_dir) {
    char path[PATH_CAP];
    struct stat st;
    snprintf(path, sizeof path, "%s/%s", dir, want);
    if (stat(path, &st) == 0 && (want_dir ? S_ISDIR(st.st_mode) : S_ISREG(st.st_mode))) {
        snprintf(found, cap, "%s", want);
        return true;
    }
    DIR *d = opendir(dir);
    if (!d) return false;
    bool ok = false;
    struct dirent *e;
    while (!ok && (e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.' || strcasecmp(e->d_name, want) != 0) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (stat(path, &st) == 0 && (want_dir ? S_ISDIR(st.st_mode) : S_ISREG(st.st_mode))) {
            snprintf(found, cap, "%s", e->d_name);
            ok = true;
        }
    }
    closedir(d);
    return ok;
}

bool store_find(const store *s, const store_name *name, store_name *canon_out) {
    store_name c;
    char dir[PATH_CAP];
    snprintf(dir, sizeof dir, "%s/manifests", s->root);
    if (!find_ci(dir, name->host, c.host, sizeof c.host, true)) return false;
    size_t n = strlen(dir);
    snprintf(dir + n, sizeof dir - n, "/%s", c.host);
    if (!find_ci(dir, name->ns, c.ns, sizeof c.ns, true)) return false;
    n = strlen(dir);
    snprintf(dir + n, sizeof dir - n, "/%s", c.ns);
    if (!find_ci(dir, name->model, c.model, sizeof c.model, true)) return false;
    n = strlen(dir);
    snprintf(dir + n, sizeof dir - n, "/%s", c.model);
    if (!find_ci(dir, name->tag, c.tag, sizeof c.tag, false)) return false;
    if (canon_out) *canon_out = c;
    return true;
}

hl_status store_manifest_read(const store *s, const store_name *n, store_manifest *out,
                              char digest_hex[65], int64_t *mtime_ns, hl_err *err) {
    memset(out, 0, sizeof *out);
    char path[PATH_CAP];
    hl_status st = store_manifest_path(s, n, path, sizeof path, err);
    if (st != HL_OK) return st;
    char *buf;
    size_t len;
    struct stat sb0;
    if (stat(path, &sb0) != 0 && errno == ENOENT)
        return hl_fail(err, HL_ERR_NOT_FOUND, "model '%s' not found", n->model);
    st = hl_file_read(path, &buf, &len, err);
    if (st != HL_OK) return st;
    st = store_manifest_parse(buf, len, out, err);
    if (st == HL_OK && digest_hex && !sha256_hex(buf, len, digest_hex))
        st = hl_fail(err, HL_ERR_NOMEM, "out of memory");
    free(buf);
    if (st != HL_OK) {
        hl_err_prefix(err, "%s", path);
        return st;
    }
    if (mtime_ns) {
        struct stat sb;
        *mtime_ns = 0;
        if (stat(path, &sb) == 0)
            *mtime_ns = (int64_t)sb.st_mtim.tv_sec * 1000000000 + sb.st_mtim.tv_nsec;
    }
    return HL_OK;
}

static hl_status prune_locked(store *s, const store_manifest *old);

/* Removes the now-empty model, namespace and host directories above a manifest path
 * (path is modified). */
static void rmdir_empty_parents(const store *s, char *path) {
    char root[PATH_CAP];
    snprintf(root, sizeof root, "%s/manifests", s->root);
    for (int i = 0; i < 3; i++) {
        char *slash = strrchr(path, '/');
        if (!slash) break;
        *slash = '\0';
        if (strcmp(path, root) == 0 || rmdir(path) != 0) break;
    }
}

/* Under s->lock: every blob m references is there. With every prune under the same lock,
 * a manifest written after this check never points at a missing blob. */
static hl_status check_blobs_locked(const store *s, const store_manifest *m, hl_err *err) {
    if (m->config.digest[0] && !store_blob_exists(s, m->config.digest, NULL))
        return hl_fail(err, HL_ERR_NOT_FOUND, "blob %s not found", m->config.digest);
    for (size_t i = 0; i < m->n_layers; i++)
        if (!store_blob_exists(s, m->layers[i].digest, NULL))
            return hl_fail(err, HL_ERR_NOT_FOUND, "blob %s not found", m->layers[i].digest);
    return HL_OK;
}

/* Writes the manifest's exact bytes; a failed write leaves no empty folders. */
static hl_status manifest_write_bytes_locked(store *s, const store_name *n, const char *json,
                                             size_t len, hl_err *err) {
    char path[PATH_CAP];
    hl_status st = store_manifest_path(s, n, path, sizeof path, err);
    if (st != HL_OK) return st;
    char *slash = strrchr(path, '/');
    *slash = '\0';
    st = mkdir_p(path, err);
    *slash = '/';
    if (st != HL_OK) return st;
    st = hl_file_write(path, json, len, err);
    if (st != HL_OK) rmdir_empty_parents(s, path); /* no empty folders from a failed write */
    return st;
}

/* Writes n's manifest m, whose serialised bytes are json (under its stored spelling when
 * there is one), once its blobs are checked, then prunes the blobs only the replaced
 * manifest referenced. */
static hl_status manifest_commit_locked(store *s, const store_name *n_in, const store_manifest *m,
                                        const char *json, size_t len, hl_err *err) {
    hl_status st = check_blobs_locked(s, m, err);
    if (st != HL_OK) return st;
    store_name canon;
    const store_name *n = store_find(s, n_in, &canon) ? &canon : n_in;
    store_manifest old = {0};
    bool had_old = store_manifest_read(s, n, &old, NULL, NULL, NULL) == HL_OK;
    st = manifest_write_bytes_locked(s, n, json, len, err);
    if (st == HL_OK && had_old && !store_noprune())
        prune_locked(s, &old);
    store_manifest_free(&old);
    return st;
}

static hl_status manifest_write_locked(store *s, const store_name *n, const store_manifest *m,
                                       hl_err *err) {
    char *json;
    size_t len;
    hl_status st = store_manifest_serialize(m, &json, &len, err);
    if (st != HL_OK) return st;
    st = manifest_commit_locked(s, n, m, json, len, err);
    free(json);
    return st;
}

/* A manifest's exact bytes (a pull keeps the registry's, so the model ID matches). */
hl_status store_manifest_write_raw(store *s, const store_name *n, const char *json, size_t len,
                                   hl_err *err) {
    store_manifest m;
    hl_status st = store_manifest_parse(json, len, &m, err);
    if (st != HL_OK) return st;
    pthread_mutex_lock(&s->lock);
    st = manifest_commit_locked(s, n, &m, json, len, err);
    pthread_mutex_unlock(&s->lock);
    store_manifest_free(&m);
    return st;
}

hl_status store_manifest_write(store *s, const store_name *n, const store_manifest *m,
                               hl_err *err) {
    pthread_mutex_lock(&s->lock);
    hl_status st = manifest_write_locked(s, n, m, err);
    pthread_mutex_unlock(&s->lock);
    return st;
}

/* Walks manifests/<host>/<ns>/<model>/<tag>, calling fn for every regular file. */
typedef void (*walk_fn)(void *ctx, const store_name *n, const char *path);

static void walk_level(const char *dir, int depth, store_name *n, walk_fn fn, void *ctx) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        char path[PATH_CAP];
        int k = snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (k < 0 || (size_t)k >= sizeof path) continue;
        struct stat st;
        if (stat(path, &st) != 0) continue;
        char *slot = depth == 0 ? n->host : depth == 1 ? n->ns : depth == 2 ? n->model : n->tag;
        size_t cap = depth == 0 ? sizeof n->host : sizeof n->ns;
        if (strlen(e->d_name) >= cap) continue;
        strcpy(slot, e->d_name);
        if (depth < 3 && S_ISDIR(st.st_mode))
            walk_level(path, depth + 1, n, fn, ctx);
        else if (depth == 3 && S_ISREG(st.st_mode))
            fn(ctx, n, path);
    }
    closedir(d);
}

static void walk_manifests(const store *s, walk_fn fn, void *ctx) {
    char dir[PATH_CAP];
    snprintf(dir, sizeof dir, "%s/manifests", s->root);
    store_name n;
    memset(&n, 0, sizeof n);
    walk_level(dir, 0, &n, fn, ctx);
}

typedef struct list_ctx {
    const store *s;
    store_entry *v;
    size_t n, cap;
    bool oom;
} list_ctx;

static void list_cb(void *ctx, const store_name *n, const char *path) {
    (void)path;
    list_ctx *lc = ctx;
    if (lc->oom) return;
    store_name check;
    if (store_name_parse(n->model, &check, NULL) != HL_OK) return; /* not a model name */
    store_entry e;
    memset(&e, 0, sizeof e);
    e.name = *n;
    if (store_manifest_read(lc->s, n, &e.manifest, e.digest_hex, &e.mtime_ns, NULL) != HL_OK) return;
    e.size = store_manifest_size(&e.manifest);
    if (lc->n == lc->cap) {
        size_t nc = lc->cap ? lc->cap * 2 : 16;
        store_entry *nv = realloc(lc->v, nc * sizeof *nv);
        if (!nv) {
            store_manifest_free(&e.manifest);
            lc->oom = true;
            return;
        }
        lc->v = nv;
        lc->cap = nc;
    }
    lc->v[lc->n++] = e;
}

static int entry_newest_first(const void *a, const void *b) {
    const store_entry *x = a, *y = b;
    if (x->mtime_ns != y->mtime_ns) return x->mtime_ns > y->mtime_ns ? -1 : 1;
    return strcmp(x->name.model, y->name.model);
}

hl_status store_list(const store *s, store_entry **out, size_t *n_out, hl_err *err) {
    list_ctx lc = {.s = s};
    walk_manifests(s, list_cb, &lc);
    if (lc.oom) {
        store_list_free(lc.v, lc.n);
        return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    }
    if (lc.n > 1) qsort(lc.v, lc.n, sizeof *lc.v, entry_newest_first);
    *out = lc.v;
    *n_out = lc.n;
    return HL_OK;
}

void store_list_free(store_entry *entries, size_t n) {
    for (size_t i = 0; i < n; i++) store_manifest_free(&entries[i].manifest);
    free(entries);
}

/* ---- delete, copy, prune ---- */

typedef struct ref_ctx {
    const store *s;
    const char *digest;
    bool found;
} ref_ctx;

static void ref_cb(void *ctx, const store_name *n, const char *path) {
    (void)path;
    ref_ctx *rc = ctx;
    if (rc->found) return;
    store_manifest m;
    if (store_manifest_read(rc->s, n, &m, NULL, NULL, NULL) != HL_OK) return;
    if (strcmp(m.config.digest, rc->digest) == 0) rc->found = true;
    for (size_t i = 0; i < m.n_layers && !rc->found; i++)
        if (strcmp(m.layers[i].digest, rc->digest) == 0) rc->found = true;
    store_manifest_free(&m);
}

/* A model blob's KV blocks (<root>/kvcache/<blob name>/, kv/store.h) go with it. */
static void remove_kv_blocks(const char *blob_path) {
    const char *b = strstr(blob_path, "/blobs/");
    if (!b) return;
    char dir[PATH_CAP], file[PATH_CAP + 64];
    if (snprintf(dir, sizeof dir, "%.*s/kvcache/%s", (int)(b - blob_path), blob_path, b + 7) >=
        (int)sizeof dir)
        return;
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *de;
    while ((de = readdir(d)))
        if (strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0) {
            snprintf(file, sizeof file, "%s/%s", dir, de->d_name);
            unlink(file);
        }
    closedir(d);
    rmdir(dir);
}

static void remove_if_unreferenced(const store *s, const char *digest) {
    ref_ctx rc = {.s = s, .digest = digest};
    walk_manifests(s, ref_cb, &rc);
    if (rc.found) return;
    char path[PATH_CAP];
    if (store_blob_path(s, digest, path, sizeof path, NULL) == HL_OK) {
        unlink(path);
        remove_kv_blocks(path);
    }
}

static hl_status prune_locked(store *s, const store_manifest *old) {
    remove_if_unreferenced(s, old->config.digest);
    for (size_t i = 0; i < old->n_layers; i++) remove_if_unreferenced(s, old->layers[i].digest);
    return HL_OK;
}

hl_status store_prune(store *s, const store_manifest *old, hl_err *err) {
    (void)err;
    if (store_noprune()) return HL_OK;
    pthread_mutex_lock(&s->lock);
    hl_status st = prune_locked(s, old);
    pthread_mutex_unlock(&s->lock);
    return st;
}

hl_status store_delete(store *s, const store_name *n_in, hl_err *err) {
    pthread_mutex_lock(&s->lock);
    store_manifest m;
    char path[PATH_CAP];
    store_name canon;
    const store_name *n = store_find(s, n_in, &canon) ? &canon : n_in;
    hl_status st = store_manifest_read(s, n, &m, NULL, NULL, err);
    if (st == HL_OK) st = store_manifest_path(s, n, path, sizeof path, err);
    if (st == HL_OK && unlink(path) != 0)
        st = hl_fail(err, HL_ERR_IO, "cannot remove %s: %s", path, strerror(errno));
    if (st == HL_OK) {
        rmdir_empty_parents(s, path);
        if (!store_noprune()) prune_locked(s, &m);
    }
    store_manifest_free(&m);
    pthread_mutex_unlock(&s->lock);
    return st;
}

hl_status store_copy(store *s, const store_name *src, const store_name *dst, hl_err *err) {
    pthread_mutex_lock(&s->lock);
    store_manifest m;
    store_name canon;
    hl_status st = store_manifest_read(s, store_find(s, src, &canon) ? &canon : src, &m, NULL,
                                       NULL, err);
    if (st == HL_OK) st = manifest_write_locked(s, dst, &m, err);
    store_manifest_free(&m);
    pthread_mutex_unlock(&s->lock);
    return st;
}

/* ---- garbage collection ---- */

typedef struct gc_ctx {
    const store *s;
    char (*digests)[STORE_DIGEST_LEN];
    size_t n, cap;
    bool unsure; /* a manifest could not be read: keep every blob */
} gc_ctx;

static void gc_add(gc_ctx *g, const char *digest) {
    if (g->unsure) return;
    if (g->n == g->cap) {
        size_t nc = g->cap ? g->cap * 2 : 64;
        char(*nv)[STORE_DIGEST_LEN] = realloc(g->digests, nc * sizeof *nv);
        if (!nv) {
            g->unsure = true;
            return;
        }
        g->digests = nv;
        g->cap = nc;
    }
    snprintf(g->digests[g->n++], STORE_DIGEST_LEN, "%s", digest);
}

static void gc_cb(void *ctx, const store_name *n, const char *path) {
    (void)path;
    gc_ctx *g = ctx;
    store_manifest m;
    if (store_manifest_read(g->s, n, &m, NULL, NULL, NULL) != HL_OK) {
        g->unsure = true;
        return;
    }
    if (m.config.digest[0]) gc_add(g, m.config.digest);
    for (size_t i = 0; i < m.n_layers; i++) gc_add(g, m.layers[i].digest);
    store_manifest_free(&m);
}

bool store_noprune(void) {
    const char *v = getenv("HEARTH_NOPRUNE");
    if (!v || !*v) v = getenv("OLLAMA_NOPRUNE");
    return v && *v;
}

hl_status store_gc(store *s, size_t *removed, hl_err *err) {
    *removed = 0;
    char dir[PATH_CAP];
    snprintf(dir, sizeof dir, "%s/blobs", s->root);
    pthread_mutex_lock(&s->lock);
    gc_ctx g = {.s = s};
    walk_manifests(s, gc_cb, &g);
    DIR *d = opendir(dir);
    if (!d) {
        pthread_mutex_unlock(&s->lock);
        free(g.digests);
        return hl_fail(err, HL_ERR_IO, "cannot read %s: %s", dir, strerror(errno));
    }
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        bool drop = strncmp(e->d_name, ".partial-", 9) == 0; /* a writer that never finished */
        char digest[STORE_DIGEST_LEN];
        if (!drop && !g.unsure && strlen(e->d_name) == 71 &&
            strncmp(e->d_name, "sha256-", 7) == 0 && store_digest_parse(e->d_name, digest)) {
            drop = true;
            for (size_t i = 0; i < g.n && drop; i++) drop = strcmp(g.digests[i], digest) != 0;
        }
        if (!drop) continue;
        char path[PATH_CAP];
        if (snprintf(path, sizeof path, "%s/%s", dir, e->d_name) < (int)sizeof path &&
            unlink(path) == 0)
            (*removed)++;
    }
    closedir(d);
    pthread_mutex_unlock(&s->lock);
    free(g.digests);
    return HL_OK;
}

/* ---- models ---- */

void store_model_free(store_model *m) {
    if (!m) return;
    store_manifest_free(&m->manifest);
    free(m->model_path);
    free(m->adapter_path);
    json_decref(m->config);
    free(m->template_text);
    free(m->system);
    json_decref(m->params);
    json_decref(m->messages);
    for (size_t i = 0; i < m->n_licenses; i++) free(m->licenses[i]);
    free(m->licenses);
    memset(m, 0, sizeof *m);
}

static hl_status read_blob_text(const store *s, const char *digest, char **out, size_t *len,
                                hl_err *err) {
    char path[PATH_CAP];
    hl_status st = store_blob_path(s, digest, path, sizeof path, err);
    if (st != HL_OK) return st;
    return hl_file_read(path, out, len, err);
}

static hl_status read_blob_json(const store *s, const char *digest, json_t **out, hl_err *err) {
    char *text;
    size_t len;
    hl_status st = read_blob_text(s, digest, &text, &len, err);
    if (st != HL_OK) return st;
    json_error_t je;
    *out = json_loadb(text, len, 0, &je);
    free(text);
    if (!*out) return hl_fail(err, HL_ERR_FORMAT, "blob %s: %s", digest, je.text);
    return HL_OK;
}

static hl_status model_load_locked(const store *s, const store_name *name, store_model *out,
                                   bool *found, hl_err *err);

hl_status store_model_load(const store *s, const store_name *name, store_model *out, bool *found,
                           hl_err *err) {
    /* under the lock: a manifest and its blobs are read as one version, never half-deleted */
    pthread_mutex_t *lock = &((store *)s)->lock;
    pthread_mutex_lock(lock);
    hl_status st = model_load_locked(s, name, out, found, err);
    pthread_mutex_unlock(lock);
    return st;
}

static hl_status model_load_locked(const store *s, const store_name *name, store_model *out,
                                   bool *found, hl_err *err) {
    memset(out, 0, sizeof *out);
    *found = false;
    if (!store_find(s, name, &out->name)) return HL_OK;
    hl_status st = store_manifest_read(s, &out->name, &out->manifest, out->digest_hex,
                                       &out->mtime_ns, err);
    if (st == HL_ERR_NOT_FOUND) return HL_OK;
    *found = true;
    if (st != HL_OK) return st;
    const store_manifest *m = &out->manifest;
    char path[PATH_CAP];
    if (m->config.digest[0] && store_blob_exists(s, m->config.digest, NULL)) {
        st = read_blob_json(s, m->config.digest, &out->config, err);
        if (st == HL_OK && !json_is_object(out->config)) {
            json_decref(out->config);
            out->config = NULL;
        }
    }
    for (size_t i = 0; st == HL_OK && i < m->n_layers; i++) {
        const store_layer *l = &m->layers[i];
        const char *mt = l->media_type;
        if (strcmp(mt, STORE_MT_MODEL) == 0 || strcmp(mt, STORE_MT_ADAPTER) == 0) {
            char **slot = strcmp(mt, STORE_MT_MODEL) == 0 ? &out->model_path : &out->adapter_path;
            if (*slot) continue;
            st = store_blob_path(s, l->digest, path, sizeof path, err);
            if (st == HL_OK && !(*slot = strdup(path))) st = hl_fail(err, HL_ERR_NOMEM, "out of memory");
        } else if (strcmp(mt, STORE_MT_TEMPLATE) == 0 ||
                   strcmp(mt, "application/vnd.ollama.image.prompt") == 0) {
            size_t len;
            free(out->template_text);
            st = read_blob_text(s, l->digest, &out->template_text, &len, err);
        } else if (strcmp(mt, STORE_MT_SYSTEM) == 0) {
            size_t len;
            free(out->system);
            st = read_blob_text(s, l->digest, &out->system, &len, err);
        } else if (strcmp(mt, STORE_MT_PARAMS) == 0) {
            json_decref(out->params);
            st = read_blob_json(s, l->digest, &out->params, err);
            if (st == HL_OK && !json_is_object(out->params)) {
                json_decref(out->params);
                out->params = NULL;
            }
        } else if (strcmp(mt, STORE_MT_MESSAGES) == 0) {
            json_decref(out->messages);
            st = read_blob_json(s, l->digest, &out->messages, err);
            if (st == HL_OK && !json_is_array(out->messages)) {
                json_decref(out->messages);
                out->messages = NULL;
            }
        } else if (strcmp(mt, STORE_MT_LICENSE) == 0) {
            char *text;
            size_t len;
            st = read_blob_text(s, l->digest, &text, &len, err);
            if (st == HL_OK) {
                char **nl = realloc(out->licenses, (out->n_licenses + 1) * sizeof *nl);
                if (!nl) {
                    free(text);
                    st = hl_fail(err, HL_ERR_NOMEM, "out of memory");
                } else {
                    out->licenses = nl;
                    nl[out->n_licenses++] = text;
                }
            }
        }
    }
    if (st == HL_OK && !out->config) out->config = json_object();
    if (st == HL_OK && !out->params) out->params = json_object();
    if (st == HL_OK && !out->messages) out->messages = json_array();
    if (st == HL_OK && (!out->config || !out->params || !out->messages))
        st = hl_fail(err, HL_ERR_NOMEM, "out of memory");
    if (st != HL_OK) {
        hl_err_prefix(err, "model '%s'", name->model);
        store_model_free(out);
        *found = true;
    }
    return st;
}
