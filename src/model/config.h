/* GLM-5.3-Flash (glm5_next) text-model configuration, as parsed from a
 * Hugging Face config.json (nested `text_config` or flat). Field names follow
 * transformers' Glm5NextTextConfig; defaults are that class's defaults, but a
 * config that omits a field the model needs is an error (see hf_config.c). */
#ifndef GLM53_MODEL_CONFIG_H
#define GLM53_MODEL_CONFIG_H
#include <stdint.h>

#define GLM53_MAX_LAYERS 256
#define GLM53_MAX_EOS 8
#define GLM53_MAX_HC 16 /* hc_mult bound (the model uses 4) */

enum glm53_attn_kind { ATTN_KDA = 0, ATTN_MLA = 1 };        /* linear_attention / deepseek_sparse_attention */
enum glm53_mlp_kind { MLP_DENSE = 0, MLP_MOE = 1 };         /* dense / sparse */
enum glm53_index_kind { INDEX_FULL = 0, INDEX_SHARED = 1 }; /* full / shared */

typedef struct {
  int vocab_size;
  int hidden_size;
  int intermediate_size;      /* dense MLP width */
  int moe_intermediate_size;  /* routed/shared expert width */
  int num_hidden_layers;
  float rms_norm_eps;
  int tie_word_embeddings;

  /* MLA (NoPE) */
  int num_attention_heads;
  int num_key_value_heads;
  int q_lora_rank;
  int kv_lora_rank;
  int qk_nope_head_dim;
  int qk_rope_head_dim;   /* must be 0: no RoPE in this model */
  int v_head_dim;

  /* DSA indexer */
  int index_n_heads;
  int index_head_dim;
  int index_topk;         /* tokens; index_topk / index_kpool pools are selected */
  int index_kpool;
  int index_kpool_always_select_tail;

  /* KDA */
  int linear_num_heads;
  int linear_head_dim;
  int linear_conv_kernel_dim;
  float linear_lower_bound;   /* NaN = not set (softplus form, unsupported) */

  /* mHC */
  int hc_mult;
  int hc_sinkhorn_iters;
  float hc_eps;

  /* MoE */
  int n_routed_experts;
  int num_experts_per_tok;
  int n_shared_experts;
  int n_group;
  int topk_group;
  int norm_topk_prob;
  float routed_scaling_factor;
  float swiglu_limit;         /* NaN = no clamp */

  int pad_token_id;           /* -1 = none */
  int bos_token_id;           /* -1 = none */
  int n_eos;
  int eos_token_id[GLM53_MAX_EOS];
  int64_t max_position_embeddings;

  uint8_t layer_types[GLM53_MAX_LAYERS];     /* glm53_attn_kind */
  uint8_t mlp_layer_types[GLM53_MAX_LAYERS]; /* glm53_mlp_kind */
  uint8_t indexer_types[GLM53_MAX_LAYERS];   /* glm53_index_kind */
  /* Added by hf_config.c: lengths of the three schedules as given in the
   * file (== num_hidden_layers when defaulted); validate checks them. */
  int n_layer_types, n_mlp_layer_types, n_indexer_types;
} glm53_config;

/* Parse config.json text. Returns 0, or -1 with a one-line error naming the
 * missing/invalid field. */
int glm53_config_parse(const char *json_text, glm53_config *cfg);
/* Read and parse DIR/config.json. */
int glm53_config_load_dir(const char *dir, glm53_config *cfg);
/* Consistency checks (head dims, divisibility, schedule lengths). */
int glm53_config_validate(const glm53_config *cfg);

#endif
