/* Server life cycle: options, start (scheduler, then HTTP), graceful stop. */
#include "server/srv_internal.h"
#include "core/err.h"
#include "core/log.h"
#include <stdlib.h>
#include <string.h>
#include <time.h>

void srv_opts_default(srv_opts *o) {
  memset(o, 0, sizeof *o);
  o->host = "127.0.0.1";
  o->port = 8080;
  o->ctx = 4096;
  o->parallel = 4;
  o->queue = 64;
  o->max_body = 1 << 20;
  o->prefill_chunk = 64;
  o->max_connections = 256;
}

static char *default_name(const glm53_model *m) {
  const char *d = glm53_model_dir(m);
  if (!d || !*d) return xstrdup("glm53");
  size_t n = strlen(d);
  while (n > 1 && d[n - 1] == '/') n--;
  size_t b = n;
  while (b > 0 && d[b - 1] != '/') b--;
  char *s = xmalloc(n - b + 1);
  memcpy(s, d + b, n - b);
  s[n - b] = 0;
  return s;
}

srv *srv_start(glm53_model *m, const glm53_tokenizer *tok, const srv_opts *o) {
  if (o->ctx < 2) { glm53_err("--ctx must be at least 2"); return NULL; }
  if (o->parallel < 1 || o->queue < 0) { glm53_err("--parallel must be >= 1 and --queue >= 0"); return NULL; }
  srv *S = xcalloc(1, sizeof *S);
  S->o = *o;
  S->m = m;
  S->tok = tok;
  S->model_name = o->model_name && *o->model_name ? xstrdup(o->model_name) : default_name(m);
  for (char *p = S->model_name; *p; p++) /* it goes into metric labels and JSON */
    if (*p == '"' || *p == '\\' || (unsigned char)*p < 0x20) *p = '_';
  pthread_mutex_init(&S->mu, NULL);
  pthread_cond_init(&S->sched_cv, NULL);
  met_init(&S->met);
  atomic_init(&S->next_id, 1);
  atomic_init(&S->cache_tokens, 0);
  if (sched_start(S)) goto fail_early;
  if (http_start(S)) {
    sched_stop(S, 0);
    goto fail_early;
  }
  return S;
fail_early:
  met_destroy(&S->met);
  pthread_cond_destroy(&S->sched_cv);
  pthread_mutex_destroy(&S->mu);
  free(S->model_name);
  free(S);
  return NULL;
}

int srv_port(const srv *S) { return S->port; }

void srv_stop(srv *S, double grace_s) {
  if (!S) return;
  pthread_mutex_lock(&S->mu);
  S->stopping = 1; /* new generation requests get 503 */
  pthread_mutex_unlock(&S->mu);
  http_quiesce(S);      /* no new connections */
  sched_stop(S, grace_s); /* in-flight requests finish, or are cancelled after grace_s */
  /* every job is finished now; give the HTTP threads a bounded moment to write
   * the last bytes (MHD_stop_daemon would cut streams short) */
  double t0 = now_sec();
  pthread_mutex_lock(&S->mu);
  while (S->n_http > 0 && now_sec() - t0 < 5.0) {
    pthread_mutex_unlock(&S->mu);
    struct timespec ts = {0, 10 * 1000 * 1000};
    nanosleep(&ts, NULL);
    pthread_mutex_lock(&S->mu);
  }
  pthread_mutex_unlock(&S->mu);
  http_stop(S);         /* joins the connection threads */
  met_destroy(&S->met);
  pthread_cond_destroy(&S->sched_cv);
  pthread_mutex_destroy(&S->mu);
  free(S->model_name);
  free(S);
}
