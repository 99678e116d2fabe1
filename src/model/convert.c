/* glm53 convert: the writer side of the shared binding walk (bind.h).
 * Precision policy per tensor is documented in docs/format.md. */
#include "model/convert.h"
#include "model/bind.h"
#include "core/err.h"
#include "core/util.h"
#include "format/g53.h"
#include "format/g53_quant.h"
#include <cjson/cJSON.h>
#include <fnmatch.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* below this many elements a tensor is converted on one thread (a parallel
 * region costs more than it saves, and much more on a busy machine) */
#define PAR_MIN (1 << 18)

typedef struct {
  const g53_convert_opts *o;
  hf_source *h;
  g53_writer *w;
  uint64_t total, done;  /* input elements */
  double t0, last;
  int n_fallback;        /* quantizable tensors stored bf16 because cols % group != 0 */
  uint64_t count_bytes[5];
  const char *src_dtype;
} conv_ctx;

static int matches(const char *pats, const char *name) {
  if (!pats || !*pats) return 0;
  char buf[512];
  const char *p = pats;
  while (*p) {
    size_t n = strcspn(p, ",");
    snprintf(buf, sizeof buf, "%.*s", (int)n, p);
    if (n && fnmatch(buf, name, 0) == 0) return 1;
    p += n + (p[n] == ',');
  }
  return 0;
}

/* The storage format of one tensor (docs/format.md, "Defaults"). */
static int choose(const conv_ctx *c, const bind_item *it) {
  if (it->vec || it->tier == TIER_FP32) return G53_F32;
  if (matches(c->o->keep_bf16, it->name)) return G53_BF16;
  int bits = it->tier == TIER_EMBED ? c->o->embed_bits : c->o->bits;
  int fmt = bits == 4 ? G53_Q4 : bits == 8 ? G53_Q8 : G53_BF16;
  if (fmt != G53_BF16 && it->shape[1] % c->o->group) fmt = G53_BF16;
  return fmt;
}

static void progress(conv_ctx *c, int final) {
  if (!c->o->progress) return;
  double now = now_sec();
  if (!final && now - c->last < 0.5) return;
  c->last = now;
  double f = c->total ? (double)c->done / c->total : 1, el = now - c->t0, eta = f > 0 ? el / f - el : 0;
  char bar[31];
  int k = (int)(f * 30);
  for (int i = 0; i < 30; i++) bar[i] = i < k ? '=' : ' ';
  bar[30] = 0;
  double unit = c->total >= 1e9 ? 1e9 : 1e6;
  fprintf(stderr, "\r[%s] %5.1f%%  %.2f/%.2f %s params  %4.0fs elapsed  ETA %4.0fs%s", bar, 100 * f, c->done / unit, c->total / unit,
          unit == 1e9 ? "G" : "M", el, final ? 0 : eta, final ? "\n" : "");
  fflush(stderr);
}

static int count_one(void *vctx, const bind_item *it) {
  conv_ctx *c = vctx;
  uint64_t n = 1;
  for (int i = 0; i < it->ndim; i++) n *= (uint64_t)it->shape[i];
  c->total += n;
  if (!c->src_dtype) c->src_dtype = hf_source_dtype(c->h, it);
  return 0;
}

static int convert_one(void *vctx, const bind_item *it) {
  conv_ctx *c = vctx;
  int64_t n = 1;
  for (int i = 0; i < it->ndim; i++) n *= it->shape[i];
  float *buf = aligned_alloc64((size_t)n * sizeof(float));
  if (hf_source_read(c->h, it, buf)) { free(buf); return -1; }
  int bad = 0;
#pragma omp parallel for reduction(|| : bad) schedule(static) if (n > PAR_MIN)
  for (int64_t i = 0; i < n; i++) bad = bad || !isfinite(buf[i]);
  if (bad) { free(buf); return glm53_err("tensor %s: contains NaN or Inf; refusing to convert", it->name); }
  int fmt = choose(c, it);
  if (fmt == G53_BF16 && !it->vec && it->tier != TIER_FP32 && !matches(c->o->keep_bf16, it->name) &&
      (it->tier == TIER_EMBED ? c->o->embed_bits : c->o->bits) != 16)
    c->n_fallback++;
  int64_t cols = it->shape[it->ndim - 1], rows = n / cols;
  int group = c->o->group, rc;
  uint64_t vb, so, total;
  g53_blob_layout(fmt, rows, cols, group, &vb, &so, &total);
  if (fmt == G53_F32) {
    rc = g53_writer_add(c->w, it->name, fmt, it->ndim, it->shape, 0, 0, buf, NULL);
  } else if (fmt == G53_BF16) {
    uint16_t *q = xmalloc((size_t)n * 2);
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
    for (int64_t i = 0; i < n; i++) q[i] = f32_to_bf16(buf[i]);
    rc = g53_writer_add(c->w, it->name, fmt, it->ndim, it->shape, 0, 0, q, NULL);
    free(q);
  } else {
    uint8_t *q = xmalloc(vb);
    uint16_t *s = xmalloc((size_t)(n / group) * 2);
    const int sb = c->o->scale_bf16;
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
      if (fmt == G53_Q4) q4_quantize_row(buf + r * cols, (int)cols, group, sb, q + r * cols / 2, s + r * (cols / group));
      else q8_quantize_row(buf + r * cols, (int)cols, group, sb, (int8_t *)q + r * cols, s + r * (cols / group));
    }
    rc = g53_writer_add(c->w, it->name, fmt, it->ndim, it->shape, group, sb, q, s);
    free(q);
    free(s);
  }
  free(buf);
  c->count_bytes[fmt] += total;
  c->done += (uint64_t)n;
  progress(c, 0);
  return rc;
}

/* tokenizer/config files copied next to model.g53 (missing ones skipped) */
static const char *const side_files[] = {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                                         "generation_config.json", "special_tokens_map.json", "config.json", NULL};

static int copy_side_files(const char *in, const char *out, cJSON *list) {
  char src[4096], dst[4096];
  for (const char *const *f = side_files; *f; f++) {
    snprintf(src, sizeof src, "%s/%s", in, *f);
    FILE *t = fopen(src, "rb");
    if (!t) continue;
    fclose(t);
    size_t len;
    char *data = read_file(src, &len);
    if (!data) return -1;
    snprintf(dst, sizeof dst, "%s/%s", out, *f);
    int rc = write_file_atomic(dst, data, len);
    free(data);
    if (rc) return -1;
    cJSON_AddItemToArray(list, cJSON_CreateString(*f));
  }
  return 0;
}

int g53_convert(const g53_convert_opts *o) {
  if (o->bits != 4 && o->bits != 8 && o->bits != 16) return glm53_err("convert: --bits must be 4, 8 or 16");
  if (o->group != 32 && o->group != 64 && o->group != 128) return glm53_err("convert: --group must be 32, 64 or 128");
  if (o->embed_bits != 8 && o->embed_bits != 16) return glm53_err("convert: embedding bits must be 8 or 16");
  char cpath[4096];
  snprintf(cpath, sizeof cpath, "%s/config.json", o->in);
  size_t clen;
  char *cfg_text = read_file(cpath, &clen);
  if (!cfg_text) return -1;
  glm53_model m;
  memset(&m, 0, sizeof m);
  if (glm53_config_parse(cfg_text, &m.cfg) || glm53_config_validate(&m.cfg)) { free(cfg_text); return glm53_err_ctx("%s", cpath); }
  conv_ctx c = {.o = o};
  c.h = hf_source_open(o->in);
  if (!c.h) { free(cfg_text); return -1; }
  int rc = model_walk(&m, count_one, &c);
  if (!rc) {
    c.w = g53_writer_open(o->out);
    if (!c.w) rc = -1;
  }
  cJSON *meta = cJSON_CreateObject(), *files = cJSON_CreateArray();
  if (!rc) {
    c.t0 = c.last = now_sec();
    rc = model_walk(&m, convert_one, &c);
    progress(&c, 1);
  }
  if (!rc) rc = copy_side_files(o->in, o->out, files);
  if (!rc) {
    cJSON_AddNumberToObject(meta, "bits", o->bits);
    cJSON_AddNumberToObject(meta, "group", o->group);
    cJSON_AddStringToObject(meta, "scale", o->scale_bf16 ? "bf16" : "f16");
    cJSON_AddNumberToObject(meta, "embed_bits", o->embed_bits);
    cJSON_AddStringToObject(meta, "keep_bf16", o->keep_bf16 ? o->keep_bf16 : "");
    cJSON_AddStringToObject(meta, "source", o->in);
    cJSON_AddStringToObject(meta, "source_dtype", c.src_dtype ? c.src_dtype : "?");
    cJSON_AddNumberToObject(meta, "bf16_fallbacks", c.n_fallback);
    cJSON_AddItemToObject(meta, "files", files);
    files = NULL;
    char *mt = cJSON_PrintUnformatted(meta);
    rc = g53_writer_finish(c.w, cfg_text, mt);
    c.w = NULL;
    free(mt);
  }
  cJSON_Delete(meta);
  cJSON_Delete(files);
  if (c.w) g53_writer_abort(c.w);
  hf_source_close(c.h);
  model_free_weights(&m);
  free(cfg_text);
  if (rc) return glm53_err_ctx("convert %s", o->in);
  if (o->progress)
    fprintf(stderr, "wrote %s/%s: f32 %.1f MB, bf16 %.1f MB, q8 %.1f MB, q4 %.1f MB%s\n", o->out, G53_FILE, c.count_bytes[G53_F32] / 1e6,
            c.count_bytes[G53_BF16] / 1e6, c.count_bytes[G53_Q8] / 1e6, c.count_bytes[G53_Q4] / 1e6,
            c.n_fallback ? " (some matrices kept bf16: columns not a multiple of the group)" : "");
  if (o->verify) {
    g53_file *f = g53_open(o->out);
    if (!f) return -1;
    rc = g53_verify(f, o->progress);
    g53_close(f);
  }
  return rc;
}
