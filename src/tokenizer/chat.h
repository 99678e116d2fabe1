/* GLM-5.3 chat format: a native renderer that produces exactly what the
 * official chat_template.jinja (shared/data/glm5) renders, and a parser for
 * the model's assistant output (reasoning / content / GLM XML tool calls). */
#ifndef GLM53_CHAT_H
#define GLM53_CHAT_H

/* id (may be NULL) was added after the brief's draft: the template uses the
 * ids to put tool results in tool-call order. arguments_json must be a JSON
 * object (OpenAI sends it as a string holding one). */
typedef struct { const char *name; const char *arguments_json; const char *id; } chat_tool_call;
/* role: "system" | "user" | "assistant" | "tool". content / reasoning_content
 * may be NULL (reasoning NULL: taken from <think>..</think> in the content,
 * as the template does). tool_call_id: for role "tool". */
typedef struct {
  const char *role;
  const char *content;
  const char *reasoning_content;
  const chat_tool_call *tool_calls;
  int n_tool_calls;
  const char *tool_call_id;
} chat_message;
/* tools_json: JSON array of OpenAI tool definitions or NULL. reasoning_effort:
 * "low" | "high"; anything else (NULL, "medium", ...) means max, as in the
 * template. clear_thinking (template kwarg, default 0): drop the reasoning of
 * assistant turns before the last user message. */
typedef struct {
  const chat_message *messages;
  int n_messages;
  const char *tools_json;
  const char *reasoning_effort;
  int add_generation_prompt;
  int clear_thinking;
} chat_request;

/* malloc'd text; NULL + glm53_err on invalid input (unknown role, bad JSON). */
char *chat_render(const chat_request *req);

/* Render from JSON template kwargs: {"messages": [...], "tools": [...],
 * "add_generation_prompt": bool, "reasoning_effort": str, "clear_thinking":
 * bool} with OpenAI-style messages (tool_calls[].function.arguments may be an
 * object or a string holding one; content may be a list of text parts, whose
 * texts are joined, and image/video/audio parts give their placeholder
 * tokens, as the template's visible_text does). NULL + glm53_err on error. */
char *chat_render_json(const char *kwargs_json);

/* Parse model output of an assistant turn (what follows the prompt's
 * "<|assistant|><think>"): text before "</think>" is reasoning (all of it if
 * "</think>" never came); after it, text before the first <tool_call> is the
 * content and each <tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>
 * ...</tool_call> becomes a tool call whose arguments are a JSON object (V
 * that parses as JSON keeps its type, otherwise it is a string). reasoning /
 * content are trimmed of white space; NULL when empty. Returns 0 or -1. */
typedef struct {
  char *reasoning;
  char *content;
  int n_tool_calls;
  char **tool_names;
  char **tool_args_json;
} chat_parsed;
int chat_parse_output(const char *text, chat_parsed *out);
void chat_parsed_free(chat_parsed *p);

#endif
