/* Hopper warpgroup matrix products (wgmma, sm_90a) for the kernels that use
 * them, and their host stand-ins for the CUDA emulator (GK_EMU: the
 * products computed at issue from the same shared-memory descriptors and
 * register fragments, tests/emu/cuda_emu.h emu_wgmma). Operands are bf16,
 * accumulators fp32. Shared-memory operands use a canonical layout of the
 * PTX ISA: the 128-byte swizzle (mw_desc_sw128, the fused MLA kernel), or
 * no swizzle ("interleave"): 8 x 16-byte core
 * matrices, each 128 contiguous bytes (its 8 rows 16 bytes apart); LBO is
 * the byte distance between core matrices adjacent along K, SBO along M or
 * N. For a K-major operand a core matrix's rows are M/N indices and its 16
 * bytes 8 consecutive k; for an MN-major (transposed) one its rows are k and
 * its 16 bytes 8 consecutive n. The accumulator fragment of warp w of the
 * warpgroup is the mma.sync m16n8 C fragment of rows 16 w .. 16 w + 15, one
 * per 8 columns (d[4 i .. 4 i + 3]: rows g, g, g + 8, g + 8, columns 8 i +
 * 2 t, + 1); a register A operand is the mma.sync m16n8k16 A fragment of
 * the same rows. MW_WGMMA says whether this compilation has the
 * instructions (sm_90a device code, or the emulator). */
#ifndef GLM53_GPU_GK_WGMMA_CUH
#define GLM53_GPU_GK_WGMMA_CUH

#if defined(GK_EMU) || defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MW_WGMMA 1
#else
#define MW_WGMMA 0
#endif

/* a shared-memory address as the descriptors and the swizzle see it (the
 * emulator: the offset into its 1024-byte aligned buffer) */
__device__ __forceinline__ uint32_t mw_saddr(const void *sm) {
#ifdef GK_EMU
  return (uint32_t)((const char *)sm - (const char *)emu_smem_buf);
#else
  return (uint32_t)__cvta_generic_to_shared(sm);
#endif
}
/* a shared-memory descriptor: no swizzle, base offset 0 (16-byte aligned
 * start, lbo and sbo in bytes) */
__device__ __forceinline__ uint64_t mw_desc(const void *sm, uint32_t lbo, uint32_t sbo) {
  return (uint64_t)((mw_saddr(sm) & 0x3ffffu) >> 4) | (uint64_t)(lbo >> 4) << 16 | (uint64_t)(sbo >> 4) << 32;
}
/* The 128-byte swizzle (descriptor mode 1): the operand in atoms of 8 rows
 * x 128 bytes (1024-byte aligned), the 16-byte chunk c of an atom's row r
 * stored at chunk c ^ r. The tensor cores apply it to the computed address
 * (bits 4-6 ^= bits 7-9), so a start inside an atom's row (a k step of a
 * K-major operand, 32 bytes; a column offset of an MN-major one) needs no
 * base offset as long as it keeps bits 7-9 of the atom's start. K-major:
 * rows (M / N) 128 bytes apart, SBO the distance between 8-row groups, LBO
 * unused (a k16 step fits an atom's row). MN-major: an atom holds 64
 * consecutive n (its row, 128 bytes) of 8 consecutive k; LBO is the
 * distance between atoms along n, SBO between 8-k groups. */
__device__ __forceinline__ uint64_t mw_desc_sw128(const void *sm, uint32_t lbo, uint32_t sbo) {
  return mw_desc(sm, lbo, sbo) | (uint64_t)1 << 62;
}
/* the byte offset of 16-byte chunk c of row r in a tile of `rows` rows
 * stored as 128-byte swizzled atoms, chunks 8 a .. 8 a + 7 of every row in
 * the a-th run of rows x 128 bytes: the K-major layout of the descriptor
 * above (SBO 1024; rows = the operand's M or N), and its MN-major layout
 * when the rows are k and the chunks hold n (SBO 1024, LBO rows x 128) */
__device__ __forceinline__ uint32_t mw_sw128_off(int c, int r, int rows) {
  return (uint32_t)((c >> 3) * rows * 128 + r * 128 + (((c ^ r) & 7) << 4));
}

#ifdef GK_EMU
#define mw_fence() do { } while (0)
#define mw_commit() do { } while (0)
#define mw_wait0() do { } while (0)
#define mw_proxy_fence() do { } while (0)
#define mw_keep(x) do { } while (0)
__device__ __forceinline__ void mw_ss_n64(float *d, uint64_t da, uint64_t db, int acc) { emu_wgmma(d, 64, nullptr, da, db, false, acc); }
__device__ __forceinline__ void mw_ss_n32(float *d, uint64_t da, uint64_t db, int acc) { emu_wgmma(d, 32, nullptr, da, db, false, acc); }
__device__ __forceinline__ void mw_rs_n256(float *d, const uint32_t *a, uint64_t db) { emu_wgmma(d, 256, a, 0, db, true, 1); }
__device__ __forceinline__ void mw_rs_n32(float *d, const uint32_t *a, uint64_t db) { emu_wgmma(d, 32, a, 0, db, true, 1); }
#elif MW_WGMMA
/* before the first product of a batch: orders the warpgroup's register
 * writes (accumulators, A fragments) before the asynchronous products */
__device__ __forceinline__ void mw_fence(void) { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void mw_commit(void) { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void mw_wait0(void) { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
/* shared memory written by ordinary stores or cp.async, read next by the
 * tensor cores (the async proxy): in each writer, before the barrier */
__device__ __forceinline__ void mw_proxy_fence(void) { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
/* keeps the compiler from moving an accumulator across the wait */
#define mw_keep(x) asm volatile("" : "+f"(x)::"memory")
#define MW_F8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
/* d[64 x 64] (acc: +)= A[64 x 16] . B[16 x 64], both K-major in shared memory */
__device__ __forceinline__ void mw_ss_n64(float *d, uint64_t da, uint64_t db, int acc) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
               "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, "
               "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31 "
               "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
               : MW_F8(0), MW_F8(8), MW_F8(16), MW_F8(24)
               : "l"(da), "l"(db), "r"(acc));
}
/* d[64 x 32] (acc: +)= A[64 x 16] . B[16 x 32], both K-major in shared memory */
__device__ __forceinline__ void mw_ss_n32(float *d, uint64_t da, uint64_t db, int acc) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {"
               "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15 "
               "}, %16, %17, p, 1, 1, 0, 0;\n}\n"
               : MW_F8(0), MW_F8(8)
               : "l"(da), "l"(db), "r"(acc));
}
/* d[64 x 256] += A[64 x 16] . B[16 x 256]: A in registers, B MN-major in shared memory */
__device__ __forceinline__ void mw_rs_n256(float *d, const uint32_t *a, uint64_t db) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
               "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, "
               "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, "
               "%40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, "
               "%59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, "
               "%78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, "
               "%97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, "
               "%113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127 "
               "}, {%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n"
               : MW_F8(0), MW_F8(8), MW_F8(16), MW_F8(24), MW_F8(32), MW_F8(40), MW_F8(48), MW_F8(56),
                 MW_F8(64), MW_F8(72), MW_F8(80), MW_F8(88), MW_F8(96), MW_F8(104), MW_F8(112), MW_F8(120)
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}
/* d[64 x 32] += A[64 x 16] . B[16 x 32]: A in registers, B MN-major in shared memory */
__device__ __forceinline__ void mw_rs_n32(float *d, const uint32_t *a, uint64_t db) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {"
               "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15 "
               "}, {%16, %17, %18, %19}, %20, p, 1, 1, 1;\n}\n"
               : MW_F8(0), MW_F8(8)
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}
#undef MW_F8
#else /* the host pass, or device code without the instructions: never called there (kernels test MW_WGMMA) */
__device__ __forceinline__ void mw_fence(void) {}
__device__ __forceinline__ void mw_commit(void) {}
__device__ __forceinline__ void mw_wait0(void) {}
__device__ __forceinline__ void mw_proxy_fence(void) {}
#define mw_keep(x) do { } while (0)
__device__ __forceinline__ void mw_ss_n64(float *, uint64_t, uint64_t, int) {}
__device__ __forceinline__ void mw_ss_n32(float *, uint64_t, uint64_t, int) {}
__device__ __forceinline__ void mw_rs_n256(float *, const uint32_t *, uint64_t) {}
__device__ __forceinline__ void mw_rs_n32(float *, const uint32_t *, uint64_t) {}
#endif

#endif
