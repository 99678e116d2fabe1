/* Internals shared by the tokenizer files (not a public header). */
#ifndef GLM53_TOK_INTERNAL_H
#define GLM53_TOK_INTERNAL_H
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stddef.h>
#include <stdint.h>

#include "tokenizer/tokenizer.h"

/* ---- hash maps (tok_map.c) ---- */
uint64_t tok_hash(const void *p, size_t n);

/* bytes -> int32 (keys are copied into the map's own arena). */
typedef struct { uint64_t h; uint32_t off, len; int32_t val; int32_t used; } tok_strslot;
typedef struct {
  tok_strslot *slots;
  size_t mask, count;
  char *arena;
  size_t arena_len, arena_cap;
} tok_strmap;
void strmap_init(tok_strmap *m, size_t expect);
void strmap_free(tok_strmap *m);
void strmap_clear(tok_strmap *m);
/* Insert or overwrite. */
void strmap_put(tok_strmap *m, const char *k, size_t n, int32_t v);
/* Returns the value or -1. */
int32_t strmap_get(const tok_strmap *m, const char *k, size_t n);

/* (left id, right id) -> (rank, merged id). */
typedef struct { uint64_t key; int32_t rank, id; } tok_mergeslot;
typedef struct { tok_mergeslot *slots; size_t mask, count; } tok_mergemap;
void mergemap_init(tok_mergemap *m, size_t expect);
void mergemap_free(tok_mergemap *m);
void mergemap_put(tok_mergemap *m, int32_t a, int32_t b, int32_t rank, int32_t id);
const tok_mergeslot *mergemap_get(const tok_mergemap *m, int32_t a, int32_t b);

/* ---- normalizers (tok_normalize.c) ---- */
enum { NORM_NFC, NORM_NFD, NORM_NFKC, NORM_NFKD, NORM_LOWERCASE };
typedef struct { int n; int *kinds; } tok_normalizer; /* applied in order */
/* Normalize valid UTF-8 text; returns malloc'd bytes (or NULL + err). */
char *tok_normalize(const tok_normalizer *nz, const char *s, size_t n, size_t *out_len);

/* ---- pre-tokenizers (tok_pretok.c) ---- */
enum { PT_SPLIT, PT_BYTELEVEL, PT_DIGITS };
enum { SPLIT_ISOLATED, SPLIT_REMOVED, SPLIT_MERGED_PREV, SPLIT_MERGED_NEXT };
typedef struct {
  int type;
  pcre2_code *re; /* SPLIT; BYTELEVEL with use_regex */
  int behavior, invert;
  int add_prefix_space, individual_digits;
} tok_pretok_step;
typedef struct { const char *p; size_t len; } tok_span;
typedef struct { tok_span *v; size_t n, cap; } tok_spans;
/* Split one normalized piece into pre-tokens (appended to out). Spans point
 * into text, or into buffers recorded in *owned (free them after use). */
typedef struct { char **v; size_t n, cap; } tok_owned;
int pretok_run(const tok_pretok_step *steps, int n_steps, const char *text, size_t len,
               tok_spans *out, tok_owned *owned, pcre2_match_data *md, pcre2_match_context *mc);
pcre2_code *pretok_compile(const char *pattern, size_t len, int literal);
void spans_push(tok_spans *s, const char *p, size_t len);

/* ---- the tokenizer ---- */
typedef struct {
  char *content; size_t len; /* as written in tokenizer.json (decodes to this) */
  char *mstr; size_t mlen;    /* what is matched: content, normalized if `normalized` */
  int32_t id;
  int phase;                  /* 0: matched on raw text, 1: after the normalizer */
  int special, lstrip, rstrip, normalized, single_word;
} tok_added;

struct glm53_tokenizer {
  int vocab_size;            /* max id + 1 */
  char **id_str;             /* vocab string per id (NULL for holes) */
  uint32_t *dec_off, *dec_len; char *dec_arena; /* decoded bytes per id */
  uint8_t *is_special, *is_added;
  tok_strmap str2id;         /* vocab + added strings -> id */
  tok_strmap raw2id;         /* model vocab by decoded bytes (ignore_merges) */
  tok_mergemap merges;
  int32_t byte_id[256];      /* id of each single byte's token, -1 if none */
  int ignore_merges;
  tok_added *added; int n_added;
  /* added tokens grouped by first byte, longest first, for each match phase */
  int *first_idx[2][256]; int first_n[2][256];
  tok_normalizer norm;       /* n == 0: none */
  tok_pretok_step *steps; int n_steps;
};

/* BPE of one pre-token (raw bytes); appends ids. Uses/fills the call cache. */
typedef struct {
  tok_strmap map;            /* word -> index into words */
  int32_t *ids; size_t n_ids, cap_ids;
  uint32_t *w_off, *w_len; size_t n_words, cap_words;
  /* scratch */
  void *sym; size_t sym_cap;
  void *heap; size_t heap_cap;
} tok_bpe_cache;
void bpe_cache_init(tok_bpe_cache *c);
void bpe_cache_free(tok_bpe_cache *c);
typedef struct { int32_t *v; size_t n, cap; } tok_ids;
void ids_push(tok_ids *o, int32_t id);
void bpe_word(const glm53_tokenizer *t, tok_bpe_cache *c, const char *w, size_t n, tok_ids *out);

/* UTF-8 helpers (tok_utf8.c) */
/* Length of the valid UTF-8 sequence at s (1..4), or 0 if invalid there. */
int utf8_valid_len(const unsigned char *s, size_t n);
/* Decode one valid code point (from utf8_valid_len > 0). */
uint32_t utf8_cp(const unsigned char *s, int len);
int utf8_put(uint32_t cp, char *out); /* returns bytes written (1..4) */
int unicode_is_white_space(uint32_t cp);

#endif
