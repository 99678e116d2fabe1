/* The .g53 format: exact decode vectors (docs/format.md), Int4/Int8 round
 * trips incl. nibble edges 0 and 15, writer/reader, corruption detection
 * (truncated, flipped data byte with verify, corrupted header, bad magic),
 * and block-FP8 dequantization (2-D via st_read_f32, fused 3-D expert slices
 * via the HF source) against a reference e4m3 decoder. */
#include "format/g53.h"
#include "format/g53_quant.h"
#include "format/safetensors.h"
#include "model/bind.h"
#include "core/err.h"
#include "core/util.h"
#include "test_util.h"
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

static char root[] = "/tmp/glm53_g53fmt_XXXXXX";

static void decode_vectors(void) {
  /* Q4, one row of 32, group 32, f16 scale 0x3800 = 0.5 */
  uint8_t q[16] = {0x80, 0xF0, 0x0F, 0x7A};
  for (int i = 4; i < 16; i++) q[i] = 0x88;
  uint16_t s = 0x3800;
  wmat w = {.fmt = WMAT_Q4, .rows = 1, .cols = 32, .group = 32, .data = q, .scales = &s};
  float out[32];
  wmat_get_row(&w, 0, out);
  const float want[8] = {-4.0f, 0.0f, -4.0f, 3.5f, 3.5f, -4.0f, 1.0f, -0.5f};
  for (int i = 0; i < 8; i++) CHECK(out[i] == want[i], "q4 vector col %d: %g != %g", i, out[i], want[i]);
  for (int i = 8; i < 32; i++) CHECK(out[i] == 0.0f, "q4 vector col %d", i);
  /* Q8, group 32, f16 scale 0x2C00 = 0.0625 */
  int8_t q8[32] = {-127, 127, 0, -2};
  uint16_t s8 = 0x2C00;
  wmat w8 = {.fmt = WMAT_Q8, .rows = 1, .cols = 32, .group = 32, .data = q8, .scales = &s8};
  wmat_get_row(&w8, 0, out);
  CHECK(out[0] == -7.9375f && out[1] == 7.9375f && out[2] == 0.0f && out[3] == -0.125f, "q8 vector: %g %g %g %g", out[0], out[1], out[2], out[3]);
}

static void round_trips(void) {
  trng r = {5};
  const int cols = 256;
  float x[256], y[256];
  uint8_t q[128];
  int8_t q8[256];
  uint16_t s[8];
  static const int groups[3] = {32, 64, 128};
  int seen0 = 0, seen15 = 0;
  for (int k = 0; k < 3; k++) {
    for (int bf = 0; bf < 2; bf++) {
      int g = groups[k];
      for (int i = 0; i < cols; i++) x[i] = (float)trng_normal(&r) * (i < 64 ? 1e-3f : 1.0f);
      q4_quantize_row(x, cols, g, bf, q, s);
      wmat w = {.fmt = WMAT_Q4, .rows = 1, .cols = cols, .group = g, .scale_bf16 = bf, .data = q, .scales = s};
      wmat_get_row(&w, 0, y);
      for (int i = 0; i < cols; i++) {
        int nib = i & 1 ? q[i / 2] >> 4 : q[i / 2] & 15;
        seen0 |= nib == 0;
        seen15 |= nib == 15;
        float d = fabsf(bf ? bf16_to_f32(s[i / g]) : f16_to_f32(s[i / g]));
        /* rounding error <= d/2, except the clamp of +8d to 7 (<= d); plus scale rounding */
        CHECK(fabsf(x[i] - y[i]) <= d * 1.02f + 1e-12f, "q4 g%d bf%d col %d: %g vs %g (d %g)", g, bf, i, x[i], y[i], d);
      }
      /* the group extreme maps to nibble 0 */
      for (int g0 = 0; g0 < cols; g0 += g) {
        int am = g0;
        for (int i = g0; i < g0 + g; i++) if (fabsf(x[i]) > fabsf(x[am])) am = i;
        int nib = am & 1 ? q[am / 2] >> 4 : q[am / 2] & 15;
        CHECK(nib == 0, "group extreme at %d has nibble %d", am, nib);
      }
      q8_quantize_row(x, cols, g, bf, q8, s);
      wmat w8 = {.fmt = WMAT_Q8, .rows = 1, .cols = cols, .group = g, .scale_bf16 = bf, .data = q8, .scales = s};
      wmat_get_row(&w8, 0, y);
      for (int i = 0; i < cols; i++) {
        float d = fabsf(bf ? bf16_to_f32(s[i / g]) : f16_to_f32(s[i / g]));
        CHECK(fabsf(x[i] - y[i]) <= d * 0.5f * 1.02f + 1e-12f, "q8 col %d", i);
      }
    }
  }
  CHECK(seen0 && seen15, "nibble edges not exercised");
  /* an all-zero group decodes to exact zeros */
  memset(x, 0, sizeof x);
  q4_quantize_row(x, 32, 32, 0, q, s);
  wmat w = {.fmt = WMAT_Q4, .rows = 1, .cols = 32, .group = 32, .data = q, .scales = s};
  wmat_get_row(&w, 0, y);
  for (int i = 0; i < 32; i++) CHECK(y[i] == 0.0f, "zero group");
}

static void write_small(const char *dir) {
  g53_writer *w = g53_writer_open(dir);
  CHECK(w != NULL, "%s", glm53_last_error());
  float v[5] = {1, 2, 3, 4, 5};
  CHECK(g53_writer_add(w, "norm.weight", G53_F32, 1, (int64_t[]){5}, 0, 0, v, NULL) == 0, "add");
  uint8_t q[4 * 64 / 2];
  uint16_t s[8];
  for (size_t i = 0; i < sizeof q; i++) q[i] = (uint8_t)(i * 37);
  for (int i = 0; i < 8; i++) s[i] = f32_to_f16(0.01f * (i + 1));
  CHECK(g53_writer_add(w, "layers.0.mlp.gate_proj.weight", G53_Q4, 2, (int64_t[]){4, 64}, 32, 0, q, s) == 0, "add q4");
  CHECK(g53_writer_finish(w, "{\"model_type\":\"glm5_next\"}", "{\"bits\":4}") == 0, "%s", glm53_last_error());
}

static char *file_copy(const char *src, const char *dir, size_t *len) {
  char p[600];
  snprintf(p, sizeof p, "%s/%s", src, G53_FILE);
  char *d = read_file(p, len);
  mkdir(dir, 0755);
  return d;
}

static void put(const char *dir, const void *d, size_t n) {
  char p[600];
  snprintf(p, sizeof p, "%s/%s", dir, G53_FILE);
  FILE *f = fopen(p, "wb");
  fwrite(d, 1, n, f);
  fclose(f);
}

static void corruption(void) {
  char good[300], bad[300];
  snprintf(good, sizeof good, "%s/good", root);
  snprintf(bad, sizeof bad, "%s/bad", root);
  write_small(good);
  g53_file *f = g53_open(good);
  CHECK(f != NULL, "%s", glm53_last_error());
  if (f) {
    CHECK(g53_count(f) == 2 && g53_find(f, "norm.weight") && g53_find(f, "layers.0.mlp.gate_proj.weight"), "index");
    const g53_tensor *t = g53_find(f, "layers.0.mlp.gate_proj.weight");
    CHECK(t && t->offset % 64 == 0 && t->group == 32 && t->shape[1] == 64, "tensor entry");
    CHECK(!strcmp(g53_config_json(f), "{\"model_type\":\"glm5_next\"}"), "config text");
    CHECK(g53_verify(f, 0) == 0, "%s", glm53_last_error());
    g53_close(f);
  }
  size_t len;
  char *d = file_copy(good, bad, &len);
  /* truncated */
  put(bad, d, len - 100);
  f = g53_open(bad);
  CHECK(!f && strstr(glm53_last_error(), "truncated"), "truncated: %s", glm53_last_error());
  /* flipped byte inside a tensor: open passes (cheap checks), verify fails */
  d[64 + 3] ^= 0x40;
  put(bad, d, len);
  f = g53_open(bad);
  CHECK(f != NULL, "%s", glm53_last_error());
  if (f) {
    CHECK(g53_verify(f, 0) != 0 && strstr(glm53_last_error(), "checksum mismatch in tensor norm.weight"), "verify: %s", glm53_last_error());
    g53_close(f);
  }
  d[64 + 3] ^= 0x40;
  /* corrupted header (last bytes of the file are the JSON header) */
  d[len - 5] ^= 0x01;
  put(bad, d, len);
  f = g53_open(bad);
  CHECK(!f && strstr(glm53_last_error(), "header checksum"), "header: %s", glm53_last_error());
  d[len - 5] ^= 0x01;
  /* bad magic */
  d[0] = 'X';
  put(bad, d, len);
  f = g53_open(bad);
  CHECK(!f && strstr(glm53_last_error(), "bad magic"), "magic: %s", glm53_last_error());
  /* a model load reports it as one line */
  CHECK(glm53_model_load(bad, NULL) == NULL && strstr(glm53_last_error(), "bad magic"), "load: %s", glm53_last_error());
  free(d);
}

/* ---- FP8 ---- */
static float ref_e4m3(uint8_t v) {
  int s = v >> 7, e = (v >> 3) & 15, m = v & 7;
  if (e == 15 && m == 7) return NAN;
  float x = e ? ldexpf(1.0f + m / 8.0f, e - 7) : ldexpf(m / 8.0f, -6);
  return s ? -x : x;
}

typedef struct { const char *name, *dtype; int ndim; int64_t shape[3]; const void *data; size_t nbytes; } stw;

static void write_st(const char *path, const stw *t, int n) {
  char hdr[4096];
  size_t hl = 0, off = 0;
  hl += (size_t)sprintf(hdr, "{");
  for (int i = 0; i < n; i++) {
    hl += (size_t)sprintf(hdr + hl, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[", i ? "," : "", t[i].name, t[i].dtype);
    for (int d = 0; d < t[i].ndim; d++) hl += (size_t)sprintf(hdr + hl, "%s%lld", d ? "," : "", (long long)t[i].shape[d]);
    hl += (size_t)sprintf(hdr + hl, "],\"data_offsets\":[%zu,%zu]}", off, off + t[i].nbytes);
    off += t[i].nbytes;
  }
  hl += (size_t)sprintf(hdr + hl, "}");
  while (hl % 8) hdr[hl++] = ' ';
  FILE *f = fopen(path, "wb");
  uint64_t h = hl;
  fwrite(&h, 8, 1, f);
  fwrite(hdr, 1, hl, f);
  for (int i = 0; i < n; i++) fwrite(t[i].data, 1, t[i].nbytes, f);
  fclose(f);
}

static void fp8(void) {
  trng r = {9};
  const int R = 130, C = 200, E = 2, I = 70, D = 150; /* grids not multiples of 128 */
  uint8_t *w2 = xmalloc(R * C), *gu = xmalloc((size_t)E * 2 * I * D), *dn = xmalloc((size_t)E * D * I);
  for (int i = 0; i < R * C; i++) { w2[i] = (uint8_t)trng_u64(&r); if ((w2[i] & 0x7F) == 0x7F) w2[i] = 0x3C; }
  for (int i = 0; i < E * 2 * I * D; i++) { gu[i] = (uint8_t)trng_u64(&r); if ((gu[i] & 0x7F) == 0x7F) gu[i] = 0x21; }
  for (int i = 0; i < E * D * I; i++) { dn[i] = (uint8_t)trng_u64(&r); if ((dn[i] & 0x7F) == 0x7F) dn[i] = 0x11; }
  float s2[4] = {0.5f, 2.0f, 0.25f, 3.0f}, sgu[2 * 2 * 2], sdn[2 * 2 * 1], emb = 1;
  for (int i = 0; i < 8; i++) sgu[i] = 0.1f * (i + 1);
  for (int i = 0; i < 4; i++) sdn[i] = 0.3f * (i + 1);
  stw t[] = {
      {"model.embed_tokens.weight", "F32", 2, {1, 1}, &emb, 4},
      {"model.layers.0.w", "F8_E4M3", 2, {R, C}, w2, (size_t)R * C},
      {"model.layers.0.w_scale_inv", "F32", 2, {2, 2}, s2, sizeof s2},
      {"model.layers.0.mlp.experts.gate_up_proj", "F8_E4M3", 3, {E, 2 * I, D}, gu, (size_t)E * 2 * I * D},
      {"model.layers.0.mlp.experts.gate_up_proj_scale_inv", "F32", 3, {E, 2, 2}, sgu, sizeof sgu},
      {"model.layers.0.mlp.experts.down_proj", "F8_E4M3", 3, {E, D, I}, dn, (size_t)E * D * I},
      {"model.layers.0.mlp.experts.down_proj_scale_inv", "F32", 3, {E, 2, 1}, sdn, sizeof sdn},
  };
  char p[300];
  snprintf(p, sizeof p, "%s/fp8", root);
  mkdir(p, 0755);
  char fpath[400];
  snprintf(fpath, sizeof fpath, "%s/model.safetensors", p);
  write_st(fpath, t, 7);
  st_set *st = st_open(p);
  CHECK(st != NULL, "%s", glm53_last_error());
  float *out = xmalloc((size_t)R * C * 4);
  if (st && st_read_f32(st, "model.layers.0.w", 2, (int64_t[]){R, C}, out) == 0) {
    int bad = 0;
    for (int i = 0; i < R; i++)
      for (int j = 0; j < C; j++) bad += out[i * C + j] != ref_e4m3(w2[i * C + j]) * s2[(i / 128) * 2 + j / 128];
    CHECK(bad == 0, "2-D fp8 block dequant: %d mismatches", bad);
  } else CHECK(0, "st_read_f32: %s", glm53_last_error());
  st_close(st);
  hf_source *h = hf_source_open(p);
  CHECK(h != NULL, "%s", glm53_last_error());
  free(out);
  out = xmalloc((size_t)I * D * 4);
  for (int part = 0; part < 3 && h; part++) {
    int e = 1;
    bind_item it = {.alts = part == 0 ? "gate_proj.weight" : part == 1 ? "up_proj.weight" : "down_proj.weight", .ndim = 2,
                    .layer = 0, .expert = e, .part = part, .tier = TIER_EXPERT};
    snprintf(it.base, sizeof it.base, "layers.0.mlp.experts.%d.", e);
    it.shape[0] = part == 2 ? D : I;
    it.shape[1] = part == 2 ? I : D;
    if (hf_source_read(h, &it, out)) { CHECK(0, "fused read: %s", glm53_last_error()); continue; }
    int bad = 0;
    for (int i = 0; i < it.shape[0]; i++)
      for (int j = 0; j < it.shape[1]; j++) {
        float want;
        if (part < 2) {
          int rr = part * I + i; /* row in the expert's [2I][D] */
          want = ref_e4m3(gu[((size_t)e * 2 * I + rr) * D + j]) * sgu[e * 4 + (rr / 128) * 2 + j / 128];
        } else {
          want = ref_e4m3(dn[((size_t)e * D + i) * I + j]) * sdn[e * 2 + (i / 128)];
        }
        bad += out[i * it.shape[1] + j] != want;
      }
    CHECK(bad == 0, "fused fp8 expert part %d: %d mismatches", part, bad);
  }
  hf_source_close(h);
  free(out); free(w2); free(gu); free(dn);
}

int main(void) {
  if (!mkdtemp(root)) { perror("mkdtemp"); return 1; }
  decode_vectors();
  round_trips();
  corruption();
  fp8();
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
  CHECK(system(cmd) == 0, "cleanup");
  TEST_DONE();
}
