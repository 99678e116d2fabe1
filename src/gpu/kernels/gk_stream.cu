/* Host<->device streaming for the expert cache (src/gpu/gpu_experts.c): a
 * dedicated copy stream, events that order it against the compute stream
 * (the per-thread default stream every kernel uses), pinned host memory,
 * and the host->device bandwidth measurement the benchmark reports. */
#include "gk_common.cuh"
#include <string.h>

#if GK_HIP
#define GK_COMPUTE ((cudaStream_t)0) /* HIP kernels launch on the null stream (no per-thread default) */
#define cudaStreamCreateWithFlags hipStreamCreateWithFlags
#define cudaStreamNonBlocking hipStreamNonBlocking
#define cudaStreamDestroy hipStreamDestroy
#define cudaStreamWaitEvent hipStreamWaitEvent
#define cudaEventCreateWithFlags hipEventCreateWithFlags
#define cudaEventDisableTiming hipEventDisableTiming
#define cudaHostAlloc hipHostMalloc
#define cudaHostAllocDefault hipHostMallocDefault
#define cudaFreeHost hipHostFree
#else
#define GK_COMPUTE cudaStreamPerThread
#endif

static cudaStream_t g_copy;
static int g_copy_ok;

static int copy_stream(void) {
  if (!g_copy_ok) {
    GK_TRY(cudaStreamCreateWithFlags(&g_copy, cudaStreamNonBlocking));
    g_copy_ok = 1;
  }
  return 0;
}

extern "C" void *gk_host_pinned(size_t n) {
  void *p = NULL;
  cudaError_t e = cudaHostAlloc(&p, n ? n : 1, cudaHostAllocDefault);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    gk_fail("pinned host allocation of %zu bytes failed: %s", n, cudaGetErrorString(e));
    return NULL;
  }
  return p;
}
extern "C" void gk_host_pinned_free(void *p) { if (p) (void)cudaFreeHost(p); }

extern "C" void *gk_sync_event_new(void) {
  cudaEvent_t e;
  if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess) {
    gk_fail("event creation failed");
    return NULL;
  }
  return (void *)e;
}
extern "C" int gk_copy_h2d_async(void *d, const void *h, size_t n) {
  if (copy_stream()) return -1;
  GK_TRY(cudaMemcpyAsync(d, h, n, cudaMemcpyHostToDevice, g_copy));
  return 0;
}
extern "C" int gk_event_on_copy(void *e) {
  if (copy_stream()) return -1;
  GK_TRY(cudaEventRecord((cudaEvent_t)e, g_copy));
  return 0;
}
extern "C" int gk_event_on_compute(void *e) { GK_TRY(cudaEventRecord((cudaEvent_t)e, GK_COMPUTE)); return 0; }
extern "C" int gk_copy_wait(void *e) {
  if (copy_stream()) return -1;
  GK_TRY(cudaStreamWaitEvent(g_copy, (cudaEvent_t)e, 0));
  return 0;
}
extern "C" int gk_compute_wait(void *e) { GK_TRY(cudaStreamWaitEvent(GK_COMPUTE, (cudaEvent_t)e, 0)); return 0; }
extern "C" int gk_event_sync(void *e) { GK_TRY(cudaEventSynchronize((cudaEvent_t)e)); return 0; }
extern "C" int gk_d2h_async(void *h, const void *d, size_t n) {
  GK_TRY(cudaMemcpyAsync(h, d, n, cudaMemcpyDeviceToHost, GK_COMPUTE));
  return 0;
}
extern "C" int gk_h2d_compute(void *d, const void *h, size_t n) {
  GK_TRY(cudaMemcpyAsync(d, h, n, cudaMemcpyHostToDevice, GK_COMPUTE));
  return 0;
}

extern "C" double gk_time_h2d_gbs(size_t bytes, int reps) {
  void *h = gk_host_pinned(bytes), *d = gk_malloc(bytes);
  if (!h || !d) { gk_host_pinned_free(h); gk_free(d); return -1; }
  memset(h, 1, bytes);
  (void)cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice);
  cudaEvent_t a, b;
  (void)cudaEventCreate(&a);
  (void)cudaEventCreate(&b);
  (void)cudaEventRecord(a, GK_COMPUTE);
  for (int i = 0; i < reps; i++) (void)cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice, GK_COMPUTE);
  (void)cudaEventRecord(b, GK_COMPUTE);
  (void)cudaEventSynchronize(b);
  float ms = 0;
  (void)cudaEventElapsedTime(&ms, a, b);
  (void)cudaEventDestroy(a);
  (void)cudaEventDestroy(b);
  gk_host_pinned_free(h);
  gk_free(d);
  return ms > 0 ? (double)bytes * reps / (ms * 1e-3) / 1e9 : -1;
}

extern "C" int gk_mem_info(size_t *free_b, size_t *total_b) {
  GK_TRY(cudaMemGetInfo(free_b, total_b));
  return 0;
}
