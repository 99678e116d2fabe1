/* Shared golden-logits comparison for tests that check our fp32 forward
 * against transformers (goldens.json + raw little-endian float32 [rows, vocab]
 * files, the format of tools/oracle/make_goldens.py). A case is run as a
 * prefill of decode_from tokens, then one token at a time; every row must
 * match to max|diff| / max|ref| <= GOLDEN_TOL. "hf_raw" cases (unpatched
 * transformers, not causal-consistent beyond index_topk, docs/oracle.md) are
 * asserted only on rows inside index_topk. Include after test_util.h. */
#ifndef GLM53_GOLDEN_CHECK_H
#define GLM53_GOLDEN_CHECK_H
#include "glm53.h"
#include "model/model.h"
#include "core/util.h"
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GOLDEN_TOL 1e-4

/* Runs one case of DIR/goldens.json; returns the worst asserted row's
 * relative difference (or -1 if the case could not run). */
static inline double golden_run_case(glm53_model *m, const char *dir, const cJSON *cs) {
  const char *name = cJSON_GetStringValue(cJSON_GetObjectItem(cs, "name"));
  const char *ref = cJSON_GetStringValue(cJSON_GetObjectItem(cs, "reference"));
  const char *file = cJSON_GetStringValue(cJSON_GetObjectItem(cs, "logits"));
  const cJSON *toks = cJSON_GetObjectItem(cs, "tokens"), *df = cJSON_GetObjectItem(cs, "decode_from");
  CHECK(name && ref && file && cJSON_IsArray(toks), "%s: malformed case", dir);
  if (!name || !ref || !file || !cJSON_IsArray(toks)) return -1;
  int T = cJSON_GetArraySize(toks), V = m->cfg.vocab_size;
  int dfrom = cJSON_IsNumber(df) ? df->valueint : T;
  int32_t *ids = xmalloc(T * sizeof(int32_t));
  for (int i = 0; i < T; i++) ids[i] = cJSON_GetArrayItem(toks, i)->valueint;
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", dir, file);
  size_t len;
  float *gold = (float *)read_file(path, &len);
  CHECK(gold && len == (size_t)T * V * sizeof(float), "%s: golden file %s has %zu bytes, want %zu", dir, file,
        gold ? len : 0, (size_t)T * V * sizeof(float));
  if (!gold || len != (size_t)T * V * sizeof(float)) { free(gold); free(ids); return -1; }
  float *out = xmalloc((size_t)T * V * sizeof(float));
  glm53_session *s = glm53_session_new(m, T);
  CHECK(s != NULL, "%s", glm53_last_error());
  if (!s) { free(out); free(gold); free(ids); return -1; }
  CHECK(glm53_forward(s, ids, dfrom, out, 1) == 0, "%s", glm53_last_error());
  for (int i = dfrom; i < T; i++) CHECK(glm53_forward(s, ids + i, 1, out + (size_t)i * V, 1) == 0, "%s", glm53_last_error());
  glm53_session_free(s);
  int raw = !strcmp(ref, "hf_raw");
  double worst = 0, worst_beyond = 0;
  for (int t = 0; t < T; t++) {
    double d = rows_rel_diff(gold + (size_t)t * V, out + (size_t)t * V, 1, V);
    if (raw && t + 1 > m->cfg.index_topk) { worst_beyond = fmax(worst_beyond, d); continue; }
    worst = fmax(worst, d);
    CHECK(d <= GOLDEN_TOL, "%s/%s (%s, T=%d, decode_from=%d) row %d: rel diff %.3g", dir, name, ref, T, dfrom, t, d);
  }
  printf("  %-28s %-9s T=%-3d decode_from=%-3d max rel diff %.2e%s", name, ref, T, dfrom, worst, raw ? "" : "\n");
  if (raw) printf("  (rows beyond index_topk, not asserted: %.2e)\n", worst_beyond);
  free(out); free(gold); free(ids);
  return worst;
}

#endif
