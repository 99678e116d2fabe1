/* `glm53 serve`: an OpenAI-compatible HTTP server (docs/server.md).
 *
 * Threads: libmicrohttpd runs one thread per connection; one scheduler thread
 * owns the model and runs rounds: all requests in their decode phase step
 * together through one glm53_forward_batch, each request still in its prompt
 * steps one prefill chunk (continuous batching; docs/server.md). */
#ifndef GLM53_SERVER_SERVER_H
#define GLM53_SERVER_SERVER_H
#include "glm53.h"
#include "tokenizer/tokenizer.h"
#include <stddef.h>

typedef struct {
  const char *host;        /* bind address (default 127.0.0.1) */
  int port;                /* 0 = any free port (srv_port tells which) */
  const char *api_key;     /* NULL: no auth; else "Authorization: Bearer KEY" on /v1/ */
  const char *model_name;  /* id served in /v1/models (default: model dir basename) */
  int ctx;                 /* max tokens per request (prompt + generated) */
  int parallel;            /* active sessions stepped together (= the largest decode batch) */
  int queue;               /* waiting requests beyond those; more get 429 */
  size_t max_body;         /* request body limit in bytes (413 beyond) */
  int prefill_chunk;       /* prompt tokens per scheduler step */
  int on_gpu_error_cpu;    /* 1: rebuild a failed session on the CPU and go on; 0: fail the request */
  int max_connections;     /* HTTP connections at once */
} srv_opts;

void srv_opts_default(srv_opts *o);

typedef struct srv srv;

/* Binds and starts serving. The model and tokenizer must outlive the server.
 * NULL + glm53_err on failure (e.g. the port is taken). */
srv *srv_start(glm53_model *m, const glm53_tokenizer *tok, const srv_opts *o);
int srv_port(const srv *s);
/* Graceful stop: stops accepting, answers queued requests 503, lets active
 * ones finish for up to grace_s seconds (then cancels them), joins all
 * threads and frees the server. */
void srv_stop(srv *s, double grace_s);

#endif
