/* api_create.c - POST /api/create: builds a manifest from uploaded GGUF blobs or an
 * existing model, plus template/system/parameters/messages/license layers; "quantize"
 * (Ollama's field, e.g. "q8_0", "q4_K_M") converts the model layer with src/quant. Progress
 * is streamed as {"status": ...} lines (see internal.h for the stream contract). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <unistd.h>

#include "gguf/gguf.h"
#include "quant/quantize.h"
#include "server/internal.h"
#include "store/ggufinfo.h"
#include "store/modelfile.h"
#include "store/sha256.h"

typedef struct create_ctx {
    store_name name;
    json_t *req;
    /* the blobs this create stored (a failed create removes those nothing uses) */
    store_manifest created;
} create_ctx;

static void create_ctx_free(void *p) {
    create_ctx *c = p;
    json_decref(c->req);
    store_manifest_free(&c->created);
    free(c);
}

/* Stores text as a blob and replaces the layers of that media type with it. */
static bool put_layer(srv_stream *s, create_ctx *c, store_manifest *m, const char *media_type,
                      const void *data, size_t len, bool replace) {
    store *st = srv_stream_server(s)->st;
    char digest[STORE_DIGEST_LEN];
    hl_err err;
    bool existed = false;
    {
        /* peek: does the blob exist already? (for the progress message) */
        char tmp[STORE_DIGEST_LEN];
        memcpy(tmp, "sha256:", 7);
        existed = sha256_hex(data, len, tmp + 7) && store_blob_exists(st, tmp, NULL);
    }
    if (store_blob_put(st, data, len, digest, &err) != HL_OK) {
        srv_stream_fail(s, 500, "%s", err.msg);
        return false;
    }
    if (!existed) store_manifest_add_layer(&c->created, media_type, digest, len, NULL);
    if (replace) store_manifest_remove_layers(m, media_type);
    if (store_manifest_add_layer(m, media_type, digest, len, &err) != HL_OK) {
        srv_stream_fail(s, 500, "%s", err.msg);
        return false;
    }
    srv_stream_status(s, "%s layer %s", existed ? "using existing" : "creating new", digest);
    return true;
}

static bool put_json_layer(srv_stream *s, create_ctx *c, store_manifest *m, const char *media_type,
                           json_t *j) {
    char *text = json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (!text) {
        srv_stream_fail(s, 500, "out of memory");
        return false;
    }
    bool ok = put_layer(s, c, m, media_type, text, strlen(text), true);
    free(text);
    return ok;
}

/* The model layer from a GGUF blob; fills *config. */
static bool from_gguf_blob(srv_stream *s, const char *digest_in, store_manifest *m, json_t **config) {
    store *st = srv_stream_server(s)->st;
    char digest[STORE_DIGEST_LEN], path[4096];
    hl_err err;
    uint64_t size;
    if (!store_digest_parse(digest_in, digest)) {
        srv_stream_fail(s, 400, "invalid digest format");
        return false;
    }
    if (!store_blob_exists(st, digest, &size) ||
        store_blob_path(st, digest, path, sizeof path, &err) != HL_OK) {
        srv_stream_fail(s, 400, "blob \"%s\" not found: upload it with POST /api/blobs/%s first",
                        digest, digest);
        return false;
    }
    srv_stream_status(s, "parsing GGUF");
    gguf_file *g;
    if (gguf_open(path, &g, &err) != HL_OK) {
        srv_stream_fail(s, 400, "supplied file was not in GGUF format: %s", err.msg);
        /* no model can use it: drop it unless a manifest does */
        store_manifest junk = {0};
        if (store_manifest_add_layer(&junk, STORE_MT_MODEL, digest, size, NULL) == HL_OK)
            store_prune(st, &junk, NULL);
        store_manifest_free(&junk);
        return false;
    }
    gguf_str type;
    if (gguf_get_str(g, "general.type", &type) && !gguf_str_eq(type, "model")) {
        srv_stream_fail(s, 400, "GGUF files of type '%.*s' (adapters, projectors) are not supported "
                                "by hearth yet", (int)(type.len > 64 ? 64 : type.len), type.ptr);
        gguf_close(g);
        return false;
    }
    hl_status rc = ggufinfo_config(g, config, &err);
    gguf_close(g);
    if (rc != HL_OK) {
        srv_stream_fail(s, 500, "%s", err.msg);
        return false;
    }
    if (store_manifest_add_layer(m, STORE_MT_MODEL, digest, size, &err) != HL_OK) {
        srv_stream_fail(s, 500, "%s", err.msg);
        return false;
    }
    srv_stream_status(s, "using existing layer %s", digest);
    return true;
}

/* Quantize progress as Ollama streams it: the status with a placeholder digest, total
 * and completed (source bytes), at most every 100 ms; a client that left cancels. */
typedef struct quant_prog {
    srv_stream *s;
    char status[128];
    struct timespec last;
} quant_prog;

static bool quant_progress(void *ud, uint64_t done, uint64_t total) {
    quant_prog *q = ud;
    if (srv_stream_cancelled(q->s)) return false;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    double dt = (double)(now.tv_sec - q->last.tv_sec) + (double)(now.tv_nsec - q->last.tv_nsec) / 1e9;
    if (done < total && dt < 0.1) return true;
    q->last = now;
    json_t *j = json_pack("{s:s, s:s, s:I, s:I}", "status", q->status, "digest", "0000000000000000000",
                          "total", (json_int_t)total, "completed", (json_int_t)done);
    if (j) srv_stream_send(q->s, j);
    return true;
}

/* Replaces m's model layer with its weights converted to ftype (src/quant: llama.cpp's
 * rules, as `hearth quantize`), and config's file_type with the new one. */
static bool quantize_model_layer(srv_stream *s, create_ctx *c, store_manifest *m, json_t *config,
                                 quant_ftype ftype) {
    store *st = srv_stream_server(s)->st;
    const store_layer *model = NULL;
    for (size_t i = 0; i < m->n_layers; i++)
        if (!strcmp(m->layers[i].media_type, STORE_MT_MODEL)) model = &m->layers[i];
    if (!model) {
        srv_stream_fail(s, 400, "the model has no weights to quantize");
        return false;
    }
    char in_path[4096], tmp[4200];
    hl_err err;
    if (store_blob_path(st, model->digest, in_path, sizeof in_path, &err) != HL_OK) {
        srv_stream_fail(s, 500, "%s", err.msg);
        return false;
    }
    const char *from = json_string_value(json_object_get(config, "file_type"));
    quant_prog qp = {.s = s};
    snprintf(qp.status, sizeof qp.status, "quantizing %s model to %s", from ? from : "",
             quant_ftype_name(ftype));
    srv_stream_status(s, "%s", qp.status);
    /* next to the blobs (same file system); a crash leaves it to the startup sweep */
    snprintf(tmp, sizeof tmp, "%s-quantize-XXXXXX", in_path);
    int fd = mkstemp(tmp);
    if (fd < 0) {
        srv_stream_fail(s, 500, "quantize: cannot create a temporary file next to %s", in_path);
        return false;
    }
    close(fd);
    quant_stats qs;
    char digest[STORE_DIGEST_LEN];
    uint64_t size = 0;
    bool existed = false;
    hl_status rc = quant_model_file_progress(in_path, tmp, ftype, 0, quant_progress, &qp, &qs, &err);
    if (rc == HL_OK) rc = store_blob_import_file(st, tmp, digest, &size, &existed, &err);
    unlink(tmp);
    if (rc != HL_OK) {
        srv_stream_fail(s, rc == HL_ERR_NOMEM || rc == HL_ERR_IO ? 500 : 400, "quantize: %s",
                        err.msg);
        return false;
    }
    if (!existed) store_manifest_add_layer(&c->created, STORE_MT_MODEL, digest, size, NULL);
    store_manifest_remove_layers(m, STORE_MT_MODEL);
    if (store_manifest_add_layer(m, STORE_MT_MODEL, digest, size, &err) != HL_OK) {
        srv_stream_fail(s, 500, "%s", err.msg);
        return false;
    }
    json_object_set_new(config, "file_type", json_string(ggufinfo_file_type_name((uint32_t)ftype)));
    srv_stream_status(s, "%s layer %s", existed ? "using existing" : "creating new", digest);
    return true;
}

static bool set_licenses(srv_stream *s, create_ctx *c, store_manifest *m, json_t *lic) {
    if (!json_is_string(lic) && !json_is_array(lic)) {
        srv_stream_fail(s, 400, "license must be a string or an array of strings");
        return false;
    }
    store_manifest_remove_layers(m, STORE_MT_LICENSE);
    size_t n = json_is_array(lic) ? json_array_size(lic) : 1;
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_is_array(lic) ? json_array_get(lic, i) : lic;
        if (!json_is_string(v)) {
            srv_stream_fail(s, 400, "license must be a string or an array of strings");
            return false;
        }
        if (!put_layer(s, c, m, STORE_MT_LICENSE, json_string_value(v), json_string_length(v), false))
            return false;
    }
    return true;
}

static bool set_messages(srv_stream *s, create_ctx *c, store_manifest *m, json_t *msgs) {
    if (!json_is_array(msgs)) {
        srv_stream_fail(s, 400, "messages must be an array");
        return false;
    }
    json_t *clean = json_array();
    size_t i;
    json_t *msg;
    json_array_foreach(msgs, i, msg) {
        const char *role = json_string_value(json_object_get(msg, "role"));
        const char *content = json_string_value(json_object_get(msg, "content"));
        if (!role || !content) {
            json_decref(clean);
            srv_stream_fail(s, 400, "messages[%zu] needs string 'role' and 'content'", i);
            return false;
        }
        json_array_append_new(clean, json_pack("{s:s, s:s}", "role", role, "content", content));
    }
    bool ok = json_array_size(clean) == 0 || put_json_layer(s, c, m, STORE_MT_MESSAGES, clean);
    if (json_array_size(clean) == 0) store_manifest_remove_layers(m, STORE_MT_MESSAGES);
    json_decref(clean);
    return ok;
}

static bool set_params(srv_stream *s, create_ctx *c, store_manifest *m, json_t *base,
                       json_t *given) {
    if (!json_is_object(given)) {
        srv_stream_fail(s, 400, "parameters must be an object");
        return false;
    }
    json_t *merged = base ? json_deep_copy(base) : json_object();
    const char *key;
    json_t *val;
    json_object_foreach(given, key, val) {
        json_t *norm;
        hl_err err;
        if (modelfile_param_check_json(key, val, &norm, &err) != HL_OK) {
            json_decref(merged);
            srv_stream_fail(s, 400, "%s", err.msg);
            return false;
        }
        if (norm) json_object_set_new(merged, key, norm);
    }
    bool ok = json_object_size(merged) == 0 || put_json_layer(s, c, m, STORE_MT_PARAMS, merged);
    json_decref(merged);
    return ok;
}

static bool string_field(srv_stream *s, json_t *req, const char *key, const char **out) {
    json_t *v = json_object_get(req, key);
    *out = NULL;
    if (!v || json_is_null(v)) return true;
    if (!json_is_string(v)) {
        srv_stream_fail(s, 400, "%s must be a string", key);
        return false;
    }
    *out = json_string_value(v);
    return true;
}

static void create_run(srv_stream *s, void *arg) {
    create_ctx *c = arg;
    hl_server *srv = srv_stream_server(s);
    json_t *req = c->req;
    store_manifest m = {0};
    json_t *config = NULL, *base_params = NULL;
    hl_err err;
    bool from_model = false, ok = false;

    json_t *files = json_object_get(req, "files");
    const char *from = NULL;
    if (!string_field(s, req, "from", &from)) goto done;
    json_t *quant = json_object_get(req, "quantize");
    if (!quant) quant = json_object_get(req, "quantization");
    quant_ftype qtype;
    bool quantize = json_is_string(quant) && json_string_length(quant) > 0;
    if (quantize && !quant_ftype_parse(json_string_value(quant), &qtype)) {
        srv_stream_fail(s, 400, "unsupported quantization type %s (one of: %s)",
                        json_string_value(quant), quant_ftype_names());
        goto done;
    }
    json_t *adapters = json_object_get(req, "adapters");
    if (json_object_size(adapters) > 0 || json_array_size(adapters) > 0) {
        srv_stream_fail(s, 400, "adapters are not supported by hearth yet");
        goto done;
    }

    char digest[STORE_DIGEST_LEN];
    if (json_object_size(files) > 0) {
        if (json_object_size(files) > 1) {
            srv_stream_fail(s, 400, "hearth supports a single GGUF file per model (got %zu files)",
                            json_object_size(files));
            goto done;
        }
        const char *fname;
        json_t *fd;
        json_object_foreach(files, fname, fd) {
            if (!from_gguf_blob(s, json_string_value(fd), &m, &config)) goto done;
        }
    } else if (from && *from && store_digest_parse(from, digest)) {
        if (!from_gguf_blob(s, digest, &m, &config)) goto done;
    } else if (from && *from) {
        store_name bn;
        if (store_name_parse(from, &bn, NULL) != HL_OK) {
            srv_stream_fail(s, 400, "invalid model name '%s'", from);
            goto done;
        }
        store_model base;
        bool found;
        if (store_model_load(srv->st, &bn, &base, &found, &err) != HL_OK) {
            srv_stream_fail(s, 500, "%s", err.msg);
            goto done;
        }
        if (!found) {
            srv_stream_fail(s, 404, "model '%s' not found", from);
            goto done;
        }
        from_model = true;
        m.config = base.manifest.config;
        for (size_t i = 0; i < base.manifest.n_layers; i++) {
            const store_layer *l = &base.manifest.layers[i];
            store_manifest_add_layer(&m, l->media_type, l->digest, l->size, NULL);
            srv_stream_status(s, "using existing layer %s", l->digest);
        }
        config = json_deep_copy(base.config);
        base_params = json_incref(base.params);
        store_model_free(&base);
    } else {
        srv_stream_fail(s, 400, "neither 'from' or 'files' was specified");
        goto done;
    }
    if (srv_stream_cancelled(s)) goto done;
    if (quantize && !quantize_model_layer(s, c, &m, config, qtype)) goto done;
    if (srv_stream_cancelled(s)) goto done;

    const char *text;
    if (!string_field(s, req, "template", &text)) goto done;
    if (text && !put_layer(s, c, &m, STORE_MT_TEMPLATE, text, strlen(text), true)) goto done;
    if (!string_field(s, req, "system", &text)) goto done;
    if (text && !put_layer(s, c, &m, STORE_MT_SYSTEM, text, strlen(text), true)) goto done;
    json_t *lic = json_object_get(req, "license");
    if (lic && !json_is_null(lic) && !set_licenses(s, c, &m, lic)) goto done;
    json_t *msgs = json_object_get(req, "messages");
    if (msgs && !json_is_null(msgs) && !set_messages(s, c, &m, msgs)) goto done;
    json_t *params = json_object_get(req, "parameters");
    if (params && !json_is_null(params) && !set_params(s, c, &m, base_params, params)) goto done;
    static const char *config_fields[] = {"renderer", "parser", "requires"};
    for (size_t i = 0; i < 3; i++) {
        if (!string_field(s, req, config_fields[i], &text)) goto done;
        if (text && *text) json_object_set_new(config, config_fields[i], json_string(text));
    }
    if (srv_stream_cancelled(s)) goto done;

    char *cfg_text = json_dumps(config, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (!cfg_text) {
        srv_stream_fail(s, 500, "out of memory");
        goto done;
    }
    char cfg_digest[STORE_DIGEST_LEN];
    size_t cfg_len = strlen(cfg_text);
    memcpy(cfg_digest, "sha256:", 7);
    sha256_hex(cfg_text, cfg_len, cfg_digest + 7);
    bool cfg_existed = store_blob_exists(srv->st, cfg_digest, NULL);
    hl_status rc = store_blob_put(srv->st, cfg_text, cfg_len, cfg_digest, &err);
    free(cfg_text);
    if (rc != HL_OK) {
        srv_stream_fail(s, 500, "%s", err.msg);
        goto done;
    }
    if (!cfg_existed) store_manifest_add_layer(&c->created, STORE_MT_CONFIG, cfg_digest, cfg_len, NULL);
    snprintf(m.config.media_type, sizeof m.config.media_type, "%s", STORE_MT_CONFIG);
    memcpy(m.config.digest, cfg_digest, sizeof cfg_digest);
    m.config.size = cfg_len;

    srv_stream_status(s, "writing manifest");
    /* checks the blobs and replaces any old manifest under the store lock */
    rc = store_manifest_write(srv->st, &c->name, &m, &err);
    if (rc == HL_ERR_NOT_FOUND && from_model) /* a delete of the base won the race */
        srv_stream_fail(s, 404, "model '%s' not found", from);
    else if (rc == HL_ERR_NOT_FOUND)
        srv_stream_fail(s, 400, "%s: a model using it was deleted meanwhile; upload it again",
                        err.msg);
    else if (rc != HL_OK)
        srv_stream_fail(s, 500, "%s", err.msg);
    if (rc != HL_OK) goto done;
    ok = true;
    srv_stream_status(s, "success");
done:
    if (!ok) store_prune(srv->st, &c->created, NULL);
    store_manifest_free(&m);
    json_decref(config);
    json_decref(base_params);
}

enum MHD_Result srv_handle_create(srv_request *r) {
    enum MHD_Result ret;
    json_t *req = srv_parse_body(r, &ret);
    if (!req) return ret;
    const char *model = NULL, *legacy = NULL;
    bool stream;
    if (!srv_get_string(r, req, "model", &model, &ret) || !srv_get_string(r, req, "name", &legacy, &ret) ||
        !srv_get_bool(r, req, "stream", true, &stream, &ret)) {
        json_decref(req);
        return ret;
    }
    if (!model || !*model) model = legacy;
    create_ctx *c = calloc(1, sizeof *c);
    if (!c) {
        json_decref(req);
        return srv_reply_error(r, 500, "out of memory");
    }
    c->req = req;
    if (!model || store_name_parse(model, &c->name, NULL) != HL_OK) {
        create_ctx_free(c);
        return srv_reply_error(r, 400, "invalid model name");
    }
    json_t *files = json_object_get(req, "files");
    if (files && !json_is_null(files) && !json_is_object(files)) {
        create_ctx_free(c);
        return srv_reply_error(r, 400, "files must be an object of file name to digest");
    }
    const char *fname;
    json_t *fd;
    char tmp[STORE_DIGEST_LEN];
    json_object_foreach(files, fname, fd) {
        if (fname[0] == '/' || strstr(fname, "..") || fname[0] == '\0') {
            create_ctx_free(c);
            return srv_reply_error(r, 400, "file path must be relative");
        }
        if (!store_digest_parse(json_string_value(fd), tmp)) {
            create_ctx_free(c);
            return srv_reply_error(r, 400, "invalid digest format");
        }
    }
    /* Field types are checked before the stream starts, so a bad request is a 400. */
    json_t *params = json_object_get(req, "parameters");
    if (params && !json_is_null(params)) {
        if (!json_is_object(params)) {
            create_ctx_free(c);
            return srv_reply_error(r, 400, "parameters must be an object");
        }
        const char *key;
        json_t *val;
        json_object_foreach(params, key, val) {
            json_t *norm;
            hl_err err;
            if (modelfile_param_check_json(key, val, &norm, &err) != HL_OK) {
                create_ctx_free(c);
                return srv_reply_error(r, 400, "%s", err.msg);
            }
            json_decref(norm);
        }
    }
    static const char *string_fields[] = {"from", "template", "system", "renderer", "parser", "requires"};
    for (size_t i = 0; i < sizeof string_fields / sizeof string_fields[0]; i++) {
        json_t *v = json_object_get(req, string_fields[i]);
        if (v && !json_is_null(v) && !json_is_string(v)) {
            create_ctx_free(c);
            return srv_reply_error(r, 400, "json: cannot unmarshal into field \"%s\" of type string",
                                   string_fields[i]);
        }
    }
    json_t *msgs = json_object_get(req, "messages");
    if (msgs && !json_is_null(msgs) && !json_is_array(msgs)) {
        create_ctx_free(c);
        return srv_reply_error(r, 400, "messages must be an array");
    }
    return srv_stream_run(r, stream, create_run, c, create_ctx_free);
}
