/* .g53 source: binds every bind_item (bind.c) to its tensor in the mmapped
 * file. Matrices point into the mapping (no copy); fp32 vectors are copied
 * to the heap so that model_free_weights can free them as for HF models. */
#include "model/bind.h"
#include "core/err.h"
#include "core/util.h"
#include "format/g53.h"
#include <stdio.h>
#include <stdlib.h>

typedef struct {
  g53_file *f;
  size_t bytes;
} g53_bind_ctx;

static int bind_one(void *vctx, const bind_item *it) {
  g53_bind_ctx *c = vctx;
  const g53_tensor *t = g53_find(c->f, it->name);
  if (!t) return glm53_err("%s: missing tensor '%s'", g53_dir(c->f), it->name);
  int64_t n = 1;
  int ok = t->ndim == it->ndim;
  for (int i = 0; i < it->ndim; i++) {
    n *= it->shape[i];
    ok = ok && t->shape[i] == it->shape[i];
  }
  if (!ok) return glm53_err("%s: tensor '%s' has the wrong shape for this config", g53_dir(c->f), it->name);
  c->bytes += t->nbytes;
  if (it->vec) {
    if (t->dtype != G53_F32) return glm53_err("%s: tensor '%s' must be f32, is %s", g53_dir(c->f), it->name, g53_dtype_name(t->dtype));
    float *buf = aligned_alloc64((size_t)n * sizeof(float));
    memcpy(buf, t->data, (size_t)n * sizeof(float));
    *it->vec = buf;
    return 0;
  }
  wmat *w = it->mat;
  memset(w, 0, sizeof *w);
  w->fmt = t->dtype; /* enum g53_dtype == enum wmat_fmt */
  w->rows = (int)it->shape[0];
  w->cols = (int)it->shape[1];
  w->group = t->group;
  w->scale_bf16 = t->scale_bf16;
  w->data = t->data;
  w->scales = t->dtype == G53_Q4 || t->dtype == G53_Q8 ? t->data + t->scale_off : NULL;
  return 0;
}

int model_bind_g53(glm53_model *m, g53_file *f) {
  g53_bind_ctx c = {.f = f};
  int rc = model_walk(m, bind_one, &c);
  model_tie_lm_head(m);
  m->weight_bytes = c.bytes;
  return rc;
}
