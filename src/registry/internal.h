/*
 * internal.h - what registry.c (context, requests, bearer auth), download.c (reg_pull)
 * and upload.c (reg_push) share. Not for use outside src/registry.
 */
#ifndef HL_REGISTRY_INTERNAL_H
#define HL_REGISTRY_INTERNAL_H

#include <curl/curl.h>
#include <stdint.h>

#include "registry/registry.h"
#include "store/name.h"

#define URL_CAP 4096
#define MANIFEST_MAX (4u << 20)
#define PROGRESS_NS 100000000LL /* at most one progress line per blob per 100 ms */
#define AUTH_HDR_CAP 2048

typedef struct reg_ctx {
    const reg_opts *o;
    store_name name;
    char base[URL_CAP]; /* scheme://host/v2/ns/model */
    bool cancelled;
    /* bearer auth: the token from the last challenge's realm; token_gen counts fetches,
     * so a request refused with an older token just goes again with the newer one */
    char *token;
    unsigned token_gen;
} reg_ctx;

hl_status reg_ctx_init(reg_ctx *c, const char *name, const reg_opts *o, hl_err *err);
void reg_ctx_free(reg_ctx *c);
int64_t reg_now_ns(void);
/* A progress line; false (and c->cancelled) once the caller cancels. */
bool reg_report(reg_ctx *c, const char *status, const char *digest, uint64_t total,
                uint64_t completed);
/* A poll without a line (status NULL), so a cancellation is seen while no bytes flow. */
bool reg_poll(reg_ctx *c);
hl_status reg_cancelled(hl_err *err);

/* Options every request gets: protocols (https only unless insecure), redirects, stall
 * detection, and the bearer token when there is one (curl sends it to the registry's
 * host only, never to a redirect's). */
void reg_common_opts(reg_ctx *c, CURL *h, const char *url);

/* Answers a 401's WWW-Authenticate value (`Bearer realm=...,service=...,scope=...`):
 * fetches a token from the realm (anonymously) for later requests (token_gen + 1). Fails
 * with "unauthorized: access denied" when the challenge is not a bearer one. Callers
 * fetch at most once per request: a fresh token refused again means access denied. */
hl_status reg_auth(reg_ctx *c, const char *www_authenticate, hl_err *err);

typedef struct reg_membuf {
    char *data;
    size_t len, cap, max;
} reg_membuf;

size_t reg_mem_write(char *p, size_t sz, size_t n, void *ud);

typedef struct reg_headers {
    char location[URL_CAP];
    char www_auth[AUTH_HDR_CAP];
    char content_range[128];
    char range[128]; /* an upload session's "Range: 0-<last byte>" */
} reg_headers;

/* CURLOPT_HEADERFUNCTION for reg_headers (each response of a redirect chain overwrites). */
size_t reg_header_cb(char *p, size_t sz, size_t n, void *ud);

/* The registry's error message ({"errors":[{"message":...}]}) or the status line. */
void reg_registry_message(long status, const reg_membuf *b, char *out, size_t cap);

typedef struct reg_req {
    const char *method; /* GET, HEAD, POST, PUT, PATCH */
    const char *url;
    const char *content_type; /* request body's, or NULL */
    const char *accept;       /* or NULL */
    const char *content_range; /* PATCH: "start-end", or NULL */
    const void *body;         /* in-memory body (may be NULL) */
    size_t body_len;
    bool body_from_fd; /* the body is body_len bytes of body_fd from body_off */
    int body_fd;
    uint64_t body_off;
    const char *progress_status; /* with body_fd: progress lines while it is sent */
    const char *progress_digest;
    uint64_t progress_total, progress_base;
    bool follow; /* follow redirects */
} reg_req;

typedef struct reg_resp {
    long status;
    reg_membuf body;
    reg_headers hdr;
} reg_resp;

/* One request with its response in memory (r->body.data to free). A 401 with a bearer
 * challenge is answered (reg_auth) and the request sent again. Transport errors:
 * HL_ERR_IO. */
hl_status reg_request(reg_ctx *c, const reg_req *q, reg_resp *r, hl_err *err);

/* Resolves a Location header against the registry's base URL. */
void reg_resolve(const reg_ctx *c, const char *loc, char *out, size_t cap);

#endif
