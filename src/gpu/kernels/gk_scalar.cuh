/* Scalar device functions with no CUDA dependency beyond the math library,
 * so that tests/emu can compile the kernels that use them on the host. */
#ifndef GLM53_GPU_GK_SCALAR_CUH
#define GLM53_GPU_GK_SCALAR_CUH
__device__ __forceinline__ float sigm(float x) { return 1.0f / (1.0f + expf(-x)); }
/* KDA forget gate (log decay) of channel c (head h) from its raw
 * projection: the token recurrence and the chunked form share it */
__device__ __forceinline__ float kda_gate1(float graw, const float *dt_bias, const float *A_log, int h, int c, float lb) {
  float rate = expf(A_log[h]), x = graw + dt_bias[c];
  return !isnan(lb) ? lb * sigm(rate * x) : -rate * (x > 20.0f ? x : log1pf(expf(x)));
}
#endif
