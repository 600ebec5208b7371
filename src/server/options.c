/* options.c - request options, keep_alive and format (options.h). */
#include "server/options.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "kv/layout.h"
#include "server/internal.h"
#include "server/sched.h"
#include "store/modelfile.h"

int32_t opt_default_num_ctx(void) {
    const char *names[] = {"HEARTH_CONTEXT_LENGTH", "OLLAMA_CONTEXT_LENGTH"};
    for (int i = 0; i < 2; i++) {
        const char *v = getenv(names[i]);
        if (!v || !*v) continue;
        char *end;
        errno = 0;
        long n = strtol(v, &end, 10);
        if (!errno && !*end && n > 0 && n <= (1L << 24)) return (int32_t)n;
    }
    return 4096;
}

const char *opt_default_kv_type(bool warn) {
    const char *names[] = {"HEARTH_KV_CACHE_TYPE", "OLLAMA_KV_CACHE_TYPE"};
    for (int i = 0; i < 2; i++) {
        const char *v = getenv(names[i]);
        if (!v || !*v) continue;
        hl_type t;
        if (kv_type_parse(v, &t)) return t == HL_TYPE_F32 ? "f32" : t == HL_TYPE_Q8_0 ? "q8_0" : "f16";
        /* Ollama falls back to f16 on a type it does not know */
        if (warn)
            HL_WARN("%s=\"%s\" is not a KV cache type (f32, f16, q8_0): using f16", names[i], v);
        return "f16";
    }
    return "f16";
}

void opt_free(infer_opts *o) {
    for (size_t i = 0; i < o->n_stop; i++) free(o->stop[i]);
    free(o->stop);
    o->stop = NULL;
    o->n_stop = 0;
}

static int32_t clamp_i32(json_int_t v) {
    if (v > INT32_MAX) return INT32_MAX;
    if (v < INT32_MIN) return INT32_MIN;
    return (int32_t)v;
}

static hl_status apply(infer_opts *o, const char *key, json_t *raw, bool quiet, hl_err *err) {
    json_t *v = NULL;
    hl_err e2;
    if (modelfile_param_check_json(key, raw, &v, &e2) != HL_OK) {
        if (strncmp(e2.msg, "unknown parameter", 17) == 0) {
            /* the logger escapes the client's text: no forged or split lines */
            if (!quiet) HL_LOG_ATTRS(HL_LOG_WARN, "invalid option provided", "option", key);
            return HL_OK;
        }
        if (strcmp(key, "stop") == 0)
            return hl_fail(err, HL_ERR_INVALID, "option \"stop\" must be of an array of strings");
        return hl_fail(err, HL_ERR_INVALID, "%s", e2.msg);
    }
    if (!v) return HL_OK; /* deprecated: dropped */
    json_int_t i = json_integer_value(v);
    double f = json_number_value(v);
    if (!strcmp(key, "num_ctx")) o->load.num_ctx = clamp_i32(i);
    else if (!strcmp(key, "num_batch")) o->load.num_batch = clamp_i32(i);
    else if (!strcmp(key, "num_thread")) o->load.n_threads = clamp_i32(i);
    else if (!strcmp(key, "use_mmap")) o->load.use_mmap = json_is_true(v);
    else if (!strcmp(key, "num_keep")) o->num_keep = clamp_i32(i);
    else if (!strcmp(key, "seed")) o->sp.seed = (int64_t)i;
    else if (!strcmp(key, "num_predict")) o->num_predict = (int64_t)i;
    else if (!strcmp(key, "top_k")) o->sp.top_k = clamp_i32(i);
    else if (!strcmp(key, "top_p")) o->sp.top_p = (float)f;
    else if (!strcmp(key, "min_p")) o->sp.min_p = (float)f;
    else if (!strcmp(key, "repeat_last_n")) o->sp.repeat_last_n = clamp_i32(i);
    else if (!strcmp(key, "temperature")) o->sp.temperature = (float)f;
    else if (!strcmp(key, "repeat_penalty")) o->sp.repeat_penalty = (float)f;
    else if (!strcmp(key, "presence_penalty")) o->sp.presence_penalty = (float)f;
    else if (!strcmp(key, "frequency_penalty")) o->sp.frequency_penalty = (float)f;
    else if (!strcmp(key, "stop")) {
        for (size_t k = 0; k < o->n_stop; k++) free(o->stop[k]);
        free(o->stop);
        o->stop = NULL;
        o->n_stop = 0;
        size_t n = json_array_size(v);
        if (n) {
            o->stop = calloc(n, sizeof *o->stop);
            if (!o->stop) {
                json_decref(v);
                return hl_fail(err, HL_ERR_NOMEM, "out of memory");
            }
            for (size_t k = 0; k < n; k++) {
                const char *s = json_string_value(json_array_get(v, k));
                if (!s || !*s) continue; /* an empty stop string would stop at once */
                o->stop[o->n_stop] = strdup(s);
                if (o->stop[o->n_stop]) o->n_stop++;
            }
        }
    }
    /* num_gpu, main_gpu, typical_p, draft_num_predict: accepted, no effect on CPU */
    json_decref(v);
    return HL_OK;
}

hl_status opt_parse(const json_t *params, const json_t *options, bool quiet, infer_opts *out,
                    hl_err *err) {
    *out = (infer_opts){0};
    out->sp = sampler_opts_defaults();
    out->load.num_ctx = opt_default_num_ctx();
    out->load.num_batch = 512;
    out->load.kv_type = opt_default_kv_type(false);
    out->num_predict = -1;
    out->num_keep = 4;
    if (options && !json_is_null(options) && !json_is_object(options))
        return hl_fail(err, HL_ERR_FORMAT,
                       "json: cannot unmarshal %s into Go struct field .options of type "
                       "map[string]interface {}",
                       json_is_array(options) ? "array" : json_is_string(options) ? "string"
                                                                                  : "number");
    const json_t *layers[2] = {params, options};
    for (int l = 0; l < 2; l++) {
        if (!json_is_object(layers[l])) continue;
        const char *key;
        json_t *val;
        json_object_foreach((json_t *)layers[l], key, val) {
            if (json_is_null(val)) continue;
            hl_status st = apply(out, key, val, quiet, err);
            if (st) {
                opt_free(out);
                return st;
            }
        }
    }
    /* the load options size real resources: keep them sane */
    if (out->load.num_ctx < 4) out->load.num_ctx = 4;
    if (out->load.num_ctx > (1 << 24)) out->load.num_ctx = 1 << 24;
    if (out->load.n_threads < 0) out->load.n_threads = 0;
    if (out->load.n_threads > 256) out->load.n_threads = 256;
    if (out->load.num_batch < 0) out->load.num_batch = 0;
    if (out->load.num_batch > 8192) out->load.num_batch = 8192;
    hl_status st = sampler_validate_opts(&out->sp, err);
    if (st) opt_free(out);
    return st;
}

/* ---- durations ---- */

hl_status opt_parse_duration(const char *s, int64_t *ns, hl_err *err) {
    const char *orig = s;
    bool neg = false;
    if (*s == '-' || *s == '+') neg = *s++ == '-';
    if (strcmp(s, "0") == 0) return (*ns = 0), HL_OK;
    if (!*s) return hl_fail(err, HL_ERR_INVALID, "time: invalid duration \"%s\"", orig);
    double total = 0;
    while (*s) {
        const char *start = s;
        double v = 0;
        bool digits = false;
        while (*s >= '0' && *s <= '9') v = v * 10 + (*s++ - '0'), digits = true;
        if (*s == '.') {
            s++;
            double scale = 0.1;
            while (*s >= '0' && *s <= '9') v += (*s++ - '0') * scale, scale /= 10, digits = true;
        }
        if (!digits || s == start)
            return hl_fail(err, HL_ERR_INVALID, "time: invalid duration \"%s\"", orig);
        static const struct {
            const char *u;
            double ns;
        } units[] = {{"ns", 1},     {"us", 1e3},  {"\xc2\xb5s", 1e3}, {"\xce\xbcs", 1e3},
                     {"ms", 1e6},   {"s", 1e9},   {"m", 60e9},        {"h", 3600e9}};
        int found = -1;
        size_t best = 0;
        for (int u = 0; u < 8; u++) {
            size_t n = strlen(units[u].u);
            if (strncmp(s, units[u].u, n) == 0 && n > best) found = u, best = n;
        }
        if (found < 0) {
            if (!*s) return hl_fail(err, HL_ERR_INVALID, "time: missing unit in duration \"%s\"", orig);
            return hl_fail(err, HL_ERR_INVALID, "time: unknown unit \"%.8s\" in duration \"%s\"",
                           s, orig);
        }
        s += best;
        total += v * units[found].ns;
        if (total > 9.2e18) return hl_fail(err, HL_ERR_INVALID, "time: invalid duration \"%s\"", orig);
    }
    *ns = (int64_t)(neg ? -total : total);
    return HL_OK;
}

hl_status opt_keep_alive(const json_t *v, int64_t *ns, hl_err *err) {
    if (!v || json_is_null(v)) return (*ns = SCHED_KEEP_UNSET), HL_OK;
    if (json_is_number(v)) {
        double secs = json_number_value(v);
        if (secs < 0) return (*ns = SCHED_KEEP_FOREVER), HL_OK;
        *ns = secs * 1e9 > 9.2e18 ? SCHED_KEEP_FOREVER : (int64_t)(secs * 1e9);
        return HL_OK;
    }
    if (json_is_string(v)) {
        hl_status st = opt_parse_duration(json_string_value(v), ns, err);
        if (st) return st;
        if (*ns < 0) *ns = SCHED_KEEP_FOREVER;
        return HL_OK;
    }
    const char *type = json_is_boolean(v) ? "bool" : json_is_array(v) ? "[]interface {}"
                                                                      : "map[string]interface {}";
    return hl_fail(err, HL_ERR_INVALID, "Unsupported type: '%s'", type);
}

hl_status opt_format_parse(const json_t *v, opt_format *out, hl_err *err) {
    *out = OPT_FORMAT_NONE;
    if (!v || json_is_null(v)) return HL_OK;
    if (json_is_string(v)) {
        const char *s = json_string_value(v);
        if (!*s) return HL_OK;
        if (strcmp(s, "json") == 0) return (*out = OPT_FORMAT_JSON), HL_OK;
    } else if (json_is_object(v)) {
        return (*out = OPT_FORMAT_SCHEMA), HL_OK;
    }
    char *raw = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    hl_fail(err, HL_ERR_INVALID,
            "invalid format: %s; expected \"json\" or a valid JSON Schema object",
            raw ? raw : "?");
    free(raw);
    return HL_ERR_INVALID;
}
