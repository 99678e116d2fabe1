/* A host emulator of the CUDA execution model, for unit tests of kernels on
 * machines without a GPU (CI): the threads of a block run as fibers
 * (ucontext) on one OS thread; __syncthreads waits for the whole block,
 * __shfl_xor_sync for the 32 lanes of the warp; blocks run one after
 * another. It covers what the emulated kernels use (dim3 indices, static
 * and dynamic shared memory, float4, indexed and xor shuffles, __syncwarp) and
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
alignas(16) static float emu_smem_buf[256 * 1024 / sizeof(float)];
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
static inline void __syncthreads() { emu::yield(emu::BLOCK_WAIT); }
/* the calling warp's 32 lanes (a shuffle without data) */
static inline void __syncwarp(unsigned mask = 0xffffffffu) {
  (void)mask;
  emu::yield(emu::WARP_WAIT);
  emu::g.cur->wgen++;
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
