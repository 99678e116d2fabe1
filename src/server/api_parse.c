/* OpenAI request parsing and validation: one clear 400 per problem, in the
 * OpenAI error format; never trusts types, ranges or UTF-8 of the input. */
#include "server/srv_internal.h"
#include "core/err.h"
#include "tokenizer/chat.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

char *api_error_json(const char *message, const char *type, const char *param, const char *code) {
  cJSON *o = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(o, "error");
  char *msg = utf8_sanitize(message, strlen(message));
  cJSON_AddStringToObject(e, "message", msg);
  free(msg);
  cJSON_AddStringToObject(e, "type", type ? type : "invalid_request_error");
  if (param) cJSON_AddStringToObject(e, "param", param);
  else cJSON_AddNullToObject(e, "param");
  if (code) cJSON_AddStringToObject(e, "code", code);
  else cJSON_AddNullToObject(e, "code");
  char *s = cJSON_PrintUnformatted(o);
  cJSON_Delete(o);
  return s;
}

int utf8_valid(const char *s, size_t n) {
  const unsigned char *p = (const unsigned char *)s;
  size_t i = 0;
  while (i < n) {
    unsigned c = p[i];
    size_t k;
    unsigned min;
    if (c < 0x80) { i++; continue; }
    if (c >= 0xC2 && c <= 0xDF) { k = 1; min = 0x80; }
    else if (c >= 0xE0 && c <= 0xEF) { k = 2; min = 0x800; }
    else if (c >= 0xF0 && c <= 0xF4) { k = 3; min = 0x10000; }
    else return 0;
    unsigned cp = c & (0x3F >> k);
    for (size_t j = 1; j <= k; j++) {
      if (i + j >= n || (p[i + j] & 0xC0) != 0x80) return 0;
      cp = (cp << 6) | (p[i + j] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    i += k + 1;
  }
  return 1;
}

char *utf8_sanitize(const char *s, size_t n) {
  sbuf b = {0};
  sbuf_add(&b, "", 0);
  size_t i = 0;
  while (i < n) {
    size_t j = i + 1;
    unsigned c = (unsigned char)s[i];
    if (c >= 0x80) {
      size_t k = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
      if (k > 1 && i + k <= n && utf8_valid(s + i, k)) j = i + k;
      else { sbuf_add(&b, "\xEF\xBF\xBD", 3); i++; continue; }
    } else if (c == 0) { /* NUL would cut C strings short: keep it visible */
      sbuf_add(&b, "\xEF\xBF\xBD", 3); i++; continue;
    }
    sbuf_add(&b, s + i, j - i);
    i = j;
  }
  return b.p;
}

/* ---- field readers: each returns 0, or -1 with the message in ctx ---- */
typedef struct {
  char msg[512];
  const char *param;
  const char *code;
  int status;
} perr;

static int fail(perr *e, int status, const char *param, const char *code, const char *fmt, ...) GLM53_PRINTF(5, 6);
static int fail(perr *e, int status, const char *param, const char *code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(e->msg, sizeof e->msg, fmt, ap);
  va_end(ap);
  e->param = param;
  e->code = code;
  e->status = status;
  return -1;
}

static const cJSON *field(const cJSON *o, const char *k) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
  return cJSON_IsNull(v) ? NULL : v; /* null means "not given", as OpenAI treats it */
}

static int get_num(const cJSON *o, const char *k, double lo, double hi, int integer, double *out, perr *e) {
  const cJSON *v = field(o, k);
  if (!v) return 0;
  if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
    return fail(e, 400, k, "invalid_type", "'%s' must be a number", k);
  double d = v->valuedouble;
  if (integer && d != floor(d)) return fail(e, 400, k, "invalid_type", "'%s' must be an integer", k);
  if (d < lo || d > hi) return fail(e, 400, k, "invalid_value", "'%s' must be between %g and %g (got %g)", k, lo, hi, d);
  *out = d;
  return 0;
}

static int get_bool(const cJSON *o, const char *k, int *out, perr *e) {
  const cJSON *v = field(o, k);
  if (!v) return 0;
  if (!cJSON_IsBool(v)) return fail(e, 400, k, "invalid_type", "'%s' must be a boolean", k);
  *out = cJSON_IsTrue(v);
  return 0;
}

static int parse_stop(const cJSON *o, job *j, perr *e) {
  const cJSON *v = field(o, "stop");
  if (!v) return 0;
  int n = cJSON_IsString(v) ? 1 : cJSON_IsArray(v) ? cJSON_GetArraySize(v) : -1;
  if (n < 0) return fail(e, 400, "stop", "invalid_type", "'stop' must be a string or an array of strings");
  if (n > 16) return fail(e, 400, "stop", "invalid_value", "'stop' has %d entries (at most 16)", n);
  j->stop = xcalloc((size_t)n + 1, sizeof(char *));
  for (int i = 0; i < n; i++) {
    const cJSON *s = cJSON_IsString(v) ? v : cJSON_GetArrayItem(v, i);
    if (!cJSON_IsString(s)) return fail(e, 400, "stop", "invalid_type", "'stop' entries must be strings");
    size_t len = strlen(s->valuestring);
    if (len == 0 || len > 256) return fail(e, 400, "stop", "invalid_value", "'stop' strings must have 1 to 256 bytes");
    j->stop[j->n_stop++] = xstrdup(s->valuestring);
  }
  return 0;
}

/* Sampling and length parameters shared by both endpoints. */
static int parse_common(srv *S, const cJSON *o, job *j, perr *e) {
  const cJSON *m = field(o, "model");
  if (m && !cJSON_IsString(m)) return fail(e, 400, "model", "invalid_type", "'model' must be a string");
  if (m && strcmp(m->valuestring, S->model_name))
    return fail(e, 404, "model", "model_not_found", "The model '%s' does not exist (this server serves '%s')",
                m->valuestring, S->model_name);
  double d;
  sampler_params *sp = &j->gp.sp;
  sp->temperature = 1;
  sp->top_p = 1;
  d = -1;
  if (get_num(o, "n", 1, 1, 1, &d, e)) return fail(e, 400, "n", "invalid_value", "only n = 1 is supported");
  d = -1;
  if (get_num(o, "max_tokens", 1, 1e9, 1, &d, e)) return -1;
  if (get_num(o, "max_completion_tokens", 1, 1e9, 1, &d, e)) return -1;
  j->gp.max_tokens = d > 0 ? (int)(d > S->o.ctx ? S->o.ctx : d) : (j->chat ? 0 : 16); /* OpenAI completions default 16 */
  d = 1;
  if (get_num(o, "temperature", 0, 2, 0, &d, e)) return -1;
  sp->temperature = (float)d;
  d = 1;
  if (get_num(o, "top_p", 0, 1, 0, &d, e)) return -1;
  if (d <= 0) return fail(e, 400, "top_p", "invalid_value", "'top_p' must be in (0, 1]");
  sp->top_p = (float)d;
  d = 0;
  if (get_num(o, "top_k", -1, 1e9, 1, &d, e)) return -1;
  sp->top_k = d < 0 ? 0 : (int)d;
  d = 0;
  if (get_num(o, "min_p", 0, 1, 0, &d, e)) return -1;
  sp->min_p = (float)d;
  d = 0;
  if (get_num(o, "presence_penalty", -2, 2, 0, &d, e)) return -1;
  sp->presence_penalty = (float)d;
  d = 0;
  if (get_num(o, "frequency_penalty", -2, 2, 0, &d, e)) return -1;
  sp->frequency_penalty = (float)d;
  d = 1;
  if (get_num(o, "repetition_penalty", 0.01, 10, 0, &d, e)) return -1;
  sp->repetition_penalty = (float)d;
  d = 0;
  if (get_num(o, "seed", -9.2e18, 9.2e18, 1, &d, e)) return -1;
  sp->seed = (uint64_t)(int64_t)d;
  if (get_bool(o, "stream", &j->stream, e) || get_bool(o, "ignore_eos", &j->gp.ignore_eos, e)) return -1;
  const cJSON *so = field(o, "stream_options");
  if (so) {
    if (!cJSON_IsObject(so)) return fail(e, 400, "stream_options", "invalid_type", "'stream_options' must be an object");
    if (get_bool(so, "include_usage", &j->include_usage, e)) return -1;
  }
  return parse_stop(o, j, e);
}

static int parse_logprobs(const cJSON *o, job *j, perr *e) {
  double d = 0;
  if (j->chat) {
    if (get_bool(o, "logprobs", &j->logprobs, e)) return -1;
    if (get_num(o, "top_logprobs", 0, SAMPLER_MAX_LOGPROBS, 1, &d, e)) return -1;
    if (d > 0 && !j->logprobs) return fail(e, 400, "top_logprobs", "invalid_value", "'top_logprobs' needs 'logprobs': true");
  } else {
    d = -1;
    if (get_num(o, "logprobs", 0, 5, 1, &d, e)) return -1;
    j->logprobs = d >= 0;
    if (d < 0) d = 0;
  }
  j->n_top = (int)d;
  j->gp.sp.n_logprobs = j->n_top;
  return 0;
}

/* Checks the message list shape before the renderer sees it, so errors name the field. */
static int check_messages(const cJSON *msgs, perr *e) {
  if (!msgs) return fail(e, 400, "messages", "missing_required_parameter", "'messages' is required");
  if (!cJSON_IsArray(msgs)) return fail(e, 400, "messages", "invalid_type", "'messages' must be an array");
  if (cJSON_GetArraySize(msgs) == 0) return fail(e, 400, "messages", "invalid_value", "'messages' must not be empty");
  int i = 0;
  const cJSON *m;
  cJSON_ArrayForEach(m, msgs) {
    if (!cJSON_IsObject(m)) return fail(e, 400, "messages", "invalid_type", "messages[%d] must be an object", i);
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(m, "role");
    if (!cJSON_IsString(r)) return fail(e, 400, "messages", "invalid_type", "messages[%d].role must be a string", i);
    static const char *roles[] = {"system", "developer", "user", "assistant", "tool"};
    int ok = 0;
    for (size_t k = 0; k < 5; k++) ok |= !strcmp(r->valuestring, roles[k]);
    if (!ok) return fail(e, 400, "messages", "invalid_value", "messages[%d].role '%.64s' is not one of system, developer, user, assistant, tool", i, r->valuestring);
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "content");
    if (c && !cJSON_IsNull(c) && !cJSON_IsString(c) && !cJSON_IsArray(c))
      return fail(e, 400, "messages", "invalid_type", "messages[%d].content must be a string, an array of parts or null", i);
    if ((!c || cJSON_IsNull(c)) && strcmp(r->valuestring, "assistant"))
      return fail(e, 400, "messages", "missing_required_parameter", "messages[%d].content is required", i);
    if (cJSON_IsArray(c)) {
      const cJSON *p;
      cJSON_ArrayForEach(p, c) if (!cJSON_IsObject(p) || !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(p, "type")))
        return fail(e, 400, "messages", "invalid_type", "messages[%d].content parts must be objects with a string 'type'", i);
    }
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
    if (tc && !cJSON_IsNull(tc)) {
      if (!cJSON_IsArray(tc)) return fail(e, 400, "messages", "invalid_type", "messages[%d].tool_calls must be an array", i);
      const cJSON *t;
      cJSON_ArrayForEach(t, tc) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(t, "function");
        if (!cJSON_IsObject(f) || !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(f, "name")))
          return fail(e, 400, "messages", "invalid_type", "messages[%d].tool_calls[].function.name must be a string", i);
      }
    }
    i++;
  }
  return 0;
}

static int render_chat(const cJSON *o, char **text, perr *e) {
  const cJSON *msgs = field(o, "messages");
  if (check_messages(msgs, e)) return -1;
  const cJSON *tools = field(o, "tools");
  if (tools && !cJSON_IsArray(tools)) return fail(e, 400, "tools", "invalid_type", "'tools' must be an array");
  const cJSON *effort = field(o, "reasoning_effort");
  if (effort && !cJSON_IsString(effort)) return fail(e, 400, "reasoning_effort", "invalid_type", "'reasoning_effort' must be a string");
  cJSON *kw = cJSON_CreateObject();
  cJSON *mc = cJSON_Duplicate(msgs, 1);
  cJSON *m;
  cJSON_ArrayForEach(m, mc) { /* the GLM template has no "developer" role */
    cJSON *r = cJSON_GetObjectItemCaseSensitive(m, "role");
    if (!strcmp(r->valuestring, "developer")) cJSON_SetValuestring(r, "system");
  }
  cJSON_AddItemToObject(kw, "messages", mc);
  if (tools) cJSON_AddItemToObject(kw, "tools", cJSON_Duplicate(tools, 1));
  if (effort) cJSON_AddStringToObject(kw, "reasoning_effort", effort->valuestring);
  cJSON_AddBoolToObject(kw, "add_generation_prompt", 1);
  char *kws = cJSON_PrintUnformatted(kw);
  cJSON_Delete(kw);
  *text = chat_render_json(kws);
  free(kws);
  if (!*text) return fail(e, 400, "messages", "invalid_value", "cannot render the conversation: %s", glm53_last_error());
  return 0;
}

/* The completions prompt: a string, a one-string array, or token ids. */
static int completion_prompt(srv *S, const cJSON *o, job *j, char **text, perr *e) {
  const cJSON *p = field(o, "prompt");
  if (!p) return fail(e, 400, "prompt", "missing_required_parameter", "'prompt' is required");
  if (cJSON_IsString(p)) { *text = xstrdup(p->valuestring); return 0; }
  if (!cJSON_IsArray(p) || cJSON_GetArraySize(p) == 0)
    return fail(e, 400, "prompt", "invalid_type", "'prompt' must be a string, an array of one string, or an array of token ids");
  const cJSON *f = cJSON_GetArrayItem(p, 0);
  if (cJSON_IsString(f)) {
    if (cJSON_GetArraySize(p) != 1) return fail(e, 400, "prompt", "invalid_value", "only one prompt per request is supported");
    *text = xstrdup(f->valuestring);
    return 0;
  }
  int n = cJSON_GetArraySize(p), V = glm53_model_vocab_size(S->m);
  if (n >= S->o.ctx)
    return fail(e, 400, "prompt", "context_length_exceeded", "the prompt has %d tokens; this server's context is %d (one position must stay free)", n, S->o.ctx);
  j->prompt = xmalloc((size_t)n * sizeof(int32_t));
  const cJSON *t;
  cJSON_ArrayForEach(t, p) {
    if (!cJSON_IsNumber(t) || t->valuedouble != floor(t->valuedouble) || t->valuedouble < 0 || t->valuedouble >= V)
      return fail(e, 400, "prompt", "invalid_value", "token ids in 'prompt' must be integers in [0, %d)", V);
    j->prompt[j->n_prompt++] = (int32_t)t->valuedouble;
  }
  return 0;
}

static void job_free(job *j) {
  for (int i = 0; i < j->n_stop; i++) free(j->stop[i]);
  free(j->stop);
  free(j->prompt);
  sbuf_free(&j->text);
  sbuf_free(&j->split_pending);
  sbuf_free(&j->out);
  free(j->result);
  cJSON_Delete(j->lp);
  pthread_cond_destroy(&j->cv);
  free(j);
}

void job_release(srv *S, job *j) {
  (void)S;
  if (--j->refs == 0) job_free(j);
}

job *api_parse_request(srv *S, int chat, const char *body, size_t len, char **err, int *status) {
  perr e = {.status = 400};
  job *j = xcalloc(1, sizeof *j);
  pthread_cond_init(&j->cv, NULL);
  j->refs = 1;
  j->chat = chat;
  j->endpoint = chat ? EP_CHAT : EP_COMPLETIONS;
  j->model = S->model_name;
  gen_params_default(&j->gp);
  char *text = NULL;
  cJSON *o = NULL;
  if (!utf8_valid(body, len)) { fail(&e, 400, NULL, "invalid_encoding", "the request body is not valid UTF-8"); goto bad; }
  o = cJSON_ParseWithLength(body, len);
  if (!o) { fail(&e, 400, NULL, "invalid_json", "the request body is not valid JSON"); goto bad; }
  if (!cJSON_IsObject(o)) { fail(&e, 400, NULL, "invalid_json", "the request body must be a JSON object"); goto bad; }
  if (parse_common(S, o, j, &e) || parse_logprobs(o, j, &e)) goto bad;
  if (chat ? render_chat(o, &text, &e) : completion_prompt(S, o, j, &text, &e)) goto bad;
  if (text) {
    /* JSON "\u0000" parses to a NUL inside the string; the text ends there,
     * as it would for any C consumer; it is not an error. */
    size_t n = 0;
    int32_t *ids = NULL;
    if (tok_encode(S->tok, text, strlen(text), 1, &ids, &n)) {
      free(ids);
      fail(&e, 400, chat ? "messages" : "prompt", "invalid_value", "cannot tokenize the prompt: %s", glm53_last_error());
      goto bad;
    }
    j->prompt = ids;
    j->n_prompt = (int)n;
    int V = glm53_model_vocab_size(S->m);
    for (size_t i = 0; i < n; i++)
      if (ids[i] >= V) { /* tokenizer and model disagree: say so instead of failing in the forward */
        fail(&e, 400, chat ? "messages" : "prompt", "invalid_value",
             "the prompt has token id %d, outside the model's vocabulary of %d (tokenizer/model mismatch)", ids[i], V);
        goto bad;
      }
  }
  if (j->n_prompt < 1) { fail(&e, 400, chat ? "messages" : "prompt", "invalid_value", "the prompt is empty"); goto bad; }
  if (j->n_prompt >= S->o.ctx) {
    fail(&e, 400, chat ? "messages" : "prompt", "context_length_exceeded",
         "this server's maximum context length is %d tokens; the prompt has %d (one position must stay free)", S->o.ctx,
         j->n_prompt);
    goto bad;
  }
  /* the sampler validates its ranges too: catch anything parse_common missed */
  sampler *probe = sampler_new(&j->gp.sp, glm53_model_vocab_size(S->m));
  if (!probe) { fail(&e, 400, NULL, "invalid_value", "%s", glm53_last_error()); goto bad; }
  sampler_free(probe);
  free(text);
  cJSON_Delete(o);
  snprintf(j->id, sizeof j->id, "%s-%ld", chat ? "chatcmpl" : "cmpl", atomic_fetch_add(&S->next_id, 1));
  j->created = (long)time(NULL);
  return j;
bad:
  free(text);
  cJSON_Delete(o);
  job_free(j);
  *status = e.status;
  *err = api_error_json(e.msg, e.status == 404 ? "invalid_request_error" : "invalid_request_error", e.param, e.code);
  return NULL;
}

char *api_models_json(srv *S) {
  cJSON *o = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(o, "data"), *m = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "object", "list");
  cJSON_AddStringToObject(m, "id", S->model_name);
  cJSON_AddStringToObject(m, "object", "model");
  cJSON_AddNumberToObject(m, "created", 0);
  cJSON_AddStringToObject(m, "owned_by", "glm53");
  cJSON_AddNumberToObject(m, "max_model_len", S->o.ctx);
  cJSON_AddItemToArray(arr, m);
  char *s = cJSON_PrintUnformatted(o);
  cJSON_Delete(o);
  return s;
}
