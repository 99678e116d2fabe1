/* The start of every GPU test: without a device it prints "SKIP: <reason>"
 * (CTest then reports the test as Skipped) and the test exits 0; with one it
 * names the device. */
#ifndef GLM53_TESTS_GPU_TEST_H
#define GLM53_TESTS_GPU_TEST_H
#include "gpu/glm53_gpu.h"
#include <stdio.h>

/* 1 when there is no device (the test returns 0 then) */
static inline int gpu_test_skip(void) {
  char why[256];
  if (!glm53_gpu_available(why, sizeof why)) {
    printf("SKIP: no GPU device (%s)\n", why);
    return 1;
  }
  printf("device: %s\n", glm53_gpu_device_desc());
  return 0;
}

#endif
