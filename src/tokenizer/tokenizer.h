/* Hugging Face byte-level BPE tokenizer (tokenizer.json) and its decoder.
 *
 * Supported tokenizer.json features (docs/tokenizer.md): model BPE (vocab,
 * merges in "a b" or ["a","b"] form, ignore_merges), added_tokens (special
 * and not; lstrip/rstrip/normalized/single_word), normalizers null / NFC /
 * NFD / NFKC / NFKD / Sequence, pre-tokenizers Sequence / Split (Regex or
 * String; Isolated / Removed; invert) / ByteLevel / Digits, decoder ByteLevel.
 *
 * Invalid UTF-8 in the input never crashes: each invalid byte becomes its own
 * pre-token (its byte-level token), skipping normalizer and regexes, so
 * decode(encode(x)) == x still holds byte for byte.
 *
 * Threading: a loaded tokenizer is read-only; tok_encode may run on many
 * threads at once (its word cache lives in the call). */
#ifndef GLM53_TOKENIZER_H
#define GLM53_TOKENIZER_H
#include <stddef.h>
#include <stdint.h>

typedef struct glm53_tokenizer glm53_tokenizer;

glm53_tokenizer *tok_load(const char *tokenizer_json_path); /* NULL + glm53_err on failure */
/* Same from JSON text in memory (len bytes). */
glm53_tokenizer *tok_load_json(const char *json, size_t len);
void tok_free(glm53_tokenizer *t);

/* Encode len bytes of text. parse_special != 0: special added tokens in the
 * text become their ids; 0: they are encoded as plain text (non-special added
 * tokens are always matched, as in llama.cpp). *ids is malloc'd (may be
 * non-NULL even when *n == 0). Returns 0 or -1. */
int tok_encode(const glm53_tokenizer *t, const char *text, size_t len, int parse_special,
               int32_t **ids, size_t *n);
int tok_token_id(const glm53_tokenizer *t, const char *token_str); /* -1 if absent */
const char *tok_token_str(const glm53_tokenizer *t, int id);       /* raw vocab string; NULL if none */
int tok_vocab_size(const glm53_tokenizer *t);                      /* max id + 1 */
int tok_is_special(const glm53_tokenizer *t, int id);

/* Decode ids to bytes (skip_special: drop special tokens). Returns a malloc'd,
 * NUL-terminated buffer (the bytes may hold invalid UTF-8 if the ids do);
 * NULL + glm53_err on an id out of range. */
char *tok_decode(const glm53_tokenizer *t, const int32_t *ids, size_t n, int skip_special,
                 size_t *len);
/* The bytes one token decodes to (not NUL-terminated); NULL if no such id. */
const char *tok_token_bytes(const glm53_tokenizer *t, int id, size_t *len);

/* Streaming detokenizer: feed one id at a time and get back the bytes that
 * form complete UTF-8; a partial multibyte sequence at the end is held back
 * until it completes (invalid bytes are passed through, never held forever).
 * push/flush return the bytes written to out (at most cap; what does not fit
 * stays pending for the next call), or -1 on a bad id. */
typedef struct tok_stream tok_stream;
tok_stream *tok_stream_new(const glm53_tokenizer *t, int skip_special);
int tok_stream_push(tok_stream *s, int32_t id, char *out, size_t cap);
int tok_stream_flush(tok_stream *s, char *out, size_t cap);
void tok_stream_free(tok_stream *s);

#endif
