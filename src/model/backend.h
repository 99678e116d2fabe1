/* Compute backends. A backend runs the forward for a session; the model code
 * above this seam does not know which one it is. The fp32 reference in this
 * folder is the "cpu" backend; src/gpu provides "gpu" when built with
 * GLM53_CUDA or GLM53_HIP (it then defines GLM53_HAVE_GPU).
 *
 * Selection (glm53_model_load): opts->backend, else $GLM53_BACKEND, else
 * "auto". "auto" tries the GPU backend (capability detection + startup
 * validation) and falls back to cpu with a log line saying why; "gpu"
 * refuses to load with the reason; "cpu" never touches a GPU.
 *
 * Fault handling: when a backend forward fails for a session, the session
 * can be rebuilt on the cpu backend from its token history
 * (glm53_session_fallback_cpu), as `--on-gpu-error=cpu` asks. */
#ifndef GLM53_MODEL_BACKEND_H
#define GLM53_MODEL_BACKEND_H
#include <stddef.h>
#include <stdint.h>
#include "glm53.h"

typedef struct glm53_backend {
  const char *name;
  /* Prepare the model (upload weights, validate kernels). 0, or -1 with a
   * one-line reason in glm53_err. */
  int (*model_init)(glm53_model *m);
  void (*model_free)(glm53_model *m);
  int (*session_init)(glm53_session *s);
  void (*session_free)(glm53_session *s);
  void (*session_reset)(glm53_session *s);
  /* Same contract as glm53_forward; the session's pos/history are advanced
   * by the caller on success. */
  int (*forward)(glm53_session *s, const int32_t *tokens, int n, float *logits, int all_rows);
  /* Optional: one token for each of n sessions in one step (glm53_forward_batch
   * contract, arguments already checked). NULL: glm53_forward_batch loops. */
  int (*forward_batch)(glm53_session **s, const int32_t *tokens, int n, float *logits);
} glm53_backend;

/* The reference backend (always available). */
const glm53_backend *glm53_cpu_backend(void);
#ifdef GLM53_HAVE_GPU
const glm53_backend *glm53_gpu_backend(void);
#endif

/* Chooses m->backend (see above). 0, or -1 with the reason. */
int glm53_backend_select(glm53_model *m, const char *want);

/* GLM53_FAULT fault injection for tests: "forward:N" makes the N-th
 * (1-based) backend forward call of the process fail as a GPU error would
 * (each row of a batch counts as one call); "batch:N" fails the N-th
 * batched forward of two or more rows as a whole. */
int glm53_fault_should_fail(const char *site);

#endif
