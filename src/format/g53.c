/* .g53 reader (mmap, validated header, name index) and streaming writer
 * (sequential tensor blobs, header at the end, preamble patched last,
 * fsync + rename). Layout in docs/format.md. */
#include "format/g53.h"
#include "core/err.h"
#include "core/util.h"
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#define PREAMBLE 64

struct g53_file {
  char *dir, *path;
  int fd;
  const uint8_t *map;
  uint64_t size;
  int n;
  g53_tensor *t;
  int *hash; /* open addressing, size hcap, -1 empty */
  int hcap;
  char *config, *meta;
};

static uint64_t rd64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static uint32_t rd32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static uint32_t hname(const char *s) { uint32_t h = 2166136261u; while (*s) h = (h ^ (uint8_t)*s++) * 16777619u; return h; }

const char *g53_dtype_name(int d) {
  switch (d) {
  case G53_F32: return "f32";
  case G53_BF16: return "bf16";
  case G53_Q8: return "q8";
  case G53_Q4: return "q4";
  default: return "?";
  }
}
static int dtype_from(const char *s) {
  for (int d = G53_F32; d <= G53_Q4; d++) if (!strcmp(s, g53_dtype_name(d))) return d;
  return 0;
}

void g53_blob_layout(int dtype, int64_t rows, int64_t cols, int group, uint64_t *vbytes, uint64_t *scale_off, uint64_t *total) {
  uint64_t n = (uint64_t)rows * (uint64_t)cols, v = 0, s = 0;
  switch (dtype) {
  case G53_F32: v = n * 4; break;
  case G53_BF16: v = n * 2; break;
  case G53_Q8: v = n; s = n / (uint64_t)group * 2; break;
  case G53_Q4: v = n / 2; s = n / (uint64_t)group * 2; break;
  }
  uint64_t so = s ? (v + 63) & ~(uint64_t)63 : v;
  *vbytes = v;
  *scale_off = so;
  *total = so + s;
}

int g53_is_g53(const char *path) {
  struct stat sb;
  if (stat(path, &sb) != 0) return 0;
  if (S_ISREG(sb.st_mode)) {
    size_t n = strlen(path);
    return n >= 4 && !strcmp(path + n - 4, ".g53");
  }
  char p[4096];
  snprintf(p, sizeof p, "%s/%s", path, G53_FILE);
  return access(p, R_OK) == 0;
}

void g53_close(g53_file *f) {
  if (!f) return;
  if (f->map) munmap((void *)f->map, f->size);
  if (f->fd >= 0) close(f->fd);
  for (int i = 0; i < f->n; i++) free(f->t[i].name);
  free(f->t); free(f->hash); free(f->dir); free(f->path); free(f->config); free(f->meta);
  free(f);
}

static int fail(g53_file *f, int rc) { (void)rc; g53_close(f); return -1; }

static int parse_tensor(g53_file *f, const cJSON *o, g53_tensor *t, uint64_t data_end) {
  const cJSON *nm = cJSON_GetObjectItemCaseSensitive(o, "name"), *dt = cJSON_GetObjectItemCaseSensitive(o, "dtype"),
              *sh = cJSON_GetObjectItemCaseSensitive(o, "shape"), *off = cJSON_GetObjectItemCaseSensitive(o, "offset"),
              *nb = cJSON_GetObjectItemCaseSensitive(o, "nbytes"), *xx = cJSON_GetObjectItemCaseSensitive(o, "xxh64");
  if (!cJSON_IsString(nm) || !cJSON_IsString(dt) || !cJSON_IsArray(sh) || !cJSON_IsNumber(off) || !cJSON_IsNumber(nb) ||
      !cJSON_IsString(xx))
    return glm53_err("bad tensor entry in header (needs name, dtype, shape, offset, nbytes, xxh64)");
  t->name = xstrdup(nm->valuestring);
  t->dtype = dtype_from(dt->valuestring);
  if (!t->dtype) return glm53_err("tensor %s: unknown dtype '%s'", t->name, dt->valuestring);
  t->ndim = cJSON_GetArraySize(sh);
  if (t->ndim < 1 || t->ndim > 4) return glm53_err("tensor %s: bad shape", t->name);
  int i = 0;
  int64_t numel = 1;
  for (const cJSON *d = sh->child; d; d = d->next, i++) {
    if (!cJSON_IsNumber(d) || d->valuedouble < 0) return glm53_err("tensor %s: bad shape", t->name);
    t->shape[i] = (int64_t)d->valuedouble;
    numel *= t->shape[i];
  }
  int64_t cols = t->shape[t->ndim - 1], rows = numel / (cols ? cols : 1);
  if (t->dtype == G53_Q4 || t->dtype == G53_Q8) {
    const cJSON *g = cJSON_GetObjectItemCaseSensitive(o, "group"), *sc = cJSON_GetObjectItemCaseSensitive(o, "scale");
    if (!cJSON_IsNumber(g) || !cJSON_IsString(sc)) return glm53_err("tensor %s: quantized tensor needs group and scale", t->name);
    t->group = g->valueint;
    t->scale_bf16 = !strcmp(sc->valuestring, "bf16");
    if (t->group <= 0 || cols % t->group || (t->dtype == G53_Q4 && t->group % 2))
      return glm53_err("tensor %s: group %d does not divide %lld columns", t->name, t->group, (long long)cols);
  }
  uint64_t vb, so, total;
  g53_blob_layout(t->dtype, rows, cols, t->group ? t->group : 1, &vb, &so, &total);
  t->offset = (uint64_t)off->valuedouble;
  t->nbytes = (uint64_t)nb->valuedouble;
  t->scale_off = so;
  if (t->nbytes != total) return glm53_err("tensor %s: nbytes %" PRIu64 " does not match its shape (%" PRIu64 ")", t->name, t->nbytes, total);
  if (t->offset % 64 || t->offset < PREAMBLE || t->offset + t->nbytes > data_end)
    return glm53_err("tensor %s: data [%" PRIu64 ", +%" PRIu64 ") outside the file's data area", t->name, t->offset, t->nbytes);
  t->xxh = strtoull(xx->valuestring, NULL, 16);
  t->data = f->map + t->offset;
  return 0;
}

g53_file *g53_open(const char *path) {
  g53_file *f = xcalloc(1, sizeof *f);
  f->fd = -1;
  struct stat sb;
  char p[4096];
  if (stat(path, &sb) != 0) { glm53_err("%s: %s", path, strerror(errno)); fail(f, 0); return NULL; }
  if (S_ISDIR(sb.st_mode)) {
    snprintf(p, sizeof p, "%s/%s", path, G53_FILE);
    f->dir = xstrdup(path);
  } else {
    snprintf(p, sizeof p, "%s", path);
    char *d = xstrdup(path), *sl = strrchr(d, '/');
    if (sl) *sl = 0; else { free(d); d = xstrdup("."); }
    f->dir = d;
  }
  f->path = xstrdup(p);
  f->fd = open(p, O_RDONLY);
  if (f->fd < 0 || fstat(f->fd, &sb) != 0) { glm53_err("%s: %s", p, strerror(errno)); fail(f, 0); return NULL; }
  f->size = (uint64_t)sb.st_size;
  if (f->size < PREAMBLE) { glm53_err("%s: truncated (%" PRIu64 " bytes, not a .g53 file)", p, f->size); fail(f, 0); return NULL; }
  f->map = mmap(NULL, f->size, PROT_READ, MAP_SHARED, f->fd, 0);
  if (f->map == MAP_FAILED) { f->map = NULL; glm53_err("%s: mmap: %s", p, strerror(errno)); fail(f, 0); return NULL; }
  const uint8_t *m = f->map;
  if (memcmp(m, G53_MAGIC, 8)) { glm53_err("%s: bad magic (not a .g53 file)", p); fail(f, 0); return NULL; }
  if (rd32(m + 8) != G53_VERSION) { glm53_err("%s: format version %u, this build reads %d", p, rd32(m + 8), G53_VERSION); fail(f, 0); return NULL; }
  uint64_t hoff = rd64(m + 16), hlen = rd64(m + 24), hxx = rd64(m + 32), fsz = rd64(m + 40);
  if (fsz != f->size) {
    glm53_err("%s: file is %" PRIu64 " bytes but the header says %" PRIu64 " (truncated or incomplete copy)", p, f->size, fsz);
    fail(f, 0);
    return NULL;
  }
  if (hoff < PREAMBLE || hlen == 0 || hoff + hlen > f->size) { glm53_err("%s: header location out of range (corrupted preamble)", p); fail(f, 0); return NULL; }
  if (XXH64(m + hoff, hlen, 0) != hxx) { glm53_err("%s: header checksum mismatch (corrupted header)", p); fail(f, 0); return NULL; }
  cJSON *root = cJSON_ParseWithLength((const char *)m + hoff, hlen);
  if (!root) { glm53_err("%s: header is not valid JSON", p); fail(f, 0); return NULL; }
  const cJSON *cfg = cJSON_GetObjectItemCaseSensitive(root, "config_json"), *ts = cJSON_GetObjectItemCaseSensitive(root, "tensors"),
              *meta = cJSON_GetObjectItemCaseSensitive(root, "convert");
  if (!cJSON_IsString(cfg) || !cJSON_IsArray(ts)) {
    cJSON_Delete(root);
    glm53_err("%s: header lacks config_json or tensors", p);
    fail(f, 0);
    return NULL;
  }
  f->config = xstrdup(cfg->valuestring);
  f->meta = meta ? cJSON_PrintUnformatted(meta) : xstrdup("{}");
  f->n = cJSON_GetArraySize(ts);
  f->t = xcalloc((size_t)(f->n ? f->n : 1), sizeof(g53_tensor));
  int i = 0;
  for (const cJSON *o = ts->child; o; o = o->next, i++) {
    if (parse_tensor(f, o, &f->t[i], hoff)) {
      glm53_err_ctx("%s", p);
      f->n = i + 1;
      cJSON_Delete(root);
      fail(f, 0);
      return NULL;
    }
  }
  cJSON_Delete(root);
  f->hcap = 16;
  while (f->hcap < 2 * f->n) f->hcap *= 2;
  f->hash = xmalloc((size_t)f->hcap * sizeof(int));
  for (int k = 0; k < f->hcap; k++) f->hash[k] = -1;
  for (int k = 0; k < f->n; k++) {
    uint32_t h = hname(f->t[k].name) & (uint32_t)(f->hcap - 1);
    while (f->hash[h] >= 0) {
      if (!strcmp(f->t[f->hash[h]].name, f->t[k].name)) { glm53_err("%s: duplicate tensor %s", p, f->t[k].name); fail(f, 0); return NULL; }
      h = (h + 1) & (uint32_t)(f->hcap - 1);
    }
    f->hash[h] = k;
  }
  return f;
}

int g53_count(const g53_file *f) { return f->n; }
const g53_tensor *g53_at(const g53_file *f, int i) { return &f->t[i]; }
const char *g53_config_json(const g53_file *f) { return f->config; }
const char *g53_dir(const g53_file *f) { return f->dir; }
const char *g53_meta_json(const g53_file *f) { return f->meta; }
uint64_t g53_file_size(const g53_file *f) { return f->size; }

const g53_tensor *g53_find(const g53_file *f, const char *name) {
  uint32_t h = hname(name) & (uint32_t)(f->hcap - 1);
  while (f->hash[h] >= 0) {
    if (!strcmp(f->t[f->hash[h]].name, name)) return &f->t[f->hash[h]];
    h = (h + 1) & (uint32_t)(f->hcap - 1);
  }
  return NULL;
}

int g53_verify(const g53_file *f, int show_progress) {
  int bad = -1;
  double t0 = now_sec();
#pragma omp parallel for schedule(dynamic)
  for (int i = 0; i < f->n; i++) {
    if (XXH64(f->t[i].data, f->t[i].nbytes, 0) != f->t[i].xxh) {
#pragma omp critical
      if (bad < 0 || i < bad) bad = i;
    }
  }
  if (show_progress) fprintf(stderr, "verified %d tensors (%.2f GB) in %.1f s\n", f->n, f->size / 1e9, now_sec() - t0);
  if (bad >= 0) return glm53_err("%s: checksum mismatch in tensor %s (corrupted file)", f->path, f->t[bad].name);
  return 0;
}

/* ---- writer ---- */

struct g53_writer {
  char *dir, *tmp, *final;
  FILE *fp;
  uint64_t pos;
  cJSON *tensors;
};

static int wr(g53_writer *w, const void *p, size_t n) {
  if (n && fwrite(p, 1, n, w->fp) != n) return glm53_err("write %s: %s", w->tmp, strerror(errno));
  w->pos += n;
  return 0;
}
static int pad64(g53_writer *w) {
  static const uint8_t z[64];
  return wr(w, z, (size_t)((64 - w->pos % 64) % 64));
}

g53_writer *g53_writer_open(const char *dir) {
  if (mkdir(dir, 0755) != 0 && errno != EEXIST) { glm53_err("cannot create %s: %s", dir, strerror(errno)); return NULL; }
  g53_writer *w = xcalloc(1, sizeof *w);
  w->dir = xstrdup(dir);
  size_t n = strlen(dir) + 64;
  w->final = xmalloc(n);
  w->tmp = xmalloc(n);
  snprintf(w->final, n, "%s/%s", dir, G53_FILE);
  snprintf(w->tmp, n, "%s/%s.tmp.%d", dir, G53_FILE, (int)getpid());
  w->fp = fopen(w->tmp, "wb");
  if (!w->fp) { glm53_err("cannot create %s: %s", w->tmp, strerror(errno)); free(w->dir); free(w->final); free(w->tmp); free(w); return NULL; }
  uint8_t pre[PREAMBLE] = {0}; /* patched by finish */
  wr(w, pre, sizeof pre);
  w->tensors = cJSON_CreateArray();
  return w;
}

int g53_writer_add(g53_writer *w, const char *name, int dtype, int ndim, const int64_t *shape, int group, int scale_bf16,
                   const void *values, const void *scales) {
  int64_t numel = 1;
  for (int i = 0; i < ndim; i++) numel *= shape[i];
  int64_t cols = shape[ndim - 1], rows = cols ? numel / cols : 0;
  uint64_t vb, so, total;
  g53_blob_layout(dtype, rows, cols, group, &vb, &so, &total);
  if (pad64(w)) return -1;
  uint64_t off = w->pos;
  XXH64_state_t *st = XXH64_createState();
  XXH64_reset(st, 0);
  XXH64_update(st, values, vb);
  int rc = wr(w, values, vb);
  if (so > vb) {
    static const uint8_t z[64];
    XXH64_update(st, z, so - vb);
    rc = rc ? rc : wr(w, z, so - vb);
  }
  if (total > so) {
    XXH64_update(st, scales, total - so);
    rc = rc ? rc : wr(w, scales, total - so);
  }
  uint64_t h = XXH64_digest(st);
  XXH64_freeState(st);
  if (rc) return -1;
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "name", name);
  cJSON_AddStringToObject(o, "dtype", g53_dtype_name(dtype));
  cJSON *sh = cJSON_AddArrayToObject(o, "shape");
  for (int i = 0; i < ndim; i++) cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)shape[i]));
  if (dtype == G53_Q4 || dtype == G53_Q8) {
    cJSON_AddNumberToObject(o, "group", group);
    cJSON_AddStringToObject(o, "scale", scale_bf16 ? "bf16" : "f16");
  }
  cJSON_AddNumberToObject(o, "offset", (double)off);
  cJSON_AddNumberToObject(o, "nbytes", (double)total);
  char hx[20];
  snprintf(hx, sizeof hx, "%016" PRIx64, h);
  cJSON_AddStringToObject(o, "xxh64", hx);
  cJSON_AddItemToArray(w->tensors, o);
  return 0;
}

void g53_writer_abort(g53_writer *w) {
  if (!w) return;
  if (w->fp) fclose(w->fp);
  unlink(w->tmp);
  cJSON_Delete(w->tensors);
  free(w->dir); free(w->tmp); free(w->final);
  free(w);
}

int g53_writer_finish(g53_writer *w, const char *config_json, const char *meta_json) {
  cJSON *root = cJSON_CreateObject();
  cJSON_AddStringToObject(root, "format", "g53");
  cJSON_AddNumberToObject(root, "version", G53_VERSION);
  cJSON_AddStringToObject(root, "config_json", config_json);
  cJSON *meta = meta_json ? cJSON_Parse(meta_json) : NULL;
  cJSON_AddItemToObject(root, "convert", meta ? meta : cJSON_CreateObject());
  cJSON_AddItemToObject(root, "tensors", w->tensors);
  w->tensors = NULL;
  char *txt = cJSON_PrintUnformatted(root);
  cJSON_Delete(root);
  size_t hlen = strlen(txt);
  int rc = pad64(w);
  uint64_t hoff = w->pos;
  rc = rc ? rc : wr(w, txt, hlen);
  uint8_t pre[PREAMBLE] = {0};
  memcpy(pre, G53_MAGIC, 8);
  uint32_t ver = G53_VERSION;
  uint64_t hx = XXH64(txt, hlen, 0), fsz = w->pos;
  memcpy(pre + 8, &ver, 4);
  memcpy(pre + 16, &hoff, 8);
  memcpy(pre + 24, &hlen, 8);
  memcpy(pre + 32, &hx, 8);
  memcpy(pre + 40, &fsz, 8);
  free(txt);
  if (!rc && (fseek(w->fp, 0, SEEK_SET) != 0 || fwrite(pre, 1, PREAMBLE, w->fp) != PREAMBLE || fflush(w->fp) != 0))
    rc = glm53_err("write %s: %s", w->tmp, strerror(errno));
  if (!rc && fsync(fileno(w->fp)) != 0) rc = glm53_err("fsync %s: %s", w->tmp, strerror(errno));
  if (fclose(w->fp) != 0 && !rc) rc = glm53_err("close %s: %s", w->tmp, strerror(errno));
  w->fp = NULL;
  if (!rc && rename(w->tmp, w->final) != 0) rc = glm53_err("rename to %s: %s", w->final, strerror(errno));
  if (rc) unlink(w->tmp);
  free(w->dir); free(w->tmp); free(w->final);
  free(w);
  return rc;
}
