/* The scheduler thread: owns the model; admits queued requests up to
 * `parallel` active sessions and, each round, advances every active request
 * by one prefill chunk or one decode token (round-robin interleaving at token
 * granularity). The step function is per request, so a batched forward over
 * all active sessions can later replace the loop in sched_round without
 * changing the request life cycle.
 *
 * Each request runs the shared generation loop (runtime/generate.h) in its
 * step-wise form: gen_step does one prefill chunk or one decode token. */
#include "server/srv_internal.h"
#include "core/err.h"
#include "core/log.h"
#include "model/config.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* gen_params.forward hook: one forward with the --on-gpu-error policy and
 * cache accounting. 0, or -1 with the reason in glm53_err. */
static int fwd(void *user, glm53_session *s, const int32_t *toks, int n, float *logits) {
  job *j = user;
  srv *S = j->srv;
  if (glm53_forward(s, toks, n, logits, 0) == 0) {
    atomic_fetch_add(&S->cache_tokens, n);
    return 0;
  }
  char err[512];
  snprintf(err, sizeof err, "%s", glm53_last_error());
  met_inc(&S->met, &S->met.backend_errors);
  LOG_WARN("request %s: backend error on %s: %s", j->id, glm53_session_backend(s), err);
  if (!S->o.on_gpu_error_cpu || j->fell_back) return glm53_err("%s", err);
  j->fell_back = 1;
  if (glm53_session_fallback_cpu(s) != 0) {
    glm53_err_ctx("CPU fallback failed");
    LOG_ERROR("request %s: %s", j->id, glm53_last_error());
    return -1;
  }
  met_inc(&S->met, &S->met.cpu_fallbacks);
  LOG_WARN("request %s: continuing on the cpu backend", j->id);
  if (glm53_forward(s, toks, n, logits, 0) == 0) {
    atomic_fetch_add(&S->cache_tokens, n);
    return 0;
  }
  glm53_err_ctx("after CPU fallback");
  LOG_ERROR("request %s: %s", j->id, glm53_last_error());
  return -1;
}

/* gen_on_token callback: stream the text, note the time to first token. */
static int on_token(void *user, const gen_token *t) {
  job *j = user;
  srv *S = j->srv;
  if (t->token >= 0 && j->t_first == 0) {
    j->t_first = now_sec();
    met_observe(&S->met, &S->met.ttft, j->t_first - j->t_arrive);
  }
  api_emit_token(S, j, t->token, t->text, t->text_len, t->logprob, t->top, t->n_top);
  return 0;
}

static int job_init(srv *S, job *j, char *err, size_t cap) {
  j->gp.stop = j->n_stop ? (const char *const *)j->stop : NULL;
  j->gp.n_stop = j->n_stop;
  j->gp.prefill_chunk = S->o.prefill_chunk > 0 ? S->o.prefill_chunk : 64;
  j->gp.forward = fwd;
  j->gp.forward_user = j;
  j->s = glm53_session_new(S->m, S->o.ctx);
  if (j->s) j->g = gen_begin(j->s, S->tok, j->prompt, j->n_prompt, &j->gp, on_token, j);
  if (!j->g) {
    snprintf(err, cap, "cannot start the request: %s", glm53_last_error());
    return -1;
  }
  api_stream_begin(S, j);
  return 0;
}

static void job_cleanup(job *j) {
  gen_end(j->g);
  glm53_session_free(j->s);
  j->g = NULL;
  j->s = NULL;
}

/* Advances j by one prefill chunk or one decode token. Returns NULL while it
 * goes on, else the finish reason ("stop", "length", "error"). */
static const char *job_step(srv *S, job *j, char *err, size_t cap) {
  if (!j->g && job_init(S, j, err, cap)) return "error";
  int rc = gen_step(j->g);
  const gen_result *r = gen_result_of(j->g);
  j->fed = r->n_prompt_fed;
  j->n_gen = r->n_generated;
  if (rc > 0) return NULL;
  if (rc < 0) {
    snprintf(err, cap, "%s", glm53_last_error());
    return "error";
  }
  return r->finish == GEN_LENGTH ? "length" : r->finish == GEN_CANCELLED ? "cancelled" : "stop";
}

static void job_end(srv *S, job *j, const char *finish, const char *err) {
  if (j->s) atomic_fetch_sub(&S->cache_tokens, glm53_session_pos(j->s));
  LOG_INFO("request %s: %d prompt + %d generated tokens, %s%s%s, %.3f s", j->id, j->n_prompt, j->n_gen, finish,
           err && *err ? ": " : "", err ? err : "", now_sec() - j->t_arrive);
  if (!strcmp(finish, "error")) api_finish(S, j, NULL, err);
  else if (!strcmp(finish, "cancelled")) api_finish(S, j, NULL, "request cancelled");
  else api_finish(S, j, finish, NULL);
  if (j->n_gen > 0) met_observe(&S->met, &S->met.total, now_sec() - j->t_arrive);
  met_tokens(&S->met, j->fed, j->n_gen);
  if (!strcmp(finish, "cancelled")) met_inc(&S->met, &S->met.cancelled);
  job_cleanup(j);
}

static void *sched_main(void *arg) {
  srv *S = arg;
  char err[512];
  pthread_mutex_lock(&S->mu);
  for (;;) {
    /* admit */
    while (S->queue_head && S->n_active < S->o.parallel && !S->quit) {
      job *j = S->queue_head;
      S->queue_head = j->next;
      if (!S->queue_head) S->queue_tail = NULL;
      S->n_queued--;
      j->next = S->active;
      S->active = j;
      S->n_active++;
    }
    if (!S->active) {
      if (S->quit) break; /* queued jobs are answered below */
      pthread_cond_wait(&S->sched_cv, &S->mu);
      continue;
    }
    int quit = S->quit;
    pthread_mutex_unlock(&S->mu);
    /* one round: every active request advances by one step */
    job *done = NULL, **pp = &S->active;
    while (*pp) {
      job *j = *pp;
      const char *fin = NULL;
      err[0] = 0;
      if (quit || atomic_load(&j->cancelled)) fin = "cancelled";
      else fin = job_step(S, j, err, sizeof err);
      if (fin) {
        job_end(S, j, fin, err);
        *pp = j->next; /* only this thread edits the active list */
        j->next = done;
        done = j;
      } else {
        pp = &j->next;
      }
    }
    pthread_mutex_lock(&S->mu);
    while (done) {
      job *j = done;
      done = j->next;
      S->n_active--;
      job_release(S, j);
    }
  }
  /* shutdown: whatever is still queued gets an error answer */
  while (S->queue_head) {
    job *j = S->queue_head;
    S->queue_head = j->next;
    S->n_queued--;
    pthread_mutex_unlock(&S->mu);
    api_finish(S, j, NULL, "server shutting down");
    pthread_mutex_lock(&S->mu);
    job_release(S, j);
  }
  S->queue_tail = NULL;
  pthread_mutex_unlock(&S->mu);
  return NULL;
}

int sched_start(srv *S) {
  if (pthread_create(&S->sched, NULL, sched_main, S)) return glm53_err("cannot start the scheduler thread");
  return 0;
}

int sched_submit(srv *S, job *j) {
  pthread_mutex_lock(&S->mu);
  if (S->stopping || S->n_queued >= S->o.queue + (S->o.parallel - S->n_active > 0 ? S->o.parallel - S->n_active : 0)) {
    pthread_mutex_unlock(&S->mu);
    return -1;
  }
  j->t_arrive = now_sec();
  j->refs++; /* the scheduler's reference */
  j->next = NULL;
  if (S->queue_tail) S->queue_tail->next = j;
  else S->queue_head = j;
  S->queue_tail = j;
  S->n_queued++;
  pthread_cond_signal(&S->sched_cv);
  pthread_mutex_unlock(&S->mu);
  return 0;
}

void sched_stop(srv *S, double grace_s) {
  double t0 = now_sec();
  pthread_mutex_lock(&S->mu);
  S->stopping = 1;
  /* queued requests are answered "shutting down" at quit; active ones may finish */
  while ((S->n_active > 0 || S->n_queued > 0) && now_sec() - t0 < grace_s) {
    pthread_mutex_unlock(&S->mu);
    struct timespec ts = {0, 20 * 1000 * 1000};
    nanosleep(&ts, NULL);
    pthread_mutex_lock(&S->mu);
  }
  S->quit = 1;
  pthread_cond_signal(&S->sched_cv);
  pthread_mutex_unlock(&S->mu);
  pthread_join(S->sched, NULL);
}
