/*
 * ggufinfo.h - what the store and /api/show say about a GGUF file.
 *
 * ggufinfo_config() builds the manifest config object Ollama writes at create time
 * (model_format, model_family(ies), model_type, file_type, architecture, os).
 * ggufinfo_model_info() flattens GGUF metadata the way /api/show reports it as
 * model_info (minus general.name and tokenizer.chat_template; arrays longer than 5
 * become [] unless verbose), plus general.parameter_count; with verbose it also lists
 * the tensors. Returned JSON objects are new references the caller decrefs.
 */
#ifndef HL_STORE_GGUFINFO_H
#define HL_STORE_GGUFINFO_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "gguf/gguf.h"

/* "F32", "Q4_K_M", ... for a llama.cpp file type id; "unknown" otherwise. */
const char *ggufinfo_file_type_name(uint32_t ftype);
/* Ollama's format.HumanNumber: 260000 -> "260K", 8030000000 -> "8.0B". */
void ggufinfo_human_number(uint64_t n, char *buf, size_t cap);
/* Sum over tensors of their element counts. */
uint64_t ggufinfo_parameter_count(const gguf_file *f);

hl_status ggufinfo_config(const gguf_file *f, json_t **out, hl_err *err);
hl_status ggufinfo_model_info(const gguf_file *f, bool verbose, json_t **model_info,
                              json_t **tensors /* may be NULL; set only when verbose */,
                              hl_err *err);

#endif
