/* stream.c - NDJSON (or, through a compat encoder, SSE) responses fed by a producer
 * thread (see internal.h). */
#define _GNU_SOURCE
#include "server/internal.h"

#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct chunk {
    struct chunk *next;
    size_t len;
    char data[];
} chunk;

struct srv_stream {
    pthread_mutex_t lock;
    pthread_cond_t cv;
    chunk *head, *tail;
    size_t head_off;
    bool done;
    bool failed;
    unsigned fail_status;
    char fail_msg[1024];
    int n_sent;
    bool stream_mode;
    json_t *last;
    atomic_bool cancel;
    int refs;
    int fd;
    hl_server *srv;
    srv_producer fn;
    void *ctx;
    void (*ctx_free)(void *);
    srv_encoder *enc; /* owned; NULL for native NDJSON */
};

static void stream_release(srv_stream *s) {
    pthread_mutex_lock(&s->lock);
    int left = --s->refs;
    pthread_mutex_unlock(&s->lock);
    if (left > 0) return;
    for (chunk *c = s->head; c;) {
        chunk *n = c->next;
        free(c);
        c = n;
    }
    json_decref(s->last);
    srv_encoder_free(s->enc);
    pthread_mutex_destroy(&s->lock);
    pthread_cond_destroy(&s->cv);
    free(s);
}

bool srv_stream_cancelled(const srv_stream *s) {
    return atomic_load(&s->cancel) || atomic_load(&s->srv->stopping);
}

hl_server *srv_stream_server(const srv_stream *s) { return s->srv; }

bool srv_stream_encoded(const srv_stream *s) { return s->enc != NULL; }

/* Appends bytes, plus a newline for NDJSON lines (lock held). */
static void push_bytes_locked(srv_stream *s, const char *text, bool newline) {
    size_t len = strlen(text);
    chunk *c = malloc(sizeof *c + len + 1);
    if (!c) return;
    memcpy(c->data, text, len);
    if (newline) c->data[len++] = '\n';
    c->len = len;
    c->next = NULL;
    if (s->tail)
        s->tail->next = c;
    else
        s->head = c;
    s->tail = c;
    pthread_cond_broadcast(&s->cv);
}

static void push_line_locked(srv_stream *s, const char *text) { push_bytes_locked(s, text, true); }

void srv_stream_send(srv_stream *s, json_t *obj) {
    if (!obj) return;
    pthread_mutex_lock(&s->lock);
    if (s->failed) {
        pthread_mutex_unlock(&s->lock);
        json_decref(obj);
        return;
    }
    if (s->stream_mode && s->enc) {
        /* the encoder's state belongs to this (the producer) thread */
        pthread_mutex_unlock(&s->lock);
        char *text = s->enc->frame ? s->enc->frame(s->enc, obj) : NULL;
        if (!s->enc->frame) json_decref(obj);
        pthread_mutex_lock(&s->lock);
        if (text && *text && !s->failed) {
            s->n_sent++;
            push_bytes_locked(s, text, false);
        }
        free(text);
        pthread_mutex_unlock(&s->lock);
        return;
    }
    s->n_sent++;
    if (s->stream_mode) {
        char *text = json_dumps(obj, JSON_COMPACT | JSON_PRESERVE_ORDER);
        json_decref(obj);
        if (text) push_line_locked(s, text);
        free(text);
    } else {
        json_decref(s->last);
        s->last = obj;
    }
    pthread_mutex_unlock(&s->lock);
}

void srv_stream_status(srv_stream *s, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    srv_stream_send(s, json_pack("{s:s}", "status", msg));
}

void srv_stream_fail(srv_stream *s, unsigned status, const char *fmt, ...) {
    pthread_mutex_lock(&s->lock);
    if (!s->failed) {
        s->failed = true;
        s->fail_status = status ? status : 500;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(s->fail_msg, sizeof s->fail_msg, fmt, ap);
        va_end(ap);
        srv_msg_clean(s->srv, s->fail_msg);
        if (s->stream_mode && s->n_sent > 0 && s->enc) {
            char *text = s->enc->error_frame
                             ? s->enc->error_frame(s->enc, s->fail_status, s->fail_msg)
                             : NULL;
            if (text) push_bytes_locked(s, text, false);
            free(text);
        } else if (s->stream_mode && s->n_sent > 0) {
            json_t *e = json_pack("{s:s}", "error", s->fail_msg);
            char *text = e ? json_dumps(e, JSON_COMPACT) : NULL;
            json_decref(e);
            if (text) push_line_locked(s, text);
            free(text);
        }
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->lock);
}

static void *producer_main(void *arg) {
    srv_stream *s = arg;
    hl_server *srv = s->srv;
    s->fn(s, s->ctx);
    if (s->ctx_free) s->ctx_free(s->ctx);
    char *end = NULL;
    if (s->stream_mode && s->enc && s->enc->end && !s->failed && !srv_stream_cancelled(s))
        end = s->enc->end(s->enc);
    pthread_mutex_lock(&s->lock);
    if (end && !s->failed) push_bytes_locked(s, end, false);
    free(end);
    s->done = true;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->lock);
    stream_release(s);
    pthread_mutex_lock(&srv->producers_lock);
    srv->n_producers--;
    pthread_cond_broadcast(&srv->producers_cv);
    pthread_mutex_unlock(&srv->producers_lock);
    return NULL;
}

static bool client_gone(int fd) {
    if (fd < 0) return false;
    struct pollfd p = {.fd = fd, .events = POLLRDHUP};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

/* Waits (lock held) until ready() or done; checks for a departed client every 100 ms.
 * Returns false when the wait was abandoned (client gone or server stopping). */
static bool wait_locked(srv_stream *s, bool need_done) {
    for (;;) {
        if (s->done) break;
        if (!need_done && (s->head != NULL || s->failed)) break;
        if (atomic_load(&s->srv->stopping)) return false;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 100 * 1000000;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        int rc = pthread_cond_timedwait(&s->cv, &s->lock, &ts);
        if (rc == ETIMEDOUT && client_gone(s->fd)) {
            atomic_store(&s->cancel, true);
            return false;
        }
    }
    return true;
}

static ssize_t reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    srv_stream *s = cls;
    pthread_mutex_lock(&s->lock);
    if (!s->head && !wait_locked(s, false)) {
        pthread_mutex_unlock(&s->lock);
        return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    if (!s->head) {
        pthread_mutex_unlock(&s->lock);
        return MHD_CONTENT_READER_END_OF_STREAM;
    }
    chunk *c = s->head;
    size_t n = c->len - s->head_off;
    if (n > max) n = max;
    memcpy(buf, c->data + s->head_off, n);
    s->head_off += n;
    if (s->head_off == c->len) {
        s->head = c->next;
        if (!s->head) s->tail = NULL;
        s->head_off = 0;
        free(c);
    }
    pthread_mutex_unlock(&s->lock);
    return (ssize_t)n;
}

static void reader_free(void *cls) {
    srv_stream *s = cls;
    atomic_store(&s->cancel, true);
    stream_release(s);
}

enum MHD_Result srv_stream_run(srv_request *r, bool stream, srv_producer fn, void *ctx,
                               void (*ctx_free)(void *)) {
    srv_stream *s = calloc(1, sizeof *s);
    if (!s) {
        if (ctx_free) ctx_free(ctx);
        return srv_reply_error(r, 500, "out of memory");
    }
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->refs = 2;
    s->stream_mode = stream;
    s->srv = r->srv;
    s->fn = fn;
    s->ctx = ctx;
    s->ctx_free = ctx_free;
    s->enc = r->enc; /* the stream outlives the request when the client leaves */
    r->enc = NULL;
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    s->fd = ci ? ci->connect_fd : -1;

    hl_server *srv = r->srv;
    pthread_mutex_lock(&srv->producers_lock);
    srv->n_producers++;
    pthread_mutex_unlock(&srv->producers_lock);
    pthread_t th;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(&th, &attr, producer_main, s);
    pthread_attr_destroy(&attr);
    if (rc != 0) {
        pthread_mutex_lock(&srv->producers_lock);
        srv->n_producers--;
        pthread_mutex_unlock(&srv->producers_lock);
        if (ctx_free) ctx_free(ctx);
        s->refs = 1;
        stream_release(s);
        return srv_reply_error(r, 500, "cannot start a worker thread");
    }

    pthread_mutex_lock(&s->lock);
    bool ok = wait_locked(s, !stream);
    if (!ok) {
        pthread_mutex_unlock(&s->lock);
        stream_release(s);
        return MHD_NO; /* client gone: close the connection */
    }
    if (s->failed && (!stream || s->n_sent == 0)) {
        unsigned st = s->fail_status;
        char msg[sizeof s->fail_msg];
        memcpy(msg, s->fail_msg, sizeof msg);
        pthread_mutex_unlock(&s->lock);
        json_t *body = s->enc && s->enc->error_body ? s->enc->error_body(s->enc, st, msg) : NULL;
        stream_release(s);
        if (body) return srv_reply_json(r, st, body);
        return srv_reply_error(r, st, "%s", msg);
    }
    if (!stream) {
        json_t *last = s->last ? json_incref(s->last) : json_object();
        pthread_mutex_unlock(&s->lock);
        if (s->enc && s->enc->reply) last = s->enc->reply(s->enc, last);
        stream_release(s);
        return srv_reply_json(r, 200, last);
    }
    pthread_mutex_unlock(&s->lock);
    struct MHD_Response *resp =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, reader, s, reader_free);
    if (!resp) {
        reader_free(s);
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", s->enc && s->enc->content_type
                                                      ? s->enc->content_type
                                                      : "application/x-ndjson");
    if (s->enc && s->enc->content_type) MHD_add_response_header(resp, "Cache-Control", "no-cache");
    srv_add_cors(r, resp);
    srv_set_status(r, 200);
    enum MHD_Result ret = MHD_queue_response(r->conn, 200, resp);
    MHD_destroy_response(resp);
    r->replied = true;
    return ret;
}
