/* Shared internals of the server: the request (job) record handed from the
 * HTTP threads to the scheduler thread, and the server object. */
#ifndef GLM53_SERVER_INTERNAL_H
#define GLM53_SERVER_INTERNAL_H
#include "server/server.h"
#include "server/sbuf.h"
#include "server/metrics.h"
#include "runtime/generate.h"
#include "runtime/stop.h"
#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdatomic.h>

enum { SPLIT_REASONING, SPLIT_CONTENT, SPLIT_TOOLS }; /* chat stream splitter mode */

typedef struct job {
  /* ---- the request (set by the HTTP thread before queueing, then read-only) ---- */
  int chat, stream, include_usage;
  int32_t *prompt;
  int n_prompt;
  gen_params gp;          /* sp, max_tokens, ignore_eos; stop strings below */
  char **stop;
  int n_stop;
  int logprobs;           /* report logprobs */
  int n_top;              /* top alternatives per token */
  char id[48];
  long created;
  const char *model;      /* the server's model name */
  int endpoint;           /* metrics endpoint index */
  struct srv *srv;

  /* ---- scheduler-thread state (no lock) ---- */
  glm53_session *s;
  gen_state *g;           /* the shared generation loop, stepped by the scheduler */
  gen_input in;           /* this round's step (gen_next_input) */
  const char *fin;        /* this round: finish reason once it ends ("stop", "length", "cancelled", "error") */
  char err[512];          /* why, for "error" */
  int fed, n_gen, fell_back;
  double t_arrive, t_first;
  sbuf text;              /* all emitted text (chat: parsed at the end) */
  sbuf split_pending;     /* chat streaming: text held back at a possible tag */
  int split_mode;
  cJSON *lp;              /* non-stream logprobs entries (array) */

  /* ---- shared with the HTTP thread (srv->mu) ---- */
  sbuf out;               /* stream: SSE bytes not yet written */
  int done;               /* finished: out holds the rest / result is set */
  int status;             /* HTTP status of a non-stream answer */
  char *result;           /* non-stream response body (JSON) */
  atomic_int cancelled;   /* set by the HTTP side (client gone) or shutdown */
  int refs;
  pthread_cond_t cv;
  struct job *next;
} job;

struct srv {
  srv_opts o;
  glm53_model *m;
  const glm53_tokenizer *tok;
  char *model_name;
  struct MHD_Daemon *d;
  int port;
  pthread_t sched;
  pthread_mutex_t mu;
  pthread_cond_t sched_cv;
  job *queue_head, *queue_tail;
  int n_queued, n_active;
  int n_http;             /* jobs an HTTP thread still answers (shutdown waits for them) */
  job *active;            /* owned by the scheduler thread */
  int stopping;           /* no new requests; scheduler drains */
  int quit;               /* scheduler: cancel everything and exit */
  atomic_long next_id;
  atomic_long cache_tokens; /* tokens held by active sessions (a gauge) */
  metrics met;
};

/* api.c: request parsing and response bodies. */
/* Parses an OpenAI request body into a new job. On error returns NULL and
 * writes an OpenAI error JSON into *err (malloc'd) and the status into *status. */
job *api_parse_request(srv *S, int chat, const char *body, size_t len, char **err, int *status);
char *api_error_json(const char *message, const char *type, const char *param, const char *code);
char *api_models_json(srv *S);
/* Called by the scheduler: one generated token's text (already past stop
 * handling), its logprob and alternatives. */
void api_emit_token(srv *S, job *j, int32_t token, const char *text, size_t len, float lp, const token_logprob *top,
                    int n_top);
/* Finish: builds the final stream chunks or the non-stream body. finish:
 * "stop" | "length" | NULL on error (msg then says why). */
void api_finish(srv *S, job *j, const char *finish, const char *errmsg);
/* The first chunk of a chat stream (role announcement). */
void api_stream_begin(srv *S, job *j);
void job_release(srv *S, job *j); /* drops one reference (srv->mu held) */
/* Valid UTF-8 copy of n bytes (invalid bytes become U+FFFD). */
char *utf8_sanitize(const char *s, size_t n);
int utf8_valid(const char *s, size_t n);

/* sched.c */
int sched_start(srv *S);
/* Enqueues j (takes the scheduler's reference). 0, or -1 when the queue is full
 * or the server is stopping. */
int sched_submit(srv *S, job *j);
void sched_stop(srv *S, double grace_s);

/* http.c */
int http_start(srv *S);
void http_quiesce(srv *S);
void http_stop(srv *S);

#endif
