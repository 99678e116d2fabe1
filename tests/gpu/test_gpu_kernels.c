/* Each GPU kernel against the fp32 CPU reference on random non-zero data
 * (three seeds); the tolerances are those of the startup validation and are
 * printed with every check (fp32 kernels 1e-5..1e-4 relative to the largest
 * reference value; the cuBLAS path of bf16/q8/q4 weights, which rounds the
 * activations to bf16, 2e-2; selections exact). No device: SKIP. */
#include "gpu/glm53_gpu.h"
#include "test_util.h"

int main(void) {
  char why[256];
  if (!glm53_gpu_available(why, sizeof why)) {
    printf("SKIP: no GPU device (%s)\n", why);
    return 0;
  }
  printf("device: %s\n", glm53_gpu_device_desc());
  for (uint64_t seed = 1; seed <= 3; seed++) {
    gpu_check chk[64];
    int n = glm53_gpu_selftest(seed, chk, 64);
    CHECK(n > 0, "selftest seed %llu failed to run", (unsigned long long)seed);
    for (int i = 0; i < n; i++) {
      if (seed == 1 || !chk[i].ok)
        printf("seed %llu  %-40s err %-10.3g tol %-8.3g %s\n", (unsigned long long)seed, chk[i].name, chk[i].err, chk[i].tol,
               chk[i].ok ? "ok" : "FAIL");
      CHECK(chk[i].ok, "%s: %g > %g", chk[i].name, chk[i].err, chk[i].tol);
    }
  }
  TEST_DONE();
}
