/* The scheduler thread: owns the model; admits queued requests up to
 * `parallel` active sessions and, each round, advances every active request
 * by one prefill chunk or one decode token (round-robin interleaving at token
 * granularity). The step function is per request, so a batched forward over
 * all active sessions can later replace the loop in sched_round without
 * changing the request life cycle.
 *
 * The per-request step mirrors gen_run (runtime/generate.c) - prefill, then
 * sample / stop / stream - but one step at a time, because gen_run is a
 * blocking loop that cannot be interleaved with other sessions. */
#include "server/srv_internal.h"
#include "core/err.h"
#include "core/log.h"
#include "model/config.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* One forward with the --on-gpu-error policy. 0, or -1 (message in errbuf). */
static int fwd(srv *S, job *j, const int32_t *toks, int n, float *logits, char *errbuf, size_t cap) {
  if (glm53_forward(j->s, toks, n, logits, 0) == 0) {
    atomic_fetch_add(&S->cache_tokens, n);
    return 0;
  }
  snprintf(errbuf, cap, "%s", glm53_last_error());
  met_inc(&S->met, &S->met.backend_errors);
  LOG_WARN("request %s: backend error on %s: %s", j->id, glm53_session_backend(j->s), errbuf);
  if (!S->o.on_gpu_error_cpu || j->fell_back) return -1;
  j->fell_back = 1;
  if (glm53_session_fallback_cpu(j->s) != 0) {
    snprintf(errbuf, cap, "CPU fallback failed: %s", glm53_last_error());
    LOG_ERROR("request %s: %s", j->id, errbuf);
    return -1;
  }
  met_inc(&S->met, &S->met.cpu_fallbacks);
  LOG_WARN("request %s: continuing on the cpu backend", j->id);
  if (glm53_forward(j->s, toks, n, logits, 0) == 0) {
    atomic_fetch_add(&S->cache_tokens, n);
    return 0;
  }
  snprintf(errbuf, cap, "%s (after CPU fallback)", glm53_last_error());
  LOG_ERROR("request %s: %s", j->id, errbuf);
  return -1;
}

static int job_init(srv *S, job *j, char *err, size_t cap) {
  const int V = glm53_model_vocab_size(S->m);
  int32_t ids[GLM53_MAX_EOS];
  int n_ids = 0;
  if (!j->gp.ignore_eos) {
    n_ids = glm53_model_eos(S->m, ids, GLM53_MAX_EOS);
    if (n_ids > GLM53_MAX_EOS) n_ids = GLM53_MAX_EOS;
  }
  stop_config sc = {.strings = j->n_stop ? (const char *const *)j->stop : NULL, .n_strings = j->n_stop,
                    .token_ids = ids, .n_token_ids = n_ids, .max_tokens = j->gp.max_tokens};
  j->s = glm53_session_new(S->m, S->o.ctx);
  if (j->s) j->sm = stop_new(&sc);
  if (j->sm) j->smp = sampler_new(&j->gp.sp, V);
  if (j->smp) j->ts = tok_stream_new(S->tok, 0);
  if (!j->ts) {
    snprintf(err, cap, "cannot start the request: %s", glm53_last_error());
    return -1;
  }
  j->logits = xmalloc((size_t)V * sizeof(float));
  j->tcap = 256;
  j->tbuf = xmalloc(j->tcap);
  api_stream_begin(S, j);
  return 0;
}

static void job_cleanup(job *j) {
  glm53_session_free(j->s);
  stop_free(j->sm);
  sampler_free(j->smp);
  tok_stream_free(j->ts);
  free(j->logits);
  free(j->tbuf);
  j->s = NULL; j->sm = NULL; j->smp = NULL; j->ts = NULL; j->logits = NULL; j->tbuf = NULL;
}

/* Releases the held-back text at the end (not after a stop-string match). */
static void flush_text(srv *S, job *j) {
  const char *out;
  size_t n = 0;
  int k = tok_stream_flush(j->ts, j->tbuf, j->tcap);
  if (k > 0) {
    if (stop_feed(j->sm, j->tbuf, (size_t)k, &out, &n)) {
      if (n) api_emit_token(S, j, -1, out, n, 0, NULL, 0);
      return;
    }
    if (n) api_emit_token(S, j, -1, out, n, 0, NULL, 0);
  }
  stop_flush(j->sm, &out, &n);
  if (n) api_emit_token(S, j, -1, out, n, 0, NULL, 0);
}

/* Samples from j->logits and emits. Returns NULL (go on) or the finish reason. */
static const char *sample_emit(srv *S, job *j, char *err, size_t cap) {
  token_logprob top[SAMPLER_MAX_LOGPROBS];
  float lp = 0;
  int32_t t = sampler_sample(j->smp, j->logits, j->n_top > 0 ? top : NULL, &lp);
  if (t < 0) {
    snprintf(err, cap, "sampling failed: %s", glm53_last_error());
    return "error";
  }
  if (j->n_gen++ == 0) {
    j->t_first = now_sec();
    met_observe(&S->met, &S->met.ttft, j->t_first - j->t_arrive);
  }
  sampler_accept(j->smp, t);
  stop_reason r = stop_token(j->sm, t);
  if (r == STOP_TOKEN) { flush_text(S, j); return "stop"; }
  size_t blen = 0;
  int k = 0;
  if (tok_token_bytes(S->tok, t, &blen)) { /* ids without a tokenizer entry give no text */
    if (blen + 16 > j->tcap) {
      j->tcap = blen + 16;
      j->tbuf = xrealloc(j->tbuf, j->tcap);
    }
    k = tok_stream_push(j->ts, t, j->tbuf, j->tcap);
    if (k < 0) k = 0;
  }
  const char *out;
  size_t n = 0;
  int matched = stop_feed(j->sm, j->tbuf, (size_t)k, &out, &n);
  api_emit_token(S, j, t, out, n, lp, j->n_top > 0 ? top : NULL, j->n_top);
  if (matched) return "stop";
  if (r == STOP_LENGTH || glm53_session_pos(j->s) + 1 >= S->o.ctx) { flush_text(S, j); return "length"; }
  j->last = t;
  return NULL;
}

/* Advances j by one prefill chunk or one decode token. Returns NULL while it
 * goes on, else the finish reason ("stop", "length", "error"). */
static const char *job_step(srv *S, job *j, char *err, size_t cap) {
  if (j->state == JOB_QUEUED) {
    if (job_init(S, j, err, cap)) return "error";
    j->state = JOB_PREFILL;
  }
  if (j->state == JOB_PREFILL) {
    int chunk = S->o.prefill_chunk > 0 ? S->o.prefill_chunk : 64;
    int len = j->n_prompt - j->fed < chunk ? j->n_prompt - j->fed : chunk;
    int last = j->fed + len == j->n_prompt;
    if (fwd(S, j, j->prompt + j->fed, len, last ? j->logits : NULL, err, cap)) return "error";
    j->fed += len;
    if (!last) return NULL;
    for (int i = 0; i < j->n_prompt; i++) sampler_accept(j->smp, j->prompt[i]);
    j->state = JOB_DECODE;
    return sample_emit(S, j, err, cap);
  }
  if (fwd(S, j, &j->last, 1, j->logits, err, cap)) return "error";
  return sample_emit(S, j, err, cap);
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
