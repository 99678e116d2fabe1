/* A host emulator of the CUDA execution model, for unit tests of kernels on
 * machines without a GPU (CI): the threads of a block run as fibers
 * (ucontext) on one OS thread; __syncthreads waits for the whole block,
 * __shfl_xor_sync for the 32 lanes of the warp; blocks run one after
 * another. It covers what the emulated kernels use (dim3 indices, static
 * and dynamic shared memory, float2/float4/uint4, indexed and xor shuffles,
 * __syncwarp, the warp's ldmatrix x4, bf16 mma.sync m16n8k16 and tf32
 * m16n8k8, cvt.rna.tf32, the warpgroup's bf16 wgmma: GK_EMU
 * selects them in the kernel sources) and
 * reports a deadlock (a barrier some threads never reach) instead of
 * hanging. Not a timing model; memory is host memory. C++ (templates of
 * the kernels), one translation unit per test. */
#ifndef GLM53_TESTS_CUDA_EMU_H
#define GLM53_TESTS_CUDA_EMU_H
#include <ucontext.h>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <math.h>
#include <vector>
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#define EMU_ASAN 1
#else
#define EMU_ASAN 0
#endif

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static /* a block's static shared arrays: blocks run one at a time */
#define __align__(n) __attribute__((aligned(n)))
/* dynamic shared memory: one host buffer for the block that runs */
alignas(1024) [[maybe_unused]] static float emu_smem_buf[256 * 1024 / sizeof(float)];
#define GK_DYN_SMEM(T, name) T *name = (T *)emu_smem_buf
#define GK_PDL_BEGIN() do { } while (0)
using std::isnan;
using std::max;
using std::min;

struct dim3 {
  unsigned x, y, z;
  dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
struct float4 {
  float x, y, z, w;
};
static inline float4 make_float4(float a, float b, float c, float d) { return float4{a, b, c, d}; }
struct float2 {
  float x, y;
};
static inline float2 make_float2(float a, float b) { return float2{a, b}; }
struct uint4 {
  unsigned x, y, z, w;
};
static inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return uint4{a, b, c, d}; }
struct uint2 {
  unsigned x, y;
};
static inline uint2 make_uint2(unsigned a, unsigned b) { return uint2{a, b}; }
static inline unsigned __float_as_uint(float f) {
  unsigned u;
  memcpy(&u, &f, 4);
  return u;
}
static inline float __uint_as_float(unsigned u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
template <class T> static inline T __ldg(const T *p) { return *p; }
/* fibers of one OS thread: no other thread in between */
static inline unsigned atomicOr(unsigned *p, unsigned v) {
  const unsigned o = *p;
  *p = o | v;
  return o;
}
static inline unsigned atomicAdd(unsigned *p, unsigned v) {
  const unsigned o = *p;
  *p = o + v;
  return o;
}
static inline void __threadfence() {} /* one memory, blocks one after another */
/* gk_common.cuh's memory helpers (device only there): an L2 load is a
 * load, an L2 prefetch nothing */
static inline float gk_ldcg(const float *p) { return *p; }
static inline void gk_l2_prefetch(const void *, unsigned, bool) {}
#define GK_EMU 1

static dim3 gridDim, blockDim, blockIdx, threadIdx;

/* Context switch. x86-64: save the callee-saved registers on the current
 * stack, swap stack pointers, restore (no signal-mask system call per
 * switch, unlike swapcontext: ~100x faster, which the shuffle-heavy kernels
 * need). Elsewhere: ucontext. */
#if defined(__x86_64__)
extern "C" void emu_ctx_switch(void **from_sp, void *to_sp);
__asm__(".text\n.globl emu_ctx_switch\n.type emu_ctx_switch,@function\nemu_ctx_switch:\n"
        "pushq %rbp\npushq %rbx\npushq %r12\npushq %r13\npushq %r14\npushq %r15\n"
        "movq %rsp, (%rdi)\nmovq %rsi, %rsp\n"
        "popq %r15\npopq %r14\npopq %r13\npopq %r12\npopq %rbx\npopq %rbp\nret\n"
        ".size emu_ctx_switch, .-emu_ctx_switch\n");
#define EMU_ASM 1
#else
#define EMU_ASM 0
#endif

namespace emu {
enum { RUN, BLOCK_WAIT, WARP_WAIT, DONE };
struct fiber {
#if EMU_ASM
  void *sp = nullptr;
#else
  ucontext_t ctx;
#endif
  std::vector<char> stack;
  int state = DONE, tid = 0;
  unsigned wgen = 0; /* warp barriers passed */
  void *fake = nullptr;
};
struct block_run {
#if EMU_ASM
  void *sched_sp = nullptr;
#else
  ucontext_t sched;
#endif
  std::vector<fiber> f;
  std::vector<float> slot[2]; /* shuffle values per thread, by barrier parity */
  const std::function<void()> *body = nullptr;
  fiber *cur = nullptr;
  void *sched_fake = nullptr;
  const void *sched_bottom = nullptr;
  size_t sched_size = 0;
};
static block_run g;
static const size_t STACK = EMU_ASAN ? 512 * 1024 : 128 * 1024;

static inline void to_fiber(fiber &f) {
  g.cur = &f;
  threadIdx = dim3((unsigned)(f.tid % blockDim.x), (unsigned)(f.tid / blockDim.x % blockDim.y),
                   (unsigned)(f.tid / (blockDim.x * blockDim.y)));
#if EMU_ASAN
  __sanitizer_start_switch_fiber(&g.sched_fake, f.stack.data(), f.stack.size());
#endif
#if EMU_ASM
  emu_ctx_switch(&g.sched_sp, f.sp);
#else
  swapcontext(&g.sched, &f.ctx);
#endif
#if EMU_ASAN
  __sanitizer_finish_switch_fiber(g.sched_fake, nullptr, nullptr);
#endif
}
/* in a fiber: back to the scheduler (for good when state is DONE) */
static inline void yield(int state) {
  fiber &f = *g.cur;
  f.state = state;
#if EMU_ASAN
  __sanitizer_start_switch_fiber(state == DONE ? nullptr : &f.fake, g.sched_bottom, g.sched_size);
#endif
#if EMU_ASM
  emu_ctx_switch(&f.sp, g.sched_sp);
#else
  swapcontext(&f.ctx, &g.sched);
#endif
#if EMU_ASAN
  __sanitizer_finish_switch_fiber(f.fake, &g.sched_bottom, &g.sched_size);
#endif
}
static void trampoline() {
#if EMU_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &g.sched_bottom, &g.sched_size);
#endif
  (*g.body)();
  yield(DONE); /* never resumed */
  abort();
}
static void fiber_start(fiber &f) {
#if EMU_ASM
  /* a stack that "returns" into trampoline: 6 saved registers, then its
   * address, then a zero return address for it (entry alignment 8 mod 16) */
  uintptr_t top = ((uintptr_t)f.stack.data() + f.stack.size()) & ~(uintptr_t)15;
  void **sp = (void **)top;
  *--sp = nullptr;
  *--sp = (void *)trampoline;
  for (int r = 0; r < 6; r++) *--sp = nullptr;
  f.sp = sp;
#else
  getcontext(&f.ctx);
  f.ctx.uc_stack.ss_sp = f.stack.data();
  f.ctx.uc_stack.ss_size = f.stack.size();
  f.ctx.uc_link = nullptr;
  makecontext(&f.ctx, trampoline, 0);
#endif
}
/* one block to completion; false on a deadlock */
static bool run_block(int nth) {
  for (int t = 0; t < nth; t++) {
    fiber &f = g.f[t];
    f.state = RUN;
    f.tid = t;
    f.wgen = 0;
    fiber_start(f);
  }
  for (;;) {
    bool any = false;
    for (int t = 0; t < nth; t++)
      if (g.f[t].state == RUN) to_fiber(g.f[t]), any = true;
    if (any) continue;
    int done = 0, bwait = 0;
    for (int t = 0; t < nth; t++) done += g.f[t].state == DONE, bwait += g.f[t].state == BLOCK_WAIT;
    if (done == nth) return true;
    bool released = false;
    if (bwait + done == nth) { /* __syncthreads: every live thread arrived */
      for (int t = 0; t < nth; t++)
        if (g.f[t].state == BLOCK_WAIT) g.f[t].state = RUN;
      released = true;
    }
    for (int w0 = 0; w0 < nth; w0 += 32) { /* a warp's shuffle: all 32 lanes arrived */
      bool all = w0 + 32 <= nth;
      for (int t = w0; all && t < w0 + 32; t++) all = g.f[t].state == WARP_WAIT;
      if (!all) continue;
      for (int t = w0; t < w0 + 32; t++) g.f[t].state = RUN;
      released = true;
    }
    if (!released) return false;
  }
}
} // namespace emu

/* v from lane src of the calling warp (all 32 lanes must call) */
static inline float __shfl_sync(unsigned mask, float v, int src) {
  (void)mask;
  emu::fiber &f = *emu::g.cur;
  const int par = f.wgen & 1, w0 = f.tid - (f.tid & 31);
  emu::g.slot[par][f.tid] = v;
  emu::yield(emu::WARP_WAIT);
  f.wgen++;
  return emu::g.slot[par][w0 + (src & 31)];
}
/* v from lane (lane ^ o) of the calling warp */
static inline float __shfl_xor_sync(unsigned mask, float v, int o) { return __shfl_sync(mask, v, (emu::g.cur->tid & 31) ^ o); }
/* the same for ints (their bits travel in the float slots: copies only) */
static inline int __shfl_sync(unsigned mask, int v, int src) {
  return (int)__float_as_uint(__shfl_sync(mask, __uint_as_float((unsigned)v), src));
}
static inline int __shfl_xor_sync(unsigned mask, int v, int o) { return __shfl_sync(mask, v, (emu::g.cur->tid & 31) ^ o); }
static inline void __syncthreads() { emu::yield(emu::BLOCK_WAIT); }
/* the calling warp's 32 lanes (a shuffle without data) */
static inline void __syncwarp(unsigned mask = 0xffffffffu) {
  (void)mask;
  emu::yield(emu::WARP_WAIT);
  emu::g.cur->wgen++;
}

/* Warp matrix collectives (all 32 lanes call; data exchanged as the
 * shuffles do, one slot per thread and barrier parity). */
namespace emu {
struct mx_slot {
  const uint16_t *row;
  uint32_t a[4], b[2];
};
static std::vector<mx_slot> mx[2];
/* this lane's slot of the current parity; returns the warp's first slot */
static inline const mx_slot *mx_exchange(const mx_slot &mine) {
  fiber &f = *g.cur;
  const int par = f.wgen & 1, w0 = f.tid - (f.tid & 31);
  if (mx[par].size() < g.f.size()) mx[0].resize(g.f.size()), mx[1].resize(g.f.size());
  mx[par][f.tid] = mine;
  yield(WARP_WAIT);
  f.wgen++;
  return &mx[par][w0];
}
/* an mma's operand registers exchanged (mx_exchange) */
static inline const mx_slot *mx_operands(const uint32_t a[4], uint32_t b0, uint32_t b1) {
  mx_slot me{};
  for (int i = 0; i < 4; i++) me.a[i] = a[i];
  me.b[0] = b0;
  me.b[1] = b1;
  return mx_exchange(me);
}
static inline float bf16f(uint32_t h) { return __uint_as_float((h & 0xffffu) << 16); }
/* the 16 x 16 bf16 A operand of m16n8k16 from the warp's 32 slots: lane l
 * (g = l / 4, t = l % 4) holds A(g, 2t..), A(g + 8, 2t..), A(g, 2t + 8..),
 * A(g + 8, 2t + 8..), the first of each pair in the low half */
static inline void a_frag16(const mx_slot *w, float A[16][16]) {
  for (int l = 0; l < 32; l++) {
    const int gr = l >> 2, t2 = 2 * (l & 3);
    for (int h = 0; h < 2; h++) {
      A[gr][t2 + h] = bf16f(w[l].a[0] >> 16 * h);
      A[gr + 8][t2 + h] = bf16f(w[l].a[1] >> 16 * h);
      A[gr][t2 + 8 + h] = bf16f(w[l].a[2] >> 16 * h);
      A[gr + 8][t2 + 8 + h] = bf16f(w[l].a[3] >> 16 * h);
    }
  }
}
/* the calling lane's accumulators (rows g, g + 8; columns 2t, 2t + 1) of
 * c += A[16][K] . B[K][8], the products summed in double, rounded once
 * (the hardware's order is unspecified) */
static inline void mma_out(float c[4], const float *A, const float *B, int K) {
  const int l = g.cur->tid & 31, gr = l >> 2, t2 = 2 * (l & 3);
  for (int e = 0; e < 4; e++) {
    const int row = gr + 8 * (e >> 1), col = t2 + (e & 1);
    double s = c[e];
    for (int k = 0; k < K; k++) s += (double)A[row * K + k] * B[k * 8 + col];
    c[e] = (float)s;
  }
}
} // namespace emu
/* ldmatrix.sync.aligned.m8n8.x4(.trans).b16: lanes 8i..8i+7 give the rows
 * of matrix i; lane l gets in r[i] the elements (l / 4, 2 (l % 4) + {0, 1})
 * of matrix i (of its transpose with trans), the first in the low half */
static inline void emu_ldmatrix_x4(uint32_t r[4], const uint16_t *row, bool trans) {
  emu::mx_slot me{};
  me.row = row;
  const emu::mx_slot *w = emu::mx_exchange(me);
  const int l = emu::g.cur->tid & 31, gr = l >> 2, c2 = 2 * (l & 3);
  for (int i = 0; i < 4; i++) {
    uint32_t lo, hi;
    if (!trans) {
      lo = w[8 * i + gr].row[c2];
      hi = w[8 * i + gr].row[c2 + 1];
    } else {
      lo = w[8 * i + c2].row[gr];
      hi = w[8 * i + c2 + 1].row[gr];
    }
    r[i] = lo | hi << 16;
  }
}
/* mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32, c += a . b: lane l
 * (g = l / 4, t = l % 4) holds a = A(g, 2t..), A(g + 8, 2t..), A(g, 2t +
 * 8..), A(g + 8, 2t + 8..), b = B(2t.., g), B(2t + 8.., g), c = C(g, 2t),
 * C(g, 2t + 1), C(g + 8, 2t), C(g + 8, 2t + 1). */
static inline void emu_mma_bf16_16816(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
  const emu::mx_slot *w = emu::mx_operands(a, b0, b1);
  float A[16][16], B[16][8];
  emu::a_frag16(w, A);
  for (int l = 0; l < 32; l++) {
    const int gr = l >> 2, t2 = 2 * (l & 3);
    for (int h = 0; h < 2; h++) {
      B[t2 + h][gr] = emu::bf16f(w[l].b[0] >> 16 * h);
      B[t2 + 8 + h][gr] = emu::bf16f(w[l].b[1] >> 16 * h);
    }
  }
  emu::mma_out(c, &A[0][0], &B[0][0], 16);
}

/* cvt.rna.tf32.f32: round to 10 mantissa bits, ties away from zero */
static inline uint32_t emu_cvt_rna_tf32(float x) {
  const uint32_t u = __float_as_uint(x);
  if ((u & 0x7f800000u) == 0x7f800000u) return u; /* inf, NaN */
  return (u + 0x1000u) & 0xffffe000u;
}
/* mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32, c += a . b: lane l
 * (g = l / 4, t = l % 4) holds a = A(g, t), A(g + 8, t), A(g, t + 4),
 * A(g + 8, t + 4), b = B(t, g), B(t + 4, g), c as the bf16 form's. Inputs
 * read as tf32 (their low 13 bits ignored). */
static inline void emu_mma_tf32_1688(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
  const emu::mx_slot *w = emu::mx_operands(a, b0, b1);
  auto tf = [](uint32_t u) { return __uint_as_float(u & 0xffffe000u); };
  float A[16][8], B[8][8];
  for (int l = 0; l < 32; l++) {
    const int gr = l >> 2, t = l & 3;
    A[gr][t] = tf(w[l].a[0]);
    A[gr + 8][t] = tf(w[l].a[1]);
    A[gr][t + 4] = tf(w[l].a[2]);
    A[gr + 8][t + 4] = tf(w[l].a[3]);
    B[t][gr] = tf(w[l].b[0]);
    B[t + 4][gr] = tf(w[l].b[1]);
  }
  emu::mma_out(c, &A[0][0], &B[0][0], 8);
}

/* wgmma.mma_async m64nNk16 bf16 -> fp32 of the calling lane's warp (warp
 * (tid / 32) % 4 of its warpgroup: rows 16 w .. 16 w + 15), computed at
 * issue (fence, commit and wait are no-ops). A comes from the registers
 * (a: the mma.sync m16n8k16 A fragment, all 32 lanes call) or, with a
 * null, from the shared-memory descriptor da; B from db, K-major or, with
 * transB, MN-major. Descriptors (start, LBO, SBO in 16-byte units at bits
 * 0, 16, 32; the mode at bit 62; src/gpu/kernels/gk_wgmma.cuh) in the
 * no-swizzle layout: the element (row r, k) of a K-major operand at start +
 * (r / 8) SBO + (r % 8) 16 + (k / 8) LBO + (k % 8) 2 bytes; (k, n) of an
 * MN-major one at start + (n / 8) SBO + (n % 8) 2 + (k / 8) LBO + (k % 8)
 * 16. In the 128-byte swizzle: (r, k) at start + (r / 8) SBO + (r % 8) 128
 * + 2 k; (k, n) at start + (n / 64) LBO + (n % 64) 2 + (k / 8) SBO + (k %
 * 8) 128; each address then swizzled. Products summed in double, rounded
 * once; acc = 0 ignores d's values. */
static inline void emu_wgmma(float *d, int N, const uint32_t *a, uint64_t da, uint64_t db, bool transB, int acc) {
  const int l = emu::g.cur->tid & 31, w = (emu::g.cur->tid >> 5) & 3, gr = l >> 2, t2 = 2 * (l & 3);
  auto at = [](uint64_t byte) {
    uint16_t h;
    memcpy(&h, (const char *)emu_smem_buf + byte, 2);
    return emu::bf16f(h);
  };
  auto field = [](uint64_t desc, int bit) { return ((desc >> bit) & 0x3fffu) << 4; };
  /* the descriptor's layout: mode 0 no swizzle, 1 the 128-byte swizzle
   * (bits 4-6 of the computed address ^= bits 7-9; the start keeps the
   * atom's bits 7-9, base offset 0: what the kernels use) */
  auto mode = [](uint64_t desc) {
    const int m = (int)(desc >> 62);
    if ((m != 0 && m != 1) || (desc >> 49 & 7)) {
      fprintf(stderr, "emu_wgmma: descriptor mode %d, base offset %d: not emulated\n", m, (int)(desc >> 49 & 7));
      abort();
    }
    return m;
  };
  auto sw = [](uint64_t byte) { return byte ^ (((byte >> 7) & 7) << 4); };
  float A[16][16];
  if (a)
    emu::a_frag16(emu::mx_operands(a, 0, 0), A);
  else {
    const bool s128 = mode(da);
    for (int r = 0; r < 16; r++)
      for (int k = 0; k < 16; k++) {
        const int row = 16 * w + r;
        const uint64_t base = field(da, 0) + (row / 8) * field(da, 32);
        A[r][k] = s128 ? at(sw(base + (row % 8) * 128 + k * 2))
                       : at(base + (row % 8) * 16 + (k / 8) * field(da, 16) + (k % 8) * 2);
      }
  }
  const bool s128 = mode(db);
  const uint64_t b0 = field(db, 0), lbo = field(db, 16), sbo = field(db, 32);
  for (int i = 0; i < N / 8; i++)
    for (int e = 0; e < 4; e++) {
      const int row = gr + 8 * (e >> 1), n = 8 * i + t2 + (e & 1);
      double s = acc ? d[4 * i + e] : 0.0;
      for (int k = 0; k < 16; k++) {
        const uint64_t at_k = s128 ? sw(b0 + (transB ? (n / 64) * lbo + (n % 64) * 2 + (k / 8) * sbo + (k % 8) * 128
                                                   : (n / 8) * sbo + (n % 8) * 128 + k * 2))
                            : b0 + (transB ? (n / 8) * sbo + (n % 8) * 2 + (k / 8) * lbo + (k % 8) * 16
                                           : (n / 8) * sbo + (n % 8) * 16 + (k / 8) * lbo + (k % 8) * 2);
        s += (double)A[row][k] * at(at_k);
      }
      d[4 * i + e] = (float)s;
    }
}

/* Run body (a call of the kernel with its arguments) on every block of the
 * grid, blocks in order. Returns false (and says which block) on a
 * deadlock. */
static inline bool emu_launch(dim3 grid, dim3 block, const std::function<void()> &body) {
  const int nth = (int)(block.x * block.y * block.z);
  if ((int)emu::g.f.size() < nth) {
    emu::g.f.resize(nth);
    for (auto &f : emu::g.f) f.stack.resize(emu::STACK);
  }
  emu::g.slot[0].assign(nth, 0.f);
  emu::g.slot[1].assign(nth, 0.f);
  emu::g.body = &body;
  gridDim = grid;
  blockDim = block;
  for (unsigned z = 0; z < grid.z; z++)
    for (unsigned y = 0; y < grid.y; y++)
      for (unsigned x = 0; x < grid.x; x++) {
        blockIdx = dim3(x, y, z);
        if (!emu::run_block(nth)) {
          fprintf(stderr, "emu: deadlock in block (%u, %u, %u): a barrier that not every thread reaches\n", x, y, z);
          return false;
        }
      }
  return true;
}
#endif
