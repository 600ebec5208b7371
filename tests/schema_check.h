/*
 * schema_check.h - a small, independent JSON schema validator for the tests of
 * constrained decoding (src/grammar): it checks a value against the keywords the
 * grammar enforces (type, properties, required, additionalProperties, items, minItems,
 * maxItems, enum, const, anyOf, oneOf (exactly one), allOf, $ref, minLength, maxLength,
 * pattern (with PCRE2),
 * minimum, maximum, exclusiveMinimum, exclusiveMaximum, nullable), written from the
 * JSON Schema specification rather than from the grammar's code.
 */
#ifndef HL_TESTS_SCHEMA_CHECK_H
#define HL_TESTS_SCHEMA_CHECK_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

/* True when v validates against schema (root: the document $refs resolve in). On false,
 * why says where and what failed. */
bool schema_check(const json_t *v, const json_t *schema, const json_t *root, char *why,
                  size_t cap);

#endif
