/* safetensors reader: valid single/multi-shard checkpoints, every dtype
 * conversion against an independent reference, block-FP8 dequant, and each
 * kind of corrupt file giving one clear error (never a crash). */
#include "core/err.h"
#include "core/util.h"
#include "format/safetensors.h"
#include "test_util.h"
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char g_dir[256];

typedef struct {
  const char *name, *dtype;
  int ndim;
  int64_t shape[9];
  const void *data;
  size_t nbytes;
} tdesc;

/* Raw file: 8-byte LE header length, header text, data. */
static void write_raw(const char *path, uint64_t hlen_field, const char *hdr, const void *data, size_t nd) {
  FILE *f = fopen(path, "wb");
  uint8_t le[8];
  for (int i = 0; i < 8; i++) le[i] = (uint8_t)(hlen_field >> (8 * i));
  fwrite(le, 1, 8, f);
  fwrite(hdr, 1, strlen(hdr), f);
  if (nd) fwrite(data, 1, nd, f);
  fclose(f);
}

/* Valid file from descriptors; tensors are laid out back to back. The header
 * is space-padded to a multiple of 8 (as the reference writer does) unless
 * odd_pad, which tests unaligned data. */
static void write_st(const char *path, const tdesc *t, int n, int odd_pad) {
  char hdr[16384];
  size_t o = (size_t)snprintf(hdr, sizeof hdr, "{\"__metadata__\":{\"format\":\"pt\"}");
  size_t off = 0;
  for (int i = 0; i < n; i++) {
    o += (size_t)snprintf(hdr + o, sizeof hdr - o, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", t[i].name, t[i].dtype);
    for (int d = 0; d < t[i].ndim; d++)
      o += (size_t)snprintf(hdr + o, sizeof hdr - o, "%s%lld", d ? "," : "", (long long)t[i].shape[d]);
    o += (size_t)snprintf(hdr + o, sizeof hdr - o, "],\"data_offsets\":[%zu,%zu]}", off, off + t[i].nbytes);
    off += t[i].nbytes;
  }
  o += (size_t)snprintf(hdr + o, sizeof hdr - o, "}");
  while ((o % 8) != (odd_pad ? 3u : 0u)) hdr[o++] = ' ';
  hdr[o] = 0;
  uint8_t *data = xmalloc(off ? off : 1);
  off = 0;
  for (int i = 0; i < n; i++) {
    if (t[i].nbytes) memcpy(data + off, t[i].data, t[i].nbytes);
    off += t[i].nbytes;
  }
  write_raw(path, o, hdr, data, off);
  free(data);
}

static char *tpath(const char *sub) {
  static char buf[8][512];
  static int k;
  char *p = buf[k++ & 7];
  snprintf(p, 512, "%s/%s", g_dir, sub);
  return p;
}

/* st_open must fail with a one-line message containing `key`. */
static void expect_open_fail(const char *path, const char *key, const char *what) {
  glm53_err_clear();
  st_set *s = st_open(path);
  CHECK(s == NULL, "%s: opened", what);
  if (s) { st_close(s); return; }
  const char *e = glm53_last_error();
  if (getenv("VERBOSE")) fprintf(stderr, "%-32s -> %s\n", what, e);
  CHECK(strstr(e, key) != NULL, "%s: error \"%s\" lacks \"%s\"", what, e, key);
  CHECK(strchr(e, '\n') == NULL, "%s: multi-line error", what);
}

/* Reference fp8 e4m3fn decode from the bit pattern, in double. */
static double fp8_ref(uint8_t v) {
  int s = v >> 7, e = (v >> 3) & 15, m = v & 7;
  double r = e == 0 ? m * ldexp(1, -9) : (1 + m / 8.0) * ldexp(1, e - 7);
  return s ? -r : r;
}

static void test_single(void) {
  float f32[6] = {1.5f, -2.f, 0.f, 3.25f, 1e-30f, -7.f};
  /* bf16 / f16 patterns with their exact values. */
  uint16_t bf[6] = {0x3FC0, 0xC010, 0x4049, 0x0001, 0x7F7F, 0x8000};
  double bf_ref[6] = {1.5, -2.25, 3.140625, ldexp(1, -133), (2 - ldexp(1, -7)) * ldexp(1, 127), -0.0};
  uint16_t hf[6] = {0x3C00, 0xC000, 0x0001, 0x7BFF, 0x3555, 0x03FF};
  double hf_ref[6] = {1, -2, ldexp(1, -24), 65504, 0.333251953125, 1023 * ldexp(1, -24)};
  double f64[3] = {0.1, -1e10, 2.5};
  int32_t i32[2] = {7, -9};
  float scalar = 42.f;
  tdesc t[] = {
      {"a.weight", "F32", 2, {2, 3}, f32, sizeof f32},
      {"b", "BF16", 2, {3, 2}, bf, sizeof bf},
      {"c", "F16", 1, {6}, hf, sizeof hf},
      {"d", "F64", 1, {3}, f64, sizeof f64},
      {"e", "I32", 1, {2}, i32, sizeof i32},
      {"scalar", "F32", 0, {0}, &scalar, 4},
      {"empty", "F32", 2, {0, 4}, NULL, 0},
  };
  for (int odd = 0; odd < 2; odd++) {
    const char *p = tpath(odd ? "odd.safetensors" : "one.safetensors");
    write_st(p, t, 7, odd);
    st_set *s = st_open(p);
    CHECK(s != NULL, "open: %s", glm53_last_error());
    if (!s) continue;
    CHECK(st_count(s) == 7, "count %d", st_count(s));
    CHECK(st_find(s, "__metadata__") == NULL, "(see condition)");
    CHECK(st_find(s, "nope") == NULL, "(see condition)");
    const st_tensor *a = st_find(s, "a.weight");
    CHECK(a && a->dtype == ST_F32 && a->ndim == 2 && a->shape[0] == 2 && a->shape[1] == 3 && a->nbytes == 24, "(see condition)");
    CHECK(a && st_numel(a) == 6 && memcmp(a->data, f32, 24) == 0, "(see condition)");
    CHECK(strcmp(st_dtype_name(ST_F8_E4M3), "F8_E4M3") == 0 && strcmp(st_dtype_name(ST_BF16), "BF16") == 0, "(see condition)");
    int seen = 0;
    for (int i = 0; i < st_count(s); i++) seen += st_find(s, st_at(s, i)->name) == st_at(s, i);
    CHECK(seen == 7, "(see condition)");
    float out[8];
    int64_t sh23[2] = {2, 3}, sh32[2] = {3, 2};
    CHECK(st_read_f32(s, "a.weight", 2, sh23, out) == 0, "(see condition)");
    CHECK(memcmp(out, f32, 24) == 0, "(see condition)");
    CHECK(st_read_f32(s, "b", 2, sh32, out) == 0, "(see condition)");
    for (int i = 0; i < 6; i++) CHECK((double)out[i] == bf_ref[i] && !!signbit(out[i]) == !!signbit(bf_ref[i]), "bf16 %d", i);
    CHECK(st_read_f32(s, "c", 0, NULL, out) == 0, "(see condition)");
    for (int i = 0; i < 6; i++) CHECK((double)out[i] == hf_ref[i], "f16 %d: %g", i, out[i]);
    CHECK(st_read_f32(s, "d", 0, NULL, out) == 0, "(see condition)");
    for (int i = 0; i < 3; i++) CHECK(out[i] == (float)f64[i], "(see condition)");
    CHECK(st_read_f32(s, "scalar", 0, NULL, out) == 0 && out[0] == 42.f, "(see condition)");
    CHECK(st_numel(st_find(s, "scalar")) == 1 && st_numel(st_find(s, "empty")) == 0, "(see condition)");
    CHECK(st_read_f32(s, "empty", 0, NULL, out) == 0, "(see condition)");
    /* Errors: wrong shape names the tensor and both shapes; int dtype; absent. */
    CHECK(st_read_f32(s, "a.weight", 2, sh32, out) == -1, "(see condition)");
    const char *e = glm53_last_error();
    CHECK(strstr(e, "a.weight") && strstr(e, "[3, 2]") && strstr(e, "[2, 3]"), "%s", e);
    int64_t sh6[1] = {6};
    CHECK(st_read_f32(s, "a.weight", 1, sh6, out) == -1, "(see condition)");
    CHECK(st_read_f32(s, "e", 0, NULL, out) == -1 && strstr(glm53_last_error(), "I32"), "%s", glm53_last_error());
    CHECK(st_read_f32(s, "zz", 0, NULL, out) == -1 && strstr(glm53_last_error(), "zz"), "(see condition)");
    st_close(s);
  }
}

/* Large conversions take the OpenMP path; compare with independent decoding. */
static void test_large_bf16_f16(void) {
  enum { N = 100000 };
  uint16_t *b = xmalloc(N * 2), *h = xmalloc(N * 2);
  trng r = {12345};
  for (int i = 0; i < N; i++) {
    uint16_t v = (uint16_t)trng_u64(&r);
    if ((v & 0x7f80) == 0x7f80) v &= 0xbfff; /* no inf/NaN in bf16 */
    b[i] = v;
    v = (uint16_t)trng_u64(&r);
    if ((v & 0x7c00) == 0x7c00) v &= 0xbfff; /* no inf/NaN in f16 */
    h[i] = v;
  }
  tdesc t[] = {{"b", "BF16", 2, {250, 400}, b, N * 2}, {"h", "F16", 1, {N}, h, N * 2}};
  const char *p = tpath("big.safetensors");
  write_st(p, t, 2, 0);
  st_set *s = st_open(p);
  CHECK(s != NULL, "%s", glm53_last_error());
  float *out = xmalloc(N * 4);
  int bad = 0;
  if (s && st_read_f32(s, "b", 0, NULL, out) == 0) {
    for (int i = 0; i < N; i++) {
      int sg = b[i] >> 15, e = (b[i] >> 7) & 255, m = b[i] & 127;
      double ref = e ? (1 + m / 128.0) * ldexp(1, e - 127) : m * ldexp(1, -133);
      bad += (double)out[i] != (sg ? -ref : ref);
    }
  } else bad = -1;
  CHECK(bad == 0, "bf16 mismatches %d", bad);
  bad = 0;
  if (s && st_read_f32(s, "h", 0, NULL, out) == 0) {
    for (int i = 0; i < N; i++) {
      int sg = h[i] >> 15, e = (h[i] >> 10) & 31, m = h[i] & 1023;
      double ref = e ? (1 + m / 1024.0) * ldexp(1, e - 15) : m * ldexp(1, -24);
      bad += (double)out[i] != (sg ? -ref : ref);
    }
  } else bad = -1;
  CHECK(bad == 0, "f16 mismatches %d", bad);
  free(out); free(b); free(h);
  st_close(s);
}

/* Block FP8 with a partial last block in both axes (128-blocks) and a
 * non-128 block size inferred from the grid. */
static void fp8_case(int R, int C, int gr, int gc, int br, int bc, const char *fname) {
  uint8_t *q = xmalloc((size_t)R * C);
  float *sc = xmalloc((size_t)gr * gc * 4);
  trng r = {(uint64_t)R * 7919 + C};
  for (int i = 0; i < R * C; i++) {
    uint8_t v = (uint8_t)trng_u64(&r);
    if ((v & 0x7f) == 0x7f) v ^= 1; /* skip the NaN codes */
    q[i] = v;
  }
  /* Make sure the edge codes are present: subnormals, max 448, negatives, zeros. */
  const uint8_t edge[] = {0x00, 0x80, 0x01, 0x07, 0x81, 0x87, 0x08, 0x7e, 0xfe, 0x38, 0xb8};
  for (int i = 0; i < (int)sizeof edge && i < R * C; i++) q[i] = edge[i];
  q[R * C - 1] = 0x7e;
  for (int i = 0; i < gr * gc; i++) sc[i] = (float)(0.001 + trng_unif(&r)) * ((i & 1) ? 1.f : -3.f);
  tdesc t[] = {{"w.weight", "F8_E4M3", 2, {R, C}, q, (size_t)R * C},
               {"w.weight_scale_inv", "F32", 2, {gr, gc}, sc, (size_t)gr * gc * 4},
               {"bare.weight", "F8_E4M3", 2, {2, 2}, q, 4}};
  const char *p = tpath(fname);
  write_st(p, t, 3, 0);
  st_set *s = st_open(p);
  CHECK(s != NULL, "%s", glm53_last_error());
  if (!s) { free(q); free(sc); return; }
  float *out = xmalloc((size_t)R * C * 4);
  int64_t shp[2] = {R, C};
  CHECK(st_read_f32(s, "w.weight", 2, shp, out) == 0, "%s", glm53_last_error());
  int bad = 0;
  for (int i = 0; i < R; i++)
    for (int j = 0; j < C; j++) {
      /* q*s in double is exact (4-bit x 24-bit mantissas); one rounding to float. */
      float ref = (float)(fp8_ref(q[i * C + j]) * (double)sc[(i / br) * gc + j / bc]);
      bad += out[i * C + j] != ref;
    }
  CHECK(bad == 0, "%s: fp8 mismatches %d", fname, bad);
  CHECK(fp8_ref(0x7e) == 448 && fp8_ref(0x01) == ldexp(1, -9), "(see condition)");
  CHECK(st_read_f32(s, "bare.weight", 0, NULL, out) == -1 && strstr(glm53_last_error(), "scale"), "%s",
        glm53_last_error());
  free(out); free(q); free(sc);
  st_close(s);
}

static void test_fp8_bad_grid(void) {
  uint8_t q[70] = {0};
  float sc[22] = {0};
  tdesc t[] = {{"w", "F8_E4M3", 2, {10, 7}, q, 70}, {"w_scale_inv", "F32", 2, {11, 2}, sc, 88}};
  const char *p = tpath("badgrid.safetensors");
  write_st(p, t, 2, 0);
  st_set *s = st_open(p);
  float out[70];
  CHECK(s && st_read_f32(s, "w", 0, NULL, out) == -1 && strstr(glm53_last_error(), "grid"), "%s", glm53_last_error());
  st_close(s);
}

static void test_multishard(void) {
  float a[4] = {1, 2, 3, 4}, b[2] = {5, 6};
  uint16_t c[3] = {0x3F80, 0x4000, 0x4040};
  char *d = tpath("sharded");
  mkdir(d, 0755);
  tdesc t1[] = {{"x.a", "F32", 2, {2, 2}, a, 16}, {"x.c", "BF16", 1, {3}, c, 6}};
  tdesc t2[] = {{"y.b", "F32", 1, {2}, b, 8}};
  write_st(tpath("sharded/model-00001-of-00002.safetensors"), t1, 2, 0);
  write_st(tpath("sharded/model-00002-of-00002.safetensors"), t2, 1, 0);
  const char *idx = "{\"metadata\":{\"total_size\":30},\"weight_map\":{"
                    "\"x.a\":\"model-00001-of-00002.safetensors\",\"y.b\":\"model-00002-of-00002.safetensors\","
                    "\"x.c\":\"model-00001-of-00002.safetensors\"}}";
  write_file_atomic(tpath("sharded/model.safetensors.index.json"), idx, strlen(idx));
  st_set *s = st_open(d);
  CHECK(s != NULL, "%s", glm53_last_error());
  if (s) {
    CHECK(st_count(s) == 3, "(see condition)");
    const st_tensor *x = st_find(s, "x.a"), *y = st_find(s, "y.b"), *z = st_find(s, "x.c");
    CHECK(x && y && z && x->shard == 0 && y->shard == 1 && z->shard == 0, "(see condition)");
    float out[4];
    CHECK(st_read_f32(s, "y.b", 0, NULL, out) == 0 && out[0] == 5 && out[1] == 6, "(see condition)");
    CHECK(st_read_f32(s, "x.c", 0, NULL, out) == 0 && out[0] == 1 && out[1] == 2 && out[2] == 3, "(see condition)");
    st_close(s);
  }
  /* Index naming a missing shard. */
  d = tpath("missing");
  mkdir(d, 0755);
  write_st(tpath("missing/model-00001-of-00002.safetensors"), t1, 2, 0);
  write_file_atomic(tpath("missing/model.safetensors.index.json"), idx, strlen(idx));
  expect_open_fail(d, "missing", "index with missing shard");
  /* Index mapping a tensor to the wrong shard. */
  d = tpath("wrongmap");
  mkdir(d, 0755);
  write_st(tpath("wrongmap/s1.safetensors"), t1, 2, 0);
  write_st(tpath("wrongmap/s2.safetensors"), t2, 1, 0);
  const char *idx2 = "{\"weight_map\":{\"x.a\":\"s2.safetensors\",\"y.b\":\"s2.safetensors\",\"x.c\":\"s1.safetensors\"}}";
  write_file_atomic(tpath("wrongmap/model.safetensors.index.json"), idx2, strlen(idx2));
  expect_open_fail(d, "not found", "index maps tensor to wrong shard");
  /* Bad index JSON. */
  d = tpath("badidx");
  mkdir(d, 0755);
  write_file_atomic(tpath("badidx/model.safetensors.index.json"), "{\"weight_map\":", 14);
  expect_open_fail(d, "JSON", "bad index json");
  /* No index: glob of *.safetensors, sorted; duplicate names across shards. */
  d = tpath("glob");
  mkdir(d, 0755);
  write_st(tpath("glob/b.safetensors"), t2, 1, 0);
  write_st(tpath("glob/a.safetensors"), t1, 2, 0);
  s = st_open(d);
  CHECK(s && st_count(s) == 3 && st_find(s, "y.b")->shard == 1, "%s", glm53_last_error());
  st_close(s);
  d = tpath("dup");
  mkdir(d, 0755);
  write_st(tpath("dup/a.safetensors"), t1, 2, 0);
  write_st(tpath("dup/b.safetensors"), t1, 1, 0);
  expect_open_fail(d, "duplicate", "duplicate names across shards");
  /* model.safetensors preferred in a directory. */
  d = tpath("single");
  mkdir(d, 0755);
  write_st(tpath("single/model.safetensors"), t2, 1, 0);
  write_st(tpath("single/other.safetensors"), t2, 1, 0); /* would be a duplicate if globbed */
  s = st_open(d);
  CHECK(s && st_count(s) == 1, "%s", glm53_last_error());
  st_close(s);
  d = tpath("emptydir");
  mkdir(d, 0755);
  expect_open_fail(d, "no .safetensors", "empty dir");
  expect_open_fail(tpath("does-not-exist"), "cannot open", "missing path");
}

/* One corrupt header: data is 16 zero bytes. */
static void corrupt(const char *hdr, const char *key, const char *what) {
  static const uint8_t z[16];
  const char *p = tpath("bad.safetensors");
  write_raw(p, strlen(hdr), hdr, z, 16);
  expect_open_fail(p, key, what);
}

static void test_corrupt(void) {
  const char *p = tpath("short.safetensors");
  write_raw(p, 0, "", NULL, 0);
  FILE *f = fopen(p, "wb"); fwrite("abcde", 1, 5, f); fclose(f);
  expect_open_fail(p, "too short", "5-byte file");
  f = fopen(p, "wb"); fclose(f);
  expect_open_fail(p, "too short", "empty file");
  write_raw(p, 1000, "{}", NULL, 0);
  expect_open_fail(p, "larger than the file", "header length > file");
  write_raw(p, ~0ull, "{}", NULL, 0);
  expect_open_fail(p, "larger than the file", "header length 2^64-1");
  corrupt("{\"a\": {\"dtype\": \"F32\"", "not valid JSON", "truncated JSON");
  corrupt("not json at all", "not valid JSON", "garbage header");
  corrupt("[1, 2, 3]", "not an object", "array header");
  corrupt("{\"a\":{\"dtype\":\"Q4_K\",\"shape\":[4],\"data_offsets\":[0,4]}}", "dtype", "unknown dtype");
  corrupt("{\"a\":{\"dtype\":7,\"shape\":[4],\"data_offsets\":[0,4]}}", "dtype", "numeric dtype");
  corrupt("{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,100]}}", "out of range", "offsets past end");
  corrupt("{\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,12]}}", "needs", "offsets vs shape");
  corrupt("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
          "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", "overlapping", "overlap");
  corrupt("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[-4,4]}}", "negative", "negative offset");
  corrupt("{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,0]}}", "reversed", "reversed offsets");
  corrupt("{\"a\":{\"dtype\":\"F32\",\"shape\":[-2,2],\"data_offsets\":[0,16]}}", "negative dimension", "negative dim");
  corrupt("{\"a\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,6]}}", "shape", "fractional dim");
  corrupt("{\"a\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", "dims", "9 dims");
  corrupt("{\"a\":{\"dtype\":\"F32\",\"shape\":[4503599627370496,4503599627370496],\"data_offsets\":[0,16]}}", "needs",
          "huge shape (overflow)");
  corrupt("{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", "data_offsets", "missing offsets");
  corrupt("{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", "shape", "missing shape");
  corrupt("{\"a\":[1,2]}", "not an object", "entry not object");
  corrupt("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
          "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", "duplicate", "duplicate in one file");
  /* The error names the file. */
  corrupt("[]", "bad.safetensors", "error names file");
  /* __metadata__ is ignored whatever it holds; adjacent tensors and empty ones are fine. */
  static const uint8_t z[16];
  const char *ok = "{\"__metadata__\":{\"x\":\"y\"},\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                   "\"e\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,8]},"
                   "\"b\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[8,16]}}";
  write_raw(p, strlen(ok), ok, z, 16);
  st_set *s = st_open(p);
  CHECK(s && st_count(s) == 3, "%s", glm53_last_error());
  st_close(s);
}

int main(void) {
  snprintf(g_dir, sizeof g_dir, "/tmp/glm53_st_XXXXXX");
  if (!mkdtemp(g_dir)) { perror("mkdtemp"); return 1; }
  test_single();
  test_large_bf16_f16();
  fp8_case(300, 400, 3, 4, 128, 128, "fp8a.safetensors"); /* partial last blocks (44 rows, 16 cols) */
  fp8_case(10, 7, 3, 2, 4, 4, "fp8b.safetensors");        /* block size inferred: 4 x 4 */
  test_fp8_bad_grid();
  test_multishard();
  test_corrupt();
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
  if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", g_dir);
  TEST_DONE();
}
