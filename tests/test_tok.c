/* Tests for the tokenizer core (tok.c, spm.c, wpm.c). */
#include <stdlib.h>

#include "base/file.h"
#include "gguf/gguf.h"
#include "test.h"
#include "tok/tok.h"
#include "tok_vectors.h"

#define VOCAB_OR_SKIP(var, name)                                                         \
    tok_vocab *var = tok_vectors_open_vocab(name);                                      \
    if (!var) SKIP("models/ggml-vocab/" name " not found (or failed to load)")

TEST(tok_vectors_llama_spm) {
    VOCAB_OR_SKIP(v, "ggml-vocab-llama-spm.gguf");
    CHECK_EQ_INT(tok_vocab_kind(v), TOK_MODEL_SPM);
    int bad = run_vocab_vectors(v, "ggml-vocab-llama-spm.gguf", TOK_VECTORS_DECODE);
    tok_vocab_destroy(v);
    if (bad < 0) SKIP("llama-spm vectors not found");
    CHECK_EQ_INT(bad, 0);
}

TEST(tok_vectors_phi3) {
    VOCAB_OR_SKIP(v, "ggml-vocab-phi-3.gguf");
    int bad = run_vocab_vectors(v, "ggml-vocab-phi-3.gguf", TOK_VECTORS_DECODE);
    tok_vocab_destroy(v);
    if (bad < 0) SKIP("phi-3 vectors not found");
    CHECK_EQ_INT(bad, 0);
}

TEST(tok_vectors_bert_bge) {
    VOCAB_OR_SKIP(v, "ggml-vocab-bert-bge.gguf");
    CHECK_EQ_INT(tok_vocab_kind(v), TOK_MODEL_WPM);
    int bad = run_vocab_vectors(v, "ggml-vocab-bert-bge.gguf", TOK_VECTORS_ENCODE);
    tok_vocab_destroy(v);
    if (bad < 0) SKIP("bert-bge vectors not found");
    CHECK_EQ_INT(bad, 0);
}
