/* The scheduler thread: owns the model; admits queued requests up to
 * `parallel` active sessions and runs rounds. In each round every active
 * request advances by one step:
 *   - all requests in their decode phase step together: one
 *     glm53_forward_batch per backend (sessions moved to the cpu backend by
 *     --on-gpu-error=cpu form their own group; a group of one is a plain
 *     glm53_forward), then each samples / stops / emits from its logits row;
 *   - every request still in its prompt steps one prefill chunk of up to
 *     --prefill-chunk tokens (its own glm53_forward), so a long prompt delays
 *     the decoders by one chunk per round, never by its whole length.
 * Each request runs the shared generation loop (runtime/generate.h) in its
 * split step-wise form: gen_next_input says what to feed, the scheduler runs
 * the forward, gen_advance consumes the logits row.
 *
 * Failures: a request is charged with a backend error only for a forward
 * that was its own. When a batch fails, the rows whose position advanced go
 * on normally. When one row's forward failed (glm53_forward_batch_failed_row:
 * a batch stepped one by one, or a GLM53_FAULT aimed at that row), that row
 * gets its --on-gpu-error policy and the rows after it, never tried, are
 * stepped one by one. When the batched forward failed as a whole, the step
 * belongs to no single row: it is logged and counted once, and every row
 * that did not advance is rebuilt from its history on its backend (the failed
 * step may have left part of its device state updated) and stepped again
 * alone (glm53_forward), each failure handled by that request's policy. */
#include "server/srv_internal.h"
#include "core/err.h"
#include "core/log.h"
#include "core/util.h"
#include "model/config.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* A forward of j alone failed with reason why: count and log it, then apply
 * the --on-gpu-error policy (fail, or rebuild the session on the CPU and
 * retry there once). 0 when the retry succeeded, else -1 + glm53_err. */
static int fwd_failed(job *j, glm53_session *s, const int32_t *toks, int n, float *logits, const char *why) {
  srv *S = j->srv;
  met_inc(&S->met, &S->met.backend_errors);
  LOG_WARN("request %s: backend error on %s: %s", j->id, glm53_session_backend(s), why);
  if (!S->o.on_gpu_error_cpu || j->fell_back) return glm53_err("%s", why);
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

/* One forward of j alone, with the --on-gpu-error policy and cache
 * accounting. 0, or -1 with the reason in glm53_err. */
static int fwd(job *j, const int32_t *toks, int n, float *logits) {
  if (glm53_forward(j->s, toks, n, logits, 0) == 0) {
    atomic_fetch_add(&j->srv->cache_tokens, n);
    return 0;
  }
  char why[512];
  snprintf(why, sizeof why, "%s", glm53_last_error());
  return fwd_failed(j, j->s, toks, n, logits, why);
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

static void job_note(job *j) {
  const gen_result *r = gen_result_of(j->g);
  j->fed = r->n_prompt_fed;
  j->n_gen = r->n_generated;
}

static void job_set_finish(job *j) {
  const int f = gen_result_of(j->g)->finish;
  j->fin = f == GEN_LENGTH ? "length" : f == GEN_CANCELLED ? "cancelled" : "stop";
}

/* j's forward of this round succeeded (rc 0; logits holds its row when
 * in.want_logits) or failed (rc < 0, reason in glm53_err): sample / stop /
 * emit, and set j->fin when it ends. */
static void job_advance(job *j, int rc, float *logits) {
  if (rc < 0) {
    snprintf(j->err, sizeof j->err, "%s", glm53_last_error());
    j->fin = "error";
    return;
  }
  if (atomic_load(&j->cancelled)) { /* client gone during the step: free the slot now */
    j->fin = "cancelled";
    return;
  }
  rc = gen_advance(j->g, logits);
  job_note(j);
  if (rc > 0) return;
  if (rc < 0) {
    snprintf(j->err, sizeof j->err, "%s", glm53_last_error());
    j->fin = "error";
    return;
  }
  job_set_finish(j);
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

/* Scheduler-thread scratch, sized for `parallel` rows. */
typedef struct {
  job **dec, **rest;
  glm53_session **ss;
  int32_t *toks;
  int *pos0;
  float *logits; /* rows x vocab, grown on demand */
  int rows, vocab;
} scratch;

static float *logit_rows(scratch *x, int n) {
  if (n > x->rows) {
    free(x->logits);
    x->logits = xmalloc((size_t)n * (size_t)x->vocab * sizeof(float));
    x->rows = n;
  }
  return x->logits;
}

/* One decode token for each of the n requests in J, all on the backend
 * named backend: one glm53_forward_batch (glm53_forward when n == 1). */
static void decode_group(srv *S, scratch *x, job **J, int n, const char *backend) {
  float *L = logit_rows(x, n);
  const size_t V = (size_t)x->vocab;
  met_batch_step(&S->met, n);
  if (n == 1) {
    job_advance(J[0], fwd(J[0], J[0]->in.tokens, 1, L), L);
    return;
  }
  for (int i = 0; i < n; i++) {
    x->ss[i] = J[i]->s;
    x->toks[i] = J[i]->in.tokens[0];
    x->pos0[i] = glm53_session_pos(J[i]->s);
  }
  if (glm53_forward_batch(x->ss, x->toks, n, L) == 0) {
    atomic_fetch_add(&S->cache_tokens, n);
    for (int i = 0; i < n; i++) job_advance(J[i], 0, L + (size_t)i * V);
    return;
  }
  char why[512];
  snprintf(why, sizeof why, "%s", glm53_last_error());
  met_inc(&S->met, &S->met.batch_failures);
  /* one row's own forward failed (the rows after it are intact), or the
   * batched forward as a whole (-1) */
  const int frow = glm53_forward_batch_failed_row(), loops = frow >= 0;
  int n_adv = 0;
  for (int i = 0; i < n; i++) n_adv += glm53_session_pos(x->ss[i]) > x->pos0[i];
  atomic_fetch_add(&S->cache_tokens, n_adv);
  if (!loops) {
    met_inc(&S->met, &S->met.backend_errors);
    LOG_WARN("decode batch of %d on %s failed: %s; %d rows went through, stepping the other %d one by one", n, backend,
             why, n_adv, n - n_adv);
  }
  for (int i = 0; i < n; i++) {
    float *row = L + (size_t)i * V;
    int rc = 0;
    if (glm53_session_pos(x->ss[i]) == x->pos0[i]) { /* not stepped */
      if (i == frow) {
        rc = fwd_failed(J[i], x->ss[i], &x->toks[i], 1, row, why);
      } else {
        met_inc(&S->met, &S->met.batch_retried);
        /* a failed batched forward may have updated part of this row's
         * device state (e.g. a KDA recurrent state): rebuild it from the
         * history before stepping it alone */
        char rwhy[512];
        if (!loops && glm53_session_rebuild(x->ss[i])) {
          snprintf(rwhy, sizeof rwhy, "%s", glm53_last_error());
          rc = fwd_failed(J[i], x->ss[i], &x->toks[i], 1, row, rwhy);
        } else {
          rc = fwd(J[i], &x->toks[i], 1, row);
        }
      }
    }
    job_advance(J[i], rc, row);
  }
}

/* The decode steps of this round: the nd requests in x->dec, grouped by
 * the backend their session runs on (stable order within a group). */
static void decode_all(srv *S, scratch *x, int nd) {
  int start = 0;
  while (start < nd) {
    const char *b = glm53_session_backend(x->dec[start]->s);
    int k = start, nr = 0;
    for (int i = start; i < nd; i++) {
      if (!strcmp(glm53_session_backend(x->dec[i]->s), b)) x->dec[k++] = x->dec[i];
      else x->rest[nr++] = x->dec[i];
    }
    memcpy(x->dec + k, x->rest, (size_t)nr * sizeof *x->rest);
    decode_group(S, x, x->dec + start, k - start, b);
    start = k;
  }
}

/* One round over the active list (scheduler thread, no lock held). Jobs
 * that end are finished (answered) and moved to *done. */
static void sched_round(srv *S, scratch *x, int quit, job **done) {
  int nd = 0;
  for (job *j = S->active; j; j = j->next) {
    j->fin = NULL;
    j->err[0] = 0;
    if (quit || atomic_load(&j->cancelled)) {
      j->fin = "cancelled";
    } else if (!j->g && job_init(S, j, j->err, sizeof j->err)) {
      j->fin = "error";
    } else if (gen_next_input(j->g, &j->in) == 0) { /* cancelled before a prefill chunk */
      job_note(j);
      job_set_finish(j);
    } else if (j->in.decode) {
      x->dec[nd++] = j;
    }
  }
  /* decoders first: their tokens go out before this round's prompt chunks */
  decode_all(S, x, nd);
  met_batch_round(&S->met, nd);
  for (job *j = S->active; j; j = j->next) {
    if (j->fin || j->in.decode) continue;
    float *L = j->in.want_logits ? logit_rows(x, 1) : NULL;
    job_advance(j, fwd(j, j->in.tokens, j->in.n, L), L);
  }
  job **pp = &S->active;
  while (*pp) {
    job *j = *pp;
    if (j->fin) {
      job_end(S, j, j->fin, j->err);
      *pp = j->next; /* only this thread edits the active list */
      j->next = *done;
      *done = j;
    } else {
      pp = &j->next;
    }
  }
  if (!S->active) met_batch_round(&S->met, 0); /* idle: no current batch */
}

static void *sched_main(void *arg) {
  srv *S = arg;
  const int P = S->o.parallel;
  scratch x = {.dec = xcalloc((size_t)P, sizeof(job *)), .rest = xcalloc((size_t)P, sizeof(job *)),
               .ss = xcalloc((size_t)P, sizeof(glm53_session *)), .toks = xcalloc((size_t)P, sizeof(int32_t)),
               .pos0 = xcalloc((size_t)P, sizeof(int)), .vocab = glm53_model_vocab_size(S->m)};
  int busy = 0; /* a round ran since the last trim */
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
      if (busy) {
        /* Idle: hand the memory freed by finished requests back to the OS.
         * glibc keeps freed chunks of its heaps (and of the per-thread
         * arenas of the connection threads) mapped; how much depends on the
         * order in which requests of different sizes ran, so without this
         * an idle server's RSS is a high-water mark that depends on timing. */
        busy = 0;
        pthread_mutex_unlock(&S->mu);
        release_free_memory();
        pthread_mutex_lock(&S->mu);
        continue; /* work may have arrived while the lock was dropped */
      }
      pthread_cond_wait(&S->sched_cv, &S->mu);
      continue;
    }
    busy = 1;
    int quit = S->quit;
    pthread_mutex_unlock(&S->mu);
    job *done = NULL;
    sched_round(S, &x, quit, &done);
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
  free(x.dec);
  free(x.rest);
  free(x.ss);
  free(x.toks);
  free(x.pos0);
  free(x.logits);
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
