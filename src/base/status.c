#include "base/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

hl_status hl_fail(hl_err *err, hl_status code, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        err->code = code;
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return code;
}

void hl_err_prefix(hl_err *err, const char *fmt, ...) {
    if (!err) return;
    char prefix[HL_ERR_MSG_LEN];
    char old[HL_ERR_MSG_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, err->msg, sizeof old);
    snprintf(err->msg, sizeof err->msg, "%s: %s", prefix, old);
}

void hl_err_clear(hl_err *err) {
    if (!err) return;
    err->code = HL_OK;
    err->msg[0] = '\0';
}

const char *hl_status_str(hl_status code) {
    switch (code) {
    case HL_OK: return "ok";
    case HL_ERR_NOMEM: return "out of memory";
    case HL_ERR_IO: return "I/O error";
    case HL_ERR_FORMAT: return "malformed input";
    case HL_ERR_INVALID: return "invalid argument";
    case HL_ERR_UNSUPPORTED: return "unsupported";
    case HL_ERR_CANCELLED: return "cancelled";
    case HL_ERR_KV_FULL: return "KV cache full";
    case HL_ERR_TIMEOUT: return "timed out";
    case HL_ERR_BUSY: return "busy";
    case HL_ERR_NOT_FOUND: return "not found";
    }
    return "unknown error";
}
