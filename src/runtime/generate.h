/* The generation loop shared by `glm53 run`, `glm53 chat` and the HTTP
 * server: prefill new prompt tokens into a session (continuing whatever it
 * already holds), then sample / stream / stop.
 *
 * Session contract (important for multi-turn use):
 *   - gen_run feeds the prompt, then every sampled token EXCEPT THE LAST ONE
 *     (res->last_token). After gen_run the session holds
 *       earlier tokens + prompt + generated[0 .. n_generated-2]
 *     and the last sampled token (an eos id, the token that completed a stop
 *     string, the max_tokens-th token, ...) is NOT fed. A caller continuing
 *     the conversation puts it (or whatever the template wants there) at the
 *     start of its next prompt.
 *   - prompt + generated never exceeds glm53_session_max_ctx(): a prompt that
 *     does not fit fails before any compute; generation stops with
 *     GEN_LENGTH when pos + n_generated reaches the context, so the pending
 *     last token can still be fed.
 *   - On cancel during prefill (p->cancel), the session holds only the first
 *     res->n_prompt_fed prompt tokens; the caller should reset it.
 *
 * Text: each token's bytes go through tok_stream (UTF-8 safe) and the stop
 * matcher (stop strings may span tokens; text that could still start a stop
 * string is held back; the stop string and everything after it are never
 * emitted). Stop-id tokens (eos) are not reported and their text is dropped.
 *
 * Not thread-safe per session; gen_run may run concurrently on different
 * sessions of one model. */
#ifndef GLM53_RUNTIME_GENERATE_H
#define GLM53_RUNTIME_GENERATE_H
#include "glm53.h"
#include "runtime/sampler.h"
#include "tokenizer/tokenizer.h"
#include <signal.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
  sampler_params sp;
  int max_tokens;              /* <= 0: until eos / stop / context end */
  const char *const *stop;     /* stop strings (may be NULL when n_stop == 0) */
  int n_stop;
  const int32_t *stop_ids;     /* extra stop token ids (added to the model's eos) */
  int n_stop_ids;
  int ignore_eos;              /* 1: do not stop on the model's eos ids */
  int skip_special;            /* 1: special tokens give no text (default 0:
                                  "</think>" etc. stay visible for parsing) */
  int prefill_chunk;           /* tokens per prefill forward; <= 0: 256 */
  int penalize_prompt;         /* 1 (default): penalties also see the prompt */
  const volatile sig_atomic_t *cancel; /* optional: set nonzero (signal handler,
                                  other thread) to stop before the next prefill
                                  chunk or decode forward: GEN_CANCELLED */
  /* optional forward hook (default glm53_forward with all_rows 0): the server
   * wraps it with its --on-gpu-error policy and cache accounting */
  int (*forward)(void *user, glm53_session *s, const int32_t *tokens, int n, float *logits);
  void *forward_user;
} gen_params;

/* One generated token, as reported to the callback. */
typedef struct {
  int32_t token;             /* -1: end-of-generation flush of held-back text */
  const char *text;          /* bytes now safe to show (not NUL-terminated;
                                may be empty: held back for UTF-8 / stop) */
  size_t text_len;
  float logprob;             /* the token's logprob (model distribution at T=1) */
  const token_logprob *top;  /* sp.n_logprobs alternatives, or NULL */
  int n_top;
} gen_token;

/* Return nonzero to cancel (finish GEN_CANCELLED; the text of this call has
 * been delivered). May be NULL. Pointers are valid only during the call. */
typedef int (*gen_on_token)(void *user, const gen_token *t);

enum { GEN_STOP = 0, GEN_LENGTH = 1, GEN_CANCELLED = 2, GEN_ERROR = 3 };

typedef struct {
  int n_prompt;       /* prompt tokens given */
  int n_prompt_fed;   /* of them actually fed (n_prompt unless cancelled/error) */
  int n_generated;    /* tokens sampled, including a final stop id */
  int32_t last_token; /* last sampled token, NOT fed into the session; -1 if none */
  int finish;         /* GEN_STOP (eos, stop id or stop string), GEN_LENGTH
                         (max_tokens or context end), GEN_CANCELLED, GEN_ERROR */
  int stop_index;     /* index of the matched stop string, else -1 */
  double prefill_s;   /* wall time of the prompt forwards */
  double decode_s;    /* wall time from the first sample to the end */
} gen_result;

/* Defaults: sampler_params_default (T 1, no truncation, seed 0), max_tokens 0,
 * no stop strings, prefill_chunk 256, penalize_prompt 1. */
void gen_params_default(gen_params *p);

/* gen_params_default, then overrides temperature / top_p / top_k / min_p /
 * repetition_penalty from DIR/generation_config.json when that file exists
 * (a missing file or field is not an error; GLM-5.3 ships T 1.0, top_p 0.95).
 * Returns 0, or -1 + glm53_err on unreadable / invalid JSON. dir may be NULL. */
int gen_params_from_generation_config(const char *dir, gen_params *p);

/* Step-wise form, for schedulers that interleave many sessions:
 *   g = gen_begin(...)        validates and sets up, no compute (NULL + glm53_err)
 *   while ((rc = gen_step(g)) > 0) ...   one prefill chunk or one decode token
 *   rc == 0: finished (gen_result_of(g)->finish); rc < 0: error (glm53_err)
 *   gen_end(g)                frees (the session stays with the caller)
 * The callback, params (incl. stop strings) and prompt must outlive g. */
typedef struct gen_state gen_state;
gen_state *gen_begin(glm53_session *s, const glm53_tokenizer *tok, const int32_t *prompt, int n_prompt,
                     const gen_params *p, gen_on_token cb, void *user);
int gen_step(gen_state *g);

/* gen_step split in two, for schedulers that run the forward themselves
 * (e.g. one glm53_forward_batch over the decode steps of many sessions):
 *   rc = gen_next_input(g, &in)   1: feed in.tokens[0 .. in.n) into the
 *                                 session, then call gen_advance; 0: finished
 *                                 without a forward (done already, or
 *                                 p->cancel set before a prefill chunk)
 *   the caller's forward          in.n tokens after the session's position;
 *                                 when in.want_logits, the last row's
 *                                 vocab-size logits into a buffer of its own
 *   rc = gen_advance(g, logits)   as gen_step returns: > 0 goes on, 0
 *                                 finished, < 0 error (glm53_err)
 * gen_step(g) is exactly gen_next_input + p->forward (or glm53_forward) +
 * gen_advance. gen_next_input does not change what it returns until
 * gen_advance is called, so a failed forward can be retried (or the request
 * dropped). gen_advance samples from logits and may modify them (scratch);
 * logits may be NULL when !in.want_logits. */
typedef struct {
  const int32_t *tokens; /* points into the prompt or the state (valid until gen_advance) */
  int n;                 /* 1 for a decode step; <= prefill_chunk for a prefill chunk */
  int decode;            /* 1: the last sampled token (one token, batchable); 0: a prompt chunk */
  int want_logits;       /* 0: a non-final prompt chunk (no logits needed) */
} gen_input;
int gen_next_input(gen_state *g, gen_input *in);
int gen_advance(gen_state *g, float *logits);
const gen_result *gen_result_of(const gen_state *g);
void gen_end(gen_state *g);

/* Runs one generation (see the contract above). prompt: n_prompt >= 1 new
 * tokens. tok: used to decode text; may be NULL (no text, and stop strings are
 * then an error). Returns 0 when generation finished (res->finish says why,
 * including GEN_CANCELLED), -1 + glm53_err on error (res->finish = GEN_ERROR;
 * the session may hold part of the prompt/generation). res may be NULL. */
int gen_run(glm53_session *s, const glm53_tokenizer *tok, const int32_t *prompt, int n_prompt, const gen_params *p,
            gen_on_token cb, void *user, gen_result *res);

#endif
