/* test_grammar.c - the JSON schema compiler, the byte recognizer and the token mask
 * (src/grammar/grammar.h). */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"
#include "gguf/gguf.h"
#include "schema_check.h"
#include "schemas.h"
#include "test.h"
#include "tok/tok.h"

static gram_schema *compile_str(const char *fmt, hl_err *err) {
    gram_schema *s = NULL;
    if (gram_compile(fmt, strlen(fmt), &s, err) != HL_OK) return NULL;
    return s;
}

/* Whether text is a complete value of the schema (the recognizer alone). */
static int accepts(const char *schema, const char *text) {
    hl_err err;
    gram_schema *s = compile_str(schema, &err);
    if (!s) return -1;
    gram_matcher *m = NULL;
    if (gram_matcher_create(s, NULL, NULL, &m, &err) != HL_OK) {
        gram_schema_free(s);
        return -1;
    }
    int r = gram_matcher_feed(m, text, strlen(text)) && gram_matcher_accepting(m);
    gram_matcher_free(m);
    gram_schema_free(s);
    return r;
}

typedef struct accept_case {
    const char *schema, *text;
    int want;
} accept_case;

TEST(grammar_recognizer_accepts_and_rejects) {
    static const accept_case cases[] = {
        {"\"json\"", "{\"a\": [1, 2.5e3, true, null, {\"b\": \"x\\u00e9\"}]}", 1},
        {"\"json\"", " {}", 1},
        {"\"json\"", "  {}", 0}, /* one space, or a newline and indentation */
        {"\"json\"", "{\n\t\t\"a\": 1,\n  \"b\": [\n    2\n  ]\n}", 1},
        {"\"json\"", "{\n\n}", 0},
        {"\"json\"", "{\n                    }", 1},  /* 20 blanks */
        {"\"json\"", "{\n                     }", 0}, /* 21 */
        {"\"json\"", "[1]", 0}, /* Ollama's json: an object */
        {"\"json\"", "{} ", 0}, /* nothing after the value */
        {"\"json\"", "{\"a\":\"\\ud800\"}", 0}, /* no surrogate escapes */
        {"\"json\"", "{\"a\":\"\xc3\"}", 0},    /* broken UTF-8 */
        {"\"json\"", "{\"a\":01}", 0},
        {"\"json\"", "{  }", 0},
        {k_test_schemas[0], "{\"name\":\"Lily\",\"age\":3}", 1},
        {k_test_schemas[0], "{\"age\":3,\"name\":\"Lily\"}", 1},
        {k_test_schemas[0], "{\"name\":\"Lily\"}", 0},                 /* required */
        {k_test_schemas[0], "{\"name\":\"Lily\",\"age\":3.5}", 0},     /* integer */
        {k_test_schemas[0], "{\"name\":\"Lily\",\"age\":3,\"x\":1}", 0}, /* additional */
        {k_test_schemas[0], "{\"name\":\"Lily\",\"name\":\"x\",\"age\":3}", 0},
        {k_test_schemas[0], "{\"name\":\"Lily is very old\",\"age\":3}", 0}, /* maxLength */
        {k_test_schemas[2], "{\"xs\":[0,100,7]}", 1},
        {k_test_schemas[2], "{\"xs\":[]}", 0},
        {k_test_schemas[2], "{\"xs\":[101]}", 0},
        {k_test_schemas[2], "{\"xs\":[1,2,3,4,5]}", 0},
        {k_test_schemas[2], "{\"xs\":[-1]}", 0},
        {k_test_schemas[3], "{\"color\":\"red\",\"size\":12}", 1},
        {k_test_schemas[3], "{\"color\":\"red\",\"size\":1}", 1},
        {k_test_schemas[3], "{\"color\":\"pink\",\"size\":1}", 0},
        {k_test_schemas[3], "{\"color\":\"red\",\"size\":13}", 0},
        {k_test_schemas[4], "{\"kind\":\"point\",\"x\":-999.5}", 1},
        {k_test_schemas[4], "{\"kind\":\"point\",\"x\":1000.5}", 0},
        {k_test_schemas[4], "{\"kind\":\"point\",\"x\":1000}", 1},
        {k_test_schemas[5], "{\"v\":null}", 1},
        {k_test_schemas[5], "{\"v\":\"abc\"}", 1},
        {k_test_schemas[5], "{\"v\":-12}", 1},
        {k_test_schemas[5], "{\"v\":true}", 0},
        {k_test_schemas[6], "{\"a\":{\"x\":1,\"y\":2},\"b\":{\"y\":0,\"x\":-3}}", 1},
        {k_test_schemas[6], "{\"a\":{\"x\":1},\"b\":{\"y\":0,\"x\":-3}}", 0},
        {k_test_schemas[9], "{\"shape\":{\"type\":\"circle\",\"r\":2.5}}", 1},
        {k_test_schemas[9], "{\"shape\":{\"type\":\"square\",\"side\":3}}", 1},
        {k_test_schemas[9], "{\"shape\":{\"type\":\"square\",\"r\":3}}", 0},
        {k_test_schemas[10], "{\"code\":\"a\\nb\"}", 1},
        {k_test_schemas[10], "{\"code\":\"\xc3\xa9\xc3\xa9\xc3\xa9\"}", 1},
        {k_test_schemas[10], "{\"code\":\"ab\"}", 0},
        {k_test_schemas[12], "\"maybe\"", 1},
        {k_test_schemas[12], "\"may\"", 0},
        {k_test_schemas[14], "-10", 1},
        {k_test_schemas[14], "-9", 0},
        {k_test_schemas[14], "-51", 0},
        {k_test_schemas[14], "10", 0},
        {k_test_schemas[15], "{\"p\":4.99}", 1},
        {k_test_schemas[15], "{\"p\":0}", 0},
        {k_test_schemas[15], "{\"p\":5}", 0},
        {k_test_schemas[20], "{\"v\":1,\"kids\":[{\"v\":2,\"kids\":[{\"v\":3}]}]}", 1},
        {k_test_schemas[20], "{\"v\":1,\"kids\":[{\"v\":2},{\"v\":3}]}", 0},
        {k_test_schemas[21], "{\"x\":null}", 1},
        {k_test_schemas[21], "{\"x\":6}", 0},
        {k_test_schemas[23], "{}", 1},
        {k_test_schemas[23], "{\"a\":1}", 0},
        {k_test_schemas[24], "{\"a\\\"b\":true,\"caf\xc3\xa9\":\"\xc3\xbc" "ber\"}", 1},
        {"{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\"},\"properties\":{\"a\":"
         "{\"type\":\"string\"}}}", "{\"a\":\"s\",\"ab\":1,\"b\":2}", 1},
        {"{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\"},\"properties\":{\"a\":"
         "{\"type\":\"string\"}}}", "{\"a\":1}", 0},
        {"{\"type\":\"object\",\"additionalProperties\":true}", "{\"\\u0041\":[{}]}", 1},
        {"{\"type\":\"string\",\"format\":\"date\"}", "\"x\"", 1},
        {k_test_schemas[26], "\"yes!\"", 1},
        {k_test_schemas[26], "\"no\"", 1},
        {k_test_schemas[26], "\"nope\"", 0},
        {k_test_schemas[25], "{\"id\":\"AB-123\",\"mail\":\"ann@ex.org\"}", 1},
        {k_test_schemas[25], "{\"id\":\"AB-12\",\"mail\":\"ann@ex.org\"}", 0},
        {k_test_schemas[25], "{\"id\":\"ab-123\",\"mail\":\"ann@ex.org\"}", 0},
        {k_test_schemas[25], "{\"id\":\"AB-123\",\"mail\":\"ann@ex.net\"}", 0},
        {"{\"type\":\"string\",\"pattern\":\"ab\"}", "\"xxabyy\"", 1}, /* a search */
        {"{\"type\":\"string\",\"pattern\":\"ab\"}", "\"xaxb\"", 0},
        {"{\"type\":\"string\",\"pattern\":\"^a.b$\"}", "\"a-b\"", 1},
        {"{\"type\":\"string\",\"pattern\":\"^a.b$\"}", "\"a\\u0041b\"", 0}, /* no escapes */
        {"{\"type\":\"string\",\"pattern\":\"^\\\\d{2,}\\\\w?$\"}", "\"123_\"", 1},
        {"{\"type\":\"string\",\"pattern\":\"^\\\\d{2,}\\\\w?$\"}", "\"1x\"", 0},
        {"{\"type\":\"string\",\"pattern\":\"^[^0-9]+$\"}", "\"abc\"", 1},
        {"{\"type\":\"string\",\"pattern\":\"^[^0-9]+$\"}", "\"a1\"", 0},
        {"{\"type\":\"string\",\"pattern\":\"^cafÃ©$\"}", "\"cafÃ©\"", 1},
        {"true", "[1,{\"a\":null}]", 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int r = accepts(cases[i].schema, cases[i].text);
        CHECK_MSG(r == cases[i].want, "case %zu: %s against %s: got %d, want %d", i, cases[i].text,
                  cases[i].schema, r, cases[i].want);
    }
}

TEST(grammar_rejects_unsupported_keywords) {
    static const struct {
        const char *schema, *needle;
    } cases[] = {
        {"{\"type\":\"string\",\"pattern\":\"(?=a)b\"}", "\"pattern\" (only (?: ) groups"},
        {"{\"type\":\"string\",\"pattern\":\"(a)\\\\1\"}", "\"pattern\" (unsupported escape"},
        {"{\"type\":\"string\",\"pattern\":\"^a|b$\"}", "top-level |"},
        {"{\"type\":\"string\",\"pattern\":\"^\\\"$\"}", "no JSON string without escapes"},
        {"{\"type\":\"object\",\"properties\":{\"x\":{\"not\":{\"type\":\"null\"}}}}", "\"not\" at #/properties/x"},
        {"{\"type\":\"array\",\"uniqueItems\":true}", "\"uniqueItems\""},
        {"{\"type\":\"number\",\"multipleOf\":3}", "\"multipleOf\""},
        {"{\"type\":\"array\",\"prefixItems\":[{\"type\":\"string\"}]}", "\"prefixItems\""},
        {"{\"allOf\":[{\"type\":\"string\"},{\"maxLength\":3}]}", "\"allOf\""},
        {"{\"$ref\":\"http://example.com/s.json\"}", "$ref"},
        {"{\"$ref\":\"#/$defs/missing\"}", "does not resolve"},
        {"{\"type\":\"object\",\"required\":[\"a\"]}", "\"a\""},
        {"{\"type\":\"strin\"}", "unknown type"},
        {"[1]", "expected an object"},
        {"\"yaml\"", "yaml"},
        {"{\"type\":\"number\",\"minimum\":0.2,\"maximum\":0.8}", "range"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        hl_err err = {0};
        gram_schema *s = compile_str(cases[i].schema, &err);
        CHECK_MSG(!s, "case %zu compiled: %s", i, cases[i].schema);
        CHECK_MSG(strstr(err.msg, cases[i].needle), "case %zu: message \"%s\" lacks %s", i, err.msg,
                  cases[i].needle);
    }
    /* harmless forms of those keywords compile */
    hl_err err;
    gram_schema *s = compile_str("{\"type\":\"array\",\"uniqueItems\":false,\"minProperties\":0}", &err);
    CHECK(s);
    gram_schema_free(s);
}

static tok_vocab *load_vocab(const char *rel, gguf_file **gf) {
    const char *p = test_shared_path(rel);
    if (!p) return NULL;
    hl_err err;
    tok_vocab *v = NULL;
    if (gguf_open(p, gf, &err) != HL_OK) return NULL;
    if (tok_vocab_load_gguf(*gf, &v, &err) != HL_OK) {
        gguf_close(*gf);
        return NULL;
    }
    return v;
}

static uint64_t rng_next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Samples uniformly among the tokens the mask leaves, n times per schema, and checks
 * that every text ends, parses and validates (with schema_check, not the grammar). */
static void sample_all(const char *rel, int n_per_schema) {
    gguf_file *gf = NULL;
    tok_vocab *v = load_vocab(rel, &gf);
    if (!v) {
        test_skip("vocabulary not found under the shared data");
        return;
    }
    hl_err err;
    gram_vocab *gv = NULL;
    CHECK(gram_vocab_create(v, &gv, &err) == HL_OK);
    int32_t nv = tok_vocab_n_tokens(v);
    float *logits = malloc((size_t)nv * sizeof *logits);
    int32_t *ok = malloc((size_t)nv * sizeof *ok);
    char *text = malloc(1 << 16);
    CHECK(logits && ok && text);
    uint64_t seed = 0x9E3779B97F4A7C15ull;
    for (size_t si = 0; si < N_TEST_SCHEMAS && !test_failed(); si++) {
        gram_schema *s = NULL;
        CHECK_MSG(gram_compile(k_test_schemas[si], strlen(k_test_schemas[si]), &s, &err) == HL_OK,
                  "schema %zu: %s", si, err.msg);
        json_t *sj = json_loads(k_test_schemas[si], 0, NULL);
        for (int r = 0; r < n_per_schema && !test_failed(); r++) {
            gram_matcher *m = NULL;
            CHECK(gram_matcher_create(s, gv, NULL, &m, &err) == HL_OK);
            size_t len = 0;
            bool ended = false;
            for (int step = 0; step < 3000 && !ended; step++) {
                for (int32_t i = 0; i < nv; i++) logits[i] = 0;
                gram_matcher_mask(m, logits, nv);
                int32_t n_ok = 0;
                for (int32_t i = 0; i < nv; i++)
                    if (logits[i] == 0) ok[n_ok++] = i;
                CHECK_MSG(n_ok > 0 && n_ok < nv, "schema %zu: mask left %d of %d", si, n_ok, nv);
                int32_t t = ok[rng_next(&seed) % (uint64_t)n_ok];
                CHECK(gram_matcher_accept(m, t));
                if (tok_is_eog(v, t)) {
                    ended = true;
                    break;
                }
                int32_t pl = tok_token_to_piece(v, t, false, text + len, (1 << 16) - 1 - len);
                CHECK(pl > 0);
                len += (size_t)pl;
                if (gram_matcher_complete(m)) ended = true;
            }
            text[len] = 0;
            gram_matcher_free(m);
            CHECK_MSG(ended, "schema %zu: no end after 3000 tokens: %.300s", si, text);
            json_error_t je;
            json_t *val = json_loads(text, JSON_DECODE_ANY, &je);
            CHECK_MSG(val, "schema %zu: not JSON (%s): %s", si, je.text, text);
            char why[512];
            bool valid = schema_check(val, sj, sj, why, sizeof why);
            json_decref(val);
            CHECK_MSG(valid, "schema %zu: %s: %s", si, why, text);
        }
        json_decref(sj);
        gram_schema_free(s);
    }
    free(logits);
    free(ok);
    free(text);
    gram_vocab_free(gv);
    tok_vocab_destroy(v);
    gguf_close(gf);
}

TEST(grammar_samples_validate_stories260k_vocab) { sample_all("models/stories260K/stories260K.gguf", 8); }
TEST(grammar_samples_validate_llama_spm_vocab) { sample_all("models/ggml-vocab/ggml-vocab-llama-spm.gguf", 2); }
TEST(grammar_samples_validate_gpt2_vocab) { sample_all("models/ggml-vocab/ggml-vocab-gpt-2.gguf", 2); }

/* The thinking part passes unconstrained; the grammar starts after its closing tag. */
TEST(grammar_think_gate) {
    hl_err err;
    gram_schema *s = compile_str(k_test_schemas[13], &err);
    CHECK(s);
    gram_think th = {.open = "<think>", .close = "</think>"};
    gram_matcher *m = NULL;
    CHECK(gram_matcher_create(s, NULL, &th, &m, &err) == HL_OK);
    CHECK(gram_matcher_feed(m, "\n<think>", 8));
    CHECK(gram_matcher_feed(m, "any {text</thi", 14));
    CHECK(!gram_matcher_accepting(m));
    CHECK(gram_matcher_feed(m, "nk>\n", 4));
    CHECK(!gram_matcher_feed(m, "x", 1));
    CHECK(gram_matcher_feed(m, "true", 4));
    CHECK(gram_matcher_complete(m));
    gram_matcher_free(m);
    /* no thinking part at all */
    CHECK(gram_matcher_create(s, NULL, &th, &m, &err) == HL_OK);
    CHECK(gram_matcher_feed(m, "false", 5) && gram_matcher_complete(m));
    gram_matcher_free(m);
    /* the prompt opened it */
    th.in_think = true;
    CHECK(gram_matcher_create(s, NULL, &th, &m, &err) == HL_OK);
    CHECK(gram_matcher_feed(m, "{hmm}</think>true", 17) && gram_matcher_complete(m));
    gram_matcher_free(m);
    gram_schema_free(s);
}

static bool feed(gram_matcher *m, const char *text) { return gram_matcher_feed(m, text, strlen(text)); }

/* Lazy grammars (tool calls): free text, then a value after each trigger, the closing
 * tag, free text again; the end of generation only in free text. */
TEST(grammar_lazy_trigger) {
    hl_err err;
    gram_schema *s = compile_str("{\"type\":\"object\",\"properties\":{\"n\":{\"const\":\"f\"},"
                                 "\"x\":{\"type\":\"integer\"}},\"required\":[\"n\",\"x\"]}", &err);
    CHECK(s);
    gram_think lz = {.trigger = "<tool_call>", .trigger_end = "</tool_call>"};
    gram_matcher *m = NULL;
    CHECK(gram_matcher_create(s, NULL, &lz, &m, &err) == HL_OK);
    CHECK(gram_matcher_accepting(m)); /* an empty reply is free text */
    CHECK(feed(m, "I will call <tool <tool_ca {\"n\": 3} <<tool_call>"));
    CHECK(!gram_matcher_accepting(m));
    CHECK(!feed(m, "hello"));
    CHECK(!feed(m, "{\"n\": \"g\""));
    CHECK(feed(m, "\n{\"x\": 12, \"n\": \"f\""));
    CHECK(!feed(m, "}x"));      /* after the value: only the closer */
    CHECK(feed(m, "}\n</tool_"));
    CHECK(!gram_matcher_accepting(m) && !gram_matcher_complete(m));
    CHECK(!feed(m, "x"));
    CHECK(feed(m, "call> and more {text}"));
    CHECK(gram_matcher_accepting(m) && !gram_matcher_complete(m));
    CHECK(feed(m, "<tool_call>{\"n\":\"f\",\"x\":-1}</tool_call>"));
    CHECK(gram_matcher_accepting(m));
    gram_matcher_free(m);
    /* a value that ends only where the next byte cannot continue it (an integer root) */
    gram_schema *si = compile_str("{\"type\":\"integer\"}", &err);
    CHECK(si);
    CHECK(gram_matcher_create(si, NULL, &lz, &m, &err) == HL_OK);
    CHECK(feed(m, "<tool_call>12</tool_call>") && gram_matcher_accepting(m));
    gram_matcher_free(m);
    /* no closing tag (a bare array after [TOOL_CALLS]) */
    gram_think lz2 = {.trigger = "[TOOL_CALLS]"};
    CHECK(gram_matcher_create(si, NULL, &lz2, &m, &err) == HL_OK);
    CHECK(feed(m, "a[TOOL_CALLS] 7 text") && gram_matcher_accepting(m));
    gram_matcher_free(m);
    /* a thinking part first; a text not opening it is free text */
    gram_think lz3 = {.open = "<think>", .close = "</think>", .trigger = "<tool_call>",
                      .trigger_end = "</tool_call>"};
    CHECK(gram_matcher_create(s, NULL, &lz3, &m, &err) == HL_OK);
    CHECK(feed(m, "<think><tool_call>x</think><tool_call>"));
    CHECK(!feed(m, "x") && !gram_matcher_accepting(m));
    gram_matcher_free(m);
    CHECK(gram_matcher_create(s, NULL, &lz3, &m, &err) == HL_OK);
    CHECK(feed(m, " <tool_call>") && !feed(m, "x"));
    gram_matcher_free(m);
    /* trigger_now: the call must come first */
    gram_think lz4 = {.trigger = "<tool_call>", .trigger_end = "</tool_call>", .trigger_now = true};
    CHECK(gram_matcher_create(s, NULL, &lz4, &m, &err) == HL_OK);
    CHECK(!gram_matcher_accepting(m) && !feed(m, "Sure"));
    CHECK(feed(m, "\n<tool_call>{\"n\":\"f\",\"x\":0}</tool_call>"));
    CHECK(gram_matcher_accepting(m) && feed(m, "done"));
    gram_matcher_free(m);
    gram_schema_free(si);
    gram_schema_free(s);
}

/* The trie walk and its fast paths (free strings, the thinking part) give exactly the
 * tokens that feeding each token's bytes allows, on SPM and byte-level BPE vocabularies. */
TEST(grammar_mask_equals_token_by_token) {
    static const char *const vocabs[] = {"models/ggml-vocab/ggml-vocab-llama-spm.gguf",
                                         "models/ggml-vocab/ggml-vocab-gpt-2.gguf"};
    static const struct {
        const char *schema, *prefix;
        int think; /* 1: a thinking part; 2: a lazy grammar */
    } cases[] = {
        {"\"json\"", "", false},
        {"\"json\"", "{\"ab", false},                /* a free key */
        {"\"json\"", "{\"a\": \"x\\u00e9", false},   /* a free string */
        {"\"json\"", "{\"a\": \"x\xc3", false},      /* in a UTF-8 sequence */
        {"\"json\"", "{\"a\": 12", false},
        {"\"json\"", "{\"a\": [tr", false},
        {"\"json\"", "{\"a\": {}} ", false},         /* rejected prefix: left as is */
        {k_test_schemas[0], "{\"name\": \"Li", false}, /* maxLength 12 */
        {k_test_schemas[0], "{\"name\": \"Lily Lily Li", false}, /* 1 left */
        {k_test_schemas[0], "{\"na", false},
        {k_test_schemas[3], "{\"color\": \"", false},
        {k_test_schemas[3], "{\"color\": \"red\", \"size\": 1", false},
        {k_test_schemas[14], "-", false},
        {k_test_schemas[9], "{\"shape\": {", false},
        {k_test_schemas[10], "{\"code\": \"ab", false},
        {"\"json\"", "", true},
        {"\"json\"", "<think>some thoughts <", true},
        {"\"json\"", "<think>a</think>", true},
        /* lazy grammars (think 2: trigger <tool_call> ... </tool_call>) */
        {"\"json\"", "", 2},
        {"\"json\"", "Let me check. <tool", 2},
        {"\"json\"", "<tool_call>\n", 2},
        {"\"json\"", "<tool_call>{\"a\": \"b", 2},
        {"\"json\"", "<tool_call>{\"a\": 1}", 2},
        {"\"json\"", "<tool_call>{\"a\": 1}\n</tool", 2},
        {"\"json\"", "<tool_call>{}</tool_call>\n<", 2},
    };
    int ran = 0;
    for (size_t vi = 0; vi < 2; vi++) {
        gguf_file *gf = NULL;
        tok_vocab *v = load_vocab(vocabs[vi], &gf);
        if (!v) continue;
        ran++;
        hl_err err;
        gram_vocab *gv = NULL;
        CHECK(gram_vocab_create(v, &gv, &err) == HL_OK);
        int32_t nv = tok_vocab_n_tokens(v);
        float *logits = malloc((size_t)nv * sizeof *logits);
        CHECK(logits);
        for (size_t ci = 0; ci < sizeof cases / sizeof *cases && !test_failed(); ci++) {
            gram_schema *s = compile_str(cases[ci].schema, &err);
            CHECK(s);
            gram_think th = {.open = "<think>", .close = "</think>"};
            gram_think lz = {.trigger = "<tool_call>", .trigger_end = "</tool_call>"};
            gram_think *tp = cases[ci].think == 1 ? &th : cases[ci].think == 2 ? &lz : NULL;
            gram_matcher *m = NULL;
            CHECK(gram_matcher_create(s, gv, tp, &m, &err) == HL_OK);
            bool fed = gram_matcher_feed(m, cases[ci].prefix, strlen(cases[ci].prefix));
            for (int32_t i = 0; i < nv; i++) logits[i] = 0;
            gram_matcher_mask(m, logits, nv);
            int32_t n_ok = 0;
            for (int32_t i = 0; i < nv && !test_failed(); i++) {
                bool want = gram_matcher_allows(m, i);
                n_ok += want;
                CHECK_MSG((logits[i] == 0) == want, "vocab %zu case %zu (%s): token %d: mask %d, "
                          "bytes %d", vi, ci, cases[ci].prefix, i, logits[i] == 0, want);
            }
            /* every case but the rejected prefix leaves some tokens and bans others */
            if (fed) /* (free text before a trigger allows every token) */
                CHECK_MSG(n_ok > 0 && (n_ok < nv || cases[ci].think == 2),
                          "case %zu: %d allowed", ci, n_ok);
            gram_matcher_free(m);
            gram_schema_free(s);
        }
        free(logits);
        gram_vocab_free(gv);
        tok_vocab_destroy(v);
        gguf_close(gf);
    }
    if (!ran) SKIP("vocabularies not found under the shared data");
}
