/* Backend selection and the CPU fallback of a session (no GPU needed):
 *  - "gpu" on a build without GPU support (or without a device) is refused
 *    with one clear line, also when asked through $GLM53_BACKEND;
 *  - "auto" without a GPU picks cpu and says so in a log line;
 *  - an unknown backend name is refused;
 *  - a GLM53_FAULT-injected forward error, then glm53_session_fallback_cpu:
 *    the session continues on the cpu backend with logits bitwise identical
 *    to an uninterrupted CPU run;
 *  - glm53_session_rebuild after the session's recurrent and latent state
 *    were scribbled over (as a failed batched step could leave them): the
 *    continuation is bitwise that of the uninterrupted run. */
#include "glm53.h"
#include "model/session.h"
#include "model_fixture.h"
#include <stdlib.h>
#include <unistd.h>

/* runs glm53_backend_select with stderr captured into buf */
static int select_captured(glm53_model *m, const char *want, char *buf, size_t len) {
  fflush(stderr);
  FILE *tmp = tmpfile();
  int saved = dup(2);
  dup2(fileno(tmp), 2);
  int rc = glm53_backend_select(m, want);
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  rewind(tmp);
  size_t n = fread(buf, 1, len - 1, tmp);
  buf[n] = 0;
  fclose(tmp);
  return rc;
}

static int have_gpu_device(void) {
#ifdef GLM53_HAVE_GPU
  return 1; /* the build has GPU support: a device may or may not be present */
#else
  return 0;
#endif
}

static void check_selection(void) {
  glm53_config c;
  fx_config(&c, 8, 4, 0);
  glm53_model *m = fx_model(&c, 11);
  char log[4096];
  int rc = select_captured(m, "gpu", log, sizeof log);
  if (!have_gpu_device()) {
    CHECK(rc == -1, "gpu on a CPU-only build must be refused");
    CHECK(strstr(glm53_last_error(), "no GPU support") != NULL, "refusal reason: %s", glm53_last_error());
    CHECK(strchr(glm53_last_error(), '\n') == NULL, "one line");
    setenv("GLM53_BACKEND", "gpu", 1);
    CHECK(select_captured(m, NULL, log, sizeof log) == -1, "$GLM53_BACKEND=gpu must be refused");
    CHECK(strstr(glm53_last_error(), "no GPU support") != NULL, "env refusal: %s", glm53_last_error());
    unsetenv("GLM53_BACKEND");
    CHECK(select_captured(m, "auto", log, sizeof log) == 0, "auto: %s", glm53_last_error());
    CHECK(!strcmp(glm53_model_backend(m), "cpu"), "auto picked %s", glm53_model_backend(m));
    CHECK(strstr(log, "backend: cpu") != NULL, "auto log line missing: '%s'", log);
  } else if (rc == -1) { /* GPU build, no usable device */
    CHECK(strstr(glm53_last_error(), "backend gpu unavailable") != NULL, "refusal: %s", glm53_last_error());
    CHECK(select_captured(m, "auto", log, sizeof log) == 0, "auto: %s", glm53_last_error());
    CHECK(!strcmp(glm53_model_backend(m), "cpu"), "auto picked %s", glm53_model_backend(m));
    CHECK(strstr(log, "backend: cpu (GPU backend unavailable") != NULL, "auto log line: '%s'", log);
  } else {
    CHECK(!strcmp(glm53_model_backend(m), "gpu"), "gpu selected: %s", glm53_model_backend(m));
  }
  CHECK(select_captured(m, "tpu", log, sizeof log) == -1, "unknown backend accepted");
  CHECK(strstr(glm53_last_error(), "unknown backend 'tpu'") != NULL, "%s", glm53_last_error());
  glm53_model_free(m);
}

static void check_fault_fallback(void) {
  glm53_config c;
  fx_config(&c, 8, 4, 1);
  glm53_model *m = fx_model(&c, 12);
  const int n = 30, pre = 12, V = c.vocab_size;
  int32_t tok[30];
  trng r = {5};
  for (int i = 0; i < n; i++) tok[i] = (int32_t)(trng_u64(&r) % V);
  float *ref = xmalloc((size_t)n * V * 4), *got = xmalloc((size_t)n * V * 4);
  glm53_session *s = glm53_session_new(m, n);
  CHECK(glm53_forward(s, tok, pre, ref, 1) == 0, "%s", glm53_last_error());
  for (int i = pre; i < n; i++) CHECK(glm53_forward(s, tok + i, 1, ref + (size_t)i * V, 1) == 0, "%s", glm53_last_error());
  glm53_session_free(s);

  s = glm53_session_new(m, n);
  CHECK(glm53_forward(s, tok, pre, got, 1) == 0, "%s", glm53_last_error());
  setenv("GLM53_FAULT", "forward:4", 1);
  int faults = 0;
  for (int i = pre; i < n; i++) {
    if (glm53_forward(s, tok + i, 1, got + (size_t)i * V, 1)) {
      faults++;
      CHECK(strstr(glm53_last_error(), "injected fault") != NULL, "%s", glm53_last_error());
      CHECK(glm53_session_pos(s) == i, "failed forward must leave the session unchanged");
      CHECK(glm53_session_fallback_cpu(s) == 0, "%s", glm53_last_error());
      CHECK(glm53_session_pos(s) == i, "fallback rebuilt %d tokens, expected %d", glm53_session_pos(s), i);
      CHECK(glm53_forward(s, tok + i, 1, got + (size_t)i * V, 1) == 0, "%s", glm53_last_error());
    }
  }
  unsetenv("GLM53_FAULT");
  CHECK(faults == 1, "expected one injected fault, saw %d", faults);
  CHECK(!strcmp(glm53_session_backend(s), "cpu"), "backend after fallback: %s", glm53_session_backend(s));
  CHECK(memcmp(ref, got, (size_t)n * V * 4) == 0, "logits after the fallback differ from the uninterrupted run");
  glm53_session_free(s);
  free(ref); free(got);
  glm53_model_free(m);
}

static void check_rebuild(void) {
  glm53_config c;
  fx_config(&c, 8, 4, 1);
  glm53_model *m = fx_model(&c, 12);
  const int n = 24, pre = 10, V = c.vocab_size;
  int32_t tok[24];
  trng r = {11};
  for (int i = 0; i < n; i++) tok[i] = (int32_t)(trng_u64(&r) % V);
  float *ref = xmalloc((size_t)n * V * 4), *got = xmalloc((size_t)n * V * 4);
  for (int pass = 0; pass < 2; pass++) {
    float *out = pass ? got : ref;
    glm53_session *s = glm53_session_new(m, n);
    CHECK(glm53_forward(s, tok, pre, out, 1) == 0, "%s", glm53_last_error());
    for (int i = pre; i < n; i++) {
      if (pass && i == pre + 3) { /* stale state, as a failed batch may leave */
        for (int l = 0; l < c.num_hidden_layers; l++) {
          if (s->kda[l].S) s->kda[l].S[0] += 1.0f;
          if (s->mla[l].latent) s->mla[l].latent[(size_t)(i - 1) * c.kv_lora_rank] += 1.0f;
        }
        CHECK(glm53_session_rebuild(s) == 0, "%s", glm53_last_error());
        CHECK(glm53_session_pos(s) == i, "rebuild left pos %d, expected %d", glm53_session_pos(s), i);
      }
      CHECK(glm53_forward(s, tok + i, 1, out + (size_t)i * V, 1) == 0, "%s", glm53_last_error());
    }
    glm53_session_free(s);
  }
  CHECK(memcmp(ref, got, (size_t)n * V * 4) == 0, "logits after glm53_session_rebuild differ from the uninterrupted run");
  free(ref); free(got);
  glm53_model_free(m);
}

int main(void) {
  check_selection();
  check_fault_fallback();
  check_rebuild();
  TEST_DONE();
}
