/* src/core/util.h number conversions against double-precision references:
 * bf16 <-> f32 (round-to-nearest-even incl. every tie, NaN, overflow), every
 * f16 bit pattern both ways plus every f16 tie, and all 256 FP8 E4M3 codes. */
#include "core/util.h"
#include "test_util.h"
#include <string.h>

static float bits_f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static uint32_t f_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

/* Exact value of a bf16 pattern (finite), from its fields. */
static double bf16_ref(uint16_t h) {
  int s = h >> 15, e = (h >> 7) & 255, m = h & 127;
  double v = e ? (1 + m / 128.0) * ldexp(1, e - 127) : m * ldexp(1, -133);
  return s ? -v : v;
}
static double f16_ref(uint16_t h) {
  int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
  double v = e ? (1 + m / 1024.0) * ldexp(1, e - 15) : m * ldexp(1, -24);
  return s ? -v : v;
}

/* Reference f32 -> bf16: pick the nearer of the two neighbouring patterns,
 * ties to the even pattern. Magnitudes past the largest bf16 round to inf. */
static uint16_t bf16_round_ref(float x) {
  uint32_t u = f_bits(x);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000), lo = (uint16_t)((u >> 16) & 0x7fff);
  double a = fabs((double)x);
  double vlo = bf16_ref(lo);
  double vhi = lo + 1 == 0x7f80 ? ldexp(1, 128) : bf16_ref((uint16_t)(lo + 1));
  double dlo = a - vlo, dhi = vhi - a;
  uint16_t r = dlo < dhi ? lo : dhi < dlo ? (uint16_t)(lo + 1) : (lo & 1) ? (uint16_t)(lo + 1) : lo;
  return (uint16_t)(sign | r);
}

/* Reference f32 -> f16 via exact double arithmetic with nearbyint (RNE). */
static uint16_t f16_round_ref(float x) {
  uint16_t sign = (f_bits(x) >> 31) ? 0x8000 : 0;
  double a = fabs((double)x);
  if (a >= 65520.0) return sign | 0x7c00; /* halfway to 2^16 and above -> inf */
  int ex;
  frexp(a, &ex); /* a = m * 2^ex, m in [0.5, 1) */
  int E = ex - 1;
  double quantum = E < -14 ? ldexp(1, -24) : ldexp(1, E - 10);
  double r = nearbyint(a / quantum) * quantum;
  if (r < ldexp(1, -14)) return sign | (uint16_t)(r / ldexp(1, -24));
  frexp(r, &ex);
  E = ex - 1;
  uint16_t m = (uint16_t)(r / ldexp(1, E) * 1024 - 1024);
  return sign | (uint16_t)((E + 15) << 10) | m;
}

static void test_bf16(void) {
  /* Every non-NaN pattern decodes exactly and round-trips. */
  int bad = 0, badrt = 0;
  for (uint32_t h = 0; h < 65536; h++) {
    float f = bf16_to_f32((uint16_t)h);
    int e = (h >> 7) & 255;
    if (e == 255) {
      if (h & 127) bad += !isnan(f) || !isnan(round_bf16(f));
      else bad += !isinf(f) || f32_to_bf16(f) != h;
      continue;
    }
    bad += (double)f != bf16_ref((uint16_t)h);
    badrt += f32_to_bf16(f) != h;
  }
  CHECK(bad == 0 && badrt == 0, "bf16 decode %d, round trip %d", bad, badrt);
  /* Every tie (midpoint of adjacent finite patterns, exact in f32) goes to even. */
  bad = 0;
  for (uint32_t h = 0; h < 0x7f7f; h++) {
    double mid = (bf16_ref((uint16_t)h) + bf16_ref((uint16_t)(h + 1))) / 2;
    float x = (float)mid;
    uint16_t want = (h & 1) ? (uint16_t)(h + 1) : (uint16_t)h;
    bad += (double)x != mid || f32_to_bf16(x) != want || f32_to_bf16(-x) != (want | 0x8000);
  }
  CHECK(bad == 0, "bf16 ties %d", bad);
  /* Random floats (all exponents) vs the reference, plus neighbours of ties. */
  trng r = {99};
  bad = 0;
  for (int i = 0; i < 1000000; i++) {
    uint32_t u = (uint32_t)trng_u64(&r);
    if ((u & 0x7f800000u) == 0x7f800000u) continue;
    bad += f32_to_bf16(bits_f(u)) != bf16_round_ref(bits_f(u));
    uint32_t t = (u & 0xffff0000u) | 0x8000u; /* exact tie, and one ulp either side */
    for (int d = -1; d <= 1; d++)
      if (((t + d) & 0x7f800000u) != 0x7f800000u) bad += f32_to_bf16(bits_f(t + d)) != bf16_round_ref(bits_f(t + d));
  }
  CHECK(bad == 0, "bf16 random %d", bad);
  /* Specials: largest finite rounds to inf once past the midpoint; NaN stays NaN (quiet). */
  CHECK(f32_to_bf16(bits_f(0x7f7f7fffu)) == 0x7f7f, "below max midpoint");
  CHECK(f32_to_bf16(bits_f(0x7f7f8000u)) == 0x7f80, "max midpoint ties to even = inf");
  CHECK(f32_to_bf16(INFINITY) == 0x7f80 && f32_to_bf16(-INFINITY) == 0xff80, "inf");
  CHECK(f32_to_bf16(-0.0f) == 0x8000 && f32_to_bf16(0.0f) == 0, "zeros");
  uint32_t nans[] = {0x7fc00000u, 0x7f800001u, 0xff800001u, 0x7fffffffu, 0x7f80ffffu, 0x7f810000u};
  for (int i = 0; i < 6; i++) {
    uint16_t b = f32_to_bf16(bits_f(nans[i]));
    CHECK((b & 0x7f80) == 0x7f80 && (b & 0x7f) != 0 && (b & 0x40), "NaN %08x -> %04x not quiet NaN", nans[i], b);
    CHECK((b >> 15) == (nans[i] >> 31), "NaN sign %08x", nans[i]);
  }
  CHECK(round_bf16(1.00390625f) == 1.0f && round_bf16(1.01171875f) == 1.015625f, "round_bf16 ties");
}

static void test_f16(void) {
  int bad = 0, badrt = 0;
  for (uint32_t h = 0; h < 65536; h++) {
    float f = f16_to_f32((uint16_t)h);
    int e = (h >> 10) & 31;
    if (e == 31) {
      if (h & 1023) bad += !isnan(f) || (f32_to_f16(f) & 0x7c00) != 0x7c00 || !(f32_to_f16(f) & 1023);
      else bad += !isinf(f) || (f > 0) != !(h >> 15) || f32_to_f16(f) != h;
      continue;
    }
    bad += (double)f != f16_ref((uint16_t)h);
    badrt += f32_to_f16(f) != h;
  }
  CHECK(bad == 0 && badrt == 0, "f16 decode %d, round trip %d", bad, badrt);
  /* Every tie between adjacent finite f16 values (incl. subnormals). */
  bad = 0;
  for (uint32_t h = 0; h < 0x7bff; h++) {
    double mid = (f16_ref((uint16_t)h) + f16_ref((uint16_t)(h + 1))) / 2;
    float x = (float)mid;
    uint16_t want = (h & 1) ? (uint16_t)(h + 1) : (uint16_t)h;
    bad += (double)x != mid || f32_to_f16(x) != want || f32_to_f16(-x) != (want | 0x8000);
  }
  CHECK(bad == 0, "f16 ties %d", bad);
  /* Random floats around the f16 range (exponents 2^-30 .. 2^17) vs the reference. */
  trng r = {7};
  bad = 0;
  for (int i = 0; i < 1000000; i++) {
    uint32_t u = (uint32_t)trng_u64(&r);
    uint32_t e = 97 + (uint32_t)(trng_u64(&r) % 48);
    u = (u & 0x807fffffu) | (e << 23);
    bad += f32_to_f16(bits_f(u)) != f16_round_ref(bits_f(u));
  }
  CHECK(bad == 0, "f16 random %d", bad);
  CHECK(f32_to_f16(65519.99f) == 0x7bff && f32_to_f16(65520.f) == 0x7c00 && f32_to_f16(1e10f) == 0x7c00, "overflow");
  CHECK(f32_to_f16(ldexpf(1, -25)) == 0 && f32_to_f16(ldexpf(1.5f, -25)) == 1 && f32_to_f16(ldexpf(1, -26)) == 0,
        "underflow rounding");
  CHECK(f32_to_f16(-0.0f) == 0x8000, "-0");
}

static void test_fp8(void) {
  int bad = 0;
  for (int v = 0; v < 256; v++) {
    float f = fp8e4m3_to_f32((uint8_t)v);
    if ((v & 0x7f) == 0x7f) { bad += !isnan(f); continue; }
    int s = v >> 7, e = (v >> 3) & 15, m = v & 7;
    double ref = e == 0 ? m * ldexp(1, -9) : (1 + m / 8.0) * ldexp(1, e - 7);
    if (s) ref = -ref;
    bad += (double)f != ref || !!signbit(f) != s;
  }
  CHECK(bad == 0, "fp8 mismatches %d", bad);
  CHECK(fp8e4m3_to_f32(0x7e) == 448 && fp8e4m3_to_f32(0xfe) == -448, "max");
  CHECK(fp8e4m3_to_f32(0x01) == ldexpf(1, -9) && fp8e4m3_to_f32(0x07) == 7 * ldexpf(1, -9), "subnormals");
  CHECK(fp8e4m3_to_f32(0x08) == ldexpf(1, -6) && fp8e4m3_to_f32(0x38) == 1.0f, "normals");
  CHECK(fp8e4m3_to_f32(0x78) == 256 && !isinf(fp8e4m3_to_f32(0x78)), "no inf in e4m3fn");
}

int main(void) {
  test_bf16();
  test_f16();
  test_fp8();
  TEST_DONE();
}
