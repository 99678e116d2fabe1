/* The generation loop (contract in generate.h). */
#include "runtime/generate.h"
#include "core/err.h"
#include "core/util.h"
#include "model/config.h"
#include "runtime/stop.h"
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

void gen_params_default(gen_params *p) {
  memset(p, 0, sizeof *p);
  sampler_params_default(&p->sp);
  p->prefill_chunk = 256;
  p->penalize_prompt = 1;
}

static void num_field(const cJSON *o, const char *k, float *f, int *i) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
  if (!cJSON_IsNumber(v)) return;
  if (f) *f = (float)v->valuedouble;
  if (i) *i = v->valueint;
}

int gen_params_from_generation_config(const char *dir, gen_params *p) {
  gen_params_default(p);
  if (!dir) return 0;
  char path[4096];
  snprintf(path, sizeof path, "%s/generation_config.json", dir);
  struct stat sb;
  if (stat(path, &sb) != 0) return 0; /* optional file */
  size_t len;
  char *text = read_file(path, &len);
  if (!text) return -1;
  cJSON *o = cJSON_ParseWithLength(text, len);
  free(text);
  if (!cJSON_IsObject(o)) {
    cJSON_Delete(o);
    return glm53_err("%s: not a JSON object", path);
  }
  num_field(o, "temperature", &p->sp.temperature, NULL);
  num_field(o, "top_p", &p->sp.top_p, NULL);
  num_field(o, "top_k", NULL, &p->sp.top_k);
  num_field(o, "min_p", &p->sp.min_p, NULL);
  num_field(o, "repetition_penalty", &p->sp.repetition_penalty, NULL);
  /* transformers: do_sample=false means greedy whatever the temperature */
  const cJSON *ds = cJSON_GetObjectItemCaseSensitive(o, "do_sample");
  if (cJSON_IsFalse(ds)) p->sp.temperature = 0;
  cJSON_Delete(o);
  return 0;
}

enum { ST_PREFILL, ST_DECODE, ST_DONE };

struct gen_state {
  glm53_session *s;
  const glm53_tokenizer *tok;
  const gen_params *p;
  const int32_t *prompt;
  int n_prompt, pos1, ctx, state;
  tok_stream *ts;
  stop_matcher *sm;
  sampler *smp;
  gen_on_token cb;
  void *user;
  char *buf;
  size_t cap;
  float *logits;
  double t0, t1;
  gen_result res;
};

static int emit(gen_state *g, int32_t token, const char *text, size_t len, float lp, const token_logprob *top, int n_top) {
  if (!g->cb) return 0;
  gen_token t = {.token = token, .text = text ? text : "", .text_len = len, .logprob = lp, .top = top, .n_top = n_top};
  return g->cb(g->user, &t);
}

/* Decodes one token's bytes into g->buf. Returns the byte count or -1. */
static int decode_token(gen_state *g, int32_t token) {
  if (!g->ts) return 0;
  size_t blen = 0;
  /* model rows with no tokenizer entry (e.g. GLM's reserved ids) give no text */
  if (!tok_token_bytes(g->tok, token, &blen)) return 0;
  if (blen + 16 > g->cap) { /* + room for a held-back UTF-8 tail */
    g->cap = blen + 16;
    g->buf = xrealloc(g->buf, g->cap);
  }
  return tok_stream_push(g->ts, token, g->buf, g->cap);
}

/* End of generation (not after a stop-string match): releases the stream's
 * incomplete UTF-8 tail and the stop matcher's held-back text in one call. */
static void flush_all(gen_state *g) {
  const char *out;
  size_t n = 0;
  char *acc = NULL;
  size_t acc_n = 0;
  int k = g->ts ? tok_stream_flush(g->ts, g->buf, g->cap) : 0;
  if (k > 0) {
    int matched = stop_feed(g->sm, g->buf, (size_t)k, &out, &n);
    if (matched) { /* a stop string completed inside the tail: nothing after it */
      if (n) emit(g, -1, out, n, 0, NULL, 0);
      return;
    }
    acc = xmalloc(n + 1);
    memcpy(acc, out, n);
    acc_n = n;
  }
  stop_flush(g->sm, &out, &n);
  if (n) {
    acc = xrealloc(acc, acc_n + n);
    memcpy(acc + acc_n, out, n);
    acc_n += n;
  }
  if (acc_n) emit(g, -1, acc, acc_n, 0, NULL, 0);
  free(acc);
}

static int forward(gen_state *g, const int32_t *toks, int n, float *logits) {
  if (g->p->forward) return g->p->forward(g->p->forward_user, g->s, toks, n, logits);
  return glm53_forward(g->s, toks, n, logits, 0);
}

gen_state *gen_begin(glm53_session *s, const glm53_tokenizer *tok, const int32_t *prompt, int n_prompt,
                     const gen_params *p, gen_on_token cb, void *user) {
  glm53_model *m = glm53_session_model(s);
  const int V = glm53_model_vocab_size(m);
  const int pos0 = glm53_session_pos(s), ctx = glm53_session_max_ctx(s);
  if (!prompt || n_prompt < 1) { glm53_err("generate: empty prompt (at least one new token is needed)"); return NULL; }
  for (int i = 0; i < n_prompt; i++)
    if (prompt[i] < 0 || prompt[i] >= V) {
      glm53_err("generate: prompt token %d at position %d is outside the vocabulary (%d)", prompt[i], i, V);
      return NULL;
    }
  /* One free position must remain so that the sampled token can be fed later. */
  if ((int64_t)pos0 + n_prompt >= ctx) {
    glm53_err("prompt too long: %d new tokens + %d already in the session do not fit the %d-token context "
              "(need at least one free position)", n_prompt, pos0, ctx);
    return NULL;
  }
  if (p->n_stop > 0 && !tok) { glm53_err("generate: stop strings need a tokenizer"); return NULL; }
  if (p->n_stop_ids > 64) { glm53_err("generate: at most 64 stop token ids (got %d)", p->n_stop_ids); return NULL; }

  int32_t ids[GLM53_MAX_EOS + 64];
  int n_ids = 0;
  if (!p->ignore_eos) {
    n_ids = glm53_model_eos(m, ids, GLM53_MAX_EOS);
    if (n_ids > GLM53_MAX_EOS) n_ids = GLM53_MAX_EOS;
  }
  for (int i = 0; i < p->n_stop_ids; i++) ids[n_ids++] = p->stop_ids[i];
  stop_config sc = {.strings = p->n_stop ? p->stop : NULL, .n_strings = p->n_stop, .token_ids = ids,
                    .n_token_ids = n_ids, .max_tokens = p->max_tokens};

  gen_state *g = xcalloc(1, sizeof *g);
  *g = (gen_state){.s = s, .tok = tok, .p = p, .prompt = prompt, .n_prompt = n_prompt, .pos1 = pos0 + n_prompt,
                   .ctx = ctx, .state = ST_PREFILL, .cb = cb, .user = user, .cap = 256};
  g->res = (gen_result){.n_prompt = n_prompt, .last_token = -1, .stop_index = -1, .finish = GEN_ERROR};
  g->sm = stop_new(&sc);
  if (g->sm) g->smp = sampler_new(&p->sp, V);
  if (g->smp && tok) g->ts = tok_stream_new(tok, p->skip_special);
  if (!g->smp || (tok && !g->ts)) {
    gen_end(g);
    return NULL;
  }
  g->buf = xmalloc(g->cap);
  g->logits = xmalloc((size_t)V * sizeof(float));
  return g;
}

static int finish(gen_state *g, int why) {
  g->res.finish = why;
  g->state = ST_DONE;
  if (g->t1 > 0) g->res.decode_s = now_sec() - g->t1;
  return 0;
}

/* Samples from logits, reports the token, decides whether to go on. */
static int sample_step(gen_state *g, float *logits) {
  const gen_params *p = g->p;
  token_logprob top[SAMPLER_MAX_LOGPROBS];
  const int n_top = p->sp.n_logprobs;
  float lp = 0;
  int32_t t = sampler_sample(g->smp, logits, n_top > 0 ? top : NULL, &lp);
  if (t < 0) return -1;
  g->res.n_generated++;
  g->res.last_token = t;
  sampler_accept(g->smp, t);
  stop_reason r = stop_token(g->sm, t);
  int why = -1;
  if (r == STOP_TOKEN) {
    why = GEN_STOP;
  } else {
    int k = decode_token(g, t);
    if (k < 0) return -1;
    const char *out;
    size_t n = 0;
    int matched = stop_feed(g->sm, g->buf, (size_t)k, &out, &n);
    int cancel = emit(g, t, out, n, lp, n_top > 0 ? top : NULL, n_top);
    if (matched) {
      g->res.stop_index = stop_which(g->sm);
      return finish(g, GEN_STOP);
    }
    /* checked after sampling, so that the last sampled token is never fed
     * (the contract in generate.h) */
    if (cancel || (p->cancel && *p->cancel)) why = GEN_CANCELLED;
    else if (r == STOP_LENGTH || g->pos1 + g->res.n_generated >= g->ctx) why = GEN_LENGTH;
  }
  if (why < 0) return 1;
  flush_all(g);
  if (stop_which(g->sm) >= 0) { /* completed by the stream's held-back UTF-8 tail */
    g->res.stop_index = stop_which(g->sm);
    why = GEN_STOP;
  }
  return finish(g, why);
}

int gen_next_input(gen_state *g, gen_input *in) {
  const gen_params *p = g->p;
  *in = (gen_input){0};
  if (g->state == ST_DONE) return 0;
  if (g->state == ST_DECODE) {
    *in = (gen_input){.tokens = &g->res.last_token, .n = 1, .decode = 1, .want_logits = 1};
    return 1;
  }
  /* decode steps check p->cancel right after sampling (sample_step) */
  if (p->cancel && *p->cancel) return finish(g, GEN_CANCELLED);
  const int chunk = p->prefill_chunk > 0 ? p->prefill_chunk : 256;
  const int i = g->res.n_prompt_fed, len = g->n_prompt - i < chunk ? g->n_prompt - i : chunk;
  if (i == 0 && g->t0 == 0) g->t0 = now_sec();
  *in = (gen_input){.tokens = g->prompt + i, .n = len, .decode = 0, .want_logits = i + len == g->n_prompt};
  return 1;
}

int gen_advance(gen_state *g, float *logits) {
  const gen_params *p = g->p;
  if (g->state == ST_DONE) return 0;
  if (g->state == ST_DECODE) return sample_step(g, logits);
  const int chunk = p->prefill_chunk > 0 ? p->prefill_chunk : 256;
  const int i = g->res.n_prompt_fed, len = g->n_prompt - i < chunk ? g->n_prompt - i : chunk;
  g->res.n_prompt_fed = i + len;
  if (g->res.n_prompt_fed < g->n_prompt) return 1;
  if (p->penalize_prompt)
    for (int k = 0; k < g->n_prompt; k++) sampler_accept(g->smp, g->prompt[k]);
  g->t1 = now_sec();
  g->res.prefill_s = g->t1 - g->t0;
  g->state = ST_DECODE;
  return sample_step(g, logits);
}

int gen_step(gen_state *g) {
  gen_input in;
  if (gen_next_input(g, &in) <= 0) return 0;
  float *logits = in.want_logits ? g->logits : NULL;
  if (forward(g, in.tokens, in.n, logits)) return -1;
  return gen_advance(g, logits);
}

const gen_result *gen_result_of(const gen_state *g) { return &g->res; }

void gen_end(gen_state *g) {
  if (!g) return;
  tok_stream_free(g->ts);
  stop_free(g->sm);
  sampler_free(g->smp);
  free(g->buf);
  free(g->logits);
  free(g);
}

int gen_run(glm53_session *s, const glm53_tokenizer *tok, const int32_t *prompt, int n_prompt, const gen_params *p,
            gen_on_token cb, void *user, gen_result *res) {
  gen_state *g = gen_begin(s, tok, prompt, n_prompt, p, cb, user);
  int rc;
  if (!g) {
    rc = -1;
  } else {
    while ((rc = gen_step(g)) > 0) {
    }
  }
  if (res) {
    if (g) *res = g->res;
    else *res = (gen_result){.n_prompt = n_prompt, .last_token = -1, .stop_index = -1, .finish = GEN_ERROR};
    if (rc < 0) res->finish = GEN_ERROR;
  }
  if (rc < 0) glm53_err_ctx("generate");
  gen_end(g);
  return rc < 0 ? -1 : 0;
}
