/*
 * registry.h - models to and from an OCI distribution (v2) registry, the protocol of
 * Ollama's registry (registry.ollama.ai) and of Docker's reference registry.
 *
 *   GET   /v2/<ns>/<model>/manifests/<tag>       the manifest (Ollama's layout, store.h)
 *   GET   /v2/<ns>/<model>/blobs/<digest>        each layer and the config, in ranged parts
 *   HEAD  /v2/<ns>/<model>/blobs/<digest>        push: does the registry have it?
 *   POST  /v2/<ns>/<model>/blobs/uploads/        push: an upload session (Location), or
 *         ...?mount=<digest>&from=<ns/model>     a cross-repository mount (201)
 *   PATCH <location> + Content-Range             push: the blob in chunks
 *   PUT   <location>?digest=<digest>             push: the session closed
 *   PUT   /v2/<ns>/<model>/manifests/<tag>       push: the manifest, last
 *
 * A model name is "[http(s)://]host/ns/model:tag" (store/name.h fills the defaults);
 * the scheme is https unless `insecure` is set (Ollama: an explicit http:// without
 * insecure fails with "insecure protocol http").
 *
 * Pulls are parallel, resumable and verified (download.c): each missing blob is fetched
 * in ranged parts (HEARTH_PULL_PART_SIZE bytes, default 64 MiB; several blobs and parts
 * at once over one curl multi handle) into <store>/blobs/sha256-<hex>-partial (a name
 * the store never reads as a blob), whose tail keeps how far each part got, so a pull
 * interrupted by a cut, a crash or a Ctrl-C resumes only what is missing. A complete
 * blob is hashed and renamed into place only when its sha256 matches and every other
 * blob of the manifest is verified too; the manifest is written last. A blob already in
 * the store is never fetched. Transport errors are retried (resuming) a few times.
 *
 * Pushes (upload.c) skip blobs the registry has, mount a blob from another repository
 * of the same registry when a local model of that host holds it, and upload the rest in
 * PATCH chunks of HEARTH_PUSH_CHUNK_SIZE bytes (default 64 MiB).
 *
 * HTTP goes through libcurl: TLS, proxies from the environment, redirects (blob
 * downloads are redirected to a CDN on registry.ollama.ai). A 401 with a bearer challenge
 * (`WWW-Authenticate: Bearer realm=...,service=...,scope=...`) is answered with an
 * anonymous token from the realm, which must be on the registry's host (as Ollama
 * requires), and the request is sent again with it. Progress is reported with Ollama's
 * /api/pull and /api/push status lines through a callback that runs on the calling
 * thread; returning false from it cancels the transfer (HL_ERR_CANCELLED).
 * Both calls block and may run on several threads at once.
 */
#ifndef HL_REGISTRY_REGISTRY_H
#define HL_REGISTRY_REGISTRY_H

#include <stdbool.h>
#include <stdint.h>

#include "base/status.h"
#include "store/store.h"

typedef struct reg_progress {
    const char *status; /* "pulling manifest", "pulling <12 hex>", "success", ... */
    const char *digest; /* NULL when the line has none */
    uint64_t total, completed; /* 0: absent (Ollama omits zero values) */
} reg_progress;

/* Returns false to cancel. Also called with status NULL (no line to show) while a
 * transfer waits, so that a cancellation is seen even when no bytes flow. */
typedef bool (*reg_progress_fn)(void *ud, const reg_progress *p);

typedef struct reg_opts {
    bool insecure;           /* plain http */
    reg_progress_fn progress; /* may be NULL */
    void *ud;
} reg_opts;

/* Errors carry Ollama's messages: "pull model manifest: file does not exist" for an
 * unknown model or tag, "digest mismatch, file must be downloaded again: want ..., got
 * ..." for corrupt bytes (the partial download is deleted), "insecure protocol http",
 * "unauthorized: access denied" when the registry refuses the realm's token. */
hl_status reg_pull(store *s, const char *name, const reg_opts *o, hl_err *err);
/* Pushes the local model `name` (its blobs, then its manifest bytes as stored). */
hl_status reg_push(store *s, const char *name, const reg_opts *o, hl_err *err);

#endif
