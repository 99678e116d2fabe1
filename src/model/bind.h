/* The one description of every weight the model binds, shared by the
 * Hugging Face loader (weights.c), the .g53 loader (weights_g53.c) and the
 * converter (convert.c). model_walk visits each tensor slot in file order
 * (routed experts: gate, up, down of one expert adjacent) and hands the
 * visitor its canonical name, accepted HF aliases, shape, precision tier and
 * destination. */
#ifndef GLM53_MODEL_BIND_H
#define GLM53_MODEL_BIND_H
#include "model/model.h"

/* What precision a tensor may be stored at (docs/format.md). */
enum bind_tier {
  TIER_FP32 = 0,   /* keep fp32: norms, mHC, router + bias, A_log, dt_bias, conv, ape, k_norm, weights_proj */
  TIER_EMBED = 1,  /* embed_tokens / lm_head */
  TIER_MAT = 2,    /* attention and dense/shared MLP matrices */
  TIER_EXPERT = 3, /* routed experts */
};

typedef struct {
  char name[256];      /* canonical name, relative to the text tower prefix, e.g. layers.3.mlp.gate.weight */
  char base[128];      /* HF name = tower prefix (unless root) + base + one of alts */
  const char *alts;    /* '|'-separated accepted spellings; the first one is canonical */
  int root;            /* HF name has no tower prefix (lm_head) */
  int ndim;
  int64_t shape[3];
  int tier;
  int layer;           /* -1 for embed/norm/lm_head */
  int expert, part;    /* routed expert id and 0 gate / 1 up / 2 down; expert -1 otherwise */
  int conv;            /* fused KDA conv (HF may split it into q/k/v_conv1d) */
  float **vec;         /* destination for fp32 tensors (non-NULL iff not a matrix) */
  wmat *mat;           /* destination for matrices */
} bind_item;

typedef int (*bind_fn)(void *ctx, const bind_item *it);

/* Allocates m->layers (and expert arrays) from m->cfg, sets the per-layer
 * kinds, and calls fn for every tensor; stops at the first error. Tied
 * embeddings: lm_head is not visited; the caller aliases it (model_tie_lm_head). */
int model_walk(glm53_model *m, bind_fn fn, void *ctx);
void model_tie_lm_head(glm53_model *m);

/* ---- Hugging Face safetensors source (weights.c) ---- */
typedef struct hf_source hf_source;
hf_source *hf_source_open(const char *dir); /* NULL + glm53_err */
void hf_source_close(hf_source *h);
/* Reads the tensor of `it` as fp32 (numel of it->shape floats), resolving
 * aliases, split conv and fused 3-D experts (sliced, never read whole). */
int hf_source_read(hf_source *h, const bind_item *it, float *out);
/* Safetensors dtype name of the tensor backing `it` (for reports). */
const char *hf_source_dtype(hf_source *h, const bind_item *it);

#endif
