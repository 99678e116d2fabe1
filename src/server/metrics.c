/* Prometheus metrics: request counts by endpoint and status, token counts,
 * latency histograms, and gauges supplied by the server at scrape time. */
#include "server/metrics.h"
#include "server/sbuf.h"
#include <stdio.h>
#include <string.h>

static const double bounds[MET_NB - 1] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
static const char *ep_names[EP_N] = {"/v1/models", "/v1/completions", "/v1/chat/completions", "/health", "/metrics", "other"};

const char *met_endpoint_name(int ep) { return ep >= 0 && ep < EP_N ? ep_names[ep] : "other"; }

void met_init(metrics *m) {
  memset(m, 0, sizeof *m);
  pthread_mutex_init(&m->mu, NULL);
}
void met_destroy(metrics *m) { pthread_mutex_destroy(&m->mu); }

void met_request(metrics *m, int ep, int code) {
  pthread_mutex_lock(&m->mu);
  int i;
  for (i = 0; i < m->n_req; i++)
    if (m->req[i].ep == ep && m->req[i].code == code) break;
  if (i == m->n_req && m->n_req < (int)(sizeof m->req / sizeof *m->req)) {
    m->req[i].ep = ep;
    m->req[i].code = code;
    m->req[i].n = 0;
    m->n_req++;
  }
  if (i < m->n_req) m->req[i].n++;
  pthread_mutex_unlock(&m->mu);
}

void met_tokens(metrics *m, long prompt, long generated) {
  pthread_mutex_lock(&m->mu);
  m->prompt_tokens += prompt;
  m->generated_tokens += generated;
  pthread_mutex_unlock(&m->mu);
}

void met_inc(metrics *m, long *counter) {
  pthread_mutex_lock(&m->mu);
  (*counter)++;
  pthread_mutex_unlock(&m->mu);
}

void met_observe(metrics *m, met_hist *h, double s) {
  int b = 0;
  while (b < MET_NB - 1 && s > bounds[b]) b++;
  pthread_mutex_lock(&m->mu);
  h->count[b]++;
  h->sum += s;
  h->n++;
  pthread_mutex_unlock(&m->mu);
}

void met_batch_step(metrics *m, int n) {
  int b = 0;
  while (b < MET_BATCH_NB - 1 && n > (1 << b)) b++;
  pthread_mutex_lock(&m->mu);
  m->batch_steps++;
  m->batch_tokens += n;
  m->batch_size_count[b]++;
  if (n > m->batch_peak) m->batch_peak = n;
  pthread_mutex_unlock(&m->mu);
}

void met_batch_round(metrics *m, int rows) {
  pthread_mutex_lock(&m->mu);
  m->batch_current = rows;
  pthread_mutex_unlock(&m->mu);
}

static void batch_hist(sbuf *b, const metrics *m) {
  char line[256];
  sbuf_adds(b, "# HELP glm53_decode_batch_size Requests decoded together in one forward step.\n"
               "# TYPE glm53_decode_batch_size histogram\n");
  long cum = 0;
  for (int i = 0; i < MET_BATCH_NB; i++) {
    cum += m->batch_size_count[i];
    if (i < MET_BATCH_NB - 1) snprintf(line, sizeof line, "glm53_decode_batch_size_bucket{le=\"%d\"} %ld\n", 1 << i, cum);
    else snprintf(line, sizeof line, "glm53_decode_batch_size_bucket{le=\"+Inf\"} %ld\n", cum);
    sbuf_adds(b, line);
  }
  snprintf(line, sizeof line, "glm53_decode_batch_size_sum %ld\nglm53_decode_batch_size_count %ld\n", m->batch_tokens,
           m->batch_steps);
  sbuf_adds(b, line);
}

static void hist(sbuf *b, const char *name, const char *help, const met_hist *h) {
  char line[256];
  snprintf(line, sizeof line, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
  sbuf_adds(b, line);
  long cum = 0;
  for (int i = 0; i < MET_NB; i++) {
    cum += h->count[i];
    if (i < MET_NB - 1) snprintf(line, sizeof line, "%s_bucket{le=\"%g\"} %ld\n", name, bounds[i], cum);
    else snprintf(line, sizeof line, "%s_bucket{le=\"+Inf\"} %ld\n", name, cum);
    sbuf_adds(b, line);
  }
  snprintf(line, sizeof line, "%s_sum %.6f\n%s_count %ld\n", name, h->sum, name, h->n);
  sbuf_adds(b, line);
}

static void scalar(sbuf *b, const char *name, const char *type, const char *help, double v) {
  char line[384];
  snprintf(line, sizeof line, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name, type, name, v);
  sbuf_adds(b, line);
}

char *met_render(metrics *m, const met_gauges *g) {
  sbuf b = {0};
  char line[512];
  pthread_mutex_lock(&m->mu);
  sbuf_adds(&b, "# HELP glm53_requests_total HTTP requests answered, by endpoint and status.\n"
                "# TYPE glm53_requests_total counter\n");
  for (int i = 0; i < m->n_req; i++) {
    snprintf(line, sizeof line, "glm53_requests_total{endpoint=\"%s\",status=\"%d\"} %ld\n", met_endpoint_name(m->req[i].ep),
             m->req[i].code, m->req[i].n);
    sbuf_adds(&b, line);
  }
  scalar(&b, "glm53_prompt_tokens_total", "counter", "Prompt tokens processed.", (double)m->prompt_tokens);
  scalar(&b, "glm53_generated_tokens_total", "counter", "Tokens generated.", (double)m->generated_tokens);
  scalar(&b, "glm53_backend_errors_total", "counter", "Backend forward errors.", (double)m->backend_errors);
  scalar(&b, "glm53_cpu_fallbacks_total", "counter", "Sessions moved to the CPU after a backend error.", (double)m->cpu_fallbacks);
  scalar(&b, "glm53_requests_cancelled_total", "counter", "Requests cancelled (client gone or shutdown).", (double)m->cancelled);
  scalar(&b, "glm53_requests_rejected_total", "counter", "Requests refused because the queue was full.", (double)m->rejected);
  hist(&b, "glm53_time_to_first_token_seconds", "Arrival to first generated token.", &m->ttft);
  hist(&b, "glm53_request_duration_seconds", "Arrival to last generated token.", &m->total);
  scalar(&b, "glm53_decode_batch_steps_total", "counter", "Decode forward steps (one token for each request in the step).",
         (double)m->batch_steps);
  scalar(&b, "glm53_decode_batch_tokens_total", "counter", "Tokens decoded by those steps (sum of their batch sizes).",
         (double)m->batch_tokens);
  batch_hist(&b, m);
  scalar(&b, "glm53_decode_batch_size_current", "gauge", "Requests decoded in the last scheduler round.", m->batch_current);
  scalar(&b, "glm53_decode_batch_size_avg", "gauge", "decode_batch_tokens_total / decode_batch_steps_total.",
         m->batch_steps > 0 ? (double)m->batch_tokens / (double)m->batch_steps : 0.0);
  scalar(&b, "glm53_decode_batch_size_peak", "gauge", "Largest decode batch so far.", m->batch_peak);
  scalar(&b, "glm53_decode_batch_failures_total", "counter", "Decode batch steps that failed (see the scheduler docs for how their rows go on).",
         (double)m->batch_failures);
  scalar(&b, "glm53_decode_batch_rows_retried_total", "counter", "Rows of failed batches stepped again one by one.",
         (double)m->batch_retried);
  pthread_mutex_unlock(&m->mu);
  scalar(&b, "glm53_queue_depth", "gauge", "Requests waiting for a slot.", g->queue_depth);
  scalar(&b, "glm53_queue_capacity", "gauge", "Most requests that may wait.", g->queue_cap);
  scalar(&b, "glm53_active_sessions", "gauge", "Requests being generated.", g->active);
  scalar(&b, "glm53_parallel_sessions", "gauge", "Most requests generated at once.", g->parallel);
  scalar(&b, "glm53_decode_batch_max_size", "gauge", "Most requests decoded in one step (= parallel sessions).", g->parallel);
  scalar(&b, "glm53_cache_tokens", "gauge", "Tokens held in the caches of active sessions.", (double)g->cache_tokens);
  scalar(&b, "glm53_cache_capacity_tokens", "gauge", "Tokens the active-session slots can hold.", (double)g->cache_capacity);
  scalar(&b, "glm53_cache_usage_ratio", "gauge", "cache_tokens / cache_capacity_tokens.",
         g->cache_capacity > 0 ? (double)g->cache_tokens / (double)g->cache_capacity : 0.0);
  snprintf(line, sizeof line,
           "# HELP glm53_backend_info The compute backend and model served.\n# TYPE glm53_backend_info gauge\n"
           "glm53_backend_info{backend=\"%s\",model=\"%s\"} 1\n",
           g->backend, g->model);
  sbuf_adds(&b, line);
  return b.p;
}
