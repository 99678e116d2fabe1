/* Token sampler over one row of logits (float, vocab up to ~155k).
 *
 * Pipeline (llama.cpp-like order; docs/sampling.md has the formulas):
 *   1. penalties  (repetition, then frequency/presence) on tokens seen in the
 *                  penalty window given by sampler_accept()
 *   2. sanitise   NaN -> -inf, +inf -> FLT_MAX
 *   3. temperature (0 => greedy: exact argmax, ties -> lowest id; steps 4-6 skipped)
 *   4. top_k      keep the k highest logits (ties -> lower id first)
 *   5. top_p      keep the shortest prefix (by logit desc, id asc) of the
 *                  remaining, renormalised distribution whose mass >= top_p
 *   6. min_p      keep tokens with p >= min_p * p_max
 *   7. sample     one uniform draw from the sampler's xoshiro256** stream
 *
 * Logprobs (OpenAI semantics): log-softmax at temperature 1 of the penalised
 * logits (after step 2), i.e. the model's distribution before temperature and
 * truncation; computed only when n_logprobs > 0.
 *
 * Not thread-safe: one sampler per sequence. */
#ifndef GLM53_RUNTIME_SAMPLER_H
#define GLM53_RUNTIME_SAMPLER_H
#include <stdint.h>

typedef struct {
  float temperature;        /* 0 => greedy; must be finite and >= 0 */
  int top_k;                /* 0 => off */
  float top_p;              /* 1 => off; must be in (0, 1] */
  float min_p;              /* 0 => off; in [0, 1] */
  float repetition_penalty; /* 1 => off; > 0. Seen tokens: l>0 ? l/r : l*r */
  float presence_penalty;   /* 0 => off. Seen tokens: l -= presence */
  float frequency_penalty;  /* 0 => off. Seen tokens: l -= count * frequency */
  int penalty_last_n;       /* window of previous accepted tokens; -1 = all, 0 = off */
  uint64_t seed;
  int n_logprobs;           /* 0..20: top-n logprobs to return */
} sampler_params;

#define SAMPLER_MAX_LOGPROBS 20

/* temperature 1, top_k 0, top_p 1, min_p 0, penalties off (last_n 64), seed 0. */
void sampler_params_default(sampler_params *p);

typedef struct sampler sampler;

/* NULL + glm53_err on invalid params or vocab_size <= 0. */
sampler *sampler_new(const sampler_params *p, int vocab_size);
void sampler_free(sampler *s);

/* Records a token in the penalty history (call it for prompt tokens, if they
 * should be penalised, and for every generated token). Out-of-range ids are
 * ignored. A no-op when all penalties are off. */
void sampler_accept(sampler *s, int32_t token);

/* Clears the penalty history and restarts the random stream from the seed. */
void sampler_reset(sampler *s);

typedef struct {
  int32_t token;
  float logprob;
} token_logprob;

/* Samples one token. logits[0..vocab) is modified in place (penalties,
 * sanitising). If n_logprobs > 0 and top != NULL, top[0..n_logprobs) gets the
 * most likely tokens (logprob desc, id asc; token -1 / -inf past the vocab);
 * if chosen_logprob != NULL it gets the sampled token's logprob (computed even
 * when n_logprobs == 0). Returns the token id, or -1 + glm53_err when every
 * logit is NaN/-inf. Deterministic for a given seed, history and call count. */
int32_t sampler_sample(sampler *s, float *logits, token_logprob *top, float *chosen_logprob);

/* The final candidate set that sampler_sample would draw from (steps 1-6),
 * without consuming randomness: ids[i], probs[i] (renormalised to sum 1) in
 * draw order. Returns the count, or -1 + glm53_err if it exceeds cap or all
 * logits are NaN/-inf. Modifies logits like sampler_sample. For tests/debug. */
int sampler_candidates(sampler *s, float *logits, int32_t *ids, float *probs, int cap);

#endif
