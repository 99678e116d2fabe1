/* Server request/response logic without HTTP: UTF-8 checks, request
 * validation (status + param), the chat output split into reasoning /
 * content / tool_calls, streamed and not, with tags cut across chunks. */
#include "server/srv_internal.h"
#include "model_fixture.h"
#include "tokenizer/tokenizer.h"
#include <cjson/cJSON.h>

static srv S;

static job *mkjob(int chat, int stream) {
  char *err = NULL;
  int status = 0;
  const char *body = chat ? "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}" : "{\"prompt\":\"hi\"}";
  job *j = api_parse_request(&S, chat, body, strlen(body), &err, &status);
  CHECK(j != NULL, "%s", err ? err : "");
  free(err);
  if (j) { j->stream = stream; j->srv = &S; }
  return j;
}

static void emit(job *j, const char *t) { api_emit_token(&S, j, 5, t, strlen(t), -1.0f, NULL, 0); }

static void expect_error(const char *body, int chat, int want_status, const char *want_param) {
  char *err = NULL;
  int status = 0;
  job *j = api_parse_request(&S, chat, body, strlen(body), &err, &status);
  CHECK(j == NULL, "accepted: %s", body);
  if (j) { pthread_mutex_lock(&S.mu); job_release(&S, j); pthread_mutex_unlock(&S.mu); return; }
  CHECK(status == want_status, "%s: status %d want %d", body, status, want_status);
  cJSON *o = cJSON_Parse(err);
  const cJSON *e = cJSON_GetObjectItem(o, "error");
  CHECK(cJSON_IsString(cJSON_GetObjectItem(e, "message")), "%s", err);
  const cJSON *p = cJSON_GetObjectItem(e, "param");
  if (want_param) CHECK(cJSON_IsString(p) && !strcmp(p->valuestring, want_param), "%s: param in %s", body, err);
  else CHECK(cJSON_IsNull(p), "%s: param should be null in %s", body, err);
  cJSON_Delete(o);
  free(err);
}

static void test_utf8(void) {
  CHECK(utf8_valid("abc \xC3\xA9 \xE4\xB8\xAD \xF0\x9F\x98\x80", 16));
  CHECK(!utf8_valid("\xC0\x80", 2), "overlong");
  CHECK(!utf8_valid("\xED\xA0\x80", 3), "surrogate");
  CHECK(!utf8_valid("\xF4\x90\x80\x80", 4), "above U+10FFFF");
  CHECK(!utf8_valid("\xE4\xB8", 2), "truncated");
  CHECK(!utf8_valid("\x80", 1), "lone continuation");
  char *s = utf8_sanitize("a\xFF" "b\xE4\xB8", 5);
  CHECK(!strcmp(s, "a\xEF\xBF\xBD" "b\xEF\xBF\xBD\xEF\xBF\xBD"), "got %s", s);
  free(s);
}

static void test_validation(void) {
  expect_error("{\"prompt\":\"hi\",\"temperature\":-1}", 0, 400, "temperature");
  expect_error("{\"prompt\":\"hi\",\"max_tokens\":-3}", 0, 400, "max_tokens");
  expect_error("{\"prompt\":\"hi\",\"stop\":[1]}", 0, 400, "stop");
  expect_error("{\"prompt\":true}", 0, 400, "prompt");
  expect_error("{\"messages\":{}}", 1, 400, "messages");
  expect_error("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"model\":\"nope\"}", 1, 404, "model");
  expect_error("{\"prompt\":\"hi\"", 0, 400, NULL);
  expect_error("{\"prompt\":\"\xFF\"}", 0, 400, NULL);
  expect_error("{\"prompt\":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16]}", 0, 400, "prompt"); /* ctx 16 */
  job *j = mkjob(0, 0);
  if (j) {
    CHECK(j->gp.max_tokens == 16, "completions default max_tokens %d", j->gp.max_tokens);
    CHECK(j->gp.sp.temperature == 1.0f);
    pthread_mutex_lock(&S.mu); job_release(&S, j); pthread_mutex_unlock(&S.mu);
  }
}

static const char *TOOL_TEXT[] = {"thinking", " hard</thi", "nk>Hello <tool_", "call>get_weather<arg_key>city</arg_key>",
                                  "<arg_value>Paris</arg_value></tool_call>"};

static void test_chat_nonstream(void) {
  job *j = mkjob(1, 0);
  if (!j) return;
  for (size_t i = 0; i < 5; i++) emit(j, TOOL_TEXT[i]);
  api_finish(&S, j, "stop", NULL);
  CHECK(j->done && j->status == 200);
  cJSON *o = cJSON_Parse(j->result);
  const cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0), *m = cJSON_GetObjectItem(c, "message");
  CHECK(!strcmp(cJSON_GetObjectItem(c, "finish_reason")->valuestring, "tool_calls"), "%s", j->result);
  CHECK(!strcmp(cJSON_GetObjectItem(m, "reasoning_content")->valuestring, "thinking hard"), "%s", j->result);
  CHECK(!strcmp(cJSON_GetObjectItem(m, "content")->valuestring, "Hello"), "%s", j->result);
  const cJSON *tc = cJSON_GetArrayItem(cJSON_GetObjectItem(m, "tool_calls"), 0), *f = cJSON_GetObjectItem(tc, "function");
  CHECK(f && !strcmp(cJSON_GetObjectItem(f, "name")->valuestring, "get_weather"), "%s", j->result);
  cJSON *args = f ? cJSON_Parse(cJSON_GetObjectItem(f, "arguments")->valuestring) : NULL;
  CHECK(args && !strcmp(cJSON_GetObjectItem(args, "city")->valuestring, "Paris"), "%s", j->result);
  CHECK(!strcmp(cJSON_GetObjectItem(tc, "type")->valuestring, "function"));
  cJSON_Delete(args);
  cJSON_Delete(o);
  pthread_mutex_lock(&S.mu); job_release(&S, j); pthread_mutex_unlock(&S.mu);
}

static void test_chat_stream(void) {
  job *j = mkjob(1, 1);
  if (!j) return;
  for (size_t i = 0; i < 5; i++) emit(j, TOOL_TEXT[i]);
  api_finish(&S, j, "stop", NULL);
  char reasoning[256] = "", content[256] = "", *finish = NULL, *tool = NULL;
  int done = 0, n = 0;
  for (char *line = strtok(j->out.p, "\n"); line; line = strtok(NULL, "\n")) {
    CHECK(!strncmp(line, "data: ", 6), "%s", line);
    if (!strcmp(line + 6, "[DONE]")) { done = 1; continue; }
    cJSON *o = cJSON_Parse(line + 6);
    CHECK(o != NULL, "chunk %s", line);
    n++;
    const cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0), *d = cJSON_GetObjectItem(c, "delta");
    const cJSON *r = cJSON_GetObjectItem(d, "reasoning_content"), *t = cJSON_GetObjectItem(d, "content");
    if (cJSON_IsString(r)) strncat(reasoning, r->valuestring, sizeof reasoning - strlen(reasoning) - 1);
    if (cJSON_IsString(t)) strncat(content, t->valuestring, sizeof content - strlen(content) - 1);
    const cJSON *fr = cJSON_GetObjectItem(c, "finish_reason");
    if (cJSON_IsString(fr)) finish = xstrdup(fr->valuestring);
    const cJSON *tc = cJSON_GetObjectItem(d, "tool_calls");
    if (tc) tool = xstrdup(cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetArrayItem(tc, 0), "function"), "name")->valuestring);
    cJSON_Delete(o);
  }
  CHECK(done && n >= 3, "done %d, %d chunks", done, n);
  CHECK(!strcmp(reasoning, "thinking hard"), "reasoning '%s'", reasoning);
  CHECK(!strcmp(content, "Hello "), "content '%s'", content);
  CHECK(finish && !strcmp(finish, "tool_calls"), "finish %s", finish ? finish : "(none)");
  CHECK(tool && !strcmp(tool, "get_weather"));
  free(finish);
  free(tool);
  pthread_mutex_lock(&S.mu); job_release(&S, j); pthread_mutex_unlock(&S.mu);
}

static void test_stream_error(void) {
  job *j = mkjob(0, 1);
  if (!j) return;
  emit(j, "partial");
  api_finish(&S, j, NULL, "gpu backend error: injected");
  CHECK(strstr(j->out.p, "\"error\"") && strstr(j->out.p, "injected"), "%s", j->out.p);
  CHECK(j->out.n >= 14 && !strcmp(j->out.p + j->out.n - 14, "data: [DONE]\n\n"), "%s", j->out.p);
  pthread_mutex_lock(&S.mu); job_release(&S, j); pthread_mutex_unlock(&S.mu);
}

int main(void) {
  glm53_config c;
  fx_config(&c, 8, 4, 0);
  c.vocab_size = 320; /* covers the fixture tokenizer (ids < 305) */
  glm53_model *m = fx_model(&c, 1);
  glm53_tokenizer *tok = tok_load("tests/data/tokenizer/fixtures/bpe_small.json");
  CHECK(tok != NULL, "%s", glm53_last_error());
  if (!tok) TEST_DONE();
  srv_opts_default(&S.o);
  S.o.ctx = 16;
  S.m = m;
  S.tok = tok;
  S.model_name = "tiny";
  pthread_mutex_init(&S.mu, NULL);
  test_utf8();
  test_validation();
  S.o.ctx = 4096; /* the chat template alone is longer than 16 tokens */
  test_chat_nonstream();
  test_chat_stream();
  test_stream_error();
  pthread_mutex_destroy(&S.mu);
  tok_free(tok);
  glm53_model_free(m);
  TEST_DONE();
}
