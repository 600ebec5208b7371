/* test_store.c - sha256, model names, the blob/manifest store, Modelfiles, GGUF info,
 * host parsing. */
#define _GNU_SOURCE
#include <dirent.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/file.h"
#include "gguf/gguf.h"
#include "net/host.h"
#include "store/ggufinfo.h"
#include "store/modelfile.h"
#include "store/name.h"
#include "store/sha256.h"
#include "store/store.h"
#include "test.h"

/* ---- sha256 ---- */

TEST(store_sha256_known_vectors) {
    char hex[65];
    sha256_hex("", 0, hex);
    CHECK_STR(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    sha256_hex("abc", 3, hex);
    CHECK_STR(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    const char *m448 = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    sha256_hex(m448, strlen(m448), hex);
    CHECK_STR(hex, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    /* one million 'a', fed in odd-sized pieces to cross block boundaries */
    sha256_ctx c;
    CHECK(sha256_init(&c));
    char buf[997];
    memset(buf, 'a', sizeof buf);
    size_t left = 1000000;
    while (left) {
        size_t n = left < sizeof buf ? left : sizeof buf;
        sha256_update(&c, buf, n);
        left -= n;
    }
    sha256_final_hex(&c, hex);
    CHECK_STR(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(store_sha256_padding_edges) {
    /* 55, 56 and 64 bytes straddle the length-field boundary */
    char hex1[65], hex2[65];
    char msg[64];
    memset(msg, 'x', sizeof msg);
    for (size_t n = 54; n <= 64; n++) {
        sha256_hex(msg, n, hex1);
        sha256_ctx c;
        CHECK(sha256_init(&c));
        for (size_t i = 0; i < n; i++) sha256_update(&c, msg + i, 1);
        sha256_final_hex(&c, hex2);
        CHECK_STR(hex1, hex2);
    }
    sha256_hex(msg, 64, hex1);
    CHECK_STR(hex1, "7ce100971f64e7001e8fe5a51973ecdfe1ced42befe7ee8d5fd6219506b5393c"); /* sha256sum of 64 'x' */
    /* a copy of a running context finishes independently of the original */
    sha256_ctx a, b;
    CHECK(sha256_init(&a));
    sha256_update(&a, "ab", 2);
    CHECK(sha256_copy(&b, &a));
    sha256_update(&a, "c", 1);
    sha256_final_hex(&a, hex1);
    CHECK_STR(hex1, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    sha256_final_hex(&b, hex2);
    CHECK_STR(hex2, "fb8e20fc2e4c3f248c60c39bd652f3c1347298bb977b8b4d5903b85055620603"); /* "ab" */
    sha256_discard(&a); /* already finished: a no-op */
}

/* ---- names ---- */

static void name_str(const char *in, char *out, size_t cap) {
    store_name n;
    if (store_name_parse(in, &n, NULL) != HL_OK) {
        snprintf(out, cap, "INVALID");
        return;
    }
    snprintf(out, cap, "%s|%s|%s|%s", n.host, n.ns, n.model, n.tag);
}

TEST(store_name_parse_defaults_and_parts) {
    char s[1024];
    name_str("llama3.2", s, sizeof s);
    CHECK_STR(s, "registry.ollama.ai|library|llama3.2|latest");
    name_str("llama3.2:1b", s, sizeof s);
    CHECK_STR(s, "registry.ollama.ai|library|llama3.2|1b");
    name_str("me/story:v1", s, sizeof s);
    CHECK_STR(s, "registry.ollama.ai|me|story|v1");
    name_str("example.com:5000/team/m:q4_K_M", s, sizeof s);
    CHECK_STR(s, "example.com:5000|team|m|q4_K_M");
    name_str("https://example.com/team/m", s, sizeof s);
    CHECK_STR(s, "example.com|team|m|latest");
    name_str("_a-b.c", s, sizeof s);
    CHECK_STR(s, "registry.ollama.ai|library|_a-b.c|latest");
}

TEST(store_name_invalid) {
    const char *bad[] = {"", ":tag", "m:", "-m", "a/b/c/d", "ns.dot/m", "m:t/x", "m!", "m:t:u",
                         "/m", "m/", "a b"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        store_name n;
        hl_err err;
        CHECK_MSG(store_name_parse(bad[i], &n, &err) == HL_ERR_INVALID, "'%s' accepted", bad[i]);
        CHECK_STR(err.msg, "invalid model name");
    }
    char long_part[100];
    memset(long_part, 'a', 81);
    long_part[81] = '\0';
    CHECK(!store_name_valid(long_part));
    long_part[80] = '\0';
    CHECK(store_name_valid(long_part));
}

TEST(store_name_display_and_equal) {
    store_name a, b;
    char buf[512];
    CHECK_OK(store_name_parse("Llama3", &a, NULL), (hl_err *)NULL);
    store_name_display(&a, buf, sizeof buf);
    CHECK_STR(buf, "Llama3:latest");
    CHECK_OK(store_name_parse("registry.ollama.ai/library/llama3:LATEST", &b, NULL), (hl_err *)NULL);
    CHECK(store_name_equal(&a, &b));
    CHECK_OK(store_name_parse("me/x:1", &a, NULL), (hl_err *)NULL);
    store_name_display(&a, buf, sizeof buf);
    CHECK_STR(buf, "me/x:1");
    CHECK_OK(store_name_parse("h.io/me/x", &a, NULL), (hl_err *)NULL);
    store_name_display(&a, buf, sizeof buf);
    CHECK_STR(buf, "h.io/me/x:latest");
    CHECK(!store_name_equal(&a, &b));
}

/* ---- digests, blobs, manifests ---- */

TEST(store_digest_parse_forms) {
    char d[STORE_DIGEST_LEN];
    const char *hex = "ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef0123456789";
    char in[100];
    snprintf(in, sizeof in, "sha256-%s", hex);
    CHECK(store_digest_parse(in, d));
    CHECK_STR(d, "sha256:abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123456789");
    snprintf(in, sizeof in, "sha256:%s", hex);
    CHECK(store_digest_parse(in, d));
    CHECK(!store_digest_parse("sha256:abc", d));
    CHECK(!store_digest_parse("md5:abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123456789", d));
    snprintf(in, sizeof in, "sha256:%.63sg", hex);
    CHECK(!store_digest_parse(in, d));
    CHECK(!store_digest_parse(NULL, d));
}

TEST(store_blobs_layout_and_verification) {
    char root[1024];
    snprintf(root, sizeof root, "%s/models", test_tmpdir());
    store *s;
    hl_err err;
    CHECK_OK(store_open(root, &s, &err), &err);
    char d[STORE_DIGEST_LEN];
    CHECK_OK(store_blob_put(s, "abc", 3, d, &err), &err);
    CHECK_STR(d, "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    char path[1200];
    snprintf(path, sizeof path, "%s/blobs/sha256-ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad", root);
    struct stat st;
    CHECK(stat(path, &st) == 0 && st.st_size == 3);
    uint64_t size = 0;
    CHECK(store_blob_exists(s, "sha256-BA7816BF8F01CFEA414140DE5DAE2223B00361A396177A9CB410FF61F20015AD", &size));
    CHECK_EQ_INT(size, 3);

    /* a streamed blob with the wrong expected digest is refused and leaves nothing */
    store_blob_writer *w;
    CHECK_OK(store_blob_writer_open(s, &w, &err), &err);
    CHECK_OK(store_blob_writer_write(w, "hello", 5, &err), &err);
    hl_status rc = store_blob_writer_commit(
        w, "sha256:0000000000000000000000000000000000000000000000000000000000000000", NULL, NULL, &err);
    CHECK_EQ_INT(rc, HL_ERR_INVALID);
    CHECK(strstr(err.msg, "digest mismatch, expected \"sha256:0000") != NULL);
    CHECK(strstr(err.msg, "got \"sha256:2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824\""));
    CHECK(!store_blob_exists(s, "sha256:2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824", NULL));
    /* no temp files left behind */
    char blobs[1100];
    snprintf(blobs, sizeof blobs, "%s/blobs", root);
    int n_files = 0;
    DIR *dir = opendir(blobs);
    CHECK(dir != NULL);
    struct dirent *e;
    while ((e = readdir(dir)) != NULL)
        if (e->d_name[0] != '.' || strncmp(e->d_name, ".partial", 8) == 0) n_files++;
    closedir(dir);
    CHECK_EQ_INT(n_files, 1);
    store_close(s);
}

static void make_manifest(store *s, store_manifest *m, const char *model_text, const char *system) {
    char d[STORE_DIGEST_LEN];
    memset(m, 0, sizeof *m);
    store_blob_put(s, model_text, strlen(model_text), d, NULL);
    store_manifest_add_layer(m, STORE_MT_MODEL, d, strlen(model_text), NULL);
    store_blob_put(s, system, strlen(system), d, NULL);
    store_manifest_add_layer(m, STORE_MT_SYSTEM, d, strlen(system), NULL);
    store_blob_put(s, "{}", 2, d, NULL);
    snprintf(m->config.media_type, sizeof m->config.media_type, "%s", STORE_MT_CONFIG);
    snprintf(m->config.digest, sizeof m->config.digest, "%s", d);
    m->config.size = 2;
}

TEST(store_manifest_roundtrip_list_copy_delete) {
    char root[1024];
    snprintf(root, sizeof root, "%s/models", test_tmpdir());
    store *s;
    hl_err err;
    CHECK_OK(store_open(root, &s, &err), &err);
    store_manifest m;
    make_manifest(s, &m, "MODEL-A", "be brief");
    store_name n, n2, canon;
    CHECK_OK(store_name_parse("Story:v1", &n, NULL), (hl_err *)NULL);
    CHECK_OK(store_manifest_write(s, &n, &m, &err), &err);
    char path[1200];
    snprintf(path, sizeof path, "%s/manifests/registry.ollama.ai/library/Story/v1", root);
    char *text;
    size_t len;
    CHECK_OK(hl_file_read(path, &text, &len, &err), &err);
    CHECK(strstr(text, "\"schemaVersion\":2") != NULL);
    CHECK(strstr(text, STORE_MT_MANIFEST) != NULL);
    CHECK(strstr(text, "\"mediaType\":\"application/vnd.ollama.image.model\"") != NULL);
    char manifest_hex[65];
    sha256_hex(text, len, manifest_hex);
    free(text);

    /* case-insensitive lookup finds the stored spelling */
    CHECK_OK(store_name_parse("story:V1", &n2, NULL), (hl_err *)NULL);
    CHECK(store_find(s, &n2, &canon));
    CHECK_STR(canon.model, "Story");
    CHECK_STR(canon.tag, "v1");
    store_manifest back;
    char digest_hex[65];
    CHECK_OK(store_manifest_read(s, &canon, &back, digest_hex, NULL, &err), &err);
    CHECK_STR(digest_hex, manifest_hex);
    CHECK_EQ_INT(back.n_layers, 2);
    CHECK_STR(back.layers[1].media_type, STORE_MT_SYSTEM);
    CHECK_EQ_INT(store_manifest_size(&back), 7 + 8 + 2);
    store_manifest_free(&back);

    /* copy shares blobs; deleting one copy keeps them, deleting the last removes them */
    CHECK_OK(store_name_parse("me/other", &n2, NULL), (hl_err *)NULL);
    CHECK_OK(store_copy(s, &n, &n2, &err), &err);
    store_entry *entries;
    size_t count;
    CHECK_OK(store_list(s, &entries, &count, &err), &err);
    CHECK_EQ_INT(count, 2);
    CHECK_STR(entries[0].digest_hex, manifest_hex);
    store_list_free(entries, count);
    const char *model_digest = m.layers[0].digest;
    CHECK_OK(store_delete(s, &n, &err), &err);
    CHECK(!store_find(s, &n, NULL));
    CHECK(store_blob_exists(s, model_digest, NULL));
    CHECK_OK(store_delete(s, &n2, &err), &err);
    CHECK(!store_blob_exists(s, model_digest, NULL));
    /* empty manifest directories are pruned */
    snprintf(path, sizeof path, "%s/manifests/registry.ollama.ai", root);
    struct stat st;
    CHECK(stat(path, &st) != 0);
    store_manifest_free(&m);
    store_close(s);
}

TEST(store_manifest_parse_rejects_bad_json) {
    store_manifest m;
    hl_err err;
    CHECK(store_manifest_parse("{", 1, &m, &err) == HL_ERR_FORMAT);
    const char *no_layers = "{\"config\":{}}";
    CHECK(store_manifest_parse(no_layers, strlen(no_layers), &m, &err) == HL_ERR_FORMAT);
    const char *bad_digest = "{\"config\":{\"mediaType\":\"x\",\"digest\":\"sha256:12\",\"size\":1},\"layers\":[]}";
    CHECK(store_manifest_parse(bad_digest, strlen(bad_digest), &m, &err) == HL_ERR_FORMAT);
    CHECK(strstr(err.msg, "invalid digest") != NULL);
}

TEST(store_open_uses_hearth_models_not_ollama_models) {
    char dir[1024], odir[1024];
    snprintf(dir, sizeof dir, "%s/hm", test_tmpdir());
    snprintf(odir, sizeof odir, "%s/om", test_tmpdir());
    setenv("HEARTH_MODELS", dir, 1);
    setenv("OLLAMA_MODELS", odir, 1);
    store *s;
    hl_err err;
    CHECK_OK(store_open(NULL, &s, &err), &err);
    CHECK_STR(store_root(s), dir);
    store_close(s);
    struct stat st;
    CHECK(stat(odir, &st) != 0);
    unsetenv("HEARTH_MODELS");
    setenv("HOME", test_tmpdir(), 1);
    CHECK_OK(store_open(NULL, &s, &err), &err);
    char want[1100];
    snprintf(want, sizeof want, "%s/.hearth/models", test_tmpdir());
    CHECK_STR(store_root(s), want);
    store_close(s);
}

/* ---- Modelfile ---- */

TEST(store_modelfile_every_command) {
    const char *text =
        "\xEF\xBB\xBF# a comment\n"
        "from ./m.gguf\n"
        "PARAMETER temperature 0.5\n"
        "Parameter num_ctx 4096\n"
        "PARAMETER stop \"<|end|>\"\n"
        "PARAMETER stop User:\n"
        "PARAMETER use_mmap false\n"
        "PARAMETER mirostat 1\n"
        "TEMPLATE \"\"\"{{ .System }}\n{{ .Prompt }}\"\"\"\n"
        "SYSTEM \"say \\\"hi\\\"\"\n"
        "\n"
        "MESSAGE user Hello there\n"
        "MESSAGE Assistant \"\"\"Hi!\nHow can I help?\"\"\"\n"
        "LICENSE MIT\n"
        "LICENSE \"\"\"Apache\n2.0\"\"\"\n"
        "RENDERER qwen3\n"
        "PARSER qwen3\n"
        "REQUIRES 0.14.0\n";
    modelfile mf;
    hl_err err;
    CHECK_OK(modelfile_parse(text, strlen(text), &mf, &err), &err);
    CHECK_EQ_INT(mf.n, 16);
    CHECK_EQ_INT(mf.cmds[0].kind, MF_FROM);
    CHECK_STR(mf.cmds[0].value, "./m.gguf");
    CHECK_EQ_INT(mf.cmds[0].line, 2);
    CHECK_STR(mf.cmds[3].value, "<|end|>");
    CHECK_EQ_INT(mf.cmds[7].kind, MF_TEMPLATE);
    CHECK_STR(mf.cmds[7].value, "{{ .System }}\n{{ .Prompt }}");
    CHECK_STR(mf.cmds[8].value, "say \"hi\"");
    CHECK_EQ_INT(mf.cmds[8].line, 11);
    CHECK_STR(mf.cmds[10].name, "assistant");
    CHECK_EQ_INT(mf.cmds[11].line, 16);
    CHECK_STR(modelfile_from(&mf), "./m.gguf");

    json_t *req = json_object();
    CHECK_OK(modelfile_to_create_request(&mf, req, &err), &err);
    char *s = json_dumps(req, JSON_SORT_KEYS | JSON_COMPACT);
    CHECK_STR(s, "{\"from\":\"./m.gguf\",\"license\":[\"MIT\",\"Apache\\n2.0\"],"
                 "\"messages\":[{\"content\":\"Hello there\",\"role\":\"user\"},"
                 "{\"content\":\"Hi!\\nHow can I help?\",\"role\":\"assistant\"}],"
                 "\"parameters\":{\"num_ctx\":4096,\"stop\":[\"<|end|>\",\"User:\"],"
                 "\"temperature\":0.5,\"use_mmap\":false},\"parser\":\"qwen3\","
                 "\"renderer\":\"qwen3\",\"requires\":\"0.14.0\",\"system\":\"say \\\"hi\\\"\","
                 "\"template\":\"{{ .System }}\\n{{ .Prompt }}\"}");
    free(s);
    json_decref(req);
    modelfile_free(&mf);
}

static void expect_mf_error(const char *text, const char *want) {
    modelfile mf;
    hl_err err;
    hl_status st = modelfile_parse(text, strlen(text), &mf, &err);
    CHECK_MSG(st != HL_OK, "accepted: %s", text);
    CHECK_MSG(strstr(err.msg, want) != NULL, "'%s' lacks '%s'", err.msg, want);
}

TEST(store_modelfile_errors_name_the_line) {
    expect_mf_error("FROM x\n\nBOGUS y\n", "(line 3): command must be one of \"from\"");
    expect_mf_error("FROM x\nPARAMETER nope 1\n", "(line 2): unknown parameter 'nope'");
    expect_mf_error("FROM x\nPARAMETER temperature hot\n", "(line 2): invalid float value [hot]");
    expect_mf_error("FROM x\nPARAMETER top_k 1.5\n", "(line 2): invalid int value [1.5]");
    expect_mf_error("FROM x\nPARAMETER use_mmap maybe\n", "(line 2): invalid bool value [maybe]");
    expect_mf_error("FROM x\nMESSAGE tool hi\n", "(line 2): message role must be one of");
    expect_mf_error("FROM x\nSYSTEM \"\"\"never\nclosed\n", "(line 2): unexpected EOF");
    expect_mf_error("FROM x\nSYSTEM \"open\n", "(line 2): unexpected EOF");
    expect_mf_error("FROM x\nREQUIRES soon\n", "(line 2): requires must be a valid semver");
    expect_mf_error("FROM\n", "(line 1): missing value for FROM");
    expect_mf_error("SYSTEM hi\n", "no FROM line");
    expect_mf_error("FROM x\nSYSTEM \"\"\"a\"\"\" trailing\n", "(line 2): unexpected text after closing quote");
    expect_mf_error("FROM x\nPARAMETER\n", "(line 2): missing name for PARAMETER");
}

TEST(store_modelfile_adapter_rejected_clearly) {
    const char *text = "FROM x\nADAPTER ./lora.gguf\n";
    modelfile mf;
    hl_err err;
    CHECK_OK(modelfile_parse(text, strlen(text), &mf, &err), &err);
    json_t *req = json_object();
    hl_status st = modelfile_to_create_request(&mf, req, &err);
    json_decref(req);
    modelfile_free(&mf);
    CHECK_EQ_INT(st, HL_ERR_UNSUPPORTED);
    CHECK(strstr(err.msg, "(line 2): ADAPTER is not supported") != NULL);
}

TEST(store_param_json_types) {
    json_t *out;
    hl_err err;
    json_t *v = json_real(40.7);
    CHECK_OK(modelfile_param_check_json("top_k", v, &out, &err), &err);
    CHECK(json_is_integer(out) && json_integer_value(out) == 40);
    json_decref(out);
    json_decref(v);
    v = json_string("x");
    CHECK(modelfile_param_check_json("temperature", v, &out, &err) == HL_ERR_INVALID);
    CHECK_STR(err.msg, "option \"temperature\" must be of type float32");
    CHECK_OK(modelfile_param_check_json("stop", v, &out, &err), &err);
    CHECK(json_is_array(out) && json_array_size(out) == 1);
    json_decref(out);
    json_decref(v);
    v = json_pack("[i]", 3);
    CHECK(modelfile_param_check_json("stop", v, &out, &err) == HL_ERR_INVALID);
    json_decref(v);
    v = json_true();
    CHECK(modelfile_param_check_json("bogus", v, &out, &err) == HL_ERR_INVALID);
    CHECK_STR(err.msg, "unknown parameter 'bogus'");
}

/* ---- GGUF info ---- */

TEST(store_ggufinfo_human_number_and_file_types) {
    char b[32];
    ggufinfo_human_number(292800, b, sizeof b);
    CHECK_STR(b, "293K");
    ggufinfo_human_number(8030000000ull, b, sizeof b);
    CHECK_STR(b, "8.0B");
    ggufinfo_human_number(7000000000ull, b, sizeof b);
    CHECK_STR(b, "7B");
    ggufinfo_human_number(1500000, b, sizeof b);
    CHECK_STR(b, "1.5M");
    ggufinfo_human_number(999, b, sizeof b);
    CHECK_STR(b, "999");
    CHECK_STR(ggufinfo_file_type_name(15), "Q4_K_M");
    CHECK_STR(ggufinfo_file_type_name(32), "BF16");
    CHECK_STR(ggufinfo_file_type_name(4), "unknown");
    CHECK_STR(ggufinfo_file_type_name(1000), "unknown");
}

TEST(store_ggufinfo_config_and_model_info) {
    gguf_writer *w = gguf_writer_create();
    CHECK(w != NULL);
    gguf_writer_set_str(w, "general.architecture", "llama");
    gguf_writer_set_str(w, "general.name", "tiny");
    gguf_writer_set_u32(w, "general.file_type", 1);
    gguf_writer_set_u32(w, "llama.context_length", 256);
    gguf_writer_set_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
    const char *toks[] = {"a", "b", "c", "d", "e", "f"};
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, 6);
    int32_t small[3] = {1, -2, 3};
    gguf_writer_set_arr(w, "x.small", GGUF_TYPE_INT32, small, 3);
    float data[8] = {0};
    int64_t ne[2] = {4, 2};
    hl_err err;
    CHECK_OK(gguf_writer_add_tensor(w, "t", 0, 2, ne, data, sizeof data, &err), &err);
    uint8_t *buf;
    size_t len;
    CHECK_OK(gguf_writer_write_memory(w, &buf, &len, &err), &err);
    gguf_writer_destroy(w);
    gguf_file *g;
    CHECK_OK(gguf_open_memory(buf, len, &g, &err), &err);
    json_t *cfg, *mi, *tensors;
    CHECK_OK(ggufinfo_config(g, &cfg, &err), &err);
    char *s = json_dumps(cfg, JSON_SORT_KEYS | JSON_COMPACT);
    CHECK_STR(s, "{\"architecture\":\"amd64\",\"file_type\":\"F16\",\"model_families\":[\"llama\"],"
                 "\"model_family\":\"llama\",\"model_format\":\"gguf\",\"model_type\":\"8\",\"os\":\"linux\"}");
    free(s);
    json_decref(cfg);
    CHECK_OK(ggufinfo_model_info(g, false, &mi, &tensors, &err), &err);
    CHECK(tensors == NULL);
    CHECK(json_object_get(mi, "general.name") == NULL);
    CHECK_EQ_INT(json_array_size(json_object_get(mi, "tokenizer.ggml.tokens")), 0);
    CHECK_EQ_INT(json_integer_value(json_array_get(json_object_get(mi, "x.small"), 1)), -2);
    CHECK_EQ_INT(json_integer_value(json_object_get(mi, "general.parameter_count")), 8);
    CHECK_NEAR(json_real_value(json_object_get(mi, "llama.attention.layer_norm_rms_epsilon")), 1e-5, 1e-12);
    json_decref(mi);
    CHECK_OK(ggufinfo_model_info(g, true, &mi, &tensors, &err), &err);
    CHECK_EQ_INT(json_array_size(json_object_get(mi, "tokenizer.ggml.tokens")), 6);
    CHECK_EQ_INT(json_array_size(tensors), 1);
    CHECK_STR(json_string_value(json_object_get(json_array_get(tensors, 0), "type")), "F32");
    json_decref(mi);
    json_decref(tensors);
    gguf_close(g);
    free(buf);
}

/* Metadata strings that are not valid UTF-8 keep their valid characters; only the
 * invalid bytes become U+FFFD. */
TEST(store_ggufinfo_invalid_utf8_strings) {
    gguf_writer *w = gguf_writer_create();
    CHECK(w != NULL);
    if (!w) return;
    gguf_writer_set_str(w, "general.architecture", "llama");
    gguf_writer_set_str(w, "x.text", "caf\xC3\xA9 \xFF\xC3 \xE2\x82\xAC");
    uint8_t *buf;
    size_t len;
    hl_err err;
    CHECK_OK(gguf_writer_write_memory(w, &buf, &len, &err), &err);
    gguf_writer_destroy(w);
    gguf_file *g;
    CHECK_OK(gguf_open_memory(buf, len, &g, &err), &err);
    json_t *mi;
    CHECK_OK(ggufinfo_model_info(g, false, &mi, NULL, &err), &err);
    CHECK_STR(json_string_value(json_object_get(mi, "x.text")),
              "caf\xC3\xA9 \xEF\xBF\xBD\xEF\xBF\xBD \xE2\x82\xAC");
    json_decref(mi);
    gguf_close(g);
    free(buf);
}

/* ---- hosts ---- */

static void host_str(const char *in, char *out, size_t cap) {
    net_host h;
    if (net_host_parse(in, &h, NULL) != HL_OK) {
        snprintf(out, cap, "INVALID");
        return;
    }
    snprintf(out, cap, "%s://%s:%d", h.scheme, h.host, h.port);
}

TEST(store_net_host_forms) {
    char s[512];
    host_str(NULL, s, sizeof s);
    CHECK_STR(s, "http://127.0.0.1:11434");
    host_str("0.0.0.0", s, sizeof s);
    CHECK_STR(s, "http://0.0.0.0:11434");
    host_str(":8080", s, sizeof s);
    CHECK_STR(s, "http://:8080");
    host_str("localhost:9", s, sizeof s);
    CHECK_STR(s, "http://localhost:9");
    host_str("http://example.com", s, sizeof s);
    CHECK_STR(s, "http://example.com:80");
    host_str("https://example.com", s, sizeof s);
    CHECK_STR(s, "https://example.com:443");
    host_str(" \"http://1.2.3.4:5/path\" ", s, sizeof s);
    CHECK_STR(s, "http://1.2.3.4:5");
    host_str("[::1]:7", s, sizeof s);
    CHECK_STR(s, "http://::1:7");
    host_str("ftp://x", s, sizeof s);
    CHECK_STR(s, "INVALID");
    host_str("x:99999", s, sizeof s);
    CHECK_STR(s, "INVALID");
    net_host h, c;
    net_host_parse(":8080", &h, NULL);
    c = net_host_connectable(&h);
    CHECK_STR(c.host, "127.0.0.1");
    setenv("OLLAMA_HOST", "1.1.1.1:1", 1);
    setenv("HEARTH_HOST", "2.2.2.2:2", 1);
    CHECK_OK(net_host_from_env(&h, NULL), (hl_err *)NULL);
    CHECK_STR(h.host, "2.2.2.2");
    unsetenv("HEARTH_HOST");
    CHECK_OK(net_host_from_env(&h, NULL), (hl_err *)NULL);
    CHECK_STR(h.host, "1.1.1.1");
}

/* Startup garbage collection: unfinished writes and unreferenced blobs go, the blobs
 * a manifest uses stay; with an unreadable manifest no blob is removed. */
TEST(store_gc_removes_partials_and_unused_blobs) {
    char root[1024];
    snprintf(root, sizeof root, "%s/gc-models", test_tmpdir());
    store *s;
    hl_err err;
    CHECK_OK(store_open(root, &s, &err), &err);
    store_manifest m;
    make_manifest(s, &m, "GC-MODEL", "gc system");
    store_name n;
    CHECK_OK(store_name_parse("gc:latest", &n, NULL), (hl_err *)NULL);
    CHECK_OK(store_manifest_write(s, &n, &m, &err), &err);
    char unused[STORE_DIGEST_LEN];
    CHECK_OK(store_blob_put(s, "nobody uses me", 14, unused, &err), &err);
    char partial[1200], other[1200];
    snprintf(partial, sizeof partial, "%s/blobs/.partial-abc123", root);
    snprintf(other, sizeof other, "%s/blobs/README", root);
    CHECK_OK(hl_file_write(partial, "half", 4, &err), &err);
    CHECK_OK(hl_file_write(other, "not a blob", 10, &err), &err);
    size_t removed = 0;
    CHECK_OK(store_gc(s, &removed, &err), &err);
    CHECK_EQ_INT((int)removed, 2);
    CHECK(!store_blob_exists(s, unused, NULL));
    CHECK(access(partial, F_OK) != 0);
    CHECK(access(other, F_OK) == 0); /* not ours: kept */
    CHECK(store_blob_exists(s, m.config.digest, NULL));
    for (size_t i = 0; i < m.n_layers; i++) CHECK(store_blob_exists(s, m.layers[i].digest, NULL));
    /* a manifest that cannot be read: keep every blob */
    CHECK_OK(store_blob_put(s, "nobody uses me", 14, unused, &err), &err);
    char bad[1200];
    snprintf(bad, sizeof bad, "%s/manifests/registry.ollama.ai/library/gc/broken", root);
    CHECK_OK(hl_file_write(bad, "{not json", 9, &err), &err);
    CHECK_OK(store_gc(s, &removed, &err), &err);
    CHECK_EQ_INT((int)removed, 0);
    CHECK(store_blob_exists(s, unused, NULL));
    store_manifest_free(&m);
    store_close(s);
}
