/* Prometheus counters and histograms of the server (text format 0.0.4). */
#ifndef GLM53_SERVER_METRICS_H
#define GLM53_SERVER_METRICS_H
#include <pthread.h>

enum { EP_MODELS, EP_COMPLETIONS, EP_CHAT, EP_HEALTH, EP_METRICS, EP_OTHER, EP_N };
#define MET_MAX_CODES 24
#define MET_NB 13

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
} metrics;

void met_init(metrics *m);
void met_destroy(metrics *m);
void met_request(metrics *m, int ep, int code);
void met_tokens(metrics *m, long prompt, long generated);
void met_observe(metrics *m, met_hist *h, double seconds);
void met_inc(metrics *m, long *counter);

/* Gauges the server supplies at render time. */
typedef struct {
  int queue_depth, active, parallel, queue_cap;
  long cache_tokens, cache_capacity;
  const char *backend, *model;
} met_gauges;

/* malloc'd Prometheus text. */
char *met_render(metrics *m, const met_gauges *g);
const char *met_endpoint_name(int ep);

#endif
