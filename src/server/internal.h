/*
 * internal.h - what the server's request handlers share (not for use outside
 * src/server/).
 *
 * Request flow: server.c accumulates the request (JSON bodies up to max_body; blob
 * uploads streamed into the store), then calls the route's handler once with the
 * whole body. A handler replies exactly once with srv_reply_*() or, for NDJSON
 * progress/token streams, with srv_stream_run():
 *
 *   srv_stream_run(r, stream, producer, ctx, ctx_free)
 *
 * runs producer(stream, ctx) on its own thread. The producer calls
 * srv_stream_send(s, obj) per chunk and srv_stream_fail(s, status, msg) on error,
 * and polls srv_stream_cancelled(s) (set when the client disconnects or the server
 * stops). Semantics follow Ollama: an error before the first chunk becomes that HTTP
 * status with {"error":...}; after it, a final {"error":...} line. With stream=false
 * the handler waits and replies with the last chunk (or the error) as one object
 * (ctx: the "merge" hook lets generate/chat concatenate text instead).
 */
#ifndef HL_SERVER_INTERNAL_H
#define HL_SERVER_INTERNAL_H

#include <jansson.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "server/server.h"
#include "store/store.h"

typedef struct srv_request srv_request;

/*
 * An encoder re-shapes a native handler's output for a compatibility layer (OpenAI,
 * Anthropic: api_openai.c, api_anthropic.c). A compat handler allocates one, sets
 * r->enc and then runs a native handler (srv_native_run) or replies itself: every reply
 * made for r then goes through it. srv_reply_error() asks error_body() for the body;
 * srv_stream_run() takes ownership of r->enc and, in stream mode, sends frame(native
 * chunk) bytes instead of NDJSON lines, error_frame() for an error after the first
 * bytes and end() when the producer finishes without error; with stream=false it
 * replies with reply(last chunk). frame/end/error_frame run on the producer thread,
 * reply/error_body on the HTTP thread (never at the same time for one request).
 * Any hook may be NULL (error_body NULL: the native {"error":...}). destroy (may be NULL)
 * frees the encoder; the owner (the request, then the stream) calls it.
 */
typedef struct srv_encoder srv_encoder;
struct srv_encoder {
    const char *content_type; /* of streamed responses; NULL: application/x-ndjson */
    char *(*frame)(srv_encoder *e, json_t *chunk);  /* steals chunk; malloc'd bytes or NULL */
    char *(*end)(srv_encoder *e);                   /* malloc'd or NULL */
    char *(*error_frame)(srv_encoder *e, unsigned status, const char *msg);
    json_t *(*reply)(srv_encoder *e, json_t *last); /* steals last; returns the reply */
    json_t *(*error_body)(srv_encoder *e, unsigned status, const char *msg);
    void (*destroy)(srv_encoder *e);
};
void srv_encoder_free(srv_encoder *e); /* accepts NULL */

struct sched;   /* server/sched.h */
struct metrics; /* server/metrics.h */

struct hl_server {
    struct MHD_Daemon *mhd;
    store *st;
    struct sched *sched; /* loaded models */
    struct metrics *metrics; /* GET /metrics (NULL in a runner process) */
    int port;
    /* Memory per request: a JSON body is buffered up to max_body (then parsed: jansson
     * takes about twice its size again); the buffers of all requests together stay
     * under body_budget (4 x max_body), past it a request is answered 503. Blob uploads
     * stream to disk and buffer nothing. */
    size_t max_body, body_budget;
    atomic_size_t body_bytes;
    bool quiet;
    const struct srv_route *extra_routes;
    size_t n_extra_routes;
    bool loopback_listener; /* enables the DNS-rebinding Host check */
    char *route_secret;     /* server_config.route_secret (copied) or NULL */
    char **origins; /* CORS origin patterns ('*' wildcards) */
    size_t n_origins;
    /* connections: idle or slow ones are closed after conn_timeout s (0: never) while a
     * request's headers or body come in, or between requests; past max_conns open ones
     * a request is answered 503 with Retry-After (a few spare slots past that, then
     * libmicrohttpd turns connections away) */
    unsigned conn_timeout, max_conns;
    atomic_int n_conns;
    atomic_bool stopping;
    /* producer threads still running (server_stop waits for 0) */
    pthread_mutex_t producers_lock;
    pthread_cond_t producers_cv;
    int n_producers;
};

struct srv_request {
    hl_server *srv;
    struct MHD_Connection *conn;
    const char *method;
    char path[1024];
    const struct srv_route *route;
    char *body;
    size_t body_len, body_cap;
    bool replied;
    /* A reply made before the whole body is in waits here, the body is read and dropped
     * (see server.c, first_call): answering mid-upload would close the connection with
     * data unread, and the client would meet a reset instead of the reply. */
    bool body_read;       /* the final call came: replies go out at once */
    bool reply_now;       /* early replies go out at once (no body worth reading) */
    struct MHD_Response *pending;
    unsigned pending_status;
    uint64_t discarded;   /* body bytes dropped after an early reply */
    char cors_origin[512]; /* echoed in Access-Control-Allow-Origin when non-empty */
    int status; /* for the log */
    uint64_t start_ns;
    srv_encoder *enc; /* compat layers (see srv_encoder); owned until a stream takes it */
    /* blob upload */
    store_blob_writer *blob;
    char blob_digest[STORE_DIGEST_LEN];
};

typedef enum MHD_Result (*srv_handler)(srv_request *r);

typedef struct srv_route {
    const char *path;
    bool prefix;     /* path is a prefix (e.g. /api/blobs/) */
    const char *methods; /* space-separated, e.g. "GET HEAD" */
    srv_handler handler;
    bool raw_body;   /* body is streamed to the handler's blob writer, not buffered */
} srv_route;

/* ---- replies (each returns what the MHD access handler should return) ---- */
/* Adds the CORS headers a reply to r needs (every reply path calls it). */
void srv_add_cors(const srv_request *r, struct MHD_Response *resp);
enum MHD_Result srv_reply_json(srv_request *r, unsigned status, json_t *obj); /* steals obj */
enum MHD_Result srv_reply_error(srv_request *r, unsigned status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
enum MHD_Result srv_reply_text(srv_request *r, unsigned status, const char *content_type,
                               const char *text);
/* Records the reply's status (for the log and /metrics); every reply path calls it once. */
void srv_set_status(srv_request *r, unsigned status);
/* Queues a response built by the caller (takes it over; CORS added, sent after the body). */
enum MHD_Result srv_reply_response(srv_request *r, unsigned status, struct MHD_Response *resp);

/* An error message on its way to a client: paths under the store root lose that prefix
 * (clients get "blobs/sha256-...", not where the store lives) and invalid UTF-8 bytes
 * (echoed client input, a cut sequence) become '?', so the JSON reply can be built. */
void srv_msg_clean(const hl_server *srv, char *msg);

/* A request-validation error, for srv_reply_error(r, e.status, "%s", e.msg) later. */
typedef struct srv_err {
    unsigned status;
    char msg[1024];
} srv_err;
/* Fills e; returns false (for `return srv_err_set(...)` in bool validators). */
bool srv_err_set(srv_err *e, unsigned status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The type name of a JSON value in error messages, as Go's encoding/json words it:
 * "object", "array", "string", "number", "bool", "null" (also for NULL). */
const char *srv_json_kind(const json_t *v);

/* Parses the body as a JSON object. On failure replies 400 (missing request body /
 * the parser's message) and returns NULL with *ret set. */
json_t *srv_parse_body(srv_request *r, enum MHD_Result *ret);
/* Reads an optional string field; wrong type -> replies 400, returns false. */
bool srv_get_string(srv_request *r, json_t *obj, const char *key, const char **out,
                    enum MHD_Result *ret);
bool srv_get_bool(srv_request *r, json_t *obj, const char *key, bool dflt, bool *out,
                  enum MHD_Result *ret);

/* RFC 3339 with nanoseconds in local time, e.g. 2024-05-01T10:00:00.123456789+02:00 */
void srv_format_time(int64_t ns, char *buf, size_t cap);
/* Current time, UTC, for response chunks ("created_at"). */
void srv_now(char *buf, size_t cap);

/* ---- streams ---- */
typedef struct srv_stream srv_stream;
typedef void (*srv_producer)(srv_stream *s, void *ctx);

enum MHD_Result srv_stream_run(srv_request *r, bool stream, srv_producer fn, void *ctx,
                               void (*ctx_free)(void *));
void srv_stream_send(srv_stream *s, json_t *obj); /* steals obj */
void srv_stream_fail(srv_stream *s, unsigned status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
bool srv_stream_cancelled(const srv_stream *s);
/* Whether a compat encoder reads this stream: native handlers then add the private
 * fields the encoders use ("_cached_tokens", "_prompt_tokens") to their chunks. */
bool srv_stream_encoded(const srv_stream *s);
hl_server *srv_stream_server(const srv_stream *s);
/* Convenience: sends {"status": text}. */
void srv_stream_status(srv_stream *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- handlers ---- */
enum MHD_Result srv_handle_tags(srv_request *r);
enum MHD_Result srv_handle_show(srv_request *r);
enum MHD_Result srv_handle_copy(srv_request *r);
enum MHD_Result srv_handle_delete(srv_request *r);
enum MHD_Result srv_handle_ps(srv_request *r);
enum MHD_Result srv_handle_blobs(srv_request *r);
enum MHD_Result srv_handle_create(srv_request *r);
enum MHD_Result srv_handle_pull(srv_request *r);
enum MHD_Result srv_handle_push(srv_request *r);
/* Generation endpoints: the plug-in point for the engine (api_infer.c). */
enum MHD_Result srv_handle_generate(srv_request *r);
enum MHD_Result srv_handle_chat(srv_request *r);
enum MHD_Result srv_handle_embed(srv_request *r);
enum MHD_Result srv_handle_embeddings(srv_request *r);
/* Runs a native handler on an already parsed request object (stolen): the compat
 * layers translate their requests into native ones and call this with r->enc set. */
typedef enum srv_native { SRV_NATIVE_GENERATE, SRV_NATIVE_CHAT, SRV_NATIVE_EMBED } srv_native;
enum MHD_Result srv_native_run(srv_request *r, srv_native which, json_t *req);
/* OpenAI (api_openai.c) and Anthropic (api_anthropic.c) compatibility. */
enum MHD_Result srv_handle_oai_chat(srv_request *r);
enum MHD_Result srv_handle_oai_completions(srv_request *r);
enum MHD_Result srv_handle_oai_models(srv_request *r);
enum MHD_Result srv_handle_oai_model(srv_request *r);
enum MHD_Result srv_handle_oai_embeddings(srv_request *r);
enum MHD_Result srv_handle_oai_responses(srv_request *r); /* api_responses.c */
enum MHD_Result srv_handle_anth_messages(srv_request *r);
enum MHD_Result srv_handle_anth_count_tokens(srv_request *r);
/* GET /metrics (Prometheus text format) and GET /health (api_metrics.c). */
enum MHD_Result srv_handle_metrics(srv_request *r);
enum MHD_Result srv_handle_health(srv_request *r);

/* The "details" object of tags/show/ps from a model's config. */
json_t *srv_model_details(json_t *config);

#endif
