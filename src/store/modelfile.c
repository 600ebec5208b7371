#include "store/modelfile.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

typedef enum param_type { PT_INT, PT_FLOAT, PT_BOOL, PT_STRINGS, PT_DEPRECATED } param_type;

static const struct {
    const char *name;
    param_type type;
} k_params[] = {
    {"num_ctx", PT_INT},           {"num_batch", PT_INT},          {"num_gpu", PT_INT},
    {"main_gpu", PT_INT},          {"use_mmap", PT_BOOL},          {"num_thread", PT_INT},
    {"draft_num_predict", PT_INT}, {"num_keep", PT_INT},           {"seed", PT_INT},
    {"num_predict", PT_INT},       {"top_k", PT_INT},              {"top_p", PT_FLOAT},
    {"min_p", PT_FLOAT},           {"typical_p", PT_FLOAT},        {"repeat_last_n", PT_INT},
    {"temperature", PT_FLOAT},     {"repeat_penalty", PT_FLOAT},   {"presence_penalty", PT_FLOAT},
    {"frequency_penalty", PT_FLOAT}, {"stop", PT_STRINGS},
    {"penalize_newline", PT_DEPRECATED}, {"low_vram", PT_DEPRECATED}, {"f16_kv", PT_DEPRECATED},
    {"logits_all", PT_DEPRECATED}, {"vocab_only", PT_DEPRECATED}, {"use_mlock", PT_DEPRECATED},
    {"mirostat", PT_DEPRECATED},   {"mirostat_tau", PT_DEPRECATED}, {"mirostat_eta", PT_DEPRECATED},
};

static bool param_lookup(const char *name, param_type *out) {
    for (size_t i = 0; i < sizeof k_params / sizeof k_params[0]; i++)
        if (strcmp(k_params[i].name, name) == 0) {
            *out = k_params[i].type;
            return true;
        }
    return false;
}

static bool parse_bool(const char *v, bool *out) {
    static const char *t[] = {"1", "t", "T", "TRUE", "true", "True"};
    static const char *f[] = {"0", "f", "F", "FALSE", "false", "False"};
    for (int i = 0; i < 6; i++) {
        if (strcmp(v, t[i]) == 0) return (*out = true), true;
        if (strcmp(v, f[i]) == 0) return (*out = false), true;
    }
    return false;
}

hl_status modelfile_param_value(const char *name, const char *value, json_t **out, hl_err *err) {
    *out = NULL;
    param_type t;
    if (!param_lookup(name, &t)) return hl_fail(err, HL_ERR_INVALID, "unknown parameter '%s'", name);
    char *end;
    switch (t) {
    case PT_DEPRECATED:
        return HL_OK;
    case PT_INT: {
        errno = 0;
        long long v = strtoll(value, &end, 10);
        if (!*value || *end || errno)
            return hl_fail(err, HL_ERR_INVALID, "invalid int value [%s]", value);
        *out = json_integer((json_int_t)v);
        break;
    }
    case PT_FLOAT: {
        errno = 0;
        double v = strtod(value, &end);
        if (!*value || *end || errno || !isfinite(v))
            return hl_fail(err, HL_ERR_INVALID, "invalid float value [%s]", value);
        *out = json_real(v);
        break;
    }
    case PT_BOOL: {
        bool b;
        if (!parse_bool(value, &b)) return hl_fail(err, HL_ERR_INVALID, "invalid bool value [%s]", value);
        *out = json_boolean(b);
        break;
    }
    case PT_STRINGS:
        *out = json_string(value);
        break;
    }
    if (!*out) return hl_fail(err, HL_ERR_INVALID, "invalid value for parameter '%s'", name);
    return HL_OK;
}

hl_status modelfile_param_check_json(const char *name, json_t *value, json_t **out, hl_err *err) {
    *out = NULL;
    param_type t;
    if (!param_lookup(name, &t)) return hl_fail(err, HL_ERR_INVALID, "unknown parameter '%s'", name);
    switch (t) {
    case PT_DEPRECATED:
        return HL_OK;
    case PT_INT:
        if (json_is_integer(value)) {
            *out = json_incref(value);
        } else if (json_is_real(value) && isfinite(json_real_value(value)) &&
                   fabs(json_real_value(value)) < 9.2e18) {
            *out = json_integer((json_int_t)json_real_value(value));
        } else {
            return hl_fail(err, HL_ERR_INVALID, "option \"%s\" must be of type integer", name);
        }
        break;
    case PT_FLOAT:
        if (!json_is_number(value))
            return hl_fail(err, HL_ERR_INVALID, "option \"%s\" must be of type float32", name);
        *out = json_real(json_number_value(value));
        break;
    case PT_BOOL:
        if (!json_is_boolean(value))
            return hl_fail(err, HL_ERR_INVALID, "option \"%s\" must be of type boolean", name);
        *out = json_incref(value);
        break;
    case PT_STRINGS:
        if (json_is_string(value)) {
            *out = json_pack("[O]", value);
        } else if (json_is_array(value)) {
            size_t i;
            json_t *v;
            json_array_foreach(value, i, v) {
                if (!json_is_string(v))
                    return hl_fail(err, HL_ERR_INVALID, "option \"%s\" must be of an array of strings", name);
            }
            *out = json_incref(value);
        } else {
            return hl_fail(err, HL_ERR_INVALID, "option \"%s\" must be of an array of strings", name);
        }
        break;
    }
    if (!*out) return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    return HL_OK;
}

static const struct {
    const char *word;
    mf_kind kind;
} k_commands[] = {
    {"from", MF_FROM},         {"parameter", MF_PARAMETER}, {"template", MF_TEMPLATE},
    {"system", MF_SYSTEM},     {"message", MF_MESSAGE},     {"license", MF_LICENSE},
    {"adapter", MF_ADAPTER},   {"draft", MF_DRAFT},         {"renderer", MF_RENDERER},
    {"parser", MF_PARSER},     {"requires", MF_REQUIRES},
};

const char *modelfile_kind_name(mf_kind k) {
    static const char *names[] = {"FROM",    "PARAMETER", "TEMPLATE", "SYSTEM",
                                  "MESSAGE", "LICENSE",   "ADAPTER",  "DRAFT",
                                  "RENDERER", "PARSER",   "REQUIRES"};
    return (unsigned)k < sizeof names / sizeof names[0] ? names[k] : "?";
}

void modelfile_free(modelfile *mf) {
    if (!mf) return;
    for (size_t i = 0; i < mf->n; i++) {
        free(mf->cmds[i].name);
        free(mf->cmds[i].value);
    }
    free(mf->cmds);
    mf->cmds = NULL;
    mf->n = 0;
}

const char *modelfile_from(const modelfile *mf) {
    const char *from = NULL;
    for (size_t i = 0; i < mf->n; i++)
        if (mf->cmds[i].kind == MF_FROM) from = mf->cmds[i].value;
    return from;
}

typedef struct parser {
    const char *p, *end;
    int line;
    hl_err *err;
} parser;

static void skip_blanks(parser *ps) {
    while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t')) ps->p++;
}

static char *dup_range(const char *a, size_t n) {
    char *s = malloc(n + 1);
    if (!s) return NULL;
    memcpy(s, a, n);
    s[n] = '\0';
    return s;
}

/* After a quoted value only blanks may follow on the line. */
static hl_status expect_eol(parser *ps, int line) {
    skip_blanks(ps);
    if (ps->p < ps->end && *ps->p == '\r') ps->p++;
    if (ps->p < ps->end && *ps->p != '\n')
        return hl_fail(ps->err, HL_ERR_FORMAT, "(line %d): unexpected text after closing quote", line);
    if (ps->p < ps->end) {
        ps->p++;
        ps->line++;
    }
    return HL_OK;
}

/* Reads a value: """...""", "..." (with \" and \\ escapes) or the rest of the line. */
static hl_status read_value(parser *ps, int line, char **out) {
    *out = NULL;
    if (ps->end - ps->p >= 3 && memcmp(ps->p, "\"\"\"", 3) == 0) {
        const char *start = ps->p + 3, *q = start;
        while (q + 3 <= ps->end && memcmp(q, "\"\"\"", 3) != 0) q++;
        if (q + 3 > ps->end)
            return hl_fail(ps->err, HL_ERR_FORMAT, "(line %d): unexpected EOF: unterminated \"\"\"", line);
        for (const char *c = start; c < q; c++)
            if (*c == '\n') ps->line++;
        if (!(*out = dup_range(start, (size_t)(q - start))))
            return hl_fail(ps->err, HL_ERR_NOMEM, "out of memory");
        ps->p = q + 3;
        return expect_eol(ps, line);
    }
    if (ps->p < ps->end && *ps->p == '"') {
        const char *q = ps->p + 1;
        size_t n = 0;
        char *buf = malloc((size_t)(ps->end - ps->p) + 1);
        if (!buf) return hl_fail(ps->err, HL_ERR_NOMEM, "out of memory");
        int lines = 0;
        while (q < ps->end && *q != '"') {
            if (*q == '\\' && q + 1 < ps->end && (q[1] == '"' || q[1] == '\\')) q++;
            if (*q == '\n') lines++;
            buf[n++] = *q++;
        }
        if (q >= ps->end) {
            free(buf);
            return hl_fail(ps->err, HL_ERR_FORMAT, "(line %d): unexpected EOF: unterminated quote", line);
        }
        buf[n] = '\0';
        ps->line += lines;
        ps->p = q + 1;
        *out = buf;
        return expect_eol(ps, line);
    }
    const char *start = ps->p;
    while (ps->p < ps->end && *ps->p != '\n') ps->p++;
    const char *e = ps->p;
    while (e > start && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\r')) e--;
    if (ps->p < ps->end) {
        ps->p++;
        ps->line++;
    }
    if (!(*out = dup_range(start, (size_t)(e - start))))
        return hl_fail(ps->err, HL_ERR_NOMEM, "out of memory");
    return HL_OK;
}

static bool valid_semver(const char *v) {
    if (*v == 'v') v++;
    int parts = 0;
    for (;;) {
        if (!isdigit((unsigned char)*v)) return false;
        while (isdigit((unsigned char)*v)) v++;
        parts++;
        if (*v != '.') break;
        v++;
    }
    return parts >= 1 && parts <= 3 && (*v == '\0' || *v == '-' || *v == '+');
}

static hl_status push_cmd(modelfile *mf, mf_command c, hl_err *err) {
    mf_command *nc = realloc(mf->cmds, (mf->n + 1) * sizeof *nc);
    if (!nc) {
        free(c.name);
        free(c.value);
        return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    }
    mf->cmds = nc;
    nc[mf->n++] = c;
    return HL_OK;
}

static hl_status parse_command(parser *ps, modelfile *mf) {
    int line = ps->line;
    const char *w = ps->p;
    while (ps->p < ps->end && isalpha((unsigned char)*ps->p)) ps->p++;
    size_t wl = (size_t)(ps->p - w);
    bool known = false;
    mf_command c = {.line = line};
    for (size_t i = 0; i < sizeof k_commands / sizeof k_commands[0]; i++)
        if (wl == strlen(k_commands[i].word) && strncasecmp(w, k_commands[i].word, wl) == 0) {
            c.kind = k_commands[i].kind;
            known = true;
        }
    if (!known || (ps->p < ps->end && *ps->p != ' ' && *ps->p != '\t' && *ps->p != '\n' &&
                   *ps->p != '\r'))
        return hl_fail(ps->err, HL_ERR_FORMAT,
                       "(line %d): command must be one of \"from\", \"license\", \"template\", "
                       "\"system\", \"adapter\", \"draft\", \"renderer\", \"parser\", "
                       "\"parameter\", \"message\", or \"requires\"", line);
    skip_blanks(ps);
    if (c.kind == MF_PARAMETER || c.kind == MF_MESSAGE) {
        const char *n = ps->p;
        while (ps->p < ps->end && !isspace((unsigned char)*ps->p)) ps->p++;
        if (ps->p == n)
            return hl_fail(ps->err, HL_ERR_FORMAT, "(line %d): missing %s for %s", line,
                           c.kind == MF_PARAMETER ? "name" : "role", modelfile_kind_name(c.kind));
        if (!(c.name = dup_range(n, (size_t)(ps->p - n))))
            return hl_fail(ps->err, HL_ERR_NOMEM, "out of memory");
        for (char *q = c.name; *q; q++) *q = (char)tolower((unsigned char)*q);
        skip_blanks(ps);
    }
    hl_status st = read_value(ps, line, &c.value);
    if (st == HL_OK && c.value[0] == '\0' && c.kind != MF_SYSTEM && c.kind != MF_TEMPLATE &&
        c.kind != MF_MESSAGE)
        st = hl_fail(ps->err, HL_ERR_FORMAT, "(line %d): missing value for %s", line,
                     modelfile_kind_name(c.kind));
    if (st == HL_OK && c.kind == MF_PARAMETER) {
        json_t *v;
        st = modelfile_param_value(c.name, c.value, &v, ps->err);
        json_decref(v);
        if (st != HL_OK) {
            hl_err_prefix(ps->err, "(line %d)", line);
            st = HL_ERR_FORMAT;
            if (ps->err) ps->err->code = st;
        }
    }
    if (st == HL_OK && c.kind == MF_MESSAGE && strcmp(c.name, "system") != 0 &&
        strcmp(c.name, "user") != 0 && strcmp(c.name, "assistant") != 0)
        st = hl_fail(ps->err, HL_ERR_FORMAT,
                     "(line %d): message role must be one of \"system\", \"user\", or \"assistant\"",
                     line);
    if (st == HL_OK && c.kind == MF_REQUIRES && !valid_semver(c.value))
        st = hl_fail(ps->err, HL_ERR_FORMAT, "(line %d): requires must be a valid semver (e.g. 0.14.0)",
                     line);
    if (st != HL_OK) {
        free(c.name);
        free(c.value);
        return st;
    }
    return push_cmd(mf, c, ps->err);
}

hl_status modelfile_parse(const char *text, size_t len, modelfile *out, hl_err *err) {
    memset(out, 0, sizeof *out);
    parser ps = {.p = text, .end = text + len, .line = 1, .err = err};
    if (len >= 3 && memcmp(text, "\xEF\xBB\xBF", 3) == 0) ps.p += 3;
    while (ps.p < ps.end) {
        skip_blanks(&ps);
        if (ps.p >= ps.end) break;
        char c = *ps.p;
        if (c == '\n' || c == '\r') {
            if (c == '\n') ps.line++;
            ps.p++;
            continue;
        }
        if (c == '#') {
            while (ps.p < ps.end && *ps.p != '\n') ps.p++;
            continue;
        }
        hl_status st = parse_command(&ps, out);
        if (st != HL_OK) {
            modelfile_free(out);
            return st;
        }
    }
    if (!modelfile_from(out)) {
        modelfile_free(out);
        return hl_fail(err, HL_ERR_FORMAT, "no FROM line");
    }
    return HL_OK;
}

hl_status modelfile_to_create_request(const modelfile *mf, json_t *req, hl_err *err) {
    json_t *params = json_object(), *messages = json_array(), *licenses = json_array();
    hl_status st = HL_OK;
    if (!params || !messages || !licenses) st = hl_fail(err, HL_ERR_NOMEM, "out of memory");
    for (size_t i = 0; st == HL_OK && i < mf->n; i++) {
        const mf_command *c = &mf->cmds[i];
        switch (c->kind) {
        case MF_FROM:
            json_object_set_new(req, "from", json_string(c->value));
            break;
        case MF_PARAMETER: {
            json_t *v;
            st = modelfile_param_value(c->name, c->value, &v, err);
            if (st != HL_OK || !v) break;
            if (json_is_string(v)) { /* stop: accumulates */
                json_t *arr = json_object_get(params, c->name);
                if (!arr) {
                    arr = json_array();
                    json_object_set_new(params, c->name, arr);
                }
                json_array_append_new(arr, v);
            } else {
                json_object_set_new(params, c->name, v);
            }
            break;
        }
        case MF_TEMPLATE:
            json_object_set_new(req, "template", json_string(c->value));
            break;
        case MF_SYSTEM:
            json_object_set_new(req, "system", json_string(c->value));
            break;
        case MF_MESSAGE:
            json_array_append_new(messages,
                                  json_pack("{s:s, s:s}", "role", c->name, "content", c->value));
            break;
        case MF_LICENSE:
            json_array_append_new(licenses, json_string(c->value));
            break;
        case MF_ADAPTER:
        case MF_DRAFT:
            st = hl_fail(err, HL_ERR_UNSUPPORTED, "(line %d): %s is not supported by hearth yet",
                         c->line, modelfile_kind_name(c->kind));
            break;
        case MF_RENDERER:
            json_object_set_new(req, "renderer", json_string(c->value));
            break;
        case MF_PARSER:
            json_object_set_new(req, "parser", json_string(c->value));
            break;
        case MF_REQUIRES:
            json_object_set_new(req, "requires", json_string(c->value));
            break;
        }
    }
    if (st == HL_OK) {
        if (json_object_size(params)) json_object_set(req, "parameters", params);
        if (json_array_size(messages)) json_object_set(req, "messages", messages);
        if (json_array_size(licenses) == 1)
            json_object_set(req, "license", json_array_get(licenses, 0));
        else if (json_array_size(licenses) > 1)
            json_object_set(req, "license", licenses);
    }
    json_decref(params);
    json_decref(messages);
    json_decref(licenses);
    return st;
}
