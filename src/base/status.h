/*
 * status.h - hearth's error convention.
 *
 * Every fallible function returns an hl_status (HL_OK == 0, errors negative) and,
 * when given a non-NULL hl_err, fills it with a message a user can read. The
 * hl_err lives in the caller's memory, so reporting an error never allocates.
 * Library code never exits; only main() decides to quit.
 */
#ifndef HL_BASE_STATUS_H
#define HL_BASE_STATUS_H

#include <stddef.h>

typedef enum hl_status {
    HL_OK = 0,
    HL_ERR_NOMEM = -1,       /* an allocation failed */
    HL_ERR_IO = -2,          /* open/read/write/mmap failed */
    HL_ERR_FORMAT = -3,      /* external bytes (file, JSON, ...) are malformed */
    HL_ERR_INVALID = -4,     /* a caller passed an invalid argument */
    HL_ERR_UNSUPPORTED = -5, /* well formed, but not something we implement */
    HL_ERR_CANCELLED = -6,
    HL_ERR_KV_FULL = -7,
    HL_ERR_TIMEOUT = -8,
    HL_ERR_BUSY = -9,        /* too many pending requests; try again later (HTTP 503) */
    HL_ERR_NOT_FOUND = -10,  /* a named thing (model, blob) does not exist (HTTP 404) */
} hl_status;

#define HL_ERR_MSG_LEN 512

typedef struct hl_err {
    hl_status code;
    char msg[HL_ERR_MSG_LEN];
} hl_err;

/* Records code and a printf-style message in err (which may be NULL). Returns code,
 * so a failure path reads `return hl_fail(err, HL_ERR_FORMAT, "bad magic");`. */
hl_status hl_fail(hl_err *err, hl_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Prepends "prefix: " to an existing message (for adding context as an error rises). */
void hl_err_prefix(hl_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

void hl_err_clear(hl_err *err);

/* A static, human-readable name for a status code. */
const char *hl_status_str(hl_status code);

#endif
