/*
 * http_client.h - a small blocking HTTP/1.1 client over a TCP socket (no TLS).
 *
 * One net_http is one request/response on its own connection ("Connection: close").
 * Usage:
 *   net_http_open(host, "POST", "/api/create", "application/json", body_len, &h, &err);
 *   net_http_send(h, body, body_len, &err);        // exactly body_len bytes in total
 *   net_http_finish(h, &err);                      // reads the status line and headers
 *   while (net_http_read_line(h, &line, &len, &err) == HL_OK && line) ...   // NDJSON
 *   net_http_close(h);
 * The response body is decoded (chunked or Content-Length or until EOF). Lines returned
 * by net_http_read_line() live until the next read. net_http_request() does a whole
 * exchange with an in-memory body. The client and every buffer it returns are malloc'd;
 * net_http_close() frees the client, the caller frees net_http_request()'s body.
 */
#ifndef HL_NET_HTTP_CLIENT_H
#define HL_NET_HTTP_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "net/host.h"

typedef struct net_http net_http;

/* content_length < 0: no body. Connection errors: HL_ERR_IO "could not connect to ...". */
hl_status net_http_open(const net_host *host, const char *method, const char *path,
                        const char *content_type, int64_t content_length, net_http **out,
                        hl_err *err);
hl_status net_http_send(net_http *h, const void *data, size_t len, hl_err *err);
hl_status net_http_finish(net_http *h, hl_err *err);
int net_http_status(const net_http *h);
const char *net_http_content_type(const net_http *h); /* "" when absent */

/* Reads body bytes; *got == 0 at the end of the body. */
hl_status net_http_read(net_http *h, void *buf, size_t cap, size_t *got, hl_err *err);
/* Next line of the body without its '\n' (and '\r'); *line == NULL at the end. */
hl_status net_http_read_line(net_http *h, char **line, size_t *len, hl_err *err);
/* The rest of the body (NUL-terminated, malloc'd), at most max bytes. */
hl_status net_http_read_all(net_http *h, size_t max, char **out, size_t *len, hl_err *err);
void net_http_close(net_http *h); /* accepts NULL */

/* Send/receive timeout for the connection (ms > 0); a read that times out fails with
 * HL_ERR_TIMEOUT and leaves the response unusable (close it). */
void net_http_set_timeout(net_http *h, int ms);
/* Called every 100 ms while a read waits for the peer (the head, a chunk's framing or
 * body bytes); a status other than HL_OK ends that read with it (the waiter fills err)
 * and leaves the response unusable (close it). Lets a caller cancel or bound a read
 * that would otherwise block; fn NULL: reads block. */
typedef hl_status (*net_http_waiter)(void *ud, hl_err *err);
void net_http_set_waiter(net_http *h, net_http_waiter fn, void *ud);
/* The socket, to poll() for readability, and whether response bytes are already
 * buffered (then a read does not need the socket). */
int net_http_fd(const net_http *h);
bool net_http_buffered(const net_http *h);

/* A whole request; body may be NULL (no body). *resp is malloc'd (NUL-terminated). */
hl_status net_http_request(const net_host *host, const char *method, const char *path,
                           const char *body, size_t body_len, int *status, char **resp,
                           size_t *resp_len, hl_err *err);

#endif
