/* OpenAI response bodies: streamed SSE chunks (chat.completion.chunk /
 * text_completion) or one JSON object at the end; logprobs in the chat and
 * legacy completions shapes; reasoning / tool calls parsed from GLM output. */
#include "server/srv_internal.h"
#include "tokenizer/chat.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double finite_lp(float lp) { return isfinite(lp) ? lp : -9999.0; }

static void add_str(cJSON *o, const char *k, const char *s, size_t n) {
  char *t = utf8_sanitize(s, n);
  cJSON_AddStringToObject(o, k, t);
  free(t);
}

/* token text for logprobs: its bytes (sanitised) and the raw byte values */
static void token_fields(srv *S, cJSON *o, int32_t tok) {
  size_t n = 0;
  const char *b = tok >= 0 ? tok_token_bytes(S->tok, tok, &n) : NULL;
  if (!b) { b = ""; n = 0; }
  add_str(o, "token", b, n);
  cJSON *arr = cJSON_AddArrayToObject(o, "bytes");
  for (size_t i = 0; i < n; i++) cJSON_AddItemToArray(arr, cJSON_CreateNumber((unsigned char)b[i]));
}

static cJSON *chat_lp_entry(srv *S, int32_t tok, float lp, const token_logprob *top, int n_top) {
  cJSON *e = cJSON_CreateObject();
  token_fields(S, e, tok);
  cJSON_AddNumberToObject(e, "logprob", finite_lp(lp));
  cJSON *arr = cJSON_AddArrayToObject(e, "top_logprobs");
  for (int i = 0; i < n_top && top; i++) {
    if (top[i].token < 0) continue;
    cJSON *t = cJSON_CreateObject();
    token_fields(S, t, top[i].token);
    cJSON_AddNumberToObject(t, "logprob", finite_lp(top[i].logprob));
    cJSON_AddItemToArray(arr, t);
  }
  return e;
}

/* Legacy completions logprobs: parallel arrays. */
static cJSON *cmpl_lp_new(void) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddArrayToObject(o, "tokens");
  cJSON_AddArrayToObject(o, "token_logprobs");
  cJSON_AddArrayToObject(o, "top_logprobs");
  cJSON_AddArrayToObject(o, "text_offset");
  return o;
}
static void cmpl_lp_add(srv *S, cJSON *o, int32_t tok, float lp, const token_logprob *top, int n_top, size_t offset) {
  size_t n = 0;
  const char *b = tok_token_bytes(S->tok, tok, &n);
  char *t = utf8_sanitize(b ? b : "", b ? n : 0);
  cJSON_AddItemToArray(cJSON_GetObjectItem(o, "tokens"), cJSON_CreateString(t));
  free(t);
  cJSON_AddItemToArray(cJSON_GetObjectItem(o, "token_logprobs"), cJSON_CreateNumber(finite_lp(lp)));
  cJSON *alt = cJSON_CreateObject();
  for (int i = 0; i < n_top && top; i++) {
    if (top[i].token < 0) continue;
    const char *tb = tok_token_bytes(S->tok, top[i].token, &n);
    char *ts = utf8_sanitize(tb ? tb : "", tb ? n : 0);
    if (!cJSON_GetObjectItemCaseSensitive(alt, ts)) cJSON_AddNumberToObject(alt, ts, finite_lp(top[i].logprob));
    free(ts);
  }
  cJSON_AddItemToArray(cJSON_GetObjectItem(o, "top_logprobs"), alt);
  cJSON_AddItemToArray(cJSON_GetObjectItem(o, "text_offset"), cJSON_CreateNumber((double)offset));
}

static cJSON *chunk_base(job *j) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "id", j->id);
  cJSON_AddStringToObject(o, "object", j->chat ? (j->stream ? "chat.completion.chunk" : "chat.completion") : "text_completion");
  cJSON_AddNumberToObject(o, "created", (double)j->created);
  cJSON_AddStringToObject(o, "model", j->model);
  return o;
}

/* Appends "data: JSON\n\n" to the stream (takes o) and wakes the writer. */
static void push_sse(srv *S, job *j, cJSON *o) {
  char *s = o ? cJSON_PrintUnformatted(o) : NULL;
  cJSON_Delete(o);
  pthread_mutex_lock(&S->mu);
  sbuf_adds(&j->out, "data: ");
  sbuf_adds(&j->out, s ? s : "[DONE]");
  sbuf_adds(&j->out, "\n\n");
  pthread_cond_broadcast(&j->cv);
  pthread_mutex_unlock(&S->mu);
  free(s);
}

/* Chat streaming: splits raw text into reasoning (before </think>) and content
 * (after it, up to the first <tool_call>), holding back a possible partial tag. */
static void split_feed(job *j, const char *text, size_t len, sbuf *reasoning, sbuf *content, int final) {
  sbuf_add(&j->split_pending, text, len);
  for (;;) {
    sbuf *p = &j->split_pending;
    if (j->split_mode == SPLIT_TOOLS || p->n == 0) return;
    const char *tag = j->split_mode == SPLIT_REASONING ? "</think>" : "<tool_call>";
    sbuf *dst = j->split_mode == SPLIT_REASONING ? reasoning : content;
    size_t tl = strlen(tag);
    char *hit = memmem(p->p, p->n, tag, tl);
    if (hit) {
      size_t k = (size_t)(hit - p->p);
      sbuf_add(dst, p->p, k);
      sbuf_consume(p, k + tl);
      j->split_mode = j->split_mode == SPLIT_REASONING ? SPLIT_CONTENT : SPLIT_TOOLS;
      continue;
    }
    size_t keep = 0; /* longest suffix that is a proper prefix of the tag */
    if (!final)
      for (size_t s = tl - 1; s > 0; s--)
        if (s <= p->n && !memcmp(p->p + p->n - s, tag, s)) { keep = s; break; }
    sbuf_add(dst, p->p, p->n - keep);
    sbuf_consume(p, p->n - keep);
    return;
  }
}

void api_emit_token(srv *S, job *j, int32_t token, const char *text, size_t len, float lp, const token_logprob *top,
                    int n_top) {
  size_t offset = j->text.n;
  sbuf_add(&j->text, text, len);
  int with_lp = j->logprobs && token >= 0;
  if (!j->stream) {
    if (!with_lp) return;
    if (j->chat) {
      if (!j->lp) j->lp = cJSON_CreateArray();
      cJSON_AddItemToArray(j->lp, chat_lp_entry(S, token, lp, top, n_top));
    } else {
      if (!j->lp) j->lp = cmpl_lp_new();
      cmpl_lp_add(S, j->lp, token, lp, top, n_top, offset);
    }
    return;
  }
  cJSON *o = chunk_base(j), *ch = cJSON_AddArrayToObject(o, "choices"), *c = cJSON_CreateObject();
  cJSON_AddItemToArray(ch, c);
  cJSON_AddNumberToObject(c, "index", 0);
  int empty = 1;
  if (j->chat) {
    sbuf r = {0}, t = {0};
    split_feed(j, text, len, &r, &t, 0);
    cJSON *d = cJSON_AddObjectToObject(c, "delta");
    if (r.n) add_str(d, "reasoning_content", r.p, r.n);
    if (t.n) add_str(d, "content", t.p, t.n);
    empty = !r.n && !t.n;
    sbuf_free(&r);
    sbuf_free(&t);
    if (with_lp) {
      cJSON *l = cJSON_AddObjectToObject(c, "logprobs"), *arr = cJSON_AddArrayToObject(l, "content");
      cJSON_AddItemToArray(arr, chat_lp_entry(S, token, lp, top, n_top));
    } else {
      cJSON_AddNullToObject(c, "logprobs");
    }
  } else {
    add_str(c, "text", text, len);
    empty = len == 0;
    if (with_lp) {
      cJSON *l = cmpl_lp_new();
      cmpl_lp_add(S, l, token, lp, top, n_top, offset);
      cJSON_AddItemToObject(c, "logprobs", l);
    } else {
      cJSON_AddNullToObject(c, "logprobs");
    }
  }
  cJSON_AddNullToObject(c, "finish_reason");
  if (empty && !with_lp) { cJSON_Delete(o); return; }
  push_sse(S, j, o);
}

/* The first chunk of a chat stream announces the role (OpenAI does). */
void api_stream_begin(srv *S, job *j) {
  if (!j->stream || !j->chat) return;
  cJSON *o = chunk_base(j), *ch = cJSON_AddArrayToObject(o, "choices"), *c = cJSON_CreateObject();
  cJSON_AddItemToArray(ch, c);
  cJSON_AddNumberToObject(c, "index", 0);
  cJSON *d = cJSON_AddObjectToObject(c, "delta");
  cJSON_AddStringToObject(d, "role", "assistant");
  cJSON_AddStringToObject(d, "content", "");
  cJSON_AddNullToObject(c, "logprobs");
  cJSON_AddNullToObject(c, "finish_reason");
  push_sse(S, j, o);
}

static cJSON *usage(job *j) {
  cJSON *u = cJSON_CreateObject();
  cJSON_AddNumberToObject(u, "prompt_tokens", j->n_prompt);
  cJSON_AddNumberToObject(u, "completion_tokens", j->n_gen);
  cJSON_AddNumberToObject(u, "total_tokens", j->n_prompt + j->n_gen);
  return u;
}

static cJSON *tool_calls_json(job *j, const chat_parsed *p, int stream) {
  cJSON *arr = cJSON_CreateArray();
  for (int i = 0; i < p->n_tool_calls; i++) {
    cJSON *t = cJSON_CreateObject(), *f;
    char id[80];
    snprintf(id, sizeof id, "call_%s_%d", j->id, i);
    if (stream) cJSON_AddNumberToObject(t, "index", i);
    cJSON_AddStringToObject(t, "id", id);
    cJSON_AddStringToObject(t, "type", "function");
    f = cJSON_AddObjectToObject(t, "function");
    add_str(f, "name", p->tool_names[i], strlen(p->tool_names[i]));
    add_str(f, "arguments", p->tool_args_json[i], strlen(p->tool_args_json[i]));
    cJSON_AddItemToArray(arr, t);
  }
  return arr;
}

void api_finish(srv *S, job *j, const char *finish, const char *errmsg) {
  chat_parsed parsed = {0};
  int have_parsed = 0;
  if (!errmsg && j->chat) have_parsed = chat_parse_output(j->text.p ? j->text.p : "", &parsed) == 0;
  if (have_parsed && parsed.n_tool_calls > 0 && !strcmp(finish, "stop")) finish = "tool_calls";
  char *body = NULL;
  int status = 200;
  if (j->stream) {
    if (errmsg) {
      cJSON *o = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(o, "error");
      add_str(e, "message", errmsg, strlen(errmsg));
      cJSON_AddStringToObject(e, "type", "server_error");
      cJSON_AddNullToObject(e, "param");
      cJSON_AddStringToObject(e, "code", "backend_error");
      push_sse(S, j, o);
    } else {
      cJSON *o = chunk_base(j), *ch = cJSON_AddArrayToObject(o, "choices"), *c = cJSON_CreateObject();
      cJSON_AddItemToArray(ch, c);
      cJSON_AddNumberToObject(c, "index", 0);
      if (j->chat) {
        sbuf r = {0}, t = {0};
        split_feed(j, "", 0, &r, &t, 1);
        cJSON *d = cJSON_AddObjectToObject(c, "delta");
        if (r.n) add_str(d, "reasoning_content", r.p, r.n);
        if (t.n) add_str(d, "content", t.p, t.n);
        sbuf_free(&r);
        sbuf_free(&t);
        if (have_parsed && parsed.n_tool_calls > 0) cJSON_AddItemToObject(d, "tool_calls", tool_calls_json(j, &parsed, 1));
      } else {
        cJSON_AddStringToObject(c, "text", "");
      }
      cJSON_AddNullToObject(c, "logprobs");
      cJSON_AddStringToObject(c, "finish_reason", finish);
      push_sse(S, j, o);
      if (j->include_usage) {
        o = chunk_base(j);
        cJSON_AddArrayToObject(o, "choices");
        cJSON_AddItemToObject(o, "usage", usage(j));
        push_sse(S, j, o);
      }
    }
    push_sse(S, j, NULL);
  } else if (errmsg) {
    status = 500;
    body = api_error_json(errmsg, "server_error", NULL, "backend_error");
  } else {
    cJSON *o = chunk_base(j), *ch = cJSON_AddArrayToObject(o, "choices"), *c = cJSON_CreateObject();
    cJSON_AddItemToArray(ch, c);
    cJSON_AddNumberToObject(c, "index", 0);
    if (j->chat) {
      cJSON *m = cJSON_AddObjectToObject(c, "message");
      cJSON_AddStringToObject(m, "role", "assistant");
      const char *content = have_parsed ? parsed.content : NULL;
      if (content) add_str(m, "content", content, strlen(content));
      else if (have_parsed && parsed.n_tool_calls > 0) cJSON_AddNullToObject(m, "content");
      else cJSON_AddStringToObject(m, "content", "");
      if (have_parsed && parsed.reasoning) add_str(m, "reasoning_content", parsed.reasoning, strlen(parsed.reasoning));
      if (have_parsed && parsed.n_tool_calls > 0) cJSON_AddItemToObject(m, "tool_calls", tool_calls_json(j, &parsed, 0));
      if (j->lp) {
        cJSON *l = cJSON_AddObjectToObject(c, "logprobs");
        cJSON_AddItemToObject(l, "content", j->lp);
        j->lp = NULL;
      } else {
        cJSON_AddNullToObject(c, "logprobs");
      }
    } else {
      add_str(c, "text", j->text.p ? j->text.p : "", j->text.n);
      if (j->lp) { cJSON_AddItemToObject(c, "logprobs", j->lp); j->lp = NULL; }
      else cJSON_AddNullToObject(c, "logprobs");
    }
    cJSON_AddStringToObject(c, "finish_reason", finish);
    cJSON_AddItemToObject(o, "usage", usage(j));
    body = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
  }
  if (have_parsed) chat_parsed_free(&parsed);
  pthread_mutex_lock(&S->mu);
  j->result = body;
  j->status = status;
  j->done = 1;
  pthread_cond_broadcast(&j->cv);
  pthread_mutex_unlock(&S->mu);
}
