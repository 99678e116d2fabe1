/* config.json parsing: the real GLM-5.3-Flash config (nested text_config),
 * flat files with transformers defaults, schedule derivations, and the exact
 * error lines for missing / mistyped / inconsistent fields. */
#include "core/err.h"
#include "core/util.h"
#include "model/config.h"
#include "test_util.h"
#include <cjson/cJSON.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *k_required[] = {
    "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "kv_lora_rank", "q_lora_rank",
    "qk_nope_head_dim", "v_head_dim", "moe_intermediate_size", "intermediate_size", "n_routed_experts",
    "num_experts_per_tok", "index_n_heads", "index_head_dim", "index_topk", "index_kpool", "linear_num_heads",
    "linear_head_dim", "hc_mult"};
#define N_REQ ((int)(sizeof k_required / sizeof k_required[0]))

/* A small flat config with only the required fields. */
static cJSON *flat_base(int layers) {
  cJSON *o = cJSON_CreateObject();
  const int v[] = {1000, 64, layers, 4, 32, 48, 16, 16, 32, 96, 8, 2, 2, 16, 16, 4, 2, 16, 2};
  for (int i = 0; i < N_REQ; i++) cJSON_AddNumberToObject(o, k_required[i], v[i]);
  return o;
}

/* Parse a cJSON object; returns parse rc. */
static int parse_obj(const cJSON *o, glm53_config *c) {
  char *txt = cJSON_PrintUnformatted(o);
  int rc = glm53_config_parse(txt, c);
  free(txt);
  return rc;
}

static void test_real(void) {
  size_t n;
  char *txt = read_file("tests/data/config/glm53_flash_config.json", &n);
  CHECK(txt != NULL, "%s", glm53_last_error());
  if (!txt) return;
  /* Through load_dir, as the engine does. */
  char dir[] = "/tmp/glm53_cfg_XXXXXX";
  CHECK(mkdtemp(dir) != NULL, "(see condition)");
  char path[300];
  snprintf(path, sizeof path, "%s/config.json", dir);
  write_file_atomic(path, txt, n);
  glm53_config c;
  CHECK(glm53_config_load_dir(dir, &c) == 0, "%s", glm53_last_error());
  unlink(path);
  rmdir(dir);
  free(txt);
  CHECK(glm53_config_validate(&c) == 0, "%s", glm53_last_error());
  CHECK(c.vocab_size == 154880 && c.hidden_size == 4096 && c.num_hidden_layers == 45, "vocab/hidden/layers");
  CHECK(c.intermediate_size == 12288 && c.moe_intermediate_size == 2048, "mlp widths");
  CHECK(c.rms_norm_eps == 1e-5f && c.tie_word_embeddings == 0, "eps/tie");
  CHECK(c.num_attention_heads == 64 && c.num_key_value_heads == 64, "heads");
  CHECK(c.q_lora_rank == 1536 && c.kv_lora_rank == 512, "lora ranks");
  CHECK(c.qk_nope_head_dim == 256 && c.qk_rope_head_dim == 0 && c.v_head_dim == 256, "head dims");
  CHECK(c.index_n_heads == 32 && c.index_head_dim == 128 && c.index_topk == 2048 && c.index_kpool == 4, "indexer");
  CHECK(c.index_kpool_always_select_tail == 1, "tail");
  CHECK(c.linear_num_heads == 64 && c.linear_head_dim == 128 && c.linear_conv_kernel_dim == 4, "kda dims");
  CHECK(c.linear_lower_bound == -5.0f, "lower bound %g", c.linear_lower_bound);
  CHECK(c.hc_mult == 4 && c.hc_sinkhorn_iters == 20 && c.hc_eps == 1e-6f, "mhc");
  CHECK(c.n_routed_experts == 288 && c.num_experts_per_tok == 8 && c.n_shared_experts == 1, "experts");
  CHECK(c.n_group == 1 && c.topk_group == 1 && c.norm_topk_prob == 1, "groups");
  CHECK(c.routed_scaling_factor == 2.5f && c.swiglu_limit == 10.0f, "scale/limit");
  CHECK(c.n_eos == 3 && c.eos_token_id[0] == 154820 && c.eos_token_id[1] == 154827 && c.eos_token_id[2] == 154829, "eos");
  CHECK(c.pad_token_id == 154820 && c.bos_token_id == -1, "pad/bos");
  CHECK(c.max_position_embeddings == 1048576, "max pos");
  CHECK(c.n_layer_types == 45 && c.n_mlp_layer_types == 45 && c.n_indexer_types == 45, "schedule lengths");
  int n_mla = 0, n_dense = 0, n_full = 0;
  for (int i = 0; i < 45; i++) {
    CHECK(c.layer_types[i] == (i % 4 == 3 ? ATTN_MLA : ATTN_KDA), "layer %d", i);
    CHECK(c.mlp_layer_types[i] == (i < 3 ? MLP_DENSE : MLP_MOE), "mlp %d", i);
    n_mla += c.layer_types[i] == ATTN_MLA;
    n_dense += c.mlp_layer_types[i] == MLP_DENSE;
    n_full += c.indexer_types[i] == INDEX_FULL;
  }
  CHECK(n_mla == 11 && n_dense == 3 && n_full == 45, "%d %d %d", n_mla, n_dense, n_full);
}

static void test_flat_defaults(void) {
  cJSON *o = flat_base(8);
  glm53_config c;
  CHECK(parse_obj(o, &c) == 0, "%s", glm53_last_error());
  CHECK(glm53_config_validate(&c) == 0, "%s", glm53_last_error());
  CHECK(c.hidden_size == 64 && c.num_hidden_layers == 8 && c.linear_head_dim == 16, "values");
  CHECK(c.num_key_value_heads == 4, "kv heads default = heads");
  CHECK(c.qk_rope_head_dim == 0 && c.rms_norm_eps == 1e-5f && c.tie_word_embeddings == 0, "defaults 1");
  CHECK(c.index_kpool_always_select_tail == 1 && c.linear_conv_kernel_dim == 4, "defaults 2");
  CHECK(c.linear_lower_bound == -5.0f && c.hc_sinkhorn_iters == 20 && c.hc_eps == 1e-6f, "defaults 3");
  CHECK(c.n_shared_experts == 1 && c.n_group == 1 && c.topk_group == 1 && c.norm_topk_prob == 1, "defaults 4");
  CHECK(c.routed_scaling_factor == 2.5f && c.swiglu_limit == 10.0f, "defaults 5");
  CHECK(c.pad_token_id == 154820 && c.bos_token_id == -1 && c.n_eos == 0, "token defaults");
  CHECK(c.max_position_embeddings == 4096, "max pos default");
  for (int i = 0; i < 8; i++) {
    CHECK(c.layer_types[i] == (i % 4 == 3 ? ATTN_MLA : ATTN_KDA), "default layer_types %d", i);
    CHECK(c.mlp_layer_types[i] == (i < 3 ? MLP_DENSE : MLP_MOE), "default mlp %d", i);
    CHECK(c.indexer_types[i] == INDEX_FULL, "default indexer %d", i);
  }
  cJSON_Delete(o);
  /* min(3, n) dense layers. */
  o = flat_base(2);
  CHECK(parse_obj(o, &c) == 0 && c.n_mlp_layer_types == 2 && c.mlp_layer_types[0] == MLP_DENSE &&
            c.mlp_layer_types[1] == MLP_DENSE, "2-layer mlp schedule");
  cJSON_Delete(o);
  /* Flat-but-with-null text_config is still flat; explicit nulls. */
  o = flat_base(4);
  cJSON_AddNullToObject(o, "text_config");
  cJSON_AddNullToObject(o, "swiglu_limit");
  cJSON_AddNullToObject(o, "pad_token_id");
  cJSON_AddNumberToObject(o, "bos_token_id", 5);
  cJSON_AddNumberToObject(o, "eos_token_id", 7);
  cJSON_AddNullToObject(o, "num_key_value_heads");
  CHECK(parse_obj(o, &c) == 0, "%s", glm53_last_error());
  CHECK(isnan(c.swiglu_limit) && c.pad_token_id == -1 && c.bos_token_id == 5, "nulls");
  CHECK(c.n_eos == 1 && c.eos_token_id[0] == 7 && c.num_key_value_heads == 4, "eos int");
  CHECK(glm53_config_validate(&c) == 0, "%s", glm53_last_error());
  cJSON_Delete(o);
}

static void test_aliases_and_dicts(void) {
  glm53_config c;
  /* num_local_experts alias; linear_attn_config overrides; legacy full_attention. */
  cJSON *o = flat_base(4);
  cJSON_DeleteItemFromObject(o, "n_routed_experts");
  cJSON_AddNumberToObject(o, "num_local_experts", 12);
  cJSON_DeleteItemFromObject(o, "linear_num_heads");
  cJSON_DeleteItemFromObject(o, "linear_head_dim");
  cJSON *d = cJSON_AddObjectToObject(o, "linear_attn_config");
  cJSON_AddNumberToObject(d, "num_heads", 6);
  cJSON_AddNumberToObject(d, "head_dim", 24);
  cJSON_AddNumberToObject(d, "short_conv_kernel_size", 3);
  cJSON_AddNumberToObject(d, "gate_lower_bound", -3.5);
  cJSON *lt = cJSON_AddArrayToObject(o, "layer_types");
  const char *types[] = {"linear_attention", "full_attention", "deepseek_sparse_attention", "linear_attention"};
  for (int i = 0; i < 4; i++) cJSON_AddItemToArray(lt, cJSON_CreateString(types[i]));
  CHECK(parse_obj(o, &c) == 0, "%s", glm53_last_error());
  CHECK(c.n_routed_experts == 12, "alias");
  CHECK(c.linear_num_heads == 6 && c.linear_head_dim == 24 && c.linear_conv_kernel_dim == 3, "dict");
  CHECK(c.linear_lower_bound == -3.5f, "dict lower bound");
  CHECK(c.layer_types[0] == ATTN_KDA && c.layer_types[1] == ATTN_MLA && c.layer_types[2] == ATTN_MLA &&
            c.layer_types[3] == ATTN_KDA, "layer types");
  CHECK(glm53_config_validate(&c) == 0, "%s", glm53_last_error());
  /* Dict null gate_lower_bound: safe_gate (default true) restores -5; with
   * safe_gate false it stays null and validate rejects it. */
  cJSON_ReplaceItemInObject(d, "gate_lower_bound", cJSON_CreateNull());
  CHECK(parse_obj(o, &c) == 0 && c.linear_lower_bound == -5.0f, "safe_gate default");
  cJSON_AddFalseToObject(d, "safe_gate");
  CHECK(parse_obj(o, &c) == 0 && isnan(c.linear_lower_bound), "null lower bound");
  CHECK(glm53_config_validate(&c) == -1 && strstr(glm53_last_error(), "linear_lower_bound"), "%s", glm53_last_error());
  cJSON_Delete(o);
}

static void test_indexer_schedules(void) {
  glm53_config c;
  cJSON *o = flat_base(4);
  cJSON_AddStringToObject(o, "index_topk_pattern", "FSSF");
  CHECK(parse_obj(o, &c) == 0 && c.n_indexer_types == 4, "%s", glm53_last_error());
  CHECK(c.indexer_types[0] == INDEX_FULL && c.indexer_types[1] == INDEX_SHARED && c.indexer_types[2] == INDEX_SHARED &&
            c.indexer_types[3] == INDEX_FULL, "pattern string");
  cJSON_ReplaceItemInObject(o, "index_topk_pattern", cJSON_CreateString("FSX"));
  CHECK(parse_obj(o, &c) == -1 && strstr(glm53_last_error(), "index_topk_pattern"), "%s", glm53_last_error());
  const char *lst[] = {"shared", "full", "full", "shared"};
  cJSON_ReplaceItemInObject(o, "index_topk_pattern", cJSON_CreateStringArray(lst, 4));
  CHECK(parse_obj(o, &c) == 0 && c.indexer_types[0] == INDEX_SHARED && c.indexer_types[1] == INDEX_FULL, "pattern list");
  /* An explicit indexer_types wins over the pattern. */
  const char *all[] = {"full", "full", "full", "full"};
  cJSON_AddItemToObject(o, "indexer_types", cJSON_CreateStringArray(all, 4));
  CHECK(parse_obj(o, &c) == 0 && c.indexer_types[0] == INDEX_FULL, "indexer_types wins");
  cJSON_Delete(o);
  /* freq/offset rule: full iff max(i - off + 1, 0) % freq == 0. */
  o = flat_base(12);
  cJSON_AddNumberToObject(o, "index_topk_freq", 3);
  cJSON_AddNumberToObject(o, "index_skip_topk_offset", 4);
  CHECK(parse_obj(o, &c) == 0, "%s", glm53_last_error());
  for (int i = 0; i < 12; i++) {
    int a = i - 4 + 1 > 0 ? i - 4 + 1 : 0;
    CHECK(c.indexer_types[i] == (a % 3 == 0 ? INDEX_FULL : INDEX_SHARED), "freq rule layer %d", i);
  }
  CHECK(c.indexer_types[3] == INDEX_FULL && c.indexer_types[4] == INDEX_SHARED && c.indexer_types[6] == INDEX_FULL,
        "spot values");
  cJSON_Delete(o);
  o = flat_base(6);
  cJSON_AddNumberToObject(o, "index_topk_freq", 2); /* default offset 2 */
  CHECK(parse_obj(o, &c) == 0, "%s", glm53_last_error());
  const uint8_t want[6] = {INDEX_FULL, INDEX_FULL, INDEX_SHARED, INDEX_FULL, INDEX_SHARED, INDEX_FULL};
  CHECK(memcmp(c.indexer_types, want, 6) == 0, "freq 2 offset 2");
  cJSON_Delete(o);
}

static void test_errors(void) {
  glm53_config c;
  /* Each required field missing: exactly one line naming it. */
  for (int i = 0; i < N_REQ; i++) {
    cJSON *o = flat_base(4);
    cJSON_DeleteItemFromObject(o, k_required[i]);
    char want[128];
    snprintf(want, sizeof want, "config.json: missing required field \"%s\"", k_required[i]);
    CHECK(parse_obj(o, &c) == -1 && strcmp(glm53_last_error(), want) == 0, "got \"%s\" want \"%s\"",
          glm53_last_error(), want);
    cJSON_Delete(o);
  }
  /* Missing inside text_config too (the top level is not consulted). */
  cJSON *o = cJSON_CreateObject();
  cJSON *tc = flat_base(4);
  cJSON_DeleteItemFromObject(tc, "hidden_size");
  cJSON_AddNumberToObject(o, "hidden_size", 64);
  cJSON_AddItemToObject(o, "text_config", tc);
  CHECK(parse_obj(o, &c) == -1 && strcmp(glm53_last_error(), "config.json: missing required field \"hidden_size\"") == 0,
        "%s", glm53_last_error());
  cJSON_Delete(o);
  /* Wrong JSON types. */
  o = flat_base(4);
  cJSON_ReplaceItemInObject(o, "hidden_size", cJSON_CreateString("4096"));
  CHECK(parse_obj(o, &c) == -1 && strstr(glm53_last_error(), "\"hidden_size\"") &&
            strstr(glm53_last_error(), "integer") && strstr(glm53_last_error(), "string"),
        "%s", glm53_last_error());
  cJSON_ReplaceItemInObject(o, "hidden_size", cJSON_CreateNumber(64.5));
  CHECK(parse_obj(o, &c) == -1 && strstr(glm53_last_error(), "hidden_size"), "%s", glm53_last_error());
  cJSON_ReplaceItemInObject(o, "hidden_size", cJSON_CreateNumber(64));
  cJSON_AddStringToObject(o, "rms_norm_eps", "1e-5");
  CHECK(parse_obj(o, &c) == -1 && strstr(glm53_last_error(), "rms_norm_eps"), "%s", glm53_last_error());
  cJSON_DeleteItemFromObject(o, "rms_norm_eps");
  cJSON_AddStringToObject(o, "eos_token_id", "2");
  CHECK(parse_obj(o, &c) == -1 && strstr(glm53_last_error(), "eos_token_id"), "%s", glm53_last_error());
  cJSON_DeleteItemFromObject(o, "eos_token_id");
  cJSON_AddStringToObject(o, "norm_topk_prob", "yes");
  CHECK(parse_obj(o, &c) == -1 && strstr(glm53_last_error(), "norm_topk_prob"), "%s", glm53_last_error());
  cJSON_DeleteItemFromObject(o, "norm_topk_prob");
  const char *lt[] = {"linear_attention", "mamba", "linear_attention", "linear_attention"};
  cJSON_AddItemToObject(o, "layer_types", cJSON_CreateStringArray(lt, 4));
  CHECK(parse_obj(o, &c) == -1 && strstr(glm53_last_error(), "mamba"), "%s", glm53_last_error());
  cJSON_DeleteItemFromObject(o, "layer_types");
  cJSON_AddNumberToObject(o, "linear_attn_config", 3);
  CHECK(parse_obj(o, &c) == -1 && strstr(glm53_last_error(), "linear_attn_config"), "%s", glm53_last_error());
  cJSON_DeleteItemFromObject(o, "linear_attn_config");
  cJSON_AddStringToObject(o, "text_config", "x");
  CHECK(parse_obj(o, &c) == -1 && strstr(glm53_last_error(), "text_config"), "%s", glm53_last_error());
  cJSON_Delete(o);
  CHECK(glm53_config_parse("{\"hidden_size\": ", &c) == -1 && strstr(glm53_last_error(), "JSON"), "bad json");
  CHECK(glm53_config_parse("[1,2]", &c) == -1 && strstr(glm53_last_error(), "object"), "array");
  CHECK(glm53_config_load_dir("/nonexistent/dir", &c) == -1 && strstr(glm53_last_error(), "config.json"), "%s",
        glm53_last_error());
}

/* validate: each inconsistency is caught with a message naming the field. */
static void test_validate(void) {
  struct { const char *field; double value; const char *key; } cases[] = {
      {"qk_rope_head_dim", 64, "NoPE"},
      {"index_topk", 18, "index_kpool"},
      {"num_experts_per_tok", 9, "num_experts_per_tok"},
      {"n_group", 3, "n_group"},
      {"topk_group", 2, "topk_group"},
      {"hc_mult", 0, "hc_mult"},
      {"hidden_size", -4, "hidden_size"},
      {"num_key_value_heads", 3, "num_key_value_heads"},
      {"index_kpool", 0, "index_kpool"},
      {"rms_norm_eps", 0, "rms_norm_eps"},
  };
  glm53_config c;
  for (int i = 0; i < (int)(sizeof cases / sizeof cases[0]); i++) {
    cJSON *o = flat_base(4);
    cJSON_DeleteItemFromObject(o, cases[i].field);
    cJSON_AddNumberToObject(o, cases[i].field, cases[i].value);
    int prc = parse_obj(o, &c);
    CHECK(prc == 0, "%s: %s", cases[i].field, glm53_last_error());
    CHECK(prc == 0 && glm53_config_validate(&c) == -1 && strstr(glm53_last_error(), cases[i].key), "%s: %s",
          cases[i].field, glm53_last_error());
    cJSON_Delete(o);
  }
  /* Schedule length mismatch. */
  cJSON *o = flat_base(4);
  const char *m3[] = {"dense", "dense", "sparse"};
  cJSON_AddItemToObject(o, "mlp_layer_types", cJSON_CreateStringArray(m3, 3));
  CHECK(parse_obj(o, &c) == 0 && glm53_config_validate(&c) == -1 && strstr(glm53_last_error(), "mlp_layer_types"),
        "%s", glm53_last_error());
  cJSON_Delete(o);
  /* First DSA layer with a shared indexer has nothing to reuse. */
  o = flat_base(4);
  cJSON_AddStringToObject(o, "index_topk_pattern", "FFFS");
  CHECK(parse_obj(o, &c) == 0 && glm53_config_validate(&c) == -1 && strstr(glm53_last_error(), "shared"), "%s",
        glm53_last_error());
  cJSON_Delete(o);
  o = flat_base(300);
  CHECK(parse_obj(o, &c) == -1 && strstr(glm53_last_error(), "num_hidden_layers"), "%s", glm53_last_error());
  cJSON_Delete(o);
}

int main(void) {
  test_real();
  test_flat_defaults();
  test_aliases_and_dicts();
  test_indexer_schedules();
  test_errors();
  test_validate();
  TEST_DONE();
}
