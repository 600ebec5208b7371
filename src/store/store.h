/*
 * store.h - the model store, laid out like Ollama's (but rooted elsewhere):
 *
 *   <root>/blobs/sha256-<hex>                       content-addressed files
 *   <root>/manifests/<host>/<namespace>/<model>/<tag>  manifest JSON
 *
 * <root> is $HEARTH_MODELS, else ~/.hearth/models. OLLAMA_MODELS is deliberately not
 * read: hearth never touches a user's Ollama store.
 *
 * A store is shared by server threads: mutating operations (manifest writes, delete,
 * copy, prune) take an internal mutex; blobs are written to a temp file and renamed,
 * so readers never see a partial blob. store_open() allocates; store_close() frees.
 * Manifests and models loaded from the store are owned by the caller and freed with
 * store_manifest_free() / store_model_free().
 */
#ifndef HL_STORE_STORE_H
#define HL_STORE_STORE_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "store/name.h"

#define STORE_MT_MANIFEST "application/vnd.docker.distribution.manifest.v2+json"
#define STORE_MT_CONFIG "application/vnd.docker.container.image.v1+json"
#define STORE_MT_MODEL "application/vnd.ollama.image.model"
#define STORE_MT_ADAPTER "application/vnd.ollama.image.adapter"
#define STORE_MT_PROJECTOR "application/vnd.ollama.image.projector"
#define STORE_MT_TEMPLATE "application/vnd.ollama.image.template"
#define STORE_MT_SYSTEM "application/vnd.ollama.image.system"
#define STORE_MT_PARAMS "application/vnd.ollama.image.params"
#define STORE_MT_MESSAGES "application/vnd.ollama.image.messages"
#define STORE_MT_LICENSE "application/vnd.ollama.image.license"

/* "sha256:" + 64 hex + NUL */
#define STORE_DIGEST_LEN 72

typedef struct store store;

/* root == NULL: $HEARTH_MODELS, else $HOME/.hearth/models. Creates blobs/ and manifests/. */
hl_status store_open(const char *root, store **out, hl_err *err);
void store_close(store *s); /* accepts NULL */
const char *store_root(const store *s);

/* Accepts "sha256:<64 hex>" or "sha256-<64 hex>" (either case); writes the canonical
 * "sha256:<lowercase hex>" to out. False when the format is wrong. */
bool store_digest_parse(const char *s, char out[STORE_DIGEST_LEN]);

/* ---- blobs ---- */
/* Downloads in progress live next to the blobs as "sha256-<hex>-partial" (registry.c);
 * nothing in the store reads those names as blobs. */
/* Path of a blob (which need not exist); digest must be canonical or parseable. */
hl_status store_blob_path(const store *s, const char *digest, char *buf, size_t cap, hl_err *err);
bool store_blob_exists(const store *s, const char *digest, uint64_t *size_out);

/* Streams bytes into a temp file while hashing them; commit verifies (when expected is
 * non-NULL) and renames into place. Commit and abort both free the writer. A digest
 * mismatch fails with HL_ERR_INVALID and Ollama's message
 * `digest mismatch, expected "<e>", got "<g>"`. */
typedef struct store_blob_writer store_blob_writer;
hl_status store_blob_writer_open(const store *s, store_blob_writer **out, hl_err *err);
hl_status store_blob_writer_write(store_blob_writer *w, const void *data, size_t len, hl_err *err);
hl_status store_blob_writer_commit(store_blob_writer *w, const char *expected,
                                   char digest_out[STORE_DIGEST_LEN], uint64_t *size_out,
                                   hl_err *err);
void store_blob_writer_abort(store_blob_writer *w); /* accepts NULL */

/* Stores a buffer as a blob (no-op when it already exists). */
hl_status store_blob_put(const store *s, const void *data, size_t len,
                         char digest_out[STORE_DIGEST_LEN], hl_err *err);
/* Copies a file into the blob store, hashing on the way. *existed tells whether the
 * blob was already there (the copy is then discarded). */
hl_status store_blob_import_file(const store *s, const char *path, char digest_out[STORE_DIGEST_LEN],
                                 uint64_t *size_out, bool *existed, hl_err *err);

/* ---- manifests ---- */
typedef struct store_layer {
    char media_type[96];
    char digest[STORE_DIGEST_LEN];
    uint64_t size;
} store_layer;

typedef struct store_manifest {
    store_layer config;
    store_layer *layers; /* malloc'd */
    size_t n_layers;
} store_manifest;

void store_manifest_free(store_manifest *m); /* frees layers, zeroes the struct */
hl_status store_manifest_add_layer(store_manifest *m, const char *media_type, const char *digest,
                                   uint64_t size, hl_err *err);
/* Removes every layer of that media type. */
void store_manifest_remove_layers(store_manifest *m, const char *media_type);
const store_layer *store_manifest_find(const store_manifest *m, const char *media_type);
hl_status store_manifest_parse(const char *json, size_t len, store_manifest *out, hl_err *err);
/* Serializes to a malloc'd NUL-terminated JSON string. */
hl_status store_manifest_serialize(const store_manifest *m, char **out, size_t *out_len,
                                   hl_err *err);
/* Total size: config plus all layers. */
uint64_t store_manifest_size(const store_manifest *m);

/* Finds the stored spelling of a name (parts compared case-insensitively). */
bool store_find(const store *s, const store_name *name, store_name *canon_out);
/* Path of the manifest file for a name (need not exist). */
hl_status store_manifest_path(const store *s, const store_name *n, char *buf, size_t cap,
                              hl_err *err);
/* Reads a manifest (exact spelling: use store_find first). digest_hex (may be NULL)
 * receives the sha256 of the manifest bytes, mtime_ns (may be NULL) its mtime; HL_ERR_NOT_FOUND
 * when there is no such manifest. */
hl_status store_manifest_read(const store *s, const store_name *n, store_manifest *out,
                              char digest_hex[65], int64_t *mtime_ns, hl_err *err);
/*
 * One writer at a time: every manifest write and every prune below runs under the store
 * lock, and a prune checks references when it runs, so no manifest ever points at a
 * missing blob. A write checks that each blob m references exists (else HL_ERR_NOT_FOUND,
 * "blob <digest> not found": e.g. a delete pruned it since the caller looked), writes
 * under the stored spelling of n when there is one, then prunes the blobs only the
 * replaced manifest referenced.
 */
hl_status store_manifest_write(store *s, const store_name *n, const store_manifest *m,
                               hl_err *err);
/* Writes manifest bytes as they are (a pulled manifest keeps the registry's bytes, so its
 * digest matches the registry's); they must parse as a manifest. */
hl_status store_manifest_write_raw(store *s, const store_name *n, const char *json, size_t len,
                                   hl_err *err);

/* Removes the manifest, prunes empty directories and deletes the blobs no other
 * manifest references. HL_ERR_NOT_FOUND when there is no such manifest (any more). */
hl_status store_delete(store *s, const store_name *n, hl_err *err);
/* Copies the manifest only (blobs are shared); HL_ERR_NOT_FOUND when src is gone. */
hl_status store_copy(store *s, const store_name *src, const store_name *dst, hl_err *err);
/* Deletes the blobs of `old` (config and layers) that no manifest references any more
 * (also: the blobs a failed create stored and nothing uses). */
hl_status store_prune(store *s, const store_manifest *old, hl_err *err);

/* Startup garbage collection: removes the temp files of blob writes that never finished
 * and every blob no manifest references (all of them are kept when a manifest cannot be
 * read). *removed gets the number of files removed. */
hl_status store_gc(store *s, size_t *removed, hl_err *err);
/* $HEARTH_NOPRUNE (else $OLLAMA_NOPRUNE) set non-empty: no pruning, no cleanup at start. */
bool store_noprune(void);

typedef struct store_entry {
    store_name name;
    char digest_hex[65]; /* sha256 of the manifest bytes */
    uint64_t size;
    int64_t mtime_ns;
    store_manifest manifest;
} store_entry;

/* Every readable manifest, newest first. Free with store_list_free(). Unreadable or
 * malformed manifests are skipped. */
hl_status store_list(const store *s, store_entry **out, size_t *n_out, hl_err *err);
void store_list_free(store_entry *entries, size_t n);

/* ---- models: a manifest with its small layers read in ---- */
typedef struct store_model {
    store_name name; /* the stored spelling */
    store_manifest manifest;
    char digest_hex[65];
    int64_t mtime_ns;
    char *model_path;   /* GGUF blob path (malloc'd); NULL when the model has no model layer */
    char *adapter_path; /* NULL when none */
    json_t *config;     /* object, never NULL after a successful load */
    char *template_text;/* NULL when absent */
    char *system;       /* NULL when absent */
    json_t *params;     /* object, never NULL */
    json_t *messages;   /* array, never NULL */
    char **licenses;
    size_t n_licenses;
} store_model;

/* Loads a model by name (case-insensitive). *found is false (and HL_OK returned) when no
 * such model exists. */
hl_status store_model_load(const store *s, const store_name *name, store_model *out, bool *found,
                           hl_err *err);
void store_model_free(store_model *m);

#endif
