/* Small read-only accessors of the public API that generation code needs
 * (kept apart from model.c, which others edit). */
#include "model/model.h"
#include "model/session.h"

int glm53_model_eos(const glm53_model *m, int32_t *ids, int cap) {
  int n = m->cfg.n_eos;
  for (int i = 0; i < n && i < cap; i++) ids[i] = m->cfg.eos_token_id[i];
  return n;
}

glm53_model *glm53_session_model(const glm53_session *s) { return s->m; }
