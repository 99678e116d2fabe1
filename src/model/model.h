/* The loaded model: configuration plus every weight of the text tower, bound
 * by name from a checkpoint (see weights.c for the accepted name layouts).
 * Small vectors (norms, biases, mHC, gates) are always fp32; matrices are
 * wmat so that quantized formats can replace fp32 without touching the
 * forward. */
#ifndef GLM53_MODEL_MODEL_H
#define GLM53_MODEL_MODEL_H
#include "glm53.h"
#include "model/config.h"
#include "model/wmat.h"

typedef struct {
  float *fn;    /* [(2+hc)*hc][hc*D] */
  float *base;  /* [(2+hc)*hc] */
  float *scale; /* [3] */
} mhc_weights;

typedef struct {
  wmat q_proj, k_proj, v_proj;  /* [inner][D] */
  float *conv;                  /* [3*inner][K], channel order q|k|v */
  wmat f_a, f_b;                /* [hd][D], [inner][hd] */
  float *dt_bias;               /* [inner] */
  float *A_log;                 /* [H] */
  wmat b_proj;                  /* [H][D] */
  wmat g_a, g_b;                /* [hd][D], [inner][hd] */
  float *o_norm;                /* [hd] */
  wmat o_proj;                  /* [D][inner] */
} kda_weights;

typedef struct {
  wmat wq_b;          /* [nh*hd][q_lora] */
  wmat wk;            /* [hd][D] */
  float *k_norm_w, *k_norm_b; /* [hd] */
  wmat weights_proj;  /* [nh][D] */
  wmat gate;          /* index_kpool_compress_gate [hd][D] */
  float *ape;         /* [kpool][hd] */
} indexer_weights;

typedef struct {
  wmat q_a;           /* [q_lora][D] */
  float *q_a_norm;    /* [q_lora] */
  wmat q_b;           /* [H*nope][q_lora] */
  wmat kv_a;          /* [kv_lora][D] */
  float *kv_a_norm;   /* [kv_lora] */
  wmat kv_b;          /* [H*(nope+v)][kv_lora] */
  float *kv_b_f32;    /* fp32 copy when kv_b is quantized (mla.c, made on first CPU use) */
  wmat o_proj;        /* [D][H*v] */
  int has_indexer;
  indexer_weights idx;
} mla_weights;

typedef struct {
  wmat gate, up, down; /* [I][D], [I][D], [D][I] */
} mlp_weights;

typedef struct {
  wmat router;            /* [E][D] */
  float *bias;            /* e_score_correction_bias [E] */
  mlp_weights *experts;   /* [E] */
  mlp_weights shared;     /* n_shared_experts * moe_intermediate wide */
} moe_weights;

typedef struct {
  int attn_kind, mlp_kind, index_kind;
  float *input_norm, *post_attn_norm; /* [D] */
  mhc_weights hc_attn, hc_ffn;
  kda_weights kda;
  mla_weights mla;
  mlp_weights dense;
  moe_weights moe;
} layer_weights;

struct glm53_backend;

struct glm53_model {
  glm53_config cfg;
  const struct glm53_backend *backend; /* chosen at load (model.c) */
  void *backend_model;                 /* backend-private (e.g. device weights) */
  double gpu_expert_gb;                /* glm53_load_opts.gpu_expert_gb, for the gpu backend */
  char *dir;
  wmat embed;    /* [V][D] */
  float *final_norm;
  wmat lm_head;  /* [V][D] */
  layer_weights *layers;
  void *st;      /* .g53 models: the g53_file whose mmap the matrices point into; NULL for HF (copied) */
  size_t weight_bytes;
};

/* Bind all weights of cfg from a safetensors checkpoint directory (fp32 copies). */
int model_bind_safetensors(glm53_model *m, const char *dir);
/* Bind all weights from an opened .g53 file (format/g53.h; matrices stay in its mmap). */
struct g53_file;
int model_bind_g53(glm53_model *m, struct g53_file *f);
void model_free_weights(glm53_model *m);

#endif
