/* Hugging Face checkpoint source: resolves each bind_item (bind.c) to
 * safetensors data. Accepts both name layouts:
 *  - release checkpoints: hc_attn_fn, self_attn.f_a_proj, q/k/v_conv1d,
 *    per-expert mlp.experts.N.{gate,up,down}_proj.weight;
 *  - transformers 5 save format: attn_hc.fn, self_attn.forget_gate.*, fused
 *    conv1d [3*inner,1,K], fused 3-D mlp.experts.gate_up_proj [E][2I][D]
 *    (gate rows first) / down_proj [E][D][I].
 * The text-tower prefix (model.language_model., model., ...) is taken from
 * the embedding tensor's name. Fused experts are read one expert slice at a
 * time so the converter never holds a whole fused tensor. */
#include "model/bind.h"
#include "core/err.h"
#include "core/util.h"
#include "format/safetensors.h"
#include <stdio.h>
#include <stdlib.h>

struct hf_source {
  st_set *st;
  char prefix[64];
};

void hf_source_close(hf_source *h) {
  if (!h) return;
  st_close(h->st);
  free(h);
}

hf_source *hf_source_open(const char *dir) {
  hf_source *h = xcalloc(1, sizeof *h);
  h->st = st_open(dir);
  if (!h->st) { free(h); return NULL; }
  static const char *cands[] = {"model.language_model.", "model.", "language_model.model.", "language_model.", ""};
  for (size_t i = 0; i < sizeof cands / sizeof *cands; i++) {
    char name[256];
    snprintf(name, sizeof name, "%sembed_tokens.weight", cands[i]);
    if (st_find(h->st, name)) {
      snprintf(h->prefix, sizeof h->prefix, "%s", cands[i]);
      return h;
    }
  }
  hf_source_close(h);
  glm53_err("checkpoint: no embed_tokens.weight tensor (is this a GLM-5.3 text checkpoint?)");
  return NULL;
}

/* First existing alias of it (full name in out), or NULL with out = canonical. */
static const st_tensor *find_item(hf_source *h, const bind_item *it, char *out, size_t cap) {
  const char *p = it->alts, *pre = it->root ? "" : h->prefix;
  char first[512] = "";
  while (*p) {
    size_t n = strcspn(p, "|");
    snprintf(out, cap, "%s%s%.*s", pre, it->base, (int)n, p);
    if (!first[0]) snprintf(first, sizeof first, "%s", out);
    const st_tensor *t = st_find(h->st, out);
    if (t) return t;
    p += n + (p[n] == '|');
  }
  snprintf(out, cap, "%s", first);
  return NULL;
}

static void fused_name(hf_source *h, const bind_item *it, char *out, size_t cap) {
  snprintf(out, cap, "%slayers.%d.mlp.experts.%s", h->prefix, it->layer, it->part == 2 ? "down_proj" : "gate_up_proj");
}

static int64_t infer_block(int64_t n, int64_t g) {
  if (g <= 0) return 0;
  if ((n + 127) / 128 == g) return 128;
  int64_t b = (n + g - 1) / g;
  return (n + b - 1) / b == g ? b : 0;
}

static float plain_at(int dtype, const void *base, int64_t i) {
  switch (dtype) {
  case ST_F32: { float v; memcpy(&v, (const char *)base + 4 * i, 4); return v; }
  case ST_BF16: { uint16_t v; memcpy(&v, (const char *)base + 2 * i, 2); return bf16_to_f32(v); }
  case ST_F16: { uint16_t v; memcpy(&v, (const char *)base + 2 * i, 2); return f16_to_f32(v); }
  default: return 0;
  }
}

/* Expert e's gate/up/down slice of a fused 3-D tensor. */
static int read_fused(hf_source *h, const bind_item *it, float *out) {
  char name[512];
  fused_name(h, it, name, sizeof name);
  const st_tensor *t = st_find(h->st, name);
  int64_t R = it->shape[0], C = it->shape[1]; /* slice rows/cols */
  int64_t er = it->part == 2 ? R : 2 * R;     /* rows per expert in the fused tensor */
  if (t->ndim != 3 || t->shape[1] != er || t->shape[2] != C)
    return glm53_err("tensor \"%s\": shape [%lld, %lld, %lld] does not fit [E, %lld, %lld]", name, (long long)t->shape[0],
                     (long long)t->shape[1], (long long)t->shape[2], (long long)er, (long long)C);
  if (it->expert >= t->shape[0]) return glm53_err("tensor \"%s\": has %lld experts, config needs %d", name, (long long)t->shape[0], it->expert + 1);
  int64_t r0 = it->part == 1 ? R : 0;
  int64_t base = ((int64_t)it->expert * er + r0) * C;
  if (t->dtype == ST_F32 || t->dtype == ST_BF16 || t->dtype == ST_F16) {
#pragma omp parallel for schedule(static) if (R * C > 65536)
    for (int64_t i = 0; i < R * C; i++) out[i] = plain_at(t->dtype, t->data, base + i);
    return 0;
  }
  if (t->dtype != ST_F8_E4M3) return glm53_err("tensor \"%s\": dtype %s cannot be read as fp32", name, st_dtype_name(t->dtype));
  char sname[540];
  snprintf(sname, sizeof sname, "%s_scale_inv", name);
  const st_tensor *sc = st_find(h->st, sname);
  if (!sc || sc->ndim != 3 || sc->shape[0] != t->shape[0] || (sc->dtype != ST_F32 && sc->dtype != ST_BF16 && sc->dtype != ST_F16))
    return glm53_err("tensor \"%s\" is F8_E4M3 but has no 3-D float scale \"%s\"", name, sname);
  int64_t gr = sc->shape[1], gc = sc->shape[2], br = infer_block(er, gr), bc = infer_block(C, gc);
  if (!br || !bc) return glm53_err("tensor \"%s\": scale grid does not fit the weight", name);
  const uint8_t *q = (const uint8_t *)t->data;
  float lut[256];
  for (int i = 0; i < 256; i++) lut[i] = fp8e4m3_to_f32((uint8_t)i);
  int64_t sb = (int64_t)it->expert * gr * gc;
#pragma omp parallel for schedule(static) if (R * C > 65536)
  for (int64_t i = 0; i < R; i++)
    for (int64_t j = 0; j < C; j++)
      out[i * C + j] = lut[q[base + i * C + j]] * plain_at(sc->dtype, sc->data, sb + ((r0 + i) / br) * gc + j / bc);
  return 0;
}

int hf_source_read(hf_source *h, const bind_item *it, float *out) {
  char name[512];
  if (find_item(h, it, name, sizeof name)) return st_read_f32(h->st, name, it->ndim, it->shape, out);
  if (it->expert >= 0) {
    char fname[512];
    fused_name(h, it, fname, sizeof fname);
    if (st_find(h->st, fname)) return read_fused(h, it, out);
  }
  if (it->conv) { /* release layout: separate q/k/v convs [inner,1,K] */
    static const char *parts[3] = {"self_attn.q_conv1d.weight", "self_attn.k_conv1d.weight", "self_attn.v_conv1d.weight"};
    int64_t inner = it->shape[0] / 3, K = it->shape[2];
    for (int i = 0; i < 3; i++) {
      bind_item p = *it;
      p.alts = parts[i];
      p.shape[0] = inner;
      p.conv = 0;
      if (!find_item(h, &p, name, sizeof name)) return glm53_err("checkpoint: missing tensor '%s' (nor fused %s%s%s)", name, h->prefix, it->base, it->alts);
      if (st_read_f32(h->st, name, 3, p.shape, out + i * inner * K)) return -1;
    }
    return 0;
  }
  return glm53_err("checkpoint: missing tensor '%s'", name);
}

const char *hf_source_dtype(hf_source *h, const bind_item *it) {
  char name[512];
  const st_tensor *t = find_item(h, it, name, sizeof name);
  if (!t && it->expert >= 0) {
    fused_name(h, it, name, sizeof name);
    t = st_find(h->st, name);
  }
  if (!t && it->conv) {
    bind_item p = *it;
    p.alts = "self_attn.q_conv1d.weight";
    t = find_item(h, &p, name, sizeof name);
  }
  return t ? st_dtype_name(t->dtype) : "?";
}

/* ---- binding an HF checkpoint as fp32 ---- */

typedef struct {
  hf_source *h;
  size_t bytes;
} hf_bind_ctx;

static int bind_one(void *vctx, const bind_item *it) {
  hf_bind_ctx *c = vctx;
  int64_t n = 1;
  for (int i = 0; i < it->ndim; i++) n *= it->shape[i];
  float *buf = aligned_alloc64((size_t)n * sizeof(float));
  if (hf_source_read(c->h, it, buf)) { free(buf); return -1; }
  c->bytes += (size_t)n * sizeof(float);
  if (it->vec) { *it->vec = buf; return 0; }
  wmat *w = it->mat;
  w->fmt = WMAT_F32;
  w->rows = (int)it->shape[0];
  w->cols = (int)it->shape[1];
  w->data = buf;
  w->owned = buf;
  return 0;
}

int model_bind_safetensors(glm53_model *m, const char *dir) {
  hf_bind_ctx c = {0};
  c.h = hf_source_open(dir);
  if (!c.h) return -1;
  int rc = model_walk(m, bind_one, &c);
  hf_source_close(c.h); /* every tensor was copied to fp32 */
  model_tie_lm_head(m);
  m->weight_bytes = c.bytes;
  return rc;
}
