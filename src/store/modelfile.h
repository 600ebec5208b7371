/*
 * modelfile.h - Ollama's Modelfile format.
 *
 *   FROM ./model.gguf            # a GGUF path (relative to the Modelfile's dir), a model name
 *   PARAMETER temperature 0.7    # typed per Ollama's options table; `stop` repeats
 *   TEMPLATE """{{ .Prompt }}""" # values: bare to end of line, "quoted" or """multi-line"""
 *   SYSTEM You are a pirate.
 *   MESSAGE user Hello           # role: system, user or assistant
 *   LICENSE """..."""            # repeatable
 *
 * Commands are case-insensitive; '#' starts a comment line. ADAPTER and DRAFT parse but
 * are rejected by modelfile_to_create_request() (not supported yet). Errors carry the
 * line number: "(line N): ...".
 *
 * modelfile_parse() fills a caller struct whose strings it allocates; modelfile_free()
 * releases them. modelfile_to_create_request() adds the /api/create JSON fields to a
 * caller-owned jansson object.
 */
#ifndef HL_STORE_MODELFILE_H
#define HL_STORE_MODELFILE_H

#include <jansson.h>
#include <stddef.h>

#include "base/status.h"

typedef enum mf_kind {
    MF_FROM,
    MF_PARAMETER,
    MF_TEMPLATE,
    MF_SYSTEM,
    MF_MESSAGE,
    MF_LICENSE,
    MF_ADAPTER,
    MF_DRAFT,
    MF_RENDERER,
    MF_PARSER,
    MF_REQUIRES,
} mf_kind;

typedef struct mf_command {
    mf_kind kind;
    char *name;  /* PARAMETER name or MESSAGE role (lower-cased); NULL for other commands */
    char *value; /* unquoted value */
    int line;    /* 1-based line where the command starts */
} mf_command;

typedef struct modelfile {
    mf_command *cmds;
    size_t n;
} modelfile;

/* Parses the text; validates parameter names/values, MESSAGE roles, REQUIRES, and that
 * there is a FROM line. */
hl_status modelfile_parse(const char *text, size_t len, modelfile *out, hl_err *err);
void modelfile_free(modelfile *mf);

const char *modelfile_kind_name(mf_kind k); /* "FROM", "PARAMETER", ... */

/* The FROM value (the last FROM), or NULL. */
const char *modelfile_from(const modelfile *mf);

/* Types a parameter value per Ollama's options table (int, float, bool, or a string for
 * `stop`). Unknown name: "unknown parameter '<name>'"; bad value: "invalid float value
 * [x]" etc. Deprecated options yield *out = NULL and HL_OK (dropped, as Ollama does). */
hl_status modelfile_param_value(const char *name, const char *value, json_t **out, hl_err *err);

/* Checks one value of a JSON `parameters` object (as /api/create receives it): the name
 * must be known and the type right. Writes a normalized value (stop becomes an array;
 * ints given as floats are truncated) to *out (new reference; NULL for deprecated). */
hl_status modelfile_param_check_json(const char *name, json_t *value, json_t **out, hl_err *err);

/* Adds "from", "parameters", "template", "system", "license", "messages", "renderer",
 * "parser", "requires" to req as Ollama's CLI does. ADAPTER/DRAFT fail (unsupported). */
hl_status modelfile_to_create_request(const modelfile *mf, json_t *req, hl_err *err);

#endif
