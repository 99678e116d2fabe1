/* glm53 public C API: load a model, open sessions, run the forward.
 *
 * Errors: functions return NULL or a negative value and leave one clear
 * message in glm53_last_error() (thread-local).
 *
 * Threading: a model is read-only after load and may be shared by many
 * sessions; a session is used by one thread at a time. */
#ifndef GLM53_H
#define GLM53_H
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct glm53_model glm53_model;
typedef struct glm53_session glm53_session;

typedef struct {
  const char *backend;   /* "auto" | "cpu" | "gpu"; NULL = $GLM53_BACKEND or "auto" */
  int n_threads;         /* CPU threads (process-wide OpenMP setting); 0 = OMP_NUM_THREADS or all cores */
  /* gpu backend: device memory in GB (1e9 bytes) for routed experts,
   * resident ones plus the cache slots of those streamed from host memory.
   * -1 (or 0, which zero-initialised opts give) = $GLM53_GPU_EXPERT_GB, else
   * auto: free device memory after the dense weights minus a reserve. */
  double gpu_expert_gb;
} glm53_load_opts;

/* Load a Hugging Face checkpoint directory (config.json + *.safetensors) or a
 * converted .g53 model. */
glm53_model *glm53_model_load(const char *path, const glm53_load_opts *opts);
void glm53_model_free(glm53_model *m);
int glm53_model_vocab_size(const glm53_model *m);
/* Directory holding tokenizer.json / chat_template.jinja, or NULL. */
const char *glm53_model_dir(const glm53_model *m);
/* The model's end-of-sequence token ids (config.json eos_token_id, in file
 * order). Writes at most cap ids to ids and returns the total count (may be
 * 0). Implemented in src/model/model_info.c. */
int glm53_model_eos(const glm53_model *m, int32_t *ids, int cap);

/* A session holds the per-sequence caches (KDA conv + recurrent state, MLA
 * latent cache, indexer pooled keys). max_ctx bounds the tokens it may hold. */
glm53_session *glm53_session_new(glm53_model *m, int max_ctx);
void glm53_session_free(glm53_session *s);
void glm53_session_reset(glm53_session *s);
int glm53_session_pos(const glm53_session *s);      /* tokens consumed so far */
int glm53_session_max_ctx(const glm53_session *s);
/* The model the session was opened on (model_info.c). */
glm53_model *glm53_session_model(const glm53_session *s);

/* Feed n tokens (a prefill chunk, or one decode token) after the session's
 * current position. logits: NULL (no output), or room for n*vocab floats
 * (all_rows != 0) or vocab floats (last row only). Returns 0 or -1; on error
 * the session is unchanged (a prompt longer than the context is refused). */
int glm53_forward(glm53_session *s, const int32_t *tokens, int n, float *logits, int all_rows);

/* One decode step for n sessions of the same model, one token each:
 * tokens[i] is fed to sessions[i] and row i of logits (n x vocab floats)
 * gets its next-token logits. Same results as n single-token
 * glm53_forward calls, up to the backend's batch tolerance (docs/gpu.md):
 * the gpu backend runs the n tokens through one forward, reading every
 * weight once; the cpu backend loops (GLM53_CPU_BATCH=1: one forward too,
 * not clearly faster where measured; the same bits up to 8 rows). Sessions must be
 * distinct; sessions on different backends or models are stepped one by
 * one. Returns 0, or -1 when some row failed: the rows whose
 * glm53_session_pos advanced were stepped (their logits rows are valid),
 * the others were not. glm53_forward_batch_failed_row() then tells whether
 * one row's own forward failed (its index: the rows after it were not
 * tried and are intact) or the batched forward as a whole (-1: the rows'
 * device state may be stale; glm53_session_rebuild or
 * glm53_session_fallback_cpu rebuilds it from the token history).
 * GLM53_FAULT counts one forward per row. */
int glm53_forward_batch(glm53_session **sessions, const int32_t *tokens, int n, float *logits);
int glm53_forward_batch_failed_row(void);

/* Backend in use ("cpu" or "gpu"). */
const char *glm53_model_backend(const glm53_model *m);
const char *glm53_session_backend(const glm53_session *s);
/* Rebuild the session's state on the CPU backend from its token history and
 * continue there (used after a GPU error with --on-gpu-error=cpu). */
int glm53_session_fallback_cpu(glm53_session *s);
/* Rebuild the session's state on its own backend from its token history
 * (after a failed glm53_forward_batch that may have left it stale). 0, or
 * -1 with the position and history unchanged (the state still stale). */
int glm53_session_rebuild(glm53_session *s);

const char *glm53_last_error(void);

#ifdef __cplusplus
}
#endif
#endif
