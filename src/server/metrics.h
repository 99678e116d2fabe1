/* Prometheus counters and histograms of the server (text format 0.0.4). */
#ifndef GLM53_SERVER_METRICS_H
#define GLM53_SERVER_METRICS_H
#include <pthread.h>

enum { EP_MODELS, EP_COMPLETIONS, EP_CHAT, EP_HEALTH, EP_METRICS, EP_OTHER, EP_N };
#define MET_MAX_CODES 24
#define MET_NB 13
#define MET_BATCH_NB 10 /* batch size buckets 1 2 4 .. 256 +Inf */

typedef struct {
  long count[MET_NB]; /* per bucket (not cumulative) */
  double sum;
  long n;
} met_hist;

typedef struct {
  pthread_mutex_t mu;
  struct { int ep, code; long n; } req[EP_N * MET_MAX_CODES];
  int n_req;
  long prompt_tokens, generated_tokens, backend_errors, cpu_fallbacks, cancelled, rejected;
  met_hist ttft, total;
  /* decode batching: one step = one forward that decodes one token for each
   * of n requests (glm53_forward_batch, or glm53_forward when n == 1) */
  long batch_steps, batch_tokens, batch_failures, batch_retried;
  long batch_size_count[MET_BATCH_NB]; /* steps by size bucket (not cumulative) */
  int batch_current, batch_peak;        /* rows decoded in the last round, largest step */
} metrics;

void met_init(metrics *m);
void met_destroy(metrics *m);
void met_request(metrics *m, int ep, int code);
void met_tokens(metrics *m, long prompt, long generated);
void met_observe(metrics *m, met_hist *h, double seconds);
void met_inc(metrics *m, long *counter);
/* One decode step of n rows. */
void met_batch_step(metrics *m, int n);
/* Rows decoded in this scheduler round (all steps); 0 when none decoded. */
void met_batch_round(metrics *m, int rows);

/* Gauges the server supplies at render time. */
typedef struct {
  int queue_depth, active, parallel, queue_cap; /* parallel = also the largest decode batch */
  long cache_tokens, cache_capacity;
  const char *backend, *model;
} met_gauges;

/* malloc'd Prometheus text. */
char *met_render(metrics *m, const met_gauges *g);
const char *met_endpoint_name(int ep);

#endif
