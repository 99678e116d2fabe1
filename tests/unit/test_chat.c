/* GLM-5.3 chat renderer and output parser: the shared render cases must be
 * byte-identical (tests/data/glm5/chat_render_cases.json, copied from
 * shared/data/glm5), plus hand-checked cases for the struct API, error paths
 * and chat_parse_output. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "core/err.h"
#include "core/util.h"
#include "test_util.h"
#include "tokenizer/chat.h"

static void shared_cases(void) {
  size_t len;
  char *buf = read_file("tests/data/glm5/chat_render_cases.json", &len);
  CHECK(buf != NULL, "%s", glm53_last_error());
  if (!buf) return;
  cJSON *root = cJSON_Parse(buf);
  free(buf);
  const cJSON *c;
  int n = 0;
  cJSON_ArrayForEach(c, cJSON_GetObjectItem(root, "cases")) {
    char *kw = cJSON_PrintUnformatted(cJSON_GetObjectItem(c, "kwargs"));
    char *out = chat_render_json(kw);
    const char *want = cJSON_GetObjectItem(c, "rendered")->valuestring;
    CHECK(out && !strcmp(out, want), "case %s:\n got: %s\nwant: %s", cJSON_GetObjectItem(c, "name")->valuestring,
          out ? out : glm53_last_error(), want);
    free(out);
    free(kw);
    n++;
  }
  CHECK(n == 7, "expected 7 shared cases, got %d", n);
  cJSON_Delete(root);
}

static void struct_api(void) {
  chat_tool_call calls[2] = {{"f", "{\"x\": 1.5, \"s\": \"v\", \"o\": {\"k\": [1, true, null]}}", "id1"},
                             {"g", "{}", "id2"}};
  chat_message msgs[] = {
      {.role = "system", .content = "S"},
      {.role = "user", .content = "Q"},
      {.role = "assistant", .content = "  \n", .reasoning_content = "R", .tool_calls = calls, .n_tool_calls = 2},
      {.role = "tool", .content = "B", .tool_call_id = "id2"},
      {.role = "tool", .content = "A", .tool_call_id = "id1"},
  };
  chat_request r = {.messages = msgs, .n_messages = 5, .reasoning_effort = "medium", .add_generation_prompt = 1};
  char *out = chat_render(&r);
  const char *want =
      "[gMASK]<sop><|system|>Reasoning Effort: Max<|system|>S<|user|>Q<|assistant|><think>R</think>"
      "<tool_call>f<arg_key>x</arg_key><arg_value>1.5</arg_value><arg_key>s</arg_key><arg_value>v</arg_value>"
      "<arg_key>o</arg_key><arg_value>{\"k\": [1, true, null]}</arg_value></tool_call><tool_call>g</tool_call>"
      "<|observation|><tool_response>A</tool_response><tool_response>B</tool_response><|assistant|><think>";
  CHECK(out && !strcmp(out, want), "got %s", out ? out : glm53_last_error());
  free(out);

  chat_message bad[] = {{.role = "wizard", .content = "x"}};
  r = (chat_request){.messages = bad, .n_messages = 1};
  CHECK(chat_render(&r) == NULL && strstr(glm53_last_error(), "role"), "unknown role must fail");
  chat_tool_call badc = {"f", "[1]", NULL};
  chat_message bad2[] = {{.role = "assistant", .content = "", .tool_calls = &badc, .n_tool_calls = 1}};
  r = (chat_request){.messages = bad2, .n_messages = 1};
  CHECK(chat_render(&r) == NULL, "array arguments must fail");
  r = (chat_request){.messages = msgs, .n_messages = 1, .tools_json = "{not json"};
  CHECK(chat_render(&r) == NULL, "bad tools JSON must fail");
  CHECK(chat_render_json("[]") == NULL, "kwargs must be an object");
}

static void parse(void) {
  chat_parsed p;
  CHECK(chat_parse_output("I think.\n</think>\n\nHello!", &p) == 0);
  CHECK(p.reasoning && !strcmp(p.reasoning, "I think."), "%s", p.reasoning);
  CHECK(p.content && !strcmp(p.content, "Hello!"), "%s", p.content);
  CHECK(p.n_tool_calls == 0);
  chat_parsed_free(&p);

  CHECK(chat_parse_output("still thinking", &p) == 0);
  CHECK(p.reasoning && !strcmp(p.reasoning, "still thinking") && !p.content);
  chat_parsed_free(&p);

  CHECK(chat_parse_output("need tool</think>Let me check.<tool_call>get_weather<arg_key>city</arg_key>"
                          "<arg_value>Paris</arg_value><arg_key>days</arg_key><arg_value>2</arg_value></tool_call>"
                          "<tool_call>now</tool_call>",
                          &p) == 0);
  CHECK(p.reasoning && !strcmp(p.reasoning, "need tool"));
  CHECK(p.content && !strcmp(p.content, "Let me check."), "%s", p.content);
  CHECK(p.n_tool_calls == 2, "%d", p.n_tool_calls);
  if (p.n_tool_calls == 2) {
    CHECK(!strcmp(p.tool_names[0], "get_weather"));
    CHECK(!strcmp(p.tool_args_json[0], "{\"city\":\"Paris\",\"days\":2}"), "%s", p.tool_args_json[0]);
    CHECK(!strcmp(p.tool_names[1], "now") && !strcmp(p.tool_args_json[1], "{}"));
  }
  chat_parsed_free(&p);

  CHECK(chat_parse_output("</think><tool_call>f<arg_key>a</arg_key></tool_call>", &p) == -1, "malformed call");
  chat_parsed_free(&p);
  CHECK(chat_parse_output("</think><tool_call>f<arg_key>a", &p) == 0 && p.n_tool_calls == 0, "unfinished call ignored");
  chat_parsed_free(&p);
}

int main(void) {
  shared_cases();
  struct_api();
  parse();
  TEST_DONE();
}
