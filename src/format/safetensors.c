/* safetensors reader: mmap each shard, validate its JSON header (cJSON) into
 * st_tensor records, index all names in one hash table. */
#include "format/safetensors.h"
#include "core/err.h"
#include "core/util.h"
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Headers beyond this are certainly corrupt (real ones are a few MB). */
#define ST_MAX_HEADER ((uint64_t)512 << 20)

typedef struct {
  char *path;
  void *map;
  size_t size;
} st_shard;

struct st_set {
  st_shard *shards;
  int n_shards;
  st_tensor *t;
  int n, cap;
  int *hash;        /* open addressing: tensor index or -1 */
  size_t hash_cap;  /* power of two */
};

static const struct { const char *name; size_t size; } k_dtypes[] = {
    [ST_F32] = {"F32", 4},    [ST_F16] = {"F16", 2},    [ST_BF16] = {"BF16", 2},
    [ST_F8_E4M3] = {"F8_E4M3", 1}, [ST_I8] = {"I8", 1}, [ST_U8] = {"U8", 1},
    [ST_I32] = {"I32", 4},    [ST_I64] = {"I64", 8},    [ST_F64] = {"F64", 8},
    [ST_BOOL] = {"BOOL", 1},
};
#define N_DTYPES ((int)(sizeof k_dtypes / sizeof k_dtypes[0]))

const char *st_dtype_name(int dtype) {
  return dtype >= 0 && dtype < N_DTYPES ? k_dtypes[dtype].name : "?";
}
size_t st_dtype_size(int dtype) { return dtype >= 0 && dtype < N_DTYPES ? k_dtypes[dtype].size : 0; }

int64_t st_numel(const st_tensor *t) {
  int64_t n = 1;
  for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
  return n;
}

int st_count(const st_set *s) { return s ? s->n : 0; }
const st_tensor *st_at(const st_set *s, int i) { return s && i >= 0 && i < s->n ? &s->t[i] : NULL; }

/* ---- hash table ---------------------------------------------------------- */

static uint64_t fnv1a(const char *s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
  return h;
}

const st_tensor *st_find(const st_set *s, const char *name) {
  if (!s || !s->hash || !name) return NULL;
  size_t m = s->hash_cap - 1;
  for (size_t i = fnv1a(name) & m;; i = (i + 1) & m) {
    int k = s->hash[i];
    if (k < 0) return NULL;
    if (strcmp(s->t[k].name, name) == 0) return &s->t[k];
  }
}

/* Builds the table; fails on a name seen twice (within or across shards). */
static int build_hash(st_set *s) {
  size_t cap = 16;
  while (cap < (size_t)s->n * 2 + 1) cap <<= 1;
  s->hash = xmalloc(cap * sizeof(int));
  s->hash_cap = cap;
  for (size_t i = 0; i < cap; i++) s->hash[i] = -1;
  for (int k = 0; k < s->n; k++) {
    size_t i = fnv1a(s->t[k].name) & (cap - 1);
    for (; s->hash[i] >= 0; i = (i + 1) & (cap - 1)) {
      const st_tensor *o = &s->t[s->hash[i]];
      if (strcmp(o->name, s->t[k].name) == 0)
        return glm53_err("duplicate tensor name \"%s\" (in %s and %s)", o->name,
                         s->shards[o->shard].path, s->shards[s->t[k].shard].path);
    }
    s->hash[i] = k;
  }
  return 0;
}

/* ---- one shard ----------------------------------------------------------- */

/* A JSON number that is an exact non-negative integer below 2^53. */
static int json_u53(const cJSON *v, uint64_t *out) {
  if (!cJSON_IsNumber(v)) return -1;
  double d = v->valuedouble;
  if (!(d >= 0 && d <= 9007199254740992.0) || d != floor(d)) return -1;
  *out = (uint64_t)d;
  return 0;
}

typedef struct { uint64_t b, e; int k; } span;
static int span_cmp(const void *a, const void *b) {
  const span *x = a, *y = b;
  return x->b < y->b ? -1 : x->b > y->b ? 1 : (x->e < y->e ? -1 : x->e > y->e);
}

static void push_tensor(st_set *s, const st_tensor *t) {
  if (s->n == s->cap) {
    s->cap = s->cap ? s->cap * 2 : 256;
    s->t = xrealloc(s->t, (size_t)s->cap * sizeof *s->t);
  }
  s->t[s->n++] = *t;
}

/* Parses one tensor entry of the header into *t (name owned by caller on
 * success). data_size = bytes after the header. */
static int parse_entry(const cJSON *it, const uint8_t *data, uint64_t data_size, st_tensor *t,
                       uint64_t *ob, uint64_t *oe) {
  const char *nm = it->string;
  if (!cJSON_IsObject(it)) return glm53_err("tensor \"%s\": entry is not an object", nm);
  const cJSON *dt = cJSON_GetObjectItemCaseSensitive(it, "dtype");
  const cJSON *sh = cJSON_GetObjectItemCaseSensitive(it, "shape");
  const cJSON *of = cJSON_GetObjectItemCaseSensitive(it, "data_offsets");
  if (!cJSON_IsString(dt)) return glm53_err("tensor \"%s\": missing or non-string dtype", nm);
  t->dtype = -1;
  for (int d = 0; d < N_DTYPES; d++)
    if (strcmp(dt->valuestring, k_dtypes[d].name) == 0) t->dtype = d;
  if (t->dtype < 0) return glm53_err("tensor \"%s\": unsupported dtype \"%s\"", nm, dt->valuestring);
  if (!cJSON_IsArray(sh)) return glm53_err("tensor \"%s\": missing or non-array shape", nm);
  int nd = cJSON_GetArraySize(sh);
  if (nd > ST_MAX_DIMS) return glm53_err("tensor \"%s\": shape has %d dims (max %d)", nm, nd, ST_MAX_DIMS);
  t->ndim = nd;
  /* numel * size must not overflow: track it in double as a guard, exact in u64. */
  uint64_t bytes = st_dtype_size(t->dtype);
  double fbytes = (double)bytes;
  int d = 0;
  for (const cJSON *x = sh->child; x; x = x->next, d++) {
    uint64_t v;
    if (cJSON_IsNumber(x) && x->valuedouble < 0)
      return glm53_err("tensor \"%s\": negative dimension %g in shape", nm, x->valuedouble);
    if (json_u53(x, &v)) return glm53_err("tensor \"%s\": shape entry %d is not a non-negative integer", nm, d);
    t->shape[d] = (int64_t)v;
    bytes *= v;
    fbytes *= (double)v;
  }
  if (!cJSON_IsArray(of) || cJSON_GetArraySize(of) != 2)
    return glm53_err("tensor \"%s\": data_offsets must be a 2-element array", nm);
  uint64_t b, e;
  if (cJSON_IsNumber(of->child) && of->child->valuedouble < 0)
    return glm53_err("tensor \"%s\": negative data_offsets", nm);
  if (cJSON_IsNumber(of->child->next) && of->child->next->valuedouble < 0)
    return glm53_err("tensor \"%s\": negative data_offsets", nm);
  if (json_u53(of->child, &b) || json_u53(of->child->next, &e))
    return glm53_err("tensor \"%s\": data_offsets are not non-negative integers", nm);
  if (b > e) return glm53_err("tensor \"%s\": data_offsets [%llu, %llu) are reversed", nm,
                              (unsigned long long)b, (unsigned long long)e);
  if (e > data_size)
    return glm53_err("tensor \"%s\": data_offsets [%llu, %llu) out of range (data section is %llu bytes)", nm,
                     (unsigned long long)b, (unsigned long long)e, (unsigned long long)data_size);
  if (fbytes > 1.8e19 || e - b != bytes)
    return glm53_err("tensor \"%s\": data_offsets span %llu bytes but its shape needs %.0f bytes of %s", nm,
                     (unsigned long long)(e - b), fbytes, st_dtype_name(t->dtype));
  t->data = data + b;
  t->nbytes = (size_t)bytes;
  *ob = b;
  *oe = e;
  return 0;
}

/* Maps `path` and appends its tensors to s. On failure the error names the file. */
static int open_shard(st_set *s, const char *path) {
  int fd = open(path, O_RDONLY);
  if (fd < 0) return glm53_err("%s: cannot open: %s", path, strerror(errno));
  struct stat sb;
  if (fstat(fd, &sb) != 0) { close(fd); return glm53_err("%s: cannot stat: %s", path, strerror(errno)); }
  if (!S_ISREG(sb.st_mode)) { close(fd); return glm53_err("%s: not a regular file", path); }
  uint64_t size = (uint64_t)sb.st_size;
  if (size < 8) { close(fd); return glm53_err("%s: file too short (%llu bytes) for a safetensors header", path, (unsigned long long)size); }
  void *map = mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  if (map == MAP_FAILED) return glm53_err("%s: mmap failed: %s", path, strerror(errno));
  int si = s->n_shards++;
  s->shards = xrealloc(s->shards, (size_t)s->n_shards * sizeof *s->shards);
  s->shards[si] = (st_shard){xstrdup(path), map, (size_t)size};

  const uint8_t *base = map;
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | base[i]; /* little-endian */
  if (hlen > size - 8)
    return glm53_err("%s: header length %llu larger than the file (%llu bytes)", path,
                     (unsigned long long)hlen, (unsigned long long)size);
  if (hlen > ST_MAX_HEADER) return glm53_err("%s: header length %llu is implausibly large", path, (unsigned long long)hlen);
  cJSON *root = cJSON_ParseWithLength((const char *)base + 8, (size_t)hlen);
  if (!root) return glm53_err("%s: header is not valid JSON", path);
  if (!cJSON_IsObject(root)) { cJSON_Delete(root); return glm53_err("%s: header JSON is not an object", path); }
  const uint8_t *data = base + 8 + hlen;
  uint64_t data_size = size - 8 - hlen;
  int first = s->n, rc = 0;
  for (const cJSON *it = root->child; it; it = it->next) {
    if (it->string && strcmp(it->string, "__metadata__") == 0) continue;
    st_tensor t = {0};
    uint64_t b, e;
    if (parse_entry(it, data, data_size, &t, &b, &e)) { rc = -1; break; }
    t.name = xstrdup(it->string);
    t.shard = si;
    push_tensor(s, &t);
  }
  cJSON_Delete(root);
  if (rc) return glm53_err_ctx("%s", path);

  /* Overlap check: sort this shard's byte spans. Empty tensors never overlap. */
  int cnt = s->n - first;
  span *sp = xmalloc((size_t)(cnt ? cnt : 1) * sizeof *sp);
  for (int i = 0; i < cnt; i++) {
    const st_tensor *t = &s->t[first + i];
    uint64_t b = (uint64_t)((const uint8_t *)t->data - data);
    sp[i] = (span){b, b + t->nbytes, first + i};
  }
  qsort(sp, (size_t)cnt, sizeof *sp, span_cmp);
  uint64_t end = 0;
  int prev = -1;
  for (int i = 0; i < cnt; i++) {
    if (sp[i].b == sp[i].e) continue;
    if (prev >= 0 && sp[i].b < end) {
      rc = glm53_err("%s: tensors \"%s\" and \"%s\" have overlapping data_offsets", path,
                     s->t[prev].name, s->t[sp[i].k].name);
      break;
    }
    end = sp[i].e;
    prev = sp[i].k;
  }
  free(sp);
  return rc;
}

/* ---- directory handling -------------------------------------------------- */

static int has_suffix(const char *s, const char *suf) {
  size_t a = strlen(s), b = strlen(suf);
  return a >= b && strcmp(s + a - b, suf) == 0;
}

static char *join(const char *dir, const char *name) {
  size_t n = strlen(dir) + strlen(name) + 2;
  char *p = xmalloc(n);
  snprintf(p, n, "%s/%s", dir, name);
  return p;
}

static int file_exists(const char *p) {
  struct stat sb;
  return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* Opens the shards named by index.json's weight_map (in order of first
 * appearance) and checks every mapped tensor is in the shard it names. */
static int open_index(st_set *s, const char *dir, const char *index_path) {
  char *txt = read_file(index_path, NULL);
  if (!txt) return -1;
  cJSON *root = cJSON_Parse(txt);
  free(txt);
  if (!root) return glm53_err("%s: not valid JSON", index_path);
  const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
  int rc = 0;
  char **names = NULL; /* shard file names, distinct, in order */
  int nn = 0;
  if (!cJSON_IsObject(wm)) { rc = glm53_err("%s: missing \"weight_map\" object", index_path); goto done; }
  for (const cJSON *it = wm->child; it; it = it->next) {
    if (!cJSON_IsString(it)) { rc = glm53_err("%s: weight_map entry \"%s\" is not a string", index_path, it->string); goto done; }
    const char *f = it->valuestring;
    if (strstr(f, "..") || f[0] == '/' || f[0] == 0) { rc = glm53_err("%s: bad shard file name \"%s\"", index_path, f); goto done; }
    int j = nn - 1;
    while (j >= 0 && strcmp(names[j], f) != 0) j--;
    if (j < 0) {
      names = xrealloc(names, (size_t)(nn + 1) * sizeof *names);
      names[nn++] = (char *)f;
    }
  }
  if (nn == 0) { rc = glm53_err("%s: weight_map is empty", index_path); goto done; }
  for (int i = 0; i < nn && !rc; i++) {
    char *p = join(dir, names[i]);
    if (!file_exists(p)) rc = glm53_err("%s: names shard \"%s\" which is missing", index_path, names[i]);
    else rc = open_shard(s, p);
    free(p);
  }
  if (!rc) rc = build_hash(s);
  for (const cJSON *it = wm->child; it && !rc; it = it->next) {
    const st_tensor *t = st_find(s, it->string);
    const char *sp = t ? s->shards[t->shard].path : "";
    size_t lp = strlen(sp), lf = strlen(it->valuestring);
    if (!t || lp <= lf || sp[lp - lf - 1] != '/' || strcmp(sp + lp - lf, it->valuestring) != 0)
      rc = glm53_err("%s: tensor \"%s\" is mapped to %s but not found there", index_path, it->string, it->valuestring);
  }
done:
  free(names);
  cJSON_Delete(root);
  return rc;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int open_dir(st_set *s, const char *dir) {
  char *p = join(dir, "model.safetensors.index.json");
  if (file_exists(p)) { int rc = open_index(s, dir, p); free(p); return rc; }
  free(p);
  p = join(dir, "model.safetensors");
  if (file_exists(p)) { int rc = open_shard(s, p); free(p); return rc ? rc : build_hash(s); }
  free(p);
  DIR *d = opendir(dir);
  if (!d) return glm53_err("%s: cannot open directory: %s", dir, strerror(errno));
  char **files = NULL;
  int nf = 0;
  for (struct dirent *e; (e = readdir(d));) {
    if (e->d_name[0] == '.' || !has_suffix(e->d_name, ".safetensors")) continue;
    files = xrealloc(files, (size_t)(nf + 1) * sizeof *files);
    files[nf++] = join(dir, e->d_name);
  }
  closedir(d);
  int rc = 0;
  if (nf == 0) rc = glm53_err("%s: no .safetensors files found", dir);
  if (nf > 1) qsort(files, (size_t)nf, sizeof *files, cmp_str);
  for (int i = 0; i < nf && !rc; i++) rc = open_shard(s, files[i]);
  for (int i = 0; i < nf; i++) free(files[i]);
  free(files);
  return rc ? rc : build_hash(s);
}

st_set *st_open(const char *path) {
  struct stat sb;
  if (!path || stat(path, &sb) != 0) {
    glm53_err("%s: cannot open: %s", path ? path : "(null)", strerror(errno));
    return NULL;
  }
  st_set *s = xcalloc(1, sizeof *s);
  int rc;
  if (S_ISDIR(sb.st_mode)) rc = open_dir(s, path);
  else {
    rc = open_shard(s, path);
    if (!rc) rc = build_hash(s);
  }
  if (rc) { st_close(s); return NULL; }
  return s;
}

void st_close(st_set *s) {
  if (!s) return;
  for (int i = 0; i < s->n; i++) free(s->t[i].name);
  for (int i = 0; i < s->n_shards; i++) {
    munmap(s->shards[i].map, s->shards[i].size);
    free(s->shards[i].path);
  }
  free(s->t);
  free(s->shards);
  free(s->hash);
  free(s);
}

/* ---- conversion to fp32 -------------------------------------------------- */

static void fmt_shape(char *buf, size_t n, int ndim, const int64_t *shape) {
  size_t o = (size_t)snprintf(buf, n, "[");
  for (int i = 0; i < ndim && o < n; i++)
    o += (size_t)snprintf(buf + o, n - o, "%s%lld", i ? ", " : "", (long long)shape[i]);
  if (o < n) snprintf(buf + o, n - o, "]");
}

/* Elements per parallel chunk: below this, threading costs more than it saves. */
#define PAR_MIN ((int64_t)1 << 16)

static void conv_plain(const st_tensor *t, float *out) {
  const uint8_t *p = t->data;
  int64_t n = st_numel(t);
  switch (t->dtype) {
  case ST_F32: if (n > 0) memcpy(out, p, (size_t)n * 4); break;
  case ST_BF16:
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
    for (int64_t i = 0; i < n; i++) { uint16_t h; memcpy(&h, p + 2 * i, 2); out[i] = bf16_to_f32(h); }
    break;
  case ST_F16:
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
    for (int64_t i = 0; i < n; i++) { uint16_t h; memcpy(&h, p + 2 * i, 2); out[i] = f16_to_f32(h); }
    break;
  case ST_F64:
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
    for (int64_t i = 0; i < n; i++) { double d; memcpy(&d, p + 8 * i, 8); out[i] = (float)d; }
    break;
  }
}

/* Block size along one axis implied by `n` elements covered by `g` scale
 * entries: 128 (DeepSeek) when consistent, else ceil(n/g) if that reproduces
 * g. Returns 0 when no block size fits. */
static int64_t infer_block(int64_t n, int64_t g) {
  if (g <= 0) return n == 0 ? 1 : 0;
  if ((n + 127) / 128 == g) return 128;
  int64_t b = (n + g - 1) / g;
  return b > 0 && (n + b - 1) / b == g ? b : 0;
}

static int conv_fp8(const st_set *s, const st_tensor *t, float *out) {
  size_t nl = strlen(t->name);
  char *sname = xmalloc(nl + 11);
  memcpy(sname, t->name, nl);
  memcpy(sname + nl, "_scale_inv", 11);
  const st_tensor *sc = st_find(s, sname);
  if (!sc) {
    int rc = glm53_err("tensor \"%s\" is F8_E4M3 but has no sibling scale \"%s\"", t->name, sname);
    free(sname);
    return rc;
  }
  free(sname);
  if (t->ndim != 2 || sc->ndim != 2)
    return glm53_err("tensor \"%s\": block FP8 needs a 2-D weight and 2-D scale (got %d-D and %d-D)", t->name,
                     t->ndim, sc->ndim);
  if (sc->dtype != ST_F32 && sc->dtype != ST_BF16 && sc->dtype != ST_F16)
    return glm53_err("tensor \"%s_scale_inv\": scale dtype %s is not a float type", t->name, st_dtype_name(sc->dtype));
  int64_t R = t->shape[0], C = t->shape[1], gr = sc->shape[0], gc = sc->shape[1];
  int64_t br = infer_block(R, gr), bc = infer_block(C, gc);
  if (!br || !bc)
    return glm53_err("tensor \"%s\": scale grid [%lld, %lld] does not fit weight [%lld, %lld]", t->name,
                     (long long)gr, (long long)gc, (long long)R, (long long)C);
  float *scale = xmalloc((size_t)(gr * gc > 0 ? gr * gc : 1) * sizeof(float));
  conv_plain(sc, scale);
  const uint8_t *q = t->data;
  /* 256-entry table: exact, and cheaper than decoding each byte. */
  float lut[256];
  for (int i = 0; i < 256; i++) lut[i] = fp8e4m3_to_f32((uint8_t)i);
#pragma omp parallel for schedule(static) if (R * C > PAR_MIN)
  for (int64_t i = 0; i < R; i++) {
    const float *srow = scale + (i / br) * gc;
    const uint8_t *qr = q + i * C;
    float *o = out + i * C;
    for (int64_t j = 0; j < C; j++) o[j] = lut[qr[j]] * srow[j / bc];
  }
  free(scale);
  return 0;
}

int st_read_f32(const st_set *s, const char *name, int ndim, const int64_t *shape, float *out) {
  const st_tensor *t = st_find(s, name);
  if (!t) return glm53_err("tensor \"%s\" not found in checkpoint", name);
  if (shape) {
    int ok = ndim == t->ndim;
    for (int i = 0; ok && i < ndim; i++) ok = shape[i] == t->shape[i];
    if (!ok) {
      char want[160], got[160];
      fmt_shape(want, sizeof want, ndim, shape);
      fmt_shape(got, sizeof got, t->ndim, t->shape);
      return glm53_err("tensor \"%s\": shape mismatch: expected %s, got %s", name, want, got);
    }
  }
  switch (t->dtype) {
  case ST_F32: case ST_F16: case ST_BF16: case ST_F64: conv_plain(t, out); return 0;
  case ST_F8_E4M3: return conv_fp8(s, t, out);
  default: return glm53_err("tensor \"%s\": dtype %s cannot be read as fp32", name, st_dtype_name(t->dtype));
  }
}
