/* Stop conditions for streaming generation: stop token ids, stop strings
 * (arbitrary bytes, may span tokens and end mid-token) and a token limit.
 *
 * Per generated token the caller does:
 *   r = stop_token(m, tok);
 *   if (r == STOP_TOKEN) { stop_flush(...); emit; finish "stop"; }     // token text not shown
 *   else if (stop_feed(m, text, len, &out, &n)) { emit out; finish "stop"; }
 *   else { emit out; if (r == STOP_LENGTH) { stop_flush(...); emit; finish "length"; } }
 *
 * Emitted text never contains a stop string or anything after one. Text that
 * could still be the start of a stop string is held back, and so is a trailing
 * incomplete UTF-8 sequence (<= 3 bytes), until more text resolves it or
 * stop_flush releases it. */
#ifndef GLM53_RUNTIME_STOP_H
#define GLM53_RUNTIME_STOP_H
#include <stddef.h>
#include <stdint.h>

#define STOP_MAX_STRINGS 64
#define STOP_MAX_STRING_LEN 1024

typedef enum { STOP_NONE = 0, STOP_STRING = 1, STOP_TOKEN = 2, STOP_LENGTH = 3 } stop_reason;

typedef struct {
  const char *const *strings; /* NUL-terminated, non-empty; NULL if n_strings == 0 */
  int n_strings;
  const int32_t *token_ids; /* e.g. the eos ids; non-negative */
  int n_token_ids;
  int max_tokens; /* <= 0: unlimited */
} stop_config;

typedef struct stop_matcher stop_matcher;

/* NULL + glm53_err on bad config (empty/too long/too many strings, negative ids). */
stop_matcher *stop_new(const stop_config *c);
void stop_free(stop_matcher *m);

/* Counts one generated token. Returns STOP_TOKEN if it is a stop id (its text
 * should not be fed), STOP_LENGTH if it is the max_tokens-th token (feed its
 * text, then flush), else STOP_NONE. */
stop_reason stop_token(stop_matcher *m, int32_t token);

/* Feeds newly decoded bytes. *out and *out_len get the text now safe to show
 * (valid until the next call on m). Returns 1 once a stop string has matched
 * (the text before the earliest match is in *out; the match and everything
 * after are dropped; later feeds return 1 and emit nothing), else 0. */
int stop_feed(stop_matcher *m, const char *text, size_t len, const char **out, size_t *out_len);

/* End of generation: releases held-back text (nothing after a match). */
void stop_flush(stop_matcher *m, const char **out, size_t *out_len);

/* Index of the matched stop string, or -1. */
int stop_which(const stop_matcher *m);

/* Tokens counted by stop_token so far. */
int stop_count(const stop_matcher *m);

#endif
