/*
 * host.h - the server address from HEARTH_HOST (else OLLAMA_HOST), in Ollama's forms:
 * "host", "host:port", ":port", "scheme://host[:port]", "[v6addr]:port".
 *
 * Default 127.0.0.1:11434. The port defaults to 11434 unless a scheme is written
 * explicitly (http -> 80, https -> 443). Values are trimmed of spaces and quotes. For
 * clients, 0.0.0.0 and :: become 127.0.0.1 and ::1 (net_host_connectable).
 * Everything lives in the caller's struct.
 */
#ifndef HL_NET_HOST_H
#define HL_NET_HOST_H

#include "base/status.h"

#define NET_DEFAULT_PORT 11434

typedef struct net_host {
    char scheme[8];  /* "http" or "https" */
    char host[256];  /* no brackets for IPv6; "" means all interfaces */
    int port;        /* 0..65535 (0: pick a free port, server side) */
} net_host;

hl_status net_host_parse(const char *value, net_host *out, hl_err *err);
/* Parses HEARTH_HOST, else OLLAMA_HOST, else the default. */
hl_status net_host_from_env(net_host *out, hl_err *err);
/* The address a client should connect to (unspecified addresses become loopback). */
net_host net_host_connectable(const net_host *h);

#endif
