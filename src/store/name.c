#include "store/name.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

static bool part_ok(const char *p, size_t len, size_t max, bool allow_dot, bool allow_colon) {
    if (len == 0 || len > max) return false;
    char c0 = p[0];
    if (!((c0 >= 'a' && c0 <= 'z') || (c0 >= 'A' && c0 <= 'Z') || (c0 >= '0' && c0 <= '9') ||
          c0 == '_'))
        return false;
    for (size_t i = 1; i < len; i++) {
        char c = p[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '_' || c == '-' || (c == '.' && allow_dot) || (c == ':' && allow_colon);
        if (!ok) return false;
    }
    return true;
}

static void copy_part(char *dst, const char *src, size_t len) {
    memcpy(dst, src, len);
    dst[len] = '\0';
}

hl_status store_name_parse(const char *s, store_name *out, hl_err *err) {
    memset(out, 0, sizeof *out);
    if (!s) return hl_fail(err, HL_ERR_INVALID, "invalid model name");
    const char *scheme = strstr(s, "://");
    if (scheme) s = scheme + 3;
    size_t n = strlen(s);
    if (n == 0 || n > STORE_NAME_HOST_MAX + 3 * STORE_NAME_PART_MAX + 3)
        return hl_fail(err, HL_ERR_INVALID, "invalid model name");

    const char *end = s + n;
    const char *last_slash = strrchr(s, '/');
    const char *last_colon = strrchr(s, ':');
    const char *tag = NULL;
    if (last_colon && (!last_slash || last_colon > last_slash)) {
        tag = last_colon + 1;
        end = last_colon;
    }
    /* Split the rest from the right: model, then namespace, then host. */
    const char *parts[3] = {NULL, NULL, NULL};
    size_t lens[3] = {0, 0, 0};
    const char *cur_end = end;
    int k = 0;
    for (; k < 3; k++) {
        const char *p = cur_end;
        while (p > s && p[-1] != '/') p--;
        parts[k] = p;
        lens[k] = (size_t)(cur_end - p);
        if (p == s) {
            k++;
            break;
        }
        if (k == 2) return hl_fail(err, HL_ERR_INVALID, "invalid model name"); /* too many '/' */
        cur_end = p - 1;
    }
    /* parts[0] = model, parts[1] = namespace, parts[2] = host */
    if (!part_ok(parts[0], lens[0], STORE_NAME_PART_MAX, true, false))
        return hl_fail(err, HL_ERR_INVALID, "invalid model name");
    copy_part(out->model, parts[0], lens[0]);
    if (k >= 2) {
        if (!part_ok(parts[1], lens[1], STORE_NAME_PART_MAX, false, false))
            return hl_fail(err, HL_ERR_INVALID, "invalid model name");
        copy_part(out->ns, parts[1], lens[1]);
    } else {
        strcpy(out->ns, STORE_DEFAULT_NAMESPACE);
    }
    if (k >= 3) {
        if (!part_ok(parts[2], lens[2], STORE_NAME_HOST_MAX, true, true))
            return hl_fail(err, HL_ERR_INVALID, "invalid model name");
        copy_part(out->host, parts[2], lens[2]);
    } else {
        strcpy(out->host, STORE_DEFAULT_HOST);
    }
    if (tag) {
        size_t tl = strlen(tag);
        if (!part_ok(tag, tl, STORE_NAME_PART_MAX, true, false))
            return hl_fail(err, HL_ERR_INVALID, "invalid model name");
        copy_part(out->tag, tag, tl);
    } else {
        strcpy(out->tag, STORE_DEFAULT_TAG);
    }
    return HL_OK;
}

bool store_name_valid(const char *s) {
    store_name n;
    return store_name_parse(s, &n, NULL) == HL_OK;
}

void store_name_display(const store_name *n, char *buf, size_t cap) {
    if (cap == 0) return;
    bool def_host = strcasecmp(n->host, STORE_DEFAULT_HOST) == 0;
    bool def_ns = strcasecmp(n->ns, STORE_DEFAULT_NAMESPACE) == 0;
    if (def_host && def_ns)
        snprintf(buf, cap, "%s:%s", n->model, n->tag);
    else if (def_host)
        snprintf(buf, cap, "%s/%s:%s", n->ns, n->model, n->tag);
    else
        snprintf(buf, cap, "%s/%s/%s:%s", n->host, n->ns, n->model, n->tag);
}

bool store_name_equal(const store_name *a, const store_name *b) {
    return strcasecmp(a->host, b->host) == 0 && strcasecmp(a->ns, b->ns) == 0 &&
           strcasecmp(a->model, b->model) == 0 && strcasecmp(a->tag, b->tag) == 0;
}
