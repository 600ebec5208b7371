#define _GNU_SOURCE
#include "net/http_client.h"

#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#define RECV_BUF 65536
#define MAX_LINE (64u << 20)
#define MAX_HEAD (64u << 10)

struct net_http {
    int fd;
    bool head_request;
    int status;
    char content_type[128];
    bool chunked;
    int64_t remaining; /* Content-Length left; -1 = until EOF */
    int64_t chunk_left; /* chunked: bytes left in the current chunk; -1 = need a size line */
    bool body_done;
    char buf[RECV_BUF];
    size_t buf_pos, buf_len;
    char *line;
    size_t line_cap;
    net_http_waiter waiter; /* may be NULL: reads block in recv() */
    void *waiter_ud;
};

static hl_status send_all(int fd, const void *data, size_t len, hl_err *err) {
    const char *p = data;
    while (len > 0) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR) continue;
            return hl_fail(err, HL_ERR_IO, "sending request: %s", strerror(errno));
        }
        p += n;
        len -= (size_t)n;
    }
    return HL_OK;
}

hl_status net_http_open(const net_host *host, const char *method, const char *path,
                        const char *content_type, int64_t content_length, net_http **out,
                        hl_err *err) {
    *out = NULL;
    net_host c = net_host_connectable(host);
    if (strcmp(c.scheme, "https") == 0)
        return hl_fail(err, HL_ERR_UNSUPPORTED, "https is not supported by the hearth client");
    char port[16];
    snprintf(port, sizeof port, "%d", c.port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
    int gai = getaddrinfo(c.host, port, &hints, &res);
    if (gai != 0)
        return hl_fail(err, HL_ERR_IO, "could not resolve %s: %s", c.host, gai_strerror(gai));
    int fd = -1, last_errno = 0;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) continue;
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) break;
        last_errno = errno;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0)
        return hl_fail(err, HL_ERR_IO, "could not connect to %s:%d: %s", c.host, c.port,
                       strerror(last_errno));
    net_http *h = calloc(1, sizeof *h);
    if (!h) {
        close(fd);
        return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    }
    h->fd = fd;
    h->head_request = strcmp(method, "HEAD") == 0;
    bool v6 = strchr(c.host, ':') != NULL;
    char head[2048];
    int n = snprintf(head, sizeof head,
                     "%s %s HTTP/1.1\r\nHost: %s%s%s:%d\r\nUser-Agent: hearth\r\n"
                     "Accept: application/json, application/x-ndjson\r\nConnection: close\r\n",
                     method, path, v6 ? "[" : "", c.host, v6 ? "]" : "", c.port);
    if (n > 0 && (size_t)n < sizeof head && content_length >= 0)
        n += snprintf(head + n, sizeof head - (size_t)n, "Content-Type: %s\r\nContent-Length: %lld\r\n",
                      content_type ? content_type : "application/octet-stream",
                      (long long)content_length);
    if (n > 0 && (size_t)n < sizeof head) n += snprintf(head + n, sizeof head - (size_t)n, "\r\n");
    if (n < 0 || (size_t)n >= sizeof head) {
        net_http_close(h);
        return hl_fail(err, HL_ERR_INVALID, "request line too long");
    }
    hl_status st = send_all(fd, head, (size_t)n, err);
    if (st != HL_OK) {
        net_http_close(h);
        return st;
    }
    *out = h;
    return HL_OK;
}

hl_status net_http_send(net_http *h, const void *data, size_t len, hl_err *err) {
    return send_all(h->fd, data, len, err);
}

/* Refills the receive buffer; false at EOF. */
static hl_status fill(net_http *h, bool *eof, hl_err *err) {
    *eof = false;
    if (h->buf_pos < h->buf_len) return HL_OK;
    while (h->waiter) { /* wait in slices, asking the waiter whether to go on */
        struct pollfd p = {.fd = h->fd, .events = POLLIN};
        int pr = poll(&p, 1, 100);
        if (pr > 0 || (pr < 0 && errno != EINTR)) break; /* readable, or recv reports it */
        hl_status st = h->waiter(h->waiter_ud, err);
        if (st != HL_OK) return st;
    }
    for (;;) {
        ssize_t n = recv(h->fd, h->buf, sizeof h->buf, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return hl_fail(err, HL_ERR_TIMEOUT, "timed out reading the response");
        if (n < 0) return hl_fail(err, HL_ERR_IO, "reading response: %s", strerror(errno));
        h->buf_pos = 0;
        h->buf_len = (size_t)n;
        *eof = n == 0;
        return HL_OK;
    }
}

/* Reads one raw CRLF-terminated line of the response head into dst. */
static hl_status raw_line(net_http *h, char *dst, size_t cap, hl_err *err) {
    size_t n = 0;
    for (;;) {
        bool eof;
        hl_status st = fill(h, &eof, err);
        if (st != HL_OK) return st;
        if (eof) return hl_fail(err, HL_ERR_IO, "connection closed in the middle of a response");
        char c = h->buf[h->buf_pos++];
        if (c == '\n') break;
        if (n + 1 >= cap) return hl_fail(err, HL_ERR_FORMAT, "response header line too long");
        dst[n++] = c;
    }
    if (n > 0 && dst[n - 1] == '\r') n--;
    dst[n] = '\0';
    return HL_OK;
}

hl_status net_http_finish(net_http *h, hl_err *err) {
    char line[8192];
    hl_status st = raw_line(h, line, sizeof line, err);
    if (st != HL_OK) return st;
    int major, minor, code;
    if (sscanf(line, "HTTP/%d.%d %d", &major, &minor, &code) != 3)
        return hl_fail(err, HL_ERR_FORMAT, "bad HTTP status line '%.80s'", line);
    h->status = code;
    h->remaining = -1;
    h->chunk_left = -1;
    size_t head_bytes = 0;
    for (;;) {
        st = raw_line(h, line, sizeof line, err);
        if (st != HL_OK) return st;
        head_bytes += strlen(line);
        if (head_bytes > MAX_HEAD) return hl_fail(err, HL_ERR_FORMAT, "response headers too long");
        if (line[0] == '\0') break;
        char *colon = strchr(line, ':');
        if (!colon) continue;
        *colon = '\0';
        char *v = colon + 1;
        while (*v == ' ' || *v == '\t') v++;
        if (strcasecmp(line, "Content-Length") == 0)
            h->remaining = strtoll(v, NULL, 10);
        else if (strcasecmp(line, "Transfer-Encoding") == 0 && strcasestr(v, "chunked"))
            h->chunked = true;
        else if (strcasecmp(line, "Content-Type") == 0)
            snprintf(h->content_type, sizeof h->content_type, "%s", v);
    }
    if (h->head_request || code == 204 || code == 304 || (code >= 100 && code < 200))
        h->body_done = true;
    return HL_OK;
}

int net_http_status(const net_http *h) { return h->status; }
const char *net_http_content_type(const net_http *h) { return h->content_type; }

hl_status net_http_read(net_http *h, void *out, size_t cap, size_t *got, hl_err *err) {
    *got = 0;
    while (!h->body_done && cap > 0) {
        if (h->chunked && h->chunk_left <= 0) {
            char line[256];
            hl_status st;
            if (h->chunk_left == 0) { /* CRLF after a chunk's data */
                st = raw_line(h, line, sizeof line, err);
                if (st != HL_OK) return st;
            }
            st = raw_line(h, line, sizeof line, err);
            if (st != HL_OK) return st;
            char *end;
            long long size = strtoll(line, &end, 16);
            if (end == line || size < 0) return hl_fail(err, HL_ERR_FORMAT, "bad chunk size '%s'", line);
            if (size == 0) {
                do { /* trailers until the empty line */
                    st = raw_line(h, line, sizeof line, err);
                    if (st != HL_OK) return st;
                } while (line[0]);
                h->body_done = true;
                break;
            }
            h->chunk_left = size;
        }
        if (!h->chunked && h->remaining == 0) {
            h->body_done = true;
            break;
        }
        bool eof;
        hl_status st = fill(h, &eof, err);
        if (st != HL_OK) return st;
        if (eof) {
            if (h->chunked || h->remaining > 0)
                return hl_fail(err, HL_ERR_IO, "connection closed in the middle of a response");
            h->body_done = true;
            break;
        }
        size_t avail = h->buf_len - h->buf_pos;
        size_t take = avail < cap ? avail : cap;
        if (h->chunked && (int64_t)take > h->chunk_left) take = (size_t)h->chunk_left;
        if (!h->chunked && h->remaining > 0 && (int64_t)take > h->remaining) take = (size_t)h->remaining;
        memcpy(out, h->buf + h->buf_pos, take);
        h->buf_pos += take;
        if (h->chunked) h->chunk_left -= (int64_t)take;
        if (!h->chunked && h->remaining > 0) h->remaining -= (int64_t)take;
        *got = take;
        return HL_OK; /* return what we have: streams must not wait for a full buffer */
    }
    return HL_OK;
}

hl_status net_http_read_line(net_http *h, char **line, size_t *len, hl_err *err) {
    *line = NULL;
    *len = 0;
    size_t n = 0;
    for (;;) {
        char c;
        size_t got;
        hl_status st = net_http_read(h, &c, 1, &got, err);
        if (st != HL_OK) return st;
        if (got == 0) {
            if (n == 0) return HL_OK;
            break;
        }
        if (c == '\n') break;
        if (n + 2 > h->line_cap) {
            if (n + 2 > MAX_LINE) return hl_fail(err, HL_ERR_FORMAT, "response line too long");
            size_t nc = h->line_cap ? h->line_cap * 2 : 4096;
            char *nl = realloc(h->line, nc);
            if (!nl) return hl_fail(err, HL_ERR_NOMEM, "out of memory");
            h->line = nl;
            h->line_cap = nc;
        }
        h->line[n++] = c;
    }
    if (!h->line) { /* an empty line before EOF */
        h->line = malloc(1);
        if (!h->line) return hl_fail(err, HL_ERR_NOMEM, "out of memory");
        h->line_cap = 1;
    }
    if (n > 0 && h->line[n - 1] == '\r') n--;
    h->line[n] = '\0';
    *line = h->line;
    *len = n;
    return HL_OK;
}

hl_status net_http_read_all(net_http *h, size_t max, char **out, size_t *len, hl_err *err) {
    *out = NULL;
    *len = 0;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    if (!buf) return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    for (;;) {
        if (cap - n < 4096) {
            if (cap > max) {
                free(buf);
                return hl_fail(err, HL_ERR_FORMAT, "response body larger than %zu bytes", max);
            }
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                return hl_fail(err, HL_ERR_NOMEM, "out of memory");
            }
            buf = nb;
            cap *= 2;
        }
        size_t got;
        hl_status st = net_http_read(h, buf + n, cap - n - 1, &got, err);
        if (st != HL_OK) {
            free(buf);
            return st;
        }
        if (got == 0) break;
        n += got;
    }
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return HL_OK;
}

void net_http_set_timeout(net_http *h, int ms) {
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    setsockopt(h->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(h->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

void net_http_set_waiter(net_http *h, net_http_waiter fn, void *ud) {
    h->waiter = fn;
    h->waiter_ud = ud;
}

int net_http_fd(const net_http *h) { return h->fd; }

bool net_http_buffered(const net_http *h) { return h->buf_pos < h->buf_len; }

void net_http_close(net_http *h) {
    if (!h) return;
    if (h->fd >= 0) close(h->fd);
    free(h->line);
    free(h);
}

hl_status net_http_request(const net_host *host, const char *method, const char *path,
                           const char *body, size_t body_len, int *status, char **resp,
                           size_t *resp_len, hl_err *err) {
    *resp = NULL;
    if (resp_len) *resp_len = 0;
    net_http *h;
    hl_status st = net_http_open(host, method, path, "application/json",
                                 body ? (int64_t)body_len : -1, &h, err);
    if (st != HL_OK) return st;
    if (body && body_len) st = net_http_send(h, body, body_len, err);
    if (st == HL_OK) st = net_http_finish(h, err);
    size_t len = 0;
    if (st == HL_OK) st = net_http_read_all(h, (size_t)1 << 30, resp, &len, err);
    if (st == HL_OK) {
        *status = net_http_status(h);
        if (resp_len) *resp_len = len;
    }
    net_http_close(h);
    return st;
}
