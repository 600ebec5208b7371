/*
 * name.h - model names as Ollama spells them: [scheme://][host/][namespace/]model[:tag].
 *
 * Defaults: host registry.ollama.ai, namespace library, tag latest. The tag is what
 * follows the last ':' when that ':' comes after the last '/'. Parts: 1-80 chars
 * (host up to 350), first char [A-Za-z0-9_], the rest [A-Za-z0-9_.-]; '.' is not
 * allowed in the namespace, ':' only in the host. Comparison is case-insensitive.
 * Everything lives in the caller's struct (fixed buffers); nothing allocates.
 */
#ifndef HL_STORE_NAME_H
#define HL_STORE_NAME_H

#include <stdbool.h>
#include <stddef.h>

#include "base/status.h"

#define STORE_DEFAULT_HOST "registry.ollama.ai"
#define STORE_DEFAULT_NAMESPACE "library"
#define STORE_DEFAULT_TAG "latest"
#define STORE_NAME_PART_MAX 80
#define STORE_NAME_HOST_MAX 350

typedef struct store_name {
    char host[STORE_NAME_HOST_MAX + 1];
    char ns[STORE_NAME_PART_MAX + 1];
    char model[STORE_NAME_PART_MAX + 1];
    char tag[STORE_NAME_PART_MAX + 1];
} store_name;

/* Parses and fills defaults. An invalid name fails with HL_ERR_INVALID and the
 * message "invalid model name". */
hl_status store_name_parse(const char *s, store_name *out, hl_err *err);
bool store_name_valid(const char *s);

/* Shortest display form: "m:tag" for the default host and namespace, "ns/m:tag" for
 * the default host, else "host/ns/m:tag". Truncates to cap (always NUL-terminated). */
void store_name_display(const store_name *n, char *buf, size_t cap);
/* Case-insensitive equality of all four parts. */
bool store_name_equal(const store_name *a, const store_name *b);

#endif
