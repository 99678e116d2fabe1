/* Hugging Face config.json -> glm53_config, following transformers'
 * Glm5NextTextConfig (configuration_glm5_next.py): nested `text_config` or a
 * flat file, the same defaults and the same schedule derivations. Fields that
 * fix tensor shapes have no default here: a missing one is an error. */
#include "model/config.h"
#include "core/err.h"
#include "core/util.h"
#include <cjson/cJSON.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CFG "config.json"

static const char *json_type(const cJSON *v) {
  if (cJSON_IsNull(v)) return "null";
  if (cJSON_IsBool(v)) return "bool";
  if (cJSON_IsNumber(v)) return "number";
  if (cJSON_IsString(v)) return "string";
  if (cJSON_IsArray(v)) return "array";
  if (cJSON_IsObject(v)) return "object";
  return "invalid";
}

static const cJSON *get(const cJSON *o, const char *k) { return cJSON_GetObjectItemCaseSensitive(o, k); }

/* JSON value -> int with a type/range check; `what` names it in errors. */
static int as_int(const cJSON *v, const char *what, int *out) {
  if (!cJSON_IsNumber(v)) return glm53_err(CFG ": field \"%s\" must be an integer, got %s", what, json_type(v));
  double d = v->valuedouble;
  if (d != floor(d) || d < INT_MIN || d > INT_MAX)
    return glm53_err(CFG ": field \"%s\" must be an integer, got %g", what, d);
  *out = (int)d;
  return 0;
}

/* Required integer: absent or null is an error. */
static int req_int(const cJSON *o, const char *k, int *out) {
  const cJSON *v = get(o, k);
  if (!v || cJSON_IsNull(v)) return glm53_err(CFG ": missing required field \"%s\"", k);
  return as_int(v, k, out);
}

/* Optional integer; absent or null -> def. */
static int opt_int(const cJSON *o, const char *k, int def, int *out) {
  const cJSON *v = get(o, k);
  if (!v || cJSON_IsNull(v)) { *out = def; return 0; }
  return as_int(v, k, out);
}

/* Optional float; absent -> def, null -> null_val (NaN for "no limit"). */
static int opt_float(const cJSON *o, const char *k, float def, float null_val, float *out) {
  const cJSON *v = get(o, k);
  if (!v) { *out = def; return 0; }
  if (cJSON_IsNull(v)) { *out = null_val; return 0; }
  if (!cJSON_IsNumber(v)) return glm53_err(CFG ": field \"%s\" must be a number, got %s", k, json_type(v));
  *out = (float)v->valuedouble;
  return 0;
}

/* Optional bool (0/1 integers accepted as Python would). */
static int opt_bool(const cJSON *o, const char *k, int def, int *out) {
  const cJSON *v = get(o, k);
  if (!v || cJSON_IsNull(v)) { *out = def; return 0; }
  if (cJSON_IsBool(v)) { *out = cJSON_IsTrue(v); return 0; }
  if (cJSON_IsNumber(v) && (v->valuedouble == 0 || v->valuedouble == 1)) { *out = v->valuedouble != 0; return 0; }
  return glm53_err(CFG ": field \"%s\" must be a bool, got %s", k, json_type(v));
}

/* Token id: absent -> def, null -> -1. */
static int opt_token(const cJSON *o, const char *k, int def, int *out) {
  const cJSON *v = get(o, k);
  if (!v) { *out = def; return 0; }
  if (cJSON_IsNull(v)) { *out = -1; return 0; }
  return as_int(v, k, out);
}

/* A list of strings mapped through names[] -> codes; n = list length. */
static int parse_schedule(const cJSON *v, const char *k, const char *const *names, const uint8_t *codes,
                          int n_names, uint8_t *dst, int *n) {
  if (!cJSON_IsArray(v)) return glm53_err(CFG ": field \"%s\" must be a list of strings, got %s", k, json_type(v));
  int len = cJSON_GetArraySize(v);
  if (len > GLM53_MAX_LAYERS) return glm53_err(CFG ": field \"%s\" has %d entries (max %d)", k, len, GLM53_MAX_LAYERS);
  int i = 0;
  for (const cJSON *x = v->child; x; x = x->next, i++) {
    if (!cJSON_IsString(x)) return glm53_err(CFG ": %s[%d] must be a string, got %s", k, i, json_type(x));
    int j = 0;
    while (j < n_names && strcmp(x->valuestring, names[j]) != 0) j++;
    if (j == n_names) return glm53_err(CFG ": %s[%d] has unknown value \"%s\"", k, i, x->valuestring);
    dst[i] = codes[j];
  }
  *n = len;
  return 0;
}

static int parse_layer_types(const cJSON *o, glm53_config *c) {
  const cJSON *v = get(o, "layer_types");
  if (v && !cJSON_IsNull(v)) {
    static const char *const nm[] = {"linear_attention", "deepseek_sparse_attention", "full_attention"};
    static const uint8_t cd[] = {ATTN_KDA, ATTN_MLA, ATTN_MLA}; /* legacy full_attention = DSA */
    return parse_schedule(v, "layer_types", nm, cd, 3, c->layer_types, &c->n_layer_types);
  }
  for (int i = 0; i < c->num_hidden_layers; i++) c->layer_types[i] = i % 4 != 3 ? ATTN_KDA : ATTN_MLA;
  c->n_layer_types = c->num_hidden_layers;
  return 0;
}

static int parse_mlp_types(const cJSON *o, glm53_config *c) {
  const cJSON *v = get(o, "mlp_layer_types");
  if (v && !cJSON_IsNull(v)) {
    static const char *const nm[] = {"dense", "sparse"};
    static const uint8_t cd[] = {MLP_DENSE, MLP_MOE};
    return parse_schedule(v, "mlp_layer_types", nm, cd, 2, c->mlp_layer_types, &c->n_mlp_layer_types);
  }
  for (int i = 0; i < c->num_hidden_layers; i++) c->mlp_layer_types[i] = i < 3 ? MLP_DENSE : MLP_MOE;
  c->n_mlp_layer_types = c->num_hidden_layers;
  return 0;
}

/* indexer_types, else index_topk_pattern (string of F/S, or list), else the
 * freq/offset rule: layer i is full iff max(i - offset + 1, 0) % freq == 0. */
static int parse_indexer_types(const cJSON *o, glm53_config *c) {
  static const char *const nm[] = {"full", "shared"};
  static const uint8_t cd[] = {INDEX_FULL, INDEX_SHARED};
  const cJSON *v = get(o, "indexer_types");
  if (v && !cJSON_IsNull(v)) return parse_schedule(v, "indexer_types", nm, cd, 2, c->indexer_types, &c->n_indexer_types);
  v = get(o, "index_topk_pattern");
  if (v && !cJSON_IsNull(v)) {
    if (!cJSON_IsString(v))
      return parse_schedule(v, "index_topk_pattern", nm, cd, 2, c->indexer_types, &c->n_indexer_types);
    const char *p = v->valuestring;
    int len = (int)strlen(p);
    if (len > GLM53_MAX_LAYERS)
      return glm53_err(CFG ": field \"index_topk_pattern\" has %d entries (max %d)", len, GLM53_MAX_LAYERS);
    for (int i = 0; i < len; i++) {
      if (p[i] != 'F' && p[i] != 'S')
        return glm53_err(CFG ": index_topk_pattern[%d] is '%c', expected 'F' or 'S'", i, p[i]);
      c->indexer_types[i] = p[i] == 'F' ? INDEX_FULL : INDEX_SHARED;
    }
    c->n_indexer_types = len;
    return 0;
  }
  int freq, off;
  if (opt_int(o, "index_topk_freq", 1, &freq) || opt_int(o, "index_skip_topk_offset", 2, &off)) return -1;
  if (freq < 1) freq = 1;
  for (int i = 0; i < c->num_hidden_layers; i++) {
    int a = i - off + 1;
    if (a < 0) a = 0;
    c->indexer_types[i] = a % freq == 0 ? INDEX_FULL : INDEX_SHARED;
  }
  c->n_indexer_types = c->num_hidden_layers;
  return 0;
}

static int parse_eos(const cJSON *o, const cJSON *top, glm53_config *c) {
  const cJSON *v = get(o, "eos_token_id");
  if (!v && o != top) v = get(top, "eos_token_id"); /* some files keep token ids at the top level */
  c->n_eos = 0;
  if (!v || cJSON_IsNull(v)) return 0;
  if (cJSON_IsNumber(v)) { c->n_eos = 1; return as_int(v, "eos_token_id", &c->eos_token_id[0]); }
  if (!cJSON_IsArray(v)) return glm53_err(CFG ": field \"eos_token_id\" must be an integer or a list, got %s", json_type(v));
  int n = cJSON_GetArraySize(v);
  if (n > GLM53_MAX_EOS) return glm53_err(CFG ": eos_token_id has %d entries (max %d)", n, GLM53_MAX_EOS);
  int i = 0;
  for (const cJSON *x = v->child; x; x = x->next, i++)
    if (as_int(x, "eos_token_id[]", &c->eos_token_id[i])) return -1;
  c->n_eos = n;
  return 0;
}

/* linear_attn_config overrides the linear_* fields with transformers 5.17's
 * semantics (dict.get(key, current)): keys head_dim, num_heads,
 * short_conv_kernel_size, gate_lower_bound (an explicit null clears it), and
 * safe_gate (default true) restores -5 when the bound ends up null. */
static int parse_linear_dict(const cJSON *o, glm53_config *c, int *have_heads, int *have_dim) {
  const cJSON *d = get(o, "linear_attn_config");
  if (!d || cJSON_IsNull(d)) return 0;
  if (!cJSON_IsObject(d)) return glm53_err(CFG ": field \"linear_attn_config\" must be an object, got %s", json_type(d));
  const cJSON *v;
  if ((v = get(d, "head_dim")) && !cJSON_IsNull(v)) {
    if (as_int(v, "linear_attn_config.head_dim", &c->linear_head_dim)) return -1;
    *have_dim = 1;
  }
  if ((v = get(d, "num_heads")) && !cJSON_IsNull(v)) {
    if (as_int(v, "linear_attn_config.num_heads", &c->linear_num_heads)) return -1;
    *have_heads = 1;
  }
  if ((v = get(d, "short_conv_kernel_size")) && !cJSON_IsNull(v) &&
      as_int(v, "linear_attn_config.short_conv_kernel_size", &c->linear_conv_kernel_dim))
    return -1;
  if (opt_float(d, "gate_lower_bound", c->linear_lower_bound, NAN, &c->linear_lower_bound)) return -1;
  int safe = 1;
  if (opt_bool(d, "safe_gate", 1, &safe)) return -1;
  if (safe && isnan(c->linear_lower_bound)) c->linear_lower_bound = -5.0f;
  return 0;
}

int glm53_config_parse(const char *json_text, glm53_config *cfg) {
  memset(cfg, 0, sizeof *cfg);
  cJSON *root = cJSON_Parse(json_text ? json_text : "");
  if (!root) return glm53_err(CFG ": not valid JSON");
  int rc = -1;
  const cJSON *o = root;
  glm53_config *c = cfg;
  if (!cJSON_IsObject(root)) { glm53_err(CFG ": top level is not a JSON object"); goto done; }
  const cJSON *tc = get(root, "text_config");
  if (tc && !cJSON_IsNull(tc)) {
    if (!cJSON_IsObject(tc)) { glm53_err(CFG ": field \"text_config\" must be an object, got %s", json_type(tc)); goto done; }
    o = tc;
  }

  /* Shape-defining fields (linear heads/dim may come from linear_attn_config). */
  if (req_int(o, "vocab_size", &c->vocab_size) || req_int(o, "hidden_size", &c->hidden_size) ||
      req_int(o, "num_hidden_layers", &c->num_hidden_layers) ||
      req_int(o, "num_attention_heads", &c->num_attention_heads) || req_int(o, "kv_lora_rank", &c->kv_lora_rank) ||
      req_int(o, "q_lora_rank", &c->q_lora_rank) || req_int(o, "qk_nope_head_dim", &c->qk_nope_head_dim) ||
      req_int(o, "v_head_dim", &c->v_head_dim) || req_int(o, "moe_intermediate_size", &c->moe_intermediate_size) ||
      req_int(o, "intermediate_size", &c->intermediate_size))
    goto done;
  {
    const cJSON *ne = get(o, "n_routed_experts");
    if (!ne || cJSON_IsNull(ne)) ne = get(o, "num_local_experts"); /* transformers attribute_map alias */
    if (!ne || cJSON_IsNull(ne)) { glm53_err(CFG ": missing required field \"n_routed_experts\""); goto done; }
    if (as_int(ne, "n_routed_experts", &c->n_routed_experts)) goto done;
  }
  if (req_int(o, "num_experts_per_tok", &c->num_experts_per_tok) || req_int(o, "index_n_heads", &c->index_n_heads) ||
      req_int(o, "index_head_dim", &c->index_head_dim) || req_int(o, "index_topk", &c->index_topk) ||
      req_int(o, "index_kpool", &c->index_kpool) || req_int(o, "hc_mult", &c->hc_mult))
    goto done;
  if (c->num_hidden_layers < 1 || c->num_hidden_layers > GLM53_MAX_LAYERS) {
    glm53_err(CFG ": num_hidden_layers = %d out of range [1, %d]", c->num_hidden_layers, GLM53_MAX_LAYERS);
    goto done;
  }

  /* Defaults as in Glm5NextTextConfig. */
  if (opt_int(o, "num_key_value_heads", c->num_attention_heads, &c->num_key_value_heads) ||
      opt_int(o, "qk_rope_head_dim", 0, &c->qk_rope_head_dim) ||
      opt_float(o, "rms_norm_eps", 1e-5f, 1e-5f, &c->rms_norm_eps) ||
      opt_bool(o, "tie_word_embeddings", 0, &c->tie_word_embeddings) ||
      opt_bool(o, "index_kpool_always_select_tail", 1, &c->index_kpool_always_select_tail) ||
      opt_int(o, "linear_conv_kernel_dim", 4, &c->linear_conv_kernel_dim) ||
      opt_float(o, "linear_lower_bound", -5.0f, NAN, &c->linear_lower_bound) ||
      opt_int(o, "hc_sinkhorn_iters", 20, &c->hc_sinkhorn_iters) ||
      opt_float(o, "hc_eps", 1e-6f, 1e-6f, &c->hc_eps) ||
      opt_int(o, "n_shared_experts", 1, &c->n_shared_experts) || opt_int(o, "n_group", 1, &c->n_group) ||
      opt_int(o, "topk_group", 1, &c->topk_group) || opt_bool(o, "norm_topk_prob", 1, &c->norm_topk_prob) ||
      opt_float(o, "routed_scaling_factor", 2.5f, 2.5f, &c->routed_scaling_factor) ||
      opt_float(o, "swiglu_limit", 10.0f, NAN, &c->swiglu_limit))
    goto done;
  {
    const cJSON *mp = get(o, "max_position_embeddings");
    c->max_position_embeddings = 4096;
    if (mp && !cJSON_IsNull(mp)) {
      if (!cJSON_IsNumber(mp) || mp->valuedouble != floor(mp->valuedouble) || fabs(mp->valuedouble) > 9e15) {
        glm53_err(CFG ": field \"max_position_embeddings\" must be an integer, got %s", json_type(mp));
        goto done;
      }
      c->max_position_embeddings = (int64_t)mp->valuedouble;
    }
  }
  /* Token ids: text_config first, then the top level, then the default. */
  {
    const cJSON *src = get(o, "pad_token_id") || o == root ? o : root;
    if (opt_token(src, "pad_token_id", 154820, &c->pad_token_id)) goto done;
    src = get(o, "bos_token_id") || o == root ? o : root;
    if (opt_token(src, "bos_token_id", -1, &c->bos_token_id)) goto done;
    if (parse_eos(o, root, c)) goto done;
  }

  /* Linear attention: top-level fields, then the dict overrides. */
  int have_heads = 0, have_dim = 0;
  {
    const cJSON *v;
    if ((v = get(o, "linear_num_heads")) && !cJSON_IsNull(v)) {
      if (as_int(v, "linear_num_heads", &c->linear_num_heads)) goto done;
      have_heads = 1;
    }
    if ((v = get(o, "linear_head_dim")) && !cJSON_IsNull(v)) {
      if (as_int(v, "linear_head_dim", &c->linear_head_dim)) goto done;
      have_dim = 1;
    }
  }
  if (parse_linear_dict(o, c, &have_heads, &have_dim)) goto done;
  if (!have_heads) { glm53_err(CFG ": missing required field \"linear_num_heads\""); goto done; }
  if (!have_dim) { glm53_err(CFG ": missing required field \"linear_head_dim\""); goto done; }

  if (parse_layer_types(o, c) || parse_mlp_types(o, c) || parse_indexer_types(o, c)) goto done;
  rc = 0;
done:
  cJSON_Delete(root);
  return rc;
}

int glm53_config_load_dir(const char *dir, glm53_config *cfg) {
  size_t n = strlen(dir) + 16;
  char *p = xmalloc(n);
  snprintf(p, n, "%s/config.json", dir);
  char *txt = read_file(p, NULL);
  free(p);
  if (!txt) return -1;
  int rc = glm53_config_parse(txt, cfg);
  free(txt);
  return rc;
}

#define POS(f) \
  if (c->f < 1) return glm53_err(CFG ": " #f " must be positive, got %d", c->f)

int glm53_config_validate(const glm53_config *c) {
  POS(vocab_size); POS(hidden_size); POS(intermediate_size); POS(moe_intermediate_size);
  POS(num_hidden_layers); POS(num_attention_heads); POS(num_key_value_heads); POS(q_lora_rank);
  POS(kv_lora_rank); POS(qk_nope_head_dim); POS(v_head_dim); POS(index_n_heads); POS(index_head_dim);
  POS(index_topk); POS(index_kpool); POS(linear_num_heads); POS(linear_head_dim); POS(linear_conv_kernel_dim);
  POS(hc_mult); POS(hc_sinkhorn_iters); POS(n_routed_experts); POS(num_experts_per_tok); POS(n_group);
  POS(topk_group);
  if (c->num_hidden_layers > GLM53_MAX_LAYERS)
    return glm53_err(CFG ": num_hidden_layers = %d exceeds %d", c->num_hidden_layers, GLM53_MAX_LAYERS);
  if (c->qk_rope_head_dim != 0)
    return glm53_err(CFG ": qk_rope_head_dim = %d but this engine supports only NoPE MLA (0)", c->qk_rope_head_dim);
  if (c->num_attention_heads % c->num_key_value_heads)
    return glm53_err(CFG ": num_attention_heads (%d) must be divisible by num_key_value_heads (%d)",
                     c->num_attention_heads, c->num_key_value_heads);
  if (c->index_topk % c->index_kpool)
    return glm53_err(CFG ": index_topk (%d) must be divisible by index_kpool (%d)", c->index_topk, c->index_kpool);
  if (c->n_shared_experts < 0) return glm53_err(CFG ": n_shared_experts must be >= 0, got %d", c->n_shared_experts);
  if (c->n_routed_experts % c->n_group)
    return glm53_err(CFG ": n_routed_experts (%d) must be divisible by n_group (%d)", c->n_routed_experts, c->n_group);
  if (c->topk_group > c->n_group)
    return glm53_err(CFG ": topk_group (%d) must be <= n_group (%d)", c->topk_group, c->n_group);
  if (c->num_experts_per_tok > c->n_routed_experts / c->n_group * c->topk_group)
    return glm53_err(CFG ": num_experts_per_tok (%d) exceeds the experts in topk_group groups (%d)",
                     c->num_experts_per_tok, c->n_routed_experts / c->n_group * c->topk_group);
  if (!(c->rms_norm_eps > 0)) return glm53_err(CFG ": rms_norm_eps must be > 0");
  if (!(c->hc_eps >= 0)) return glm53_err(CFG ": hc_eps must be >= 0");
  if (!isfinite(c->routed_scaling_factor)) return glm53_err(CFG ": routed_scaling_factor must be finite");
  if (!isnan(c->swiglu_limit) && !(c->swiglu_limit > 0)) return glm53_err(CFG ": swiglu_limit must be > 0 or null");
  if (isnan(c->linear_lower_bound))
    return glm53_err(CFG ": linear_lower_bound is null: the unbounded (softplus) KDA gate is not supported");
  if (c->max_position_embeddings < 1) return glm53_err(CFG ": max_position_embeddings must be positive");
  const struct { const char *name; int n; } sched[] = {
      {"layer_types", c->n_layer_types}, {"mlp_layer_types", c->n_mlp_layer_types}, {"indexer_types", c->n_indexer_types}};
  for (int i = 0; i < 3; i++)
    if (sched[i].n != c->num_hidden_layers)
      return glm53_err(CFG ": %s has %d entries but num_hidden_layers is %d", sched[i].name, sched[i].n,
                       c->num_hidden_layers);
  for (int i = 0; i < c->num_hidden_layers; i++)
    if (c->layer_types[i] > ATTN_MLA || c->mlp_layer_types[i] > MLP_MOE || c->indexer_types[i] > INDEX_SHARED)
      return glm53_err(CFG ": bad schedule code at layer %d", i);
  /* A shared indexer layer reuses the previous full layer's selection. */
  int seen_full = 0;
  for (int i = 0; i < c->num_hidden_layers; i++) {
    if (c->layer_types[i] != ATTN_MLA) continue;
    if (c->indexer_types[i] == INDEX_FULL) seen_full = 1;
    else if (!seen_full)
      return glm53_err(CFG ": layer %d has a shared indexer but no earlier full indexer layer", i);
  }
  /* Token ids are not range-checked against vocab_size: tiny test configs keep
   * the real model's default ids (pad 154820), and an unreachable id is harmless. */
  return 0;
}
