/* HTTP side (libmicrohttpd, one thread per connection): body collection with
 * a size limit, auth, routing, and the two ways a generation is answered:
 * non-stream (the handler waits for the job, watching for a client hang-up)
 * and stream (an SSE response whose reader waits for new chunks; a failed
 * write or hang-up ends the response, whose free callback cancels the job). */
#include "server/srv_internal.h"
#include "core/err.h"
#include "core/log.h"
#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct {
  sbuf body;
  int too_big;
  int started;
} req_ctx;

static enum MHD_Result respond(srv *S, struct MHD_Connection *c, int ep, int status, const char *ctype, char *body,
                               const char *allow) {
  struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
  MHD_add_response_header(r, "Content-Type", ctype);
  if (allow) MHD_add_response_header(r, "Allow", allow);
  if (status == 401) MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
  enum MHD_Result rc = MHD_queue_response(c, (unsigned)status, r);
  MHD_destroy_response(r);
  met_request(&S->met, ep, status);
  return rc;
}

static enum MHD_Result respond_err(srv *S, struct MHD_Connection *c, int ep, int status, const char *msg, const char *type,
                                   const char *code, const char *allow) {
  return respond(S, c, ep, status, "application/json", api_error_json(msg, type, NULL, code), allow);
}

static int auth_ok(srv *S, struct MHD_Connection *c) {
  if (!S->o.api_key || !*S->o.api_key) return 1;
  const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
  if (!h || strncmp(h, "Bearer ", 7)) return 0;
  h += 7;
  size_t a = strlen(h), b = strlen(S->o.api_key);
  unsigned diff = (unsigned)(a ^ b);
  for (size_t i = 0; i < a; i++) diff |= (unsigned char)h[i] ^ (unsigned char)S->o.api_key[i % (b ? b : 1)];
  return diff == 0;
}

/* ---- streaming ---- */
static ssize_t sse_reader(void *cls, uint64_t pos, char *buf, size_t max) {
  (void)pos;
  job *j = cls;
  srv *S = j->srv;
  pthread_mutex_lock(&S->mu);
  while (j->out.n == 0 && !j->done) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 2;
    if (pthread_cond_timedwait(&j->cv, &S->mu, &ts) == ETIMEDOUT && j->out.n == 0 && !j->done) {
      /* an SSE comment: a write to a closed socket is how a hang-up shows */
      pthread_mutex_unlock(&S->mu);
      static const char ping[] = ": ping\n\n";
      size_t n = sizeof ping - 1 < max ? sizeof ping - 1 : max;
      memcpy(buf, ping, n);
      return (ssize_t)n;
    }
  }
  ssize_t n;
  if (j->out.n) {
    n = (ssize_t)(j->out.n < max ? j->out.n : max);
    memcpy(buf, j->out.p, (size_t)n);
    sbuf_consume(&j->out, (size_t)n);
  } else {
    n = MHD_CONTENT_READER_END_OF_STREAM;
  }
  pthread_mutex_unlock(&S->mu);
  return n;
}

static void sse_free(void *cls) {
  job *j = cls;
  srv *S = j->srv;
  atomic_store(&j->cancelled, 1); /* no effect when it already finished */
  pthread_mutex_lock(&S->mu);
  S->n_http--;
  pthread_cond_signal(&S->sched_cv);
  job_release(S, j);
  pthread_mutex_unlock(&S->mu);
}

static int client_gone(struct MHD_Connection *c) {
  const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
  if (!ci) return 0;
  struct pollfd p = {.fd = ci->connect_fd, .events = POLLRDHUP};
  return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

static enum MHD_Result generate(srv *S, struct MHD_Connection *c, int chat, req_ctx *rq) {
  int ep = chat ? EP_CHAT : EP_COMPLETIONS;
  char *err = NULL;
  int status = 400;
  job *j = api_parse_request(S, chat, rq->body.p ? rq->body.p : "", rq->body.n, &err, &status);
  if (!j) return respond(S, c, ep, status, "application/json", err, NULL);
  j->srv = S;
  if (sched_submit(S, j)) {
    pthread_mutex_lock(&S->mu);
    int stopping = S->stopping;
    job_release(S, j);
    pthread_mutex_unlock(&S->mu);
    if (stopping) return respond_err(S, c, ep, 503, "the server is shutting down", "server_error", "shutting_down", NULL);
    met_inc(&S->met, &S->met.rejected);
    return respond_err(S, c, ep, 429, "too many requests: the queue is full, retry later", "rate_limit_error",
                       "queue_full", NULL);
  }
  pthread_mutex_lock(&S->mu);
  S->n_http++;
  pthread_mutex_unlock(&S->mu);
  if (j->stream) {
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, sse_reader, j, sse_free);
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    enum MHD_Result rc = MHD_queue_response(c, MHD_HTTP_OK, r);
    MHD_destroy_response(r); /* the reference to j now belongs to the response */
    met_request(&S->met, ep, 200);
    return rc;
  }
  pthread_mutex_lock(&S->mu);
  while (!j->done) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 200 * 1000 * 1000;
    if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
    pthread_cond_timedwait(&j->cv, &S->mu, &ts);
    if (!j->done && client_gone(c)) {
      atomic_store(&j->cancelled, 1);
      pthread_cond_signal(&S->sched_cv);
    }
  }
  char *body = j->result;
  j->result = NULL;
  status = j->status;
  S->n_http--;
  job_release(S, j);
  pthread_mutex_unlock(&S->mu);
  if (!body) body = api_error_json("internal error: no result", "server_error", NULL, NULL);
  return respond(S, c, ep, status, "application/json", body, NULL);
}

static char *metrics_text(srv *S) {
  met_gauges g = {.parallel = S->o.parallel, .queue_cap = S->o.queue, .backend = glm53_model_backend(S->m),
                  .model = S->model_name};
  pthread_mutex_lock(&S->mu);
  g.queue_depth = S->n_queued;
  g.active = S->n_active;
  pthread_mutex_unlock(&S->mu);
  g.cache_capacity = (long)S->o.parallel * S->o.ctx;
  g.cache_tokens = atomic_load(&S->cache_tokens);
  return met_render(&S->met, &g);
}

static enum MHD_Result handler(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                               const char *version, const char *upload_data, size_t *upload_data_size, void **con_cls) {
  (void)version;
  srv *S = cls;
  req_ctx *rq = *con_cls;
  if (!rq) {
    rq = xcalloc(1, sizeof *rq);
    *con_cls = rq;
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
    if (cl && strtoull(cl, NULL, 10) > S->o.max_body) rq->too_big = 1;
    return MHD_YES;
  }
  if (*upload_data_size) {
    if (!rq->too_big && rq->body.n + *upload_data_size > S->o.max_body) {
      rq->too_big = 1;
      sbuf_free(&rq->body);
    }
    if (!rq->too_big) sbuf_add(&rq->body, upload_data, *upload_data_size);
    *upload_data_size = 0;
    return MHD_YES;
  }
  int get = !strcmp(method, "GET"), post = !strcmp(method, "POST");
  struct { const char *path; int ep; int post; } routes[] = {
      {"/v1/models", EP_MODELS, 0}, {"/v1/completions", EP_COMPLETIONS, 1}, {"/v1/chat/completions", EP_CHAT, 1},
      {"/health", EP_HEALTH, 0},    {"/metrics", EP_METRICS, 0},
  };
  int ep = -1, want_post = 0;
  for (size_t i = 0; i < sizeof routes / sizeof *routes; i++)
    if (!strcmp(url, routes[i].path)) { ep = routes[i].ep; want_post = routes[i].post; }
  if (ep < 0) return respond_err(S, c, EP_OTHER, 404, "unknown path", "invalid_request_error", "not_found", NULL);
  if (rq->too_big) {
    char msg[128];
    snprintf(msg, sizeof msg, "the request body exceeds the limit of %zu bytes", S->o.max_body);
    return respond_err(S, c, ep, 413, msg, "invalid_request_error", "body_too_large", NULL);
  }
  if (want_post ? !post : !(get || !strcmp(method, "HEAD")))
    return respond_err(S, c, ep, 405, "method not allowed", "invalid_request_error", "method_not_allowed", want_post ? "POST" : "GET");
  if (!strncmp(url, "/v1/", 4) && !auth_ok(S, c))
    return respond_err(S, c, ep, 401, "invalid or missing API key (Authorization: Bearer ...)", "authentication_error",
                       "invalid_api_key", NULL);
  switch (ep) {
  case EP_HEALTH: {
    pthread_mutex_lock(&S->mu);
    int stopping = S->stopping;
    pthread_mutex_unlock(&S->mu);
    if (stopping) return respond(S, c, ep, 503, "application/json", xstrdup("{\"status\":\"stopping\"}"), NULL);
    return respond(S, c, ep, 200, "application/json", xstrdup("{\"status\":\"ok\"}"), NULL);
  }
  case EP_METRICS: return respond(S, c, ep, 200, "text/plain; version=0.0.4", metrics_text(S), NULL);
  case EP_MODELS: return respond(S, c, ep, 200, "application/json", api_models_json(S), NULL);
  default: return generate(S, c, ep == EP_CHAT, rq);
  }
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
  (void)cls; (void)c;
  req_ctx *rq = *con_cls;
  if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK) LOG_DEBUG("request ended early (code %d)", (int)toe);
  if (rq) {
    sbuf_free(&rq->body);
    free(rq);
  }
  *con_cls = NULL;
}

int http_start(srv *S) {
  struct sockaddr_storage ss;
  memset(&ss, 0, sizeof ss);
  unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ITC;
  const char *host = S->o.host && *S->o.host ? S->o.host : "127.0.0.1";
  if (!strcmp(host, "localhost")) host = "127.0.0.1";
  struct sockaddr_in *a4 = (struct sockaddr_in *)&ss;
  struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&ss;
  if (inet_pton(AF_INET, host, &a4->sin_addr) == 1) {
    a4->sin_family = AF_INET;
    a4->sin_port = htons((uint16_t)S->o.port);
  } else if (inet_pton(AF_INET6, host, &a6->sin6_addr) == 1) {
    a6->sin6_family = AF_INET6;
    a6->sin6_port = htons((uint16_t)S->o.port);
    flags |= MHD_USE_IPv6;
  } else {
    return glm53_err("--host '%s' is not an IPv4 or IPv6 address", host);
  }
  S->d = MHD_start_daemon(flags, (uint16_t)S->o.port, NULL, NULL, handler, S, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
                          MHD_OPTION_NOTIFY_COMPLETED, completed, S, MHD_OPTION_CONNECTION_LIMIT,
                          (unsigned)S->o.max_connections, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)300,
                          MHD_OPTION_END);
  if (!S->d) return glm53_err("cannot listen on %s port %d (in use or not permitted)", host, S->o.port);
  const union MHD_DaemonInfo *di = MHD_get_daemon_info(S->d, MHD_DAEMON_INFO_BIND_PORT);
  S->port = di ? di->port : S->o.port;
  return 0;
}

void http_quiesce(srv *S) {
  if (!S->d) return;
  MHD_socket fd = MHD_quiesce_daemon(S->d);
  if (fd != MHD_INVALID_SOCKET) close(fd);
}

void http_stop(srv *S) {
  if (S->d) MHD_stop_daemon(S->d);
  S->d = NULL;
}
