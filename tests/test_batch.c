/*
 * test_batch.c - continuous batching: the batched forward pass (several sequences, mixed
 * prefill chunks and decode tokens, one pass) against each sequence alone, and the
 * concurrent runner (many threads calling runner_generate at once).
 */
#include <pthread.h>
#include <stdlib.h>

#include "kv/trie.h"
#include "model_synth.h"
#include "runner/runner.h"
#include "test.h"

#define V 64

static model *load_synth_type(hl_type wtype) {
    char path[512];
    snprintf(path, sizeof path, "%s/batch%d.gguf", test_tmpdir(), (int)wtype);
    synth_cfg c = {.arch = "llama", .n_vocab = V, .n_embd = 64, .n_layer = 2, .n_ff = 96,
                   .n_head = 4, .n_head_kv = 2, .rope_base = 10000, .wtype = wtype, .seed = 11};
    synth_model *s = synth_build(&c, path);
    if (!s) return NULL;
    synth_free(s);
    model *m = NULL;
    if (model_load(path, NULL, &m, NULL) != HL_OK) return NULL;
    return m;
}

static void fill_prompt(int32_t *p, int n, int seed) {
    uint32_t x = (uint32_t)seed * 2654435761u + 1;
    for (int i = 0; i < n; i++) {
        x = x * 1103515245u + 12345u;
        p[i] = 3 + (int32_t)((x >> 16) % (V - 3)); /* never BOS/EOS */
    }
}

/* ---- the batched forward pass ---- */

#define NSEQ 5
static const int seq_cached[NSEQ] = {10, 20, 0, 33, 7};  /* already in the cache */
static const int seq_new[NSEQ] = {7, 1, 5, 1, 12};      /* fed in the batch */

static void view_of(const kv_table *t, model_kv_view *v) {
    *v = (model_kv_view){t->data, t->n_blocks, kv_pool_layout(t->pool)->block_tokens, t->len};
}

TEST(batch_forward_mixed_sequences_match_each_alone) {
    hl_type types[] = {HL_TYPE_Q8_0, HL_TYPE_F32};
    for (int ti = 0; ti < 2; ti++) {
        model *m = load_synth_type(types[ti]);
        CHECK(m);
        const model_hparams *hp = model_get_hparams(m);
        model_ctx *c;
        CHECK_OK(model_ctx_create(m, 2, 64, &c, NULL), NULL);
        kv_pool_config pc = {.layout = {hp->n_layer, hp->n_head_kv, hp->head_dim_k,
                                        hp->head_dim_v, 8},
                             .budget_bytes = (size_t)16 << 20};
        kv_pool *pool;
        CHECK_OK(kv_pool_create(&pc, &pool, NULL), NULL);
        int32_t toks[NSEQ][64];
        kv_table alone[NSEQ], batched[NSEQ];
        float alone_logits[NSEQ][V];
        /* each sequence's cached part, then its new tokens alone */
        for (int s = 0; s < NSEQ; s++) {
            fill_prompt(toks[s], seq_cached[s] + seq_new[s], 40 + s);
            kv_table *tabs[2] = {&alone[s], &batched[s]};
            for (int k = 0; k < 2; k++) {
                kv_table_init(tabs[k], pool);
                if (!seq_cached[s]) continue;
                model_kv_view v;
                CHECK_OK(kv_table_reserve(tabs[k], seq_cached[s], NULL), NULL);
                view_of(tabs[k], &v);
                CHECK_OK(model_eval_view(c, &v, toks[s], seq_cached[s], NULL, NULL), NULL);
                kv_table_commit(tabs[k], seq_cached[s]);
            }
            model_kv_view v;
            CHECK_OK(kv_table_reserve(&alone[s], seq_new[s], NULL), NULL);
            view_of(&alone[s], &v);
            CHECK_OK(model_eval_view(c, &v, toks[s] + seq_cached[s], seq_new[s], NULL, NULL),
                     NULL);
            kv_table_commit(&alone[s], seq_new[s]);
            memcpy(alone_logits[s], model_ctx_logits(c), sizeof alone_logits[s]);
        }
        /* all at once: sequence 4 does not want logits */
        model_batch_entry e[NSEQ];
        for (int s = 0; s < NSEQ; s++) {
            CHECK_OK(kv_table_reserve(&batched[s], seq_new[s], NULL), NULL);
            view_of(&batched[s], &e[s].kv);
            e[s].tokens = toks[s] + seq_cached[s];
            e[s].n_tokens = seq_new[s];
            e[s].want_logits = s != 4;
        }
        float out[NSEQ][V];
        memset(out, 0, sizeof out);
        CHECK_OK(model_eval_batch(c, e, NSEQ, &out[0][0], NULL), NULL);
        /* exact: activations are quantized per token and attention is per token */
        for (int s = 0; s < NSEQ - 1; s++)
            CHECK_MSG(memcmp(out[s], alone_logits[s], sizeof out[s]) == 0,
                      "type %d: sequence %d's logits differ in a batch", ti, s);
        /* and the cache rows written are the same */
        const size_t bb = kv_pool_get_stats(pool).block_bytes;
        for (int s = 0; s < NSEQ; s++) {
            kv_table_commit(&batched[s], seq_new[s]);
            CHECK_EQ_INT(batched[s].n_blocks, alone[s].n_blocks);
            for (int b = 0; b < alone[s].n_blocks; b++) {
                const int rows = alone[s].len - b * 8 < 8 ? alone[s].len - b * 8 : 8;
                for (int l = 0; l < hp->n_layer; l++)
                    for (int h = 0; h < hp->n_head_kv; h++) {
                        const size_t kb = (size_t)rows * (size_t)hp->head_dim_k * sizeof(float);
                        CHECK(memcmp(kv_block_k_row(pool, batched[s].data[b], l, h, 0),
                                     kv_block_k_row(pool, alone[s].data[b], l, h, 0), kb) == 0);
                        CHECK(memcmp(kv_block_v_row(pool, batched[s].data[b], l, h, 0),
                                     kv_block_v_row(pool, alone[s].data[b], l, h, 0), kb) == 0);
                    }
            }
            (void)bb;
        }
        /* bad batches fail before anything runs */
        hl_err err;
        e[1].kv = e[0].kv;
        CHECK(model_eval_batch(c, e, 2, &out[0][0], &err) == HL_ERR_INVALID);
        CHECK(strstr(err.msg, "same block table") != NULL);
        model_batch_entry big = e[0];
        static int32_t many[100];
        big.tokens = many;
        big.n_tokens = 65;
        CHECK(model_eval_batch(c, &big, 1, &out[0][0], &err) != HL_OK);
        CHECK(model_eval_batch(c, e, 0, NULL, &err) == HL_ERR_INVALID);
        for (int s = 0; s < NSEQ; s++) {
            kv_table_free(&alone[s]);
            kv_table_free(&batched[s]);
        }
        kv_pool_destroy(pool);
        model_ctx_free(c);
        model_free(m);
    }
}
