/* Saves the random fixture model (model_fixture.h) as a Hugging Face style
 * checkpoint directory (config.json + model.safetensors via hf_writer.h, plus
 * tokenizer.json) so that whole-program tests (glm53 run / chat) have a small
 * model on disk.
 *
 * The tokenizer is generated too: byte-level BPE with the 256 byte tokens
 * (ids 0..255, no merges) followed by the GLM chat special tokens (ids 256..),
 * so FX_TOK_VOCAB ids cover every byte string and the whole chat template. */
#ifndef GLM53_TEST_MODEL_FIXTURE_SAVE_H
#define GLM53_TEST_MODEL_FIXTURE_SAVE_H
#include "model_fixture.h"
#include "hf_writer.h"
#include <cjson/cJSON.h>
#include <stdio.h>
#include <sys/stat.h>

/* GLM-5.3 added tokens used by the template / parser, in GLM's order. The
 * special flag follows the GLM tokenizer (think / tool markup are plain added
 * tokens so they stay visible when decoding with skip_special). */
static const struct { const char *s; int special; } fx_added[] = {
    {"<|endoftext|>", 1}, {"[MASK]", 1},        {"[gMASK]", 1},       {"[sMASK]", 1},        {"<sop>", 1},
    {"<eop>", 1},         {"<|system|>", 1},    {"<|user|>", 1},      {"<|assistant|>", 1},  {"<|observation|>", 1},
    {"<think>", 0},       {"</think>", 0},      {"<tool_call>", 0},   {"</tool_call>", 0},   {"<tool_response>", 0},
    {"</tool_response>", 0}, {"<arg_key>", 0},  {"</arg_key>", 0},    {"<arg_value>", 0},    {"</arg_value>", 0},
};
#define FX_N_ADDED ((int)(sizeof fx_added / sizeof *fx_added))
#define FX_TOK_VOCAB (256 + FX_N_ADDED)
#define FX_ID_EOT 256      /* <|endoftext|> */
#define FX_ID_USER 263     /* <|user|> */
#define FX_ID_OBS 265      /* <|observation|> */

/* GPT-2 bytes_to_unicode: byte b -> code point, as UTF-8 into out (<= 3 bytes + NUL). */
static void fx_byte_char(int b, char *out) {
  int n = 0, cp = -1;
  for (int x = 0; x < 256; x++) {
    int printable = (x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255);
    int c = printable ? x : 256 + n++;
    if (x == b) { cp = c; break; }
  }
  if (cp < 0x80) { out[0] = (char)cp; out[1] = 0; }
  else { out[0] = (char)(0xC0 | (cp >> 6)); out[1] = (char)(0x80 | (cp & 63)); out[2] = 0; }
}

/* malloc'd tokenizer.json text. */
static char *fx_tokenizer_json(void) {
  cJSON *root = cJSON_CreateObject();
  cJSON_AddStringToObject(root, "version", "1.0");
  cJSON *added = cJSON_AddArrayToObject(root, "added_tokens");
  for (int i = 0; i < FX_N_ADDED; i++) {
    cJSON *a = cJSON_CreateObject();
    cJSON_AddNumberToObject(a, "id", 256 + i);
    cJSON_AddStringToObject(a, "content", fx_added[i].s);
    cJSON_AddBoolToObject(a, "single_word", 0);
    cJSON_AddBoolToObject(a, "lstrip", 0);
    cJSON_AddBoolToObject(a, "rstrip", 0);
    cJSON_AddBoolToObject(a, "normalized", 0);
    cJSON_AddBoolToObject(a, "special", fx_added[i].special);
    cJSON_AddItemToArray(added, a);
  }
  cJSON_AddNullToObject(root, "normalizer");
  cJSON *pre = cJSON_AddObjectToObject(root, "pre_tokenizer");
  cJSON_AddStringToObject(pre, "type", "ByteLevel");
  cJSON_AddBoolToObject(pre, "add_prefix_space", 0);
  cJSON_AddBoolToObject(pre, "trim_offsets", 1);
  cJSON_AddBoolToObject(pre, "use_regex", 1);
  cJSON *dec = cJSON_AddObjectToObject(root, "decoder");
  cJSON_AddStringToObject(dec, "type", "ByteLevel");
  cJSON *model = cJSON_AddObjectToObject(root, "model");
  cJSON_AddStringToObject(model, "type", "BPE");
  cJSON *vocab = cJSON_AddObjectToObject(model, "vocab");
  for (int b = 0; b < 256; b++) {
    char s[4];
    fx_byte_char(b, s);
    cJSON_AddNumberToObject(vocab, s, b);
  }
  cJSON_AddArrayToObject(model, "merges");
  char *text = cJSON_PrintUnformatted(root);
  cJSON_Delete(root);
  return text;
}

/* The chat fixture: fx_config with the tokenizer's vocabulary and GLM's three
 * eos tokens. */
static void fx_chat_config(glm53_config *c) {
  fx_config(c, 8, 2, 1);
  c->vocab_size = FX_TOK_VOCAB;
  c->n_eos = 3;
  c->eos_token_id[0] = FX_ID_EOT; c->eos_token_id[1] = FX_ID_USER; c->eos_token_id[2] = FX_ID_OBS;
  c->pad_token_id = FX_ID_EOT;
}

/* Writes m (an fx_model) as DIR/{config.json, model.safetensors,
 * tokenizer.json} (release tensor names, see src/model/weights.c). */
static int fx_save_dir(const glm53_model *m, const char *dir) {
  char path[4096];
  if (hfw_save(m, dir, 0, 0)) return -1;
  char *tj = fx_tokenizer_json();
  snprintf(path, sizeof path, "%s/tokenizer.json", dir);
  int rc = write_file_atomic(path, tj, strlen(tj));
  free(tj);
  return rc;
}

#endif
