#include "net/host.h"

#include <ctype.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

hl_status net_host_parse(const char *value, net_host *out, hl_err *err) {
    memset(out, 0, sizeof *out);
    strcpy(out->scheme, "http");
    strcpy(out->host, "127.0.0.1");
    out->port = NET_DEFAULT_PORT;
    if (!value) return HL_OK;
    char buf[512];
    while (*value && (isspace((unsigned char)*value) || *value == '"' || *value == '\'')) value++;
    snprintf(buf, sizeof buf, "%s", value);
    size_t n = strlen(buf);
    while (n > 0 && (isspace((unsigned char)buf[n - 1]) || buf[n - 1] == '"' || buf[n - 1] == '\''))
        buf[--n] = '\0';
    if (n == 0) return HL_OK;

    char *p = buf;
    bool explicit_scheme = false;
    char *sep = strstr(p, "://");
    if (sep) {
        *sep = '\0';
        if (strcasecmp(p, "http") == 0)
            strcpy(out->scheme, "http");
        else if (strcasecmp(p, "https") == 0)
            strcpy(out->scheme, "https");
        else
            return hl_fail(err, HL_ERR_INVALID, "unsupported scheme '%s' in host '%s'", p, value);
        explicit_scheme = true;
        p = sep + 3;
    }
    char *slash = strchr(p, '/'); /* a path suffix is ignored */
    if (slash) *slash = '\0';
    char *port_str = NULL;
    if (*p == '[') {
        char *close = strchr(p, ']');
        if (!close) return hl_fail(err, HL_ERR_INVALID, "invalid host '%s'", value);
        *close = '\0';
        snprintf(out->host, sizeof out->host, "%s", p + 1);
        if (close[1] == ':') port_str = close + 2;
        else if (close[1]) return hl_fail(err, HL_ERR_INVALID, "invalid host '%s'", value);
    } else {
        char *colon = strrchr(p, ':');
        if (colon && strchr(p, ':') != colon) colon = NULL; /* a bare IPv6 address */
        if (colon) {
            *colon = '\0';
            port_str = colon + 1;
        }
        snprintf(out->host, sizeof out->host, "%s", p);
    }
    if (port_str && *port_str) {
        char *end;
        long v = strtol(port_str, &end, 10);
        if (*end || v < 0 || v > 65535)
            return hl_fail(err, HL_ERR_INVALID, "invalid port '%s' in host '%s'", port_str, value);
        out->port = (int)v;
    } else if (explicit_scheme) {
        out->port = strcmp(out->scheme, "https") == 0 ? 443 : 80;
    }
    return HL_OK;
}

hl_status net_host_from_env(net_host *out, hl_err *err) {
    const char *v = getenv("HEARTH_HOST");
    if (!v || !*v) v = getenv("OLLAMA_HOST");
    hl_status st = net_host_parse(v, out, err);
    if (st != HL_OK) hl_err_prefix(err, "%s", getenv("HEARTH_HOST") && *getenv("HEARTH_HOST")
                                                  ? "HEARTH_HOST" : "OLLAMA_HOST");
    return st;
}

net_host net_host_connectable(const net_host *h) {
    net_host c = *h;
    if (c.host[0] == '\0' || strcmp(c.host, "0.0.0.0") == 0) strcpy(c.host, "127.0.0.1");
    else if (strcmp(c.host, "::") == 0) strcpy(c.host, "::1");
    return c;
}
