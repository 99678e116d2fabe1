/* One source for CUDA and HIP: the kernels are written against the CUDA
 * runtime/cuBLAS names; under hipcc (__HIP_PLATFORM_AMD__ or GLM53_HIP) they
 * are mapped to their HIP/hipBLAS equivalents. Only names the kernels use are
 * mapped. Warp size is taken as 32 everywhere (gfx9 wave64 parts run the
 * kernels with half the lanes idle; see docs/gpu.md). */
#ifndef GLM53_GPU_COMPAT_H
#define GLM53_GPU_COMPAT_H

#if defined(GLM53_HIP) || defined(__HIP_PLATFORM_AMD__)
#include <hip/hip_runtime.h>
#define GK_HIP 1
/* hipBLAS is optional (Debian bookworm ships hipcc but no hipBLAS): without
 * it every product takes the in-house GEMV (correct, slow for prefill). */
#ifdef GLM53_HIPBLAS
#include <hipblas/hipblas.h>
#define GK_HAVE_BLAS 1
#else
#define GK_HAVE_BLAS 0
#endif
/* 32-lane reductions: on wave64 parts an xor below 32 stays inside the
 * 32-lane half that the kernels treat as a warp */
#if !defined(HIP_VERSION_MAJOR) || HIP_VERSION_MAJOR < 6 || (HIP_VERSION_MAJOR == 6 && HIP_VERSION_MINOR < 2)
#define __shfl_xor_sync(mask, v, o) __shfl_xor((v), (o))
#define __shfl_sync(mask, v, s) __shfl((v), (s), 32)
#define __syncwarp(...) __builtin_amdgcn_wave_barrier()
#endif
#define cudaError_t hipError_t
#define cudaSuccess hipSuccess
#define cudaGetErrorString hipGetErrorString
#define cudaGetLastError hipGetLastError
#define cudaGetDeviceCount hipGetDeviceCount
#define cudaGetDeviceProperties hipGetDeviceProperties
#define cudaDeviceProp hipDeviceProp_t
#define cudaSetDevice hipSetDevice
#define cudaMalloc hipMalloc
#define cudaFree hipFree
#define cudaMemcpy hipMemcpy
#define cudaMemcpyAsync hipMemcpyAsync
#define cudaMemset hipMemset
#define cudaMemsetAsync hipMemsetAsync
#define cudaMemcpyHostToDevice hipMemcpyHostToDevice
#define cudaMemcpyDeviceToHost hipMemcpyDeviceToHost
#define cudaMemcpyDeviceToDevice hipMemcpyDeviceToDevice
#define cudaDeviceSynchronize hipDeviceSynchronize
#define cudaStream_t hipStream_t
#define cudaStreamSynchronize hipStreamSynchronize
#define cudaEvent_t hipEvent_t
#define cudaEventCreate hipEventCreate
#define cudaEventRecord hipEventRecord
#define cudaEventSynchronize hipEventSynchronize
#define cudaEventElapsedTime hipEventElapsedTime
#define cudaEventDestroy hipEventDestroy
#define cudaMemGetInfo hipMemGetInfo
#define cudaFuncSetAttribute hipFuncSetAttribute
#define cudaFuncAttribute hipFuncAttribute
#define cudaFuncAttributeMaxDynamicSharedMemorySize hipFuncAttributeMaxDynamicSharedMemorySize
#define __nv_bfloat16 hip_bfloat16
#define cublasHandle_t hipblasHandle_t
#define cublasStatus_t hipblasStatus_t
#define CUBLAS_STATUS_SUCCESS HIPBLAS_STATUS_SUCCESS
#define cublasCreate hipblasCreate
#define cublasDestroy hipblasDestroy
#define cublasSgemm hipblasSgemm
#define cublasSgemmStridedBatched hipblasSgemmStridedBatched
#define cublasGemmEx hipblasGemmEx_v2
#define cublasGemmStridedBatchedEx hipblasGemmStridedBatchedEx_v2
#define cublasGemmBatchedEx hipblasGemmBatchedEx_v2
#define cublasComputeType_t hipblasComputeType_t
#define cublasOperation_t hipblasOperation_t
#define CUBLAS_COMPUTE_32F_FAST_TF32 HIPBLAS_COMPUTE_32F_FAST_TF32
#define CUBLAS_OP_N HIPBLAS_OP_N
#define CUBLAS_OP_T HIPBLAS_OP_T
#define CUDA_R_16BF HIP_R_16BF
#define CUDA_R_32F HIP_R_32F
#define CUBLAS_COMPUTE_32F HIPBLAS_COMPUTE_32F
#define CUBLAS_GEMM_DEFAULT HIPBLAS_GEMM_DEFAULT
#else
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cublas_v2.h>
#define GK_HIP 0
#define GK_HAVE_BLAS 1
#endif

#endif
