/* glm53 run: one prompt in, streamed completion out (docs/cli.md). */
#include "cli/cli.h"
#include "cli/cli_gen.h"
#include "core/err.h"
#include "core/util.h"
#include "tokenizer/chat.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const run_opts[] = {CLI_GEN_OPTS, "--prompt=", "--chat", "--system=", "--reasoning-effort=",
                                       "--raw", "--help", NULL};

static int print_text(void *user, const gen_token *t) {
  (void)user;
  if (t->text_len) {
    fwrite(t->text, 1, t->text_len, stdout);
    fflush(stdout);
  }
  return 0;
}

static const char *finish_name(int f) {
  static const char *n[] = {"stop", "length", "cancelled", "error"};
  return f >= 0 && f <= 3 ? n[f] : "?";
}

int cmd_run(int argc, char **argv) {
  if (cli_flag(argc, argv, "--help")) {
    printf("usage: glm53 run [--model DIR] -p PROMPT [options]\n"
           "  Generates a completion of PROMPT and streams it to stdout; a stats line goes to stderr.\n"
           "  -p, --prompt TEXT     the prompt (special tokens such as <|user|> in it are recognised)\n"
           "  --raw                 encode the prompt as plain text (special-token strings are not parsed)\n"
           "  --chat                wrap the prompt as one user message in the GLM chat template\n"
           "  --system TEXT         with --chat: a system message first\n"
           "  --reasoning-effort low|high|max   with --chat (default max)\n" CLI_GEN_HELP);
    return 0;
  }
  /* accept the short -p: rewrite it to --prompt before the common checks */
  char **av = xcalloc((size_t)argc + 1, sizeof *av);
  for (int i = 0; i < argc; i++) av[i] = !strcmp(argv[i], "-p") ? "--prompt" : argv[i];
  int rc = 1;
  glm53_model *m = NULL;
  glm53_tokenizer *tok = NULL;
  glm53_session *s = NULL;
  const char **stops = NULL;
  char *text = NULL;
  int32_t *ids = NULL;
  if (cli_check_opts(argc, av, "run", run_opts)) { rc = 2; goto out; }
  const char *prompt = cli_opt(argc, av, "--prompt");
  if (!prompt) { fprintf(stderr, "glm53 run: a prompt is required (-p TEXT)\n"); rc = 2; goto out; }
  int chat = cli_flag(argc, av, "--chat"), raw = cli_flag(argc, av, "--raw");
  if (cli_precheck_tokenizer(argc, av, "run")) goto out;
  if (!(m = cli_load_model(argc, av))) goto out;
  if (!(tok = cli_load_tokenizer(m, "run"))) goto out;
  gen_params p;
  int ctx;
  if (cli_gen_params(argc, av, "run", m, &p, &stops, &ctx)) { rc = 2; goto out; }

  if (chat) {
    chat_message msgs[2];
    int n = 0;
    const char *sys = cli_opt(argc, av, "--system");
    if (sys) msgs[n++] = (chat_message){.role = "system", .content = sys};
    msgs[n++] = (chat_message){.role = "user", .content = prompt};
    chat_request req = {.messages = msgs, .n_messages = n, .add_generation_prompt = 1,
                        .reasoning_effort = cli_opt(argc, av, "--reasoning-effort")};
    if (!(text = chat_render(&req))) { fprintf(stderr, "glm53 run: %s\n", glm53_last_error()); goto out; }
  } else {
    text = xstrdup(prompt);
  }
  size_t n_ids = 0;
  /* the chat template's markers must become special tokens, whatever --raw says */
  if (tok_encode(tok, text, strlen(text), chat || !raw, &ids, &n_ids)) {
    fprintf(stderr, "glm53 run: %s\n", glm53_last_error());
    goto out;
  }
  if (n_ids == 0) { fprintf(stderr, "glm53 run: the prompt encodes to no tokens\n"); goto out; }
  if ((int64_t)n_ids >= ctx) {
    fprintf(stderr, "glm53 run: prompt too long: %zu tokens do not fit the %d-token context (raise --ctx)\n", n_ids, ctx);
    goto out;
  }
  if (!(s = glm53_session_new(m, ctx))) { fprintf(stderr, "glm53 run: %s\n", glm53_last_error()); goto out; }
  gen_result r;
  if (gen_run(s, tok, ids, (int)n_ids, &p, print_text, NULL, &r)) {
    fprintf(stdout, "\n");
    fprintf(stderr, "glm53 run: %s\n", glm53_last_error());
    goto out;
  }
  fprintf(stdout, "\n");
  fflush(stdout);
  fprintf(stderr, "[prompt %d tokens, %.1f tok/s | generated %d tokens, %.1f tok/s | finish: %s | seed %llu]\n",
          r.n_prompt, r.prefill_s > 0 ? r.n_prompt / r.prefill_s : 0.0, r.n_generated,
          r.decode_s > 0 ? r.n_generated / r.decode_s : 0.0, finish_name(r.finish), (unsigned long long)p.sp.seed);
  rc = 0;
out:
  glm53_session_free(s);
  tok_free(tok);
  glm53_model_free(m);
  free(ids);
  free(text);
  free(stops);
  free(av);
  return rc;
}
