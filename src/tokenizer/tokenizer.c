/* Loading a Hugging Face tokenizer.json (byte-level BPE) into lookup tables,
 * and the small id <-> string accessors. Encoding: tok_encode.c; decoding:
 * tok_decode.c. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "core/err.h"
#include "core/util.h"
#include "tokenizer/tok_internal.h"
#include "tokenizer/tokenizer.h"

#define MAX_VOCAB (1 << 24)

/* GPT-2 byte-level map: printable bytes stand for themselves, the other 68
 * bytes are shifted to U+0100.. in byte order. */
static void bytelevel_map(uint32_t b2u[256], int u2b[512]) {
  int n = 0;
  for (int i = 0; i < 512; i++) u2b[i] = -1;
  for (int b = 0; b < 256; b++) {
    int printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    b2u[b] = printable ? (uint32_t)b : (uint32_t)(256 + n++);
    u2b[b2u[b]] = b;
  }
}

/* Byte-level string -> raw bytes. Returns the length; *all_mapped = 0 if a
 * character is outside the map (it is then copied through as UTF-8, as the
 * Hugging Face ByteLevel decoder does). */
static size_t bytelevel_decode(const char *s, const int u2b[512], char *out, int *all_mapped) {
  const unsigned char *u = (const unsigned char *)s;
  size_t n = strlen(s), k = 0, i = 0;
  *all_mapped = 1;
  while (i < n) {
    int l = utf8_valid_len(u + i, n - i);
    if (l == 0) { out[k++] = (char)u[i++]; *all_mapped = 0; continue; }
    uint32_t cp = utf8_cp(u + i, l);
    if (cp < 512 && u2b[cp] >= 0) out[k++] = (char)u2b[cp];
    else { memcpy(out + k, u + i, (size_t)l); k += (size_t)l; *all_mapped = 0; }
    i += (size_t)l;
  }
  return k;
}

static int parse_normalizer(const cJSON *j, tok_normalizer *nz) {
  if (!j || cJSON_IsNull(j)) return 0;
  const cJSON *ty = cJSON_GetObjectItemCaseSensitive(j, "type");
  if (!cJSON_IsString(ty)) return glm53_err("tokenizer.json: normalizer without type");
  const char *s = ty->valuestring;
  int kind = -1;
  if (!strcmp(s, "Sequence")) {
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(j, "normalizers"), *e;
    cJSON_ArrayForEach(e, arr) if (parse_normalizer(e, nz)) return -1;
    return 0;
  }
  if (!strcmp(s, "NFC")) kind = NORM_NFC;
  else if (!strcmp(s, "NFD")) kind = NORM_NFD;
  else if (!strcmp(s, "NFKC")) kind = NORM_NFKC;
  else if (!strcmp(s, "NFKD")) kind = NORM_NFKD;
  else if (!strcmp(s, "Lowercase")) kind = NORM_LOWERCASE;
  else return glm53_err("tokenizer.json: unsupported normalizer %s", s);
  nz->kinds = xrealloc(nz->kinds, (size_t)(nz->n + 1) * sizeof *nz->kinds);
  nz->kinds[nz->n++] = kind;
  return 0;
}

static int json_bool(const cJSON *o, const char *key, int def) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
  return cJSON_IsBool(v) ? cJSON_IsTrue(v) : def;
}

static void add_step(glm53_tokenizer *t, tok_pretok_step st) {
  t->steps = xrealloc(t->steps, (size_t)(t->n_steps + 1) * sizeof *t->steps);
  t->steps[t->n_steps++] = st;
}

/* GPT-2's split regex, used by ByteLevel when use_regex is true. */
static const char GPT2_RE[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static int parse_pretok(const cJSON *j, glm53_tokenizer *t, int *has_bytelevel) {
  if (!j || cJSON_IsNull(j)) return 0;
  const cJSON *ty = cJSON_GetObjectItemCaseSensitive(j, "type");
  if (!cJSON_IsString(ty)) return glm53_err("tokenizer.json: pre_tokenizer without type");
  const char *s = ty->valuestring;
  tok_pretok_step st;
  memset(&st, 0, sizeof st);
  if (!strcmp(s, "Sequence")) {
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(j, "pretokenizers"), *e;
    cJSON_ArrayForEach(e, arr) if (parse_pretok(e, t, has_bytelevel)) return -1;
    return 0;
  }
  if (!strcmp(s, "Split")) {
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(j, "pattern");
    const cJSON *re = cJSON_GetObjectItemCaseSensitive(pat, "Regex");
    const cJSON *lit = cJSON_GetObjectItemCaseSensitive(pat, "String");
    const cJSON *bh = cJSON_GetObjectItemCaseSensitive(j, "behavior");
    const cJSON *src = cJSON_IsString(re) ? re : lit;
    if (!cJSON_IsString(src)) return glm53_err("tokenizer.json: Split without a Regex/String pattern");
    st.type = PT_SPLIT;
    st.re = pretok_compile(src->valuestring, strlen(src->valuestring), src == lit);
    if (!st.re) return -1;
    const char *b = cJSON_IsString(bh) ? bh->valuestring : "Isolated";
    if (!strcmp(b, "Isolated")) st.behavior = SPLIT_ISOLATED;
    else if (!strcmp(b, "Removed")) st.behavior = SPLIT_REMOVED;
    else if (!strcmp(b, "MergedWithPrevious")) st.behavior = SPLIT_MERGED_PREV;
    else if (!strcmp(b, "MergedWithNext")) st.behavior = SPLIT_MERGED_NEXT;
    else { pcre2_code_free(st.re); return glm53_err("tokenizer.json: unsupported Split behavior %s", b); }
    st.invert = json_bool(j, "invert", 0);
    add_step(t, st);
    return 0;
  }
  if (!strcmp(s, "ByteLevel")) {
    st.type = PT_BYTELEVEL;
    st.add_prefix_space = json_bool(j, "add_prefix_space", 0);
    if (json_bool(j, "use_regex", 1)) {
      st.re = pretok_compile(GPT2_RE, sizeof GPT2_RE - 1, 0);
      if (!st.re) return -1;
    }
    *has_bytelevel = 1;
    add_step(t, st);
    return 0;
  }
  if (!strcmp(s, "Digits")) {
    st.type = PT_DIGITS;
    st.individual_digits = json_bool(j, "individual_digits", 0);
    add_step(t, st);
    return 0;
  }
  return glm53_err("tokenizer.json: unsupported pre_tokenizer %s", s);
}

static int check_decoder(const cJSON *j) {
  if (!j || cJSON_IsNull(j)) return 0;
  const cJSON *ty = cJSON_GetObjectItemCaseSensitive(j, "type");
  if (cJSON_IsString(ty) && !strcmp(ty->valuestring, "ByteLevel")) return 0;
  return glm53_err("tokenizer.json: unsupported decoder %s (only ByteLevel)",
                   cJSON_IsString(ty) ? ty->valuestring : "?");
}

static int cmp_added_len(const void *a, const void *b, void *ctx) {
  const tok_added *ad = ctx;
  size_t la = ad[*(const int *)a].mlen, lb = ad[*(const int *)b].mlen;
  if (la != lb) return la > lb ? -1 : 1;
  return *(const int *)a - *(const int *)b;
}

static int load_model(glm53_tokenizer *t, const cJSON *model, const cJSON *added) {
  const cJSON *ty = cJSON_GetObjectItemCaseSensitive(model, "type");
  if (cJSON_IsString(ty) && strcmp(ty->valuestring, "BPE"))
    return glm53_err("tokenizer.json: model type %s unsupported (only BPE)", ty->valuestring);
  if (json_bool(model, "byte_fallback", 0)) return glm53_err("tokenizer.json: BPE byte_fallback unsupported");
  const char *affix[] = {"continuing_subword_prefix", "end_of_word_suffix"};
  for (int i = 0; i < 2; i++) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(model, affix[i]);
    if (cJSON_IsString(v) && v->valuestring[0]) return glm53_err("tokenizer.json: BPE %s unsupported", affix[i]);
  }
  t->ignore_merges = json_bool(model, "ignore_merges", 0);
  const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
  const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
  if (!cJSON_IsObject(vocab)) return glm53_err("tokenizer.json: model.vocab missing");
  if (merges && !cJSON_IsArray(merges)) return glm53_err("tokenizer.json: model.merges is not an array");

  /* ids: vocab and added tokens */
  int max_id = -1, n_vocab = 0;
  const cJSON *e;
  cJSON_ArrayForEach(e, vocab) {
    if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble >= MAX_VOCAB)
      return glm53_err("tokenizer.json: bad id for vocab entry '%s'", e->string);
    if (e->valueint > max_id) max_id = e->valueint;
    n_vocab++;
  }
  int n_added = cJSON_IsArray(added) ? cJSON_GetArraySize(added) : 0;
  t->added = xcalloc((size_t)n_added + 1, sizeof *t->added);
  cJSON_ArrayForEach(e, added) {
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(e, "id");
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(e, "content");
    if (!cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble >= MAX_VOCAB || !cJSON_IsString(c) ||
        !c->valuestring[0])
      return glm53_err("tokenizer.json: bad added_tokens entry");
    tok_added *a = &t->added[t->n_added++];
    a->content = xstrdup(c->valuestring);
    a->len = strlen(a->content);
    a->id = id->valueint;
    a->special = json_bool(e, "special", 0);
    a->lstrip = json_bool(e, "lstrip", 0);
    a->rstrip = json_bool(e, "rstrip", 0);
    a->single_word = json_bool(e, "single_word", 0);
    a->normalized = json_bool(e, "normalized", !a->special);
    if (a->id > max_id) max_id = a->id;
  }
  if (max_id < 0) return glm53_err("tokenizer.json: empty vocabulary");
  t->vocab_size = max_id + 1;
  t->id_str = xcalloc((size_t)t->vocab_size, sizeof *t->id_str);
  t->is_special = xcalloc((size_t)t->vocab_size, 1);
  t->is_added = xcalloc((size_t)t->vocab_size, 1);
  t->dec_off = xcalloc((size_t)t->vocab_size, sizeof *t->dec_off);
  t->dec_len = xcalloc((size_t)t->vocab_size, sizeof *t->dec_len);
  strmap_init(&t->str2id, (size_t)(n_vocab + n_added));
  strmap_init(&t->raw2id, (size_t)n_vocab);

  uint32_t b2u[256];
  int u2b[512];
  bytelevel_map(b2u, u2b);
  size_t dcap = 1 << 20, dlen = 0;
  t->dec_arena = xmalloc(dcap);
  cJSON_ArrayForEach(e, vocab) {
    int id = e->valueint;
    size_t sl = strlen(e->string);
    if (t->id_str[id]) return glm53_err("tokenizer.json: id %d used twice in vocab", id);
    t->id_str[id] = xstrdup(e->string);
    strmap_put(&t->str2id, e->string, sl, id);
    if (dlen + sl + 1 > dcap) { while (dlen + sl + 1 > dcap) dcap *= 2; t->dec_arena = xrealloc(t->dec_arena, dcap); }
    int mapped;
    size_t dl = bytelevel_decode(e->string, u2b, t->dec_arena + dlen, &mapped);
    t->dec_off[id] = (uint32_t)dlen;
    t->dec_len[id] = (uint32_t)dl;
    if (mapped) strmap_put(&t->raw2id, t->dec_arena + dlen, dl, id);
    dlen += dl;
  }
  for (int i = 0; i < t->n_added; i++) { /* added tokens decode to their content */
    tok_added *a = &t->added[i];
    free(t->id_str[a->id]);
    t->id_str[a->id] = xstrdup(a->content);
    strmap_put(&t->str2id, a->content, a->len, a->id);
    t->is_special[a->id] = (uint8_t)a->special;
    t->is_added[a->id] = 1;
    if (dlen + a->len > dcap) { while (dlen + a->len > dcap) dcap *= 2; t->dec_arena = xrealloc(t->dec_arena, dcap); }
    memcpy(t->dec_arena + dlen, a->content, a->len);
    t->dec_off[a->id] = (uint32_t)dlen;
    t->dec_len[a->id] = (uint32_t)a->len;
    dlen += a->len;
  }
  for (int b = 0; b < 256; b++) {
    char c = (char)b;
    t->byte_id[b] = strmap_get(&t->raw2id, &c, 1);
  }

  /* merges: rank = position; a later duplicate wins (as in HF) */
  int nm = merges ? cJSON_GetArraySize(merges) : 0;
  mergemap_init(&t->merges, (size_t)nm);
  int rank = 0;
  char *buf = NULL;
  size_t bcap = 0;
  cJSON_ArrayForEach(e, merges) {
    const char *a = NULL, *b = NULL;
    size_t la = 0, lb = 0;
    if (cJSON_IsString(e)) {
      const char *sp = strchr(e->valuestring, ' ');
      if (!sp || strchr(sp + 1, ' ')) { free(buf); return glm53_err("tokenizer.json: bad merge #%d '%s'", rank, e->valuestring); }
      a = e->valuestring; la = (size_t)(sp - a);
      b = sp + 1; lb = strlen(b);
    } else if (cJSON_IsArray(e) && cJSON_GetArraySize(e) == 2 && cJSON_IsString(cJSON_GetArrayItem(e, 0)) &&
               cJSON_IsString(cJSON_GetArrayItem(e, 1))) {
      a = cJSON_GetArrayItem(e, 0)->valuestring; la = strlen(a);
      b = cJSON_GetArrayItem(e, 1)->valuestring; lb = strlen(b);
    } else {
      free(buf);
      return glm53_err("tokenizer.json: bad merge #%d", rank);
    }
    if (la + lb > bcap) { bcap = (la + lb) * 2; buf = xrealloc(buf, bcap); }
    memcpy(buf, a, la);
    memcpy(buf + la, b, lb);
    int32_t ia = strmap_get(&t->str2id, a, la), ib = strmap_get(&t->str2id, b, lb);
    int32_t im = strmap_get(&t->str2id, buf, la + lb);
    if (ia < 0 || ib < 0 || im < 0) {
      int r = glm53_err("tokenizer.json: merge #%d '%.*s %.*s' uses a token not in the vocab", rank, (int)la, a, (int)lb, b);
      free(buf);
      return r;
    }
    mergemap_put(&t->merges, ia, ib, rank, im);
    rank++;
  }
  free(buf);
  return 0;
}

/* Matching tables for added tokens: phase 0 on raw text, phase 1 after the
 * normalizer (tokens with normalized=true, when there is a normalizer). */
static int index_added(glm53_tokenizer *t) {
  for (int i = 0; i < t->n_added; i++) {
    tok_added *a = &t->added[i];
    a->phase = (a->normalized && t->norm.n > 0) ? 1 : 0;
    if (a->phase == 1) {
      a->mstr = tok_normalize(&t->norm, a->content, a->len, &a->mlen);
      if (!a->mstr) return -1;
      if (a->mlen == 0) { free(a->mstr); a->mstr = xstrdup(a->content); a->mlen = a->len; }
    } else {
      a->mstr = xstrdup(a->content);
      a->mlen = a->len;
    }
    int ph = a->phase;
    unsigned char fb = (unsigned char)a->mstr[0];
    t->first_idx[ph][fb] = xrealloc(t->first_idx[ph][fb], (size_t)(t->first_n[ph][fb] + 1) * sizeof(int));
    t->first_idx[ph][fb][t->first_n[ph][fb]++] = i;
  }
  for (int ph = 0; ph < 2; ph++)
    for (int b = 0; b < 256; b++)
      if (t->first_n[ph][b] > 1) qsort_r(t->first_idx[ph][b], (size_t)t->first_n[ph][b], sizeof(int), cmp_added_len, t->added);
  return 0;
}

glm53_tokenizer *tok_load_json(const char *json, size_t len) {
  cJSON *root = cJSON_ParseWithLength(json, len);
  if (!root) { glm53_err("tokenizer.json: invalid JSON"); return NULL; }
  glm53_tokenizer *t = xcalloc(1, sizeof *t);
  int has_bl = 0, rc = 0;
  const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
  if (!cJSON_IsObject(model)) rc = glm53_err("tokenizer.json: no model");
  if (!rc) rc = parse_normalizer(cJSON_GetObjectItemCaseSensitive(root, "normalizer"), &t->norm);
  if (!rc) rc = parse_pretok(cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"), t, &has_bl);
  if (!rc) rc = check_decoder(cJSON_GetObjectItemCaseSensitive(root, "decoder"));
  if (!rc && !has_bl) rc = glm53_err("tokenizer.json: no ByteLevel pre-tokenizer (only byte-level BPE is supported)");
  if (!rc) rc = load_model(t, model, cJSON_GetObjectItemCaseSensitive(root, "added_tokens"));
  if (!rc) rc = index_added(t);
  cJSON_Delete(root);
  if (rc) { tok_free(t); return NULL; }
  return t;
}

glm53_tokenizer *tok_load(const char *path) {
  size_t len;
  char *buf = read_file(path, &len);
  if (!buf) return NULL;
  glm53_tokenizer *t = tok_load_json(buf, len);
  free(buf);
  if (!t) glm53_err_ctx("%s", path);
  return t;
}

void tok_free(glm53_tokenizer *t) {
  if (!t) return;
  if (t->id_str)
    for (int i = 0; i < t->vocab_size; i++) free(t->id_str[i]);
  free(t->id_str);
  free(t->dec_off); free(t->dec_len); free(t->dec_arena);
  free(t->is_special); free(t->is_added);
  strmap_free(&t->str2id);
  strmap_free(&t->raw2id);
  mergemap_free(&t->merges);
  for (int i = 0; i < t->n_added; i++) { free(t->added[i].content); free(t->added[i].mstr); }
  free(t->added);
  for (int ph = 0; ph < 2; ph++)
    for (int b = 0; b < 256; b++) free(t->first_idx[ph][b]);
  free(t->norm.kinds);
  for (int i = 0; i < t->n_steps; i++) pcre2_code_free(t->steps[i].re);
  free(t->steps);
  free(t);
}

int tok_token_id(const glm53_tokenizer *t, const char *s) {
  if (!t || !s) return -1;
  return strmap_get(&t->str2id, s, strlen(s));
}

const char *tok_token_str(const glm53_tokenizer *t, int id) {
  if (!t || id < 0 || id >= t->vocab_size) return NULL;
  return t->id_str[id];
}

int tok_vocab_size(const glm53_tokenizer *t) { return t ? t->vocab_size : 0; }

int tok_is_special(const glm53_tokenizer *t, int id) {
  return t && id >= 0 && id < t->vocab_size && t->is_special[id];
}
