/* Per-sequence state, so that decode continues a prefill exactly:
 *  KDA layers: the last K-1 pre-conv inputs and the fp32 recurrent state S;
 *  MLA layers: the normalised kv latent of every token (absorbed MLA caches
 *  only this), and for layers with their own indexer the per-token indexer
 *  key and pool-gate logits plus the pooled keys of every complete pool. */
#ifndef GLM53_MODEL_SESSION_H
#define GLM53_MODEL_SESSION_H
#include "model/model.h"

typedef struct {
  float *conv; /* [K-1][3*inner], oldest first */
  float *S;    /* [H][dk][dv] */
} kda_state;

typedef struct {
  float *latent; /* [max_ctx][kv_lora] */
  float *ik;     /* [max_ctx][ihd]  indexer keys (after LayerNorm) */
  float *is;     /* [max_ctx][ihd]  pool-gate logits */
  float *pool;   /* [max_ctx/kpool][ihd] pooled keys */
} mla_state;

struct glm53_session {
  glm53_model *m;
  const struct glm53_backend *backend; /* normally m->backend; cpu after a fallback */
  void *backend_state;                 /* backend-private per-session state */
  int max_ctx;
  int pos;
  int32_t *history;                    /* [max_ctx] tokens consumed, for CPU fallback */
  kda_state *kda; /* by layer (unused entries zero) */
  mla_state *mla;
};

/* Allocates the cpu backend's caches (kda/mla above) where missing:
 * at session creation on the cpu backend, and by glm53_session_fallback_cpu. */
void session_cpu_state_alloc(glm53_session *s);

#endif
