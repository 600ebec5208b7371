#include "store/ggufinfo.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/utf8.h"
#include "tensor/types.h"

const char *ggufinfo_file_type_name(uint32_t ftype) {
    static const char *names[] = {
        [0] = "F32",      [1] = "F16",      [2] = "Q4_0",     [3] = "Q4_1",
        [7] = "Q8_0",     [8] = "Q5_0",     [9] = "Q5_1",     [10] = "Q2_K",
        [11] = "Q3_K_S",  [12] = "Q3_K_M",  [13] = "Q3_K_L",  [14] = "Q4_K_S",
        [15] = "Q4_K_M",  [16] = "Q5_K_S",  [17] = "Q5_K_M",  [18] = "Q6_K",
        [19] = "IQ2_XXS", [20] = "IQ2_XS",  [21] = "Q2_K_S",  [22] = "IQ3_XS",
        [23] = "IQ3_XXS", [24] = "IQ1_S",   [25] = "IQ4_NL",  [26] = "IQ3_S",
        [27] = "IQ3_M",   [28] = "IQ2_S",   [29] = "IQ2_M",   [30] = "IQ4_XS",
        [31] = "IQ1_M",   [32] = "BF16",    [36] = "TQ1_0",   [37] = "TQ2_0",
    };
    if (ftype < sizeof names / sizeof names[0] && names[ftype]) return names[ftype];
    return "unknown";
}

void ggufinfo_human_number(uint64_t n, char *buf, size_t cap) {
    static const struct {
        double scale;
        const char *unit;
    } units[] = {{1e12, "T"}, {1e9, "B"}, {1e6, "M"}, {1e3, "K"}};
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if ((double)n >= units[i].scale) {
            double v = (double)n / units[i].scale;
            if (units[i].scale == 1e3 || v == (double)(uint64_t)v)
                snprintf(buf, cap, "%.0f%s", v, units[i].unit);
            else
                snprintf(buf, cap, "%.1f%s", v, units[i].unit);
            return;
        }
    }
    snprintf(buf, cap, "%llu", (unsigned long long)n);
}

uint64_t ggufinfo_parameter_count(const gguf_file *f) {
    uint64_t total = 0;
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        uint64_t n = 1;
        for (uint32_t d = 0; d < t->n_dims && d < GGUF_MAX_DIMS; d++) n *= (uint64_t)t->ne[d];
        total += n;
    }
    return total;
}

static char *str_dup(gguf_str s) {
    char *r = malloc(s.len + 1);
    if (!r) return NULL;
    if (s.len) memcpy(r, s.ptr, s.len);
    r[s.len] = '\0';
    return r;
}

/* GGUF strings are not trusted to be UTF-8: invalid bytes become U+FFFD. */
static json_t *json_from_gstr(gguf_str s) {
    const char *p = s.ptr ? s.ptr : "";
    json_t *j = json_stringn(p, s.len);
    if (j || s.len > (1u << 28)) return j;
    char *buf = malloc(s.len * 3 + 1);
    if (!buf) return NULL;
    size_t n = 0;
    for (size_t i = 0; i < s.len;) {
        size_t k = hl_utf8_valid_len(p + i, s.len - i);
        if (k) {
            memcpy(buf + n, p + i, k);
            n += k;
            i += k;
        } else {
            memcpy(buf + n, "\xEF\xBF\xBD", 3);
            n += 3;
            i++;
        }
    }
    j = json_stringn(buf, n);
    free(buf);
    return j;
}

/* When general.file_type is absent: name the tensor type holding most parameters. */
static const char *guess_file_type(const gguf_file *f) {
    uint64_t by_type[HL_TYPE_COUNT] = {0};
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        if (t->type >= HL_TYPE_COUNT) continue;
        uint64_t n = 1;
        for (uint32_t d = 0; d < t->n_dims && d < GGUF_MAX_DIMS; d++) n *= (uint64_t)t->ne[d];
        by_type[t->type] += n;
    }
    uint32_t best = 0;
    for (uint32_t t = 1; t < HL_TYPE_COUNT; t++)
        if (by_type[t] > by_type[best]) best = t;
    switch (best) {
    case HL_TYPE_F32: return "F32";
    case HL_TYPE_F16: return "F16";
    case HL_TYPE_BF16: return "BF16";
    case HL_TYPE_Q4_0: return "Q4_0";
    case HL_TYPE_Q4_1: return "Q4_1";
    case HL_TYPE_Q5_0: return "Q5_0";
    case HL_TYPE_Q5_1: return "Q5_1";
    case HL_TYPE_Q8_0: return "Q8_0";
    case HL_TYPE_Q2_K: return "Q2_K";
    case HL_TYPE_Q3_K: return "Q3_K_M";
    case HL_TYPE_Q4_K: return "Q4_K_M";
    case HL_TYPE_Q5_K: return "Q5_K_M";
    case HL_TYPE_Q6_K: return "Q6_K";
    default: return "unknown";
    }
}

hl_status ggufinfo_config(const gguf_file *f, json_t **out, hl_err *err) {
    *out = NULL;
    gguf_str arch = {"", 0};
    gguf_get_str(f, "general.architecture", &arch);
    char *family = str_dup(arch);
    if (!family) return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    char model_type[32];
    ggufinfo_human_number(ggufinfo_parameter_count(f), model_type, sizeof model_type);
    uint32_t ftype;
    const char *ftype_name =
        gguf_get_u32(f, "general.file_type", &ftype) ? ggufinfo_file_type_name(ftype) : guess_file_type(f);
    json_t *families = family[0] ? json_pack("[s]", family) : json_null();
    json_t *cfg = json_pack("{s:s, s:s, s:o, s:s, s:s, s:s, s:s}", "model_format", "gguf",
                            "model_family", family, "model_families", families, "model_type",
                            model_type, "file_type", ftype_name, "architecture", "amd64", "os",
                            "linux");
    free(family);
    if (!cfg) return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    *out = cfg;
    return HL_OK;
}

/* float32 values as their shortest decimal (1e-05, not 9.9999997473787516e-06). */
static json_t *json_real_f32(float x) {
    char buf[32];
    snprintf(buf, sizeof buf, "%.7g", (double)x);
    return json_real(strtod(buf, NULL));
}

static json_t *array_value(const gguf_file *f, const char *key, bool verbose) {
    gguf_type et;
    uint64_t n;
    if (!gguf_get_arr(f, key, &et, &n)) return json_null();
    json_t *arr = json_array();
    if (!arr || (n > 5 && !verbose)) return arr;
    if (et == GGUF_TYPE_STRING) {
        for (uint64_t j = 0; j < n; j++) json_array_append_new(arr, json_from_gstr(gguf_arr_str(f, key, j)));
        return arr;
    }
    const uint8_t *p = gguf_arr_data(f, key);
    size_t es = gguf_type_size(et);
    if (!p || es == 0) return arr; /* nested arrays are not exposed */
    for (uint64_t j = 0; j < n; j++, p += es) {
        json_t *v = NULL;
        switch (et) {
        case GGUF_TYPE_UINT8: v = json_integer(p[0]); break;
        case GGUF_TYPE_INT8: v = json_integer((int8_t)p[0]); break;
        case GGUF_TYPE_UINT16: { uint16_t x; memcpy(&x, p, 2); v = json_integer(x); break; }
        case GGUF_TYPE_INT16: { int16_t x; memcpy(&x, p, 2); v = json_integer(x); break; }
        case GGUF_TYPE_UINT32: { uint32_t x; memcpy(&x, p, 4); v = json_integer(x); break; }
        case GGUF_TYPE_INT32: { int32_t x; memcpy(&x, p, 4); v = json_integer(x); break; }
        case GGUF_TYPE_UINT64: { uint64_t x; memcpy(&x, p, 8); v = json_integer((json_int_t)x); break; }
        case GGUF_TYPE_INT64: { int64_t x; memcpy(&x, p, 8); v = json_integer(x); break; }
        case GGUF_TYPE_FLOAT32: { float x; memcpy(&x, p, 4); v = json_real_f32(x); break; }
        case GGUF_TYPE_FLOAT64: { double x; memcpy(&x, p, 8); v = json_real(x); break; }
        case GGUF_TYPE_BOOL: v = json_boolean(p[0] != 0); break;
        default: break;
        }
        json_array_append_new(arr, v ? v : json_null());
    }
    return arr;
}

static json_t *kv_value(const gguf_file *f, const char *key, gguf_type t, bool verbose) {
    uint64_t u;
    int32_t i;
    float x;
    bool b;
    gguf_str s;
    switch (t) {
    case GGUF_TYPE_UINT8: case GGUF_TYPE_UINT16: case GGUF_TYPE_UINT32: case GGUF_TYPE_UINT64:
        return gguf_get_u64(f, key, &u) ? json_integer((json_int_t)u) : json_null();
    case GGUF_TYPE_INT8: case GGUF_TYPE_INT16: case GGUF_TYPE_INT32:
        return gguf_get_i32(f, key, &i) ? json_integer(i) : json_null();
    case GGUF_TYPE_INT64:
        if (gguf_get_u64(f, key, &u)) return json_integer((json_int_t)u);
        return gguf_get_i32(f, key, &i) ? json_integer(i) : json_null();
    case GGUF_TYPE_FLOAT32: case GGUF_TYPE_FLOAT64:
        return gguf_get_f32(f, key, &x) ? json_real_f32(x) : json_null();
    case GGUF_TYPE_BOOL:
        return gguf_get_bool(f, key, &b) ? json_boolean(b) : json_null();
    case GGUF_TYPE_STRING:
        return gguf_get_str(f, key, &s) ? json_from_gstr(s) : json_null();
    case GGUF_TYPE_ARRAY:
        return array_value(f, key, verbose);
    default:
        return json_null();
    }
}

hl_status ggufinfo_model_info(const gguf_file *f, bool verbose, json_t **model_info,
                              json_t **tensors, hl_err *err) {
    *model_info = NULL;
    if (tensors) *tensors = NULL;
    json_t *mi = json_object();
    if (!mi) return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    for (int64_t i = 0; i < gguf_n_kv(f); i++) {
        char *key = str_dup(gguf_kv_key(f, i));
        if (!key) {
            json_decref(mi);
            return hl_fail(err, HL_ERR_NOMEM, "out of memory");
        }
        if (strcmp(key, "general.name") != 0 && strcmp(key, "tokenizer.chat_template") != 0)
            json_object_set_new(mi, key, kv_value(f, key, gguf_kv_type(f, i), verbose));
        free(key);
    }
    json_object_set_new(mi, "general.parameter_count",
                        json_integer((json_int_t)ggufinfo_parameter_count(f)));
    if (verbose && tensors) {
        json_t *arr = json_array();
        for (int64_t i = 0; arr && i < gguf_n_tensors(f); i++) {
            const gguf_tensor *t = gguf_tensor_at(f, i);
            char tname[16];
            snprintf(tname, sizeof tname, "%s", hl_type_name(t->type));
            for (char *c = tname; *c; c++) *c = (char)toupper((unsigned char)*c);
            json_t *shape = json_array();
            for (uint32_t d = 0; d < t->n_dims && d < GGUF_MAX_DIMS; d++)
                json_array_append_new(shape, json_integer(t->ne[d]));
            json_array_append_new(arr, json_pack("{s:o, s:s, s:o}", "name", json_from_gstr(t->name),
                                                 "type", tname, "shape", shape));
        }
        *tensors = arr;
    }
    *model_info = mi;
    return HL_OK;
}
