/* webui.c - serves the embedded chat page (see webui.h). */
#define _GNU_SOURCE
#include "server/webui.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <xxhash.h>
#include <zlib.h>

/* Per asset, made once on first use: the gzip body (NULL when compression failed: then
 * the plain body is sent) and the ETag. */
typedef struct prepared {
    unsigned char *gz;
    size_t gz_len;
    char etag[24];
} prepared;

static prepared *g_prep;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static unsigned char *gzip_buf(const unsigned char *data, size_t len, size_t *out_len) {
    z_stream z = {0};
    /* 15 + 16: a gzip wrapper; no file name or time in the header, so the bytes are
     * the same on every start */
    if (deflateInit2(&z, 9, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) return NULL;
    uLong cap = deflateBound(&z, (uLong)len);
    unsigned char *out = malloc(cap);
    if (!out) {
        deflateEnd(&z);
        return NULL;
    }
    z.next_in = (Bytef *)data;
    z.avail_in = (uInt)len;
    z.next_out = out;
    z.avail_out = (uInt)cap;
    int rc = deflate(&z, Z_FINISH);
    *out_len = z.total_out;
    deflateEnd(&z);
    if (rc != Z_STREAM_END) {
        free(out);
        return NULL;
    }
    return out;
}

static void prepare(void) {
    prepared *p = calloc(webui_n_assets ? webui_n_assets : 1, sizeof *p);
    if (!p) return;
    for (size_t i = 0; i < webui_n_assets; i++) {
        const webui_asset *a = &webui_assets[i];
        snprintf(p[i].etag, sizeof p[i].etag, "\"%016llx\"",
                 (unsigned long long)XXH64(a->data, a->len, 0));
        p[i].gz = gzip_buf(a->data, a->len, &p[i].gz_len);
        if (p[i].gz && p[i].gz_len >= a->len) { /* not worth it */
            free(p[i].gz);
            p[i].gz = NULL;
        }
    }
    g_prep = p;
}

static const char *content_type(const char *name) {
    const char *dot = strrchr(name, '.');
    if (!dot) return "application/octet-stream";
    if (!strcmp(dot, ".html")) return "text/html; charset=utf-8";
    if (!strcmp(dot, ".css")) return "text/css; charset=utf-8";
    if (!strcmp(dot, ".js")) return "text/javascript; charset=utf-8";
    if (!strcmp(dot, ".svg")) return "image/svg+xml";
    if (!strcmp(dot, ".png")) return "image/png";
    if (!strcmp(dot, ".ico")) return "image/x-icon";
    return "application/octet-stream";
}

/* Whether a comma-separated header lists token (case-insensitive, parameters ignored)
 * with a nonzero q. */
static bool header_has(const char *hdr, const char *token) {
    if (!hdr) return false;
    size_t n = strlen(token);
    for (const char *p = hdr; *p;) {
        while (*p == ' ' || *p == ',') p++;
        const char *end = p + strcspn(p, ",");
        const char *semi = memchr(p, ';', (size_t)(end - p));
        const char *tend = semi ? semi : end;
        while (tend > p && tend[-1] == ' ') tend--;
        if ((size_t)(tend - p) == n && strncasecmp(p, token, n) == 0) {
            const char *q = semi ? strstr(semi, "q=") : NULL;
            if (!q || q > end) return true;
            return strtod(q + 2, NULL) > 0;
        }
        p = end;
    }
    return false;
}

/* If-None-Match: "*" or a list holding our tag (W/ prefixes compare weakly, RFC 9110). */
static bool etag_matches(const char *inm, const char *etag) {
    if (!inm) return false;
    if (strchr(inm, '*')) return true;
    return strstr(inm, etag) != NULL;
}

static enum MHD_Result serve(srv_request *r, size_t idx, const char *vary) {
    pthread_once(&g_once, prepare);
    if (!g_prep) return srv_reply_error(r, 500, "out of memory");
    const webui_asset *a = &webui_assets[idx];
    const prepared *p = &g_prep[idx];
    const char *inm = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "If-None-Match");
    bool not_modified = etag_matches(inm, p->etag);
    bool gz = p->gz && header_has(MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND,
                                                              "Accept-Encoding"),
                                  "gzip");
    struct MHD_Response *resp =
        not_modified ? MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT)
        : gz         ? MHD_create_response_from_buffer(p->gz_len, p->gz, MHD_RESPMEM_PERSISTENT)
                     : MHD_create_response_from_buffer(a->len, (void *)a->data,
                                                       MHD_RESPMEM_PERSISTENT);
    if (!resp) return MHD_NO;
    if (!not_modified) {
        MHD_add_response_header(resp, "Content-Type", content_type(a->name));
        if (gz) MHD_add_response_header(resp, "Content-Encoding", "gzip");
    }
    MHD_add_response_header(resp, "ETag", p->etag);
    MHD_add_response_header(resp, "Cache-Control", "no-cache");
    MHD_add_response_header(resp, "Vary", vary);
    MHD_add_response_header(resp, "X-Content-Type-Options", "nosniff");
    if (strstr(a->name, ".html")) {
        /* everything comes from this origin; no inline script; no framing */
        MHD_add_response_header(resp, "Content-Security-Policy",
                                "default-src 'self'; img-src 'self' data:; "
                                "frame-ancestors 'none'; base-uri 'none'; form-action 'self'");
        MHD_add_response_header(resp, "Referrer-Policy", "no-referrer");
    }
    return srv_reply_response(r, not_modified ? 304 : 200, resp);
}

static bool find(const char *name, size_t *idx) {
    for (size_t i = 0; i < webui_n_assets; i++)
        if (strcmp(webui_assets[i].name, name) == 0) {
            *idx = i;
            return true;
        }
    return false;
}

enum MHD_Result webui_handle_root(srv_request *r) {
    const char *accept = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "Accept");
    size_t idx;
    if (header_has(accept, "text/html") && find("index.html", &idx))
        return serve(r, idx, "Accept, Accept-Encoding");
    struct MHD_Response *resp = MHD_create_response_from_buffer(
        strlen("Ollama is running"), (void *)"Ollama is running", MHD_RESPMEM_PERSISTENT);
    if (!resp) return MHD_NO;
    MHD_add_response_header(resp, "Content-Type", "text/plain; charset=utf-8");
    MHD_add_response_header(resp, "Vary", "Accept");
    return srv_reply_response(r, 200, resp);
}

enum MHD_Result webui_handle_asset(srv_request *r) {
    const char *name = r->path + strlen("/webui/");
    size_t idx;
    /* index.html is served at / only */
    if (strcmp(name, "index.html") == 0 || !find(name, &idx))
        return srv_reply_text(r, 404, "text/plain", "404 page not found");
    return serve(r, idx, "Accept-Encoding");
}
