/* The "gpu" compute backend (CUDA, or HIP through kernels/gpu_compat.h):
 * dense weights resident on one device, routed experts resident up to a
 * VRAM budget and streamed from host memory beyond it, per-session caches
 * on the device, the whole forward on the device; only the logits come
 * back. See docs/gpu.md. Built only with -DGLM53_CUDA=ON or -DGLM53_HIP=ON. */
#ifndef GLM53_GPU_H
#define GLM53_GPU_H
#include <stddef.h>
#include <stdint.h>
#include "model/backend.h"

const glm53_backend *glm53_gpu_backend(void);

/* 1 if a usable device is present; else 0 with the reason in `why`. */
int glm53_gpu_available(char *why, size_t whylen);
/* One line describing the device (name, memory, arch), or the reason none. */
const char *glm53_gpu_device_desc(void);

/* With GLM53_GPU_PROFILE=1: prints the time per forward stage accumulated
 * since the last dump (stages are synchronised, so slower than unprofiled). */
void glm53_gpu_profile_dump(const char *label);

/* Routed-expert placement of a model on the gpu backend (docs/gpu.md):
 * counts, cache slots, and since load (or the last reset) the cache hits and
 * misses among streamed experts (one per expert used by a layer call; an
 * expert the look-ahead copied in time is a hit), the look-ahead copies
 * and how many of them a layer then used, and the bytes copied
 * host->device. -1 when the model is not on the gpu. */
typedef struct {
  int streaming;             /* some expert lives in host memory */
  long resident, streamed;   /* experts */
  int slots;                 /* device cache slots */
  double resident_gb, slot_gb, budget_gb;
  unsigned long long hits, misses, resident_uses, bytes_h2d;
  unsigned long long prefetches, prefetch_hits;
} glm53_gpu_expert_stats;
int glm53_gpu_expert_stats_get(const glm53_model *m, glm53_gpu_expert_stats *out);
void glm53_gpu_expert_stats_reset(glm53_model *m);
/* Expert streaming's look-ahead copies of the next streamed layer's guessed
 * experts: GLM53_GPU_LA_OFF, _ALL (every guess after every layer call),
 * _IDLE (the default: one guess, only after a layer call that copied
 * nothing of its own, i.e. while the copy engine would idle), -1 back to
 * $GLM53_GPU_EXPERT_LOOKAHEAD (0 | all | idle). Placement only: results
 * are the same in every mode. Bench and test use. */
enum { GLM53_GPU_LA_OFF = 0, GLM53_GPU_LA_ALL = 1, GLM53_GPU_LA_IDLE = 2 };
void glm53_gpu_set_expert_lookahead(int mode);

/* The GEMM form of the MLA attention for long chunks: 1 on (default, unless
 * GLM53_GPU_MLA_GEMM=0 or its startup check failed), 0 off. Bench use. */
void glm53_gpu_set_mla_gemm(int on);

/* Startup validation: each device kernel on small random data against the
 * fp32 CPU reference (src/model/layers.h) or a float64 host loop. */
typedef struct {
  char name[48];
  double err, tol; /* max |gpu - ref| / max |ref| (or mismatches for exact checks) */
  int ok;
  int optional; /* a faster path with a fallback: failing turns the path off instead of the backend */
} gpu_check;
/* Runs every check with `seed`; fills up to max entries; returns the number
 * of checks run (failures have ok == 0), or -1 on a device error. */
int glm53_gpu_selftest(uint64_t seed, gpu_check *out, int max);

#endif
