/* glm53 chat: interactive multi-turn REPL (docs/cli.md).
 *
 * The session cache is kept between turns. Each turn renders the whole
 * conversation with chat_render and compares its tokens with what the session
 * already holds (`fed`): if those are a prefix, only the new suffix is fed;
 * otherwise the session is reset and the whole conversation re-prefilled.
 *
 * Which case applies with GLM-5.3: the template re-emits earlier reasoning
 * (clear_thinking defaults to false) as <|assistant|><think>R</think>C, with
 * R and C stripped, and gen_run leaves the turn's final token (the eos
 * <|user|> or <|observation|>) unfed, which is exactly what the template puts
 * next. So when the model's output is already in canonical form (trimmed, and
 * re-tokenizing its text gives the sampled tokens) only the new user message
 * is fed. A turn that ended by interrupt, length or <|endoftext|>, or output
 * with white space the template strips, does not match and costs a full
 * re-prefill (logged at info level). */
#include "cli/cli.h"
#include "cli/cli_gen.h"
#include "core/err.h"
#include "core/log.h"
#include "core/util.h"
#include "tokenizer/chat.h"
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *const chat_opts[] = {CLI_GEN_OPTS, "--system=", "--reasoning-effort=", "--help", NULL};

static volatile sig_atomic_t g_cancel; /* stop the running generation */
static volatile sig_atomic_t g_sigint; /* a Ctrl-C arrived */

static void on_sigint(int sig) {
  (void)sig;
  g_cancel = 1;
  g_sigint = 1;
}

static void install_sigint(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART; /* output writes must not fail; the prompt read uses ppoll */
  sigaction(SIGINT, &sa, NULL);
}

/* ---- streaming display: reasoning (before </think>) dimmed or labelled ---- */
typedef struct {
  int tty;
  int in_think;     /* the generation prompt opens <think> */
  int answer_start; /* skip white space at the start of the answer */
  char hold[16];    /* a possible prefix of "</think>" */
  size_t nhold;
  char *all;        /* the whole raw output, for the history */
  size_t nall, cap;
  int32_t *toks;    /* reported tokens, in order */
  int ntoks, tcap;
} display;

static const char THINK_END[] = "</think>";

static void out(const char *s, size_t n) {
  if (n) fwrite(s, 1, n, stdout);
}

static void show(display *d, const char *s, size_t n) {
  if (d->in_think) { out(s, n); return; }
  if (d->answer_start) {
    while (n && (*s == '\n' || *s == ' ' || *s == '\r' || *s == '\t')) { s++; n--; }
    if (!n) return;
    d->answer_start = 0;
  }
  out(s, n);
}

static void end_think(display *d) {
  d->in_think = 0;
  d->answer_start = 1;
  fputs(d->tty ? "\033[0m\n" : "\n", stdout);
  fputs(d->tty ? "" : "[answer] ", stdout);
}

/* Feeds text; finds "</think>" even when split across tokens. */
static void display_text(display *d, const char *s, size_t n) {
  while (n) {
    if (!d->in_think) { show(d, s, n); return; }
    /* append to the hold buffer one byte at a time while it can still be a
     * prefix of </think>; else release */
    char c = *s++;
    n--;
    d->hold[d->nhold++] = c;
    if (d->nhold == sizeof THINK_END - 1 && !memcmp(d->hold, THINK_END, d->nhold)) {
      d->nhold = 0;
      end_think(d);
      continue;
    }
    if (!memcmp(d->hold, THINK_END, d->nhold)) continue;
    /* mismatch: release the longest head that cannot start the marker */
    size_t k = 1;
    while (k < d->nhold && memcmp(d->hold + k, THINK_END, d->nhold - k)) k++;
    show(d, d->hold, k);
    memmove(d->hold, d->hold + k, d->nhold - k);
    d->nhold -= k;
  }
}

static int on_token(void *user, const gen_token *t) {
  display *d = user;
  if (t->token >= 0) {
    if (d->ntoks == d->tcap) d->toks = xrealloc(d->toks, (size_t)(d->tcap = d->tcap * 2 + 64) * sizeof(int32_t));
    d->toks[d->ntoks++] = t->token;
  }
  if (d->nall + t->text_len + 1 > d->cap) d->all = xrealloc(d->all, d->cap = (d->nall + t->text_len) * 2 + 64);
  memcpy(d->all + d->nall, t->text, t->text_len);
  d->nall += t->text_len;
  d->all[d->nall] = 0;
  display_text(d, t->text, t->text_len);
  fflush(stdout);
  return 0;
}

/* ---- conversation ---- */
typedef struct {
  chat_message *m;
  int n, cap;
} convo;

static void convo_add(convo *c, const char *role, const char *content, const char *reasoning) {
  if (c->n == c->cap) c->m = xrealloc(c->m, (size_t)(c->cap = c->cap * 2 + 8) * sizeof *c->m);
  c->m[c->n++] = (chat_message){.role = role, .content = content ? xstrdup(content) : NULL,
                                .reasoning_content = reasoning ? xstrdup(reasoning) : NULL};
}

static void convo_pop(convo *c) {
  c->n--;
  free((char *)c->m[c->n].content);
  free((char *)c->m[c->n].reasoning_content);
}

static void convo_clear(convo *c, int keep) {
  while (c->n > keep) convo_pop(c);
}

/* Line reader on fd 0 that a Ctrl-C can interrupt without a race: SIGINT is
 * blocked except inside ppoll, so a signal that came after the prompt was
 * printed but before the wait is seen through g_sigint. */
typedef struct {
  char *buf;
  size_t len, cap;
  size_t consumed; /* bytes of the previous line still at the front */
  int eof;
} line_reader;

/* Returns 1 with *line (NUL-terminated, no newline; valid until the next
 * call), 0 at end of input, or -1 when Ctrl-C was pressed. */
static int read_line(line_reader *r, char **line) {
  if (r->consumed) {
    memmove(r->buf, r->buf + r->consumed, r->len - r->consumed);
    r->len -= r->consumed;
    r->consumed = 0;
  }
  sigset_t block, old;
  sigemptyset(&block);
  sigaddset(&block, SIGINT);
  sigprocmask(SIG_BLOCK, &block, &old);
  int rc;
  for (;;) {
    if (g_sigint) { rc = -1; break; }
    char *nl = r->len ? memchr(r->buf, '\n', r->len) : NULL;
    if (nl || (r->eof && r->len)) {
      size_t n = nl ? (size_t)(nl - r->buf) : r->len;
      r->consumed = nl ? n + 1 : n;
      if (!nl) { /* last line without a newline: make room for the NUL */
        if (r->len + 1 > r->cap) r->buf = xrealloc(r->buf, r->cap = r->len + 1);
      }
      r->buf[n] = 0;
      while (n > 0 && r->buf[n - 1] == '\r') r->buf[--n] = 0;
      *line = r->buf;
      rc = 1;
      break;
    }
    if (r->eof) { rc = 0; break; }
    struct pollfd pfd = {.fd = STDIN_FILENO, .events = POLLIN};
    if (ppoll(&pfd, 1, NULL, &old) < 0) {
      if (errno == EINTR) continue; /* g_sigint is checked at the top */
      r->eof = 1;
      continue;
    }
    if (r->len + 4096 > r->cap) r->buf = xrealloc(r->buf, r->cap = r->cap * 2 + 4096);
    ssize_t k = read(STDIN_FILENO, r->buf + r->len, r->cap - r->len);
    if (k > 0) r->len += (size_t)k;
    else if (k == 0 || errno != EINTR) r->eof = 1;
  }
  sigprocmask(SIG_SETMASK, &old, NULL);
  return rc;
}

int cmd_chat(int argc, char **argv) {
  if (cli_flag(argc, argv, "--help")) {
    printf("usage: glm53 chat [--model DIR] [--system TEXT] [--reasoning-effort low|high|max] [options]\n"
           "  Interactive chat on stdin/stdout. Commands: /reset (new conversation), /quit (or EOF),\n"
           "  /set max-tokens N, /set temperature T.\n"
           "  Ctrl-C stops the reply being generated; Ctrl-C twice at the prompt exits.\n" CLI_GEN_HELP);
    return 0;
  }
  if (cli_check_opts(argc, argv, "chat", chat_opts)) return 2;
  const char *effort = cli_opt(argc, argv, "--reasoning-effort");
  if (effort && strcmp(effort, "low") && strcmp(effort, "high") && strcmp(effort, "max")) {
    fprintf(stderr, "glm53 chat: --reasoning-effort must be low, high or max\n");
    return 2;
  }
  int rc = 1;
  glm53_model *m = NULL;
  glm53_tokenizer *tok = NULL;
  glm53_session *s = NULL;
  const char **stops = NULL;
  convo cv = {0};
  int32_t *fed = NULL;
  int n_fed = 0;
  line_reader lr = {0};
  char *line = NULL;
  display d = {0};
  if (cli_precheck_tokenizer(argc, argv, "chat")) goto out;
  if (!(m = cli_load_model(argc, argv))) goto out;
  if (!(tok = cli_load_tokenizer(m, "chat"))) goto out;
  gen_params p;
  int ctx;
  if (cli_gen_params(argc, argv, "chat", m, &p, &stops, &ctx)) { rc = 2; goto out; }
  if (!(s = glm53_session_new(m, ctx))) { fprintf(stderr, "glm53 chat: %s\n", glm53_last_error()); goto out; }
  fed = xmalloc((size_t)ctx * sizeof(int32_t));
  install_sigint();
  p.cancel = &g_cancel;
  const char *sys = cli_opt(argc, argv, "--system");
  if (sys) convo_add(&cv, "system", sys, NULL);
  const int keep = cv.n;
  d.tty = isatty(STDOUT_FILENO);
  const uint64_t seed0 = p.sp.seed;
  int turn = 0, ctrlc_at_prompt = 0;
  /* test knob: always re-prefill, to check that continuing the cache gives
   * the same replies (tests/integration/test_chat_pty.sh) */
  const char *nr = getenv("GLM53_CHAT_NO_REUSE");
  const int no_reuse = nr && *nr && strcmp(nr, "0");
  printf("glm53 chat - /reset starts over, /quit exits, Ctrl-C stops a reply\n");

  for (;;) {
    g_sigint = 0;
    fputs(">>> ", stdout);
    fflush(stdout);
    int r = read_line(&lr, &line);
    if (r == 0) { fputs("\n", stdout); break; } /* EOF */
    if (r < 0) {
      if (ctrlc_at_prompt) { fputs("\n", stdout); break; }
      ctrlc_at_prompt = 1;
      fputs("\n(Ctrl-C again or /quit to exit)\n", stdout);
      continue;
    }
    ctrlc_at_prompt = 0;
    if (!line[0]) continue;
    if (!strcmp(line, "/quit") || !strcmp(line, "/exit")) break;
    if (!strncmp(line, "/set ", 5)) { /* per-session settings: /set max-tokens N | temperature T */
      char key[32];
      double v;
      if (sscanf(line + 5, "%31s %lf", key, &v) == 2 && !strcmp(key, "max-tokens") && v >= 0 && v <= 1e9)
        p.max_tokens = (int)v;
      else if (sscanf(line + 5, "%31s %lf", key, &v) == 2 && !strcmp(key, "temperature") && v >= 0 && v <= 1e6)
        p.sp.temperature = (float)v;
      else
        fputs("usage: /set max-tokens N | /set temperature T\n", stdout);
      continue;
    }
    if (!strcmp(line, "/reset")) {
      convo_clear(&cv, keep);
      glm53_session_reset(s);
      n_fed = 0;
      fputs("(conversation cleared)\n", stdout);
      continue;
    }

    convo_add(&cv, "user", line, NULL);
    chat_request req = {.messages = cv.m, .n_messages = cv.n, .reasoning_effort = effort, .add_generation_prompt = 1};
    char *text = chat_render(&req);
    int32_t *ids = NULL;
    size_t n_ids = 0;
    if (!text || tok_encode(tok, text, strlen(text), 1, &ids, &n_ids)) {
      fprintf(stderr, "glm53 chat: %s\n", glm53_last_error());
      free(text);
      free(ids);
      convo_pop(&cv);
      continue;
    }
    free(text);
    if ((int64_t)n_ids >= ctx) {
      fprintf(stderr, "glm53 chat: the conversation (%zu tokens) no longer fits the %d-token context; /reset or raise --ctx\n",
              n_ids, ctx);
      free(ids);
      convo_pop(&cv);
      continue;
    }
    /* continue the cache when it holds a prefix of the new rendering */
    int start = 0;
    if (n_fed > 0 && (size_t)n_fed < n_ids && !memcmp(ids, fed, (size_t)n_fed * sizeof(int32_t)) && !no_reuse) {
      start = n_fed;
    } else if (n_fed > 0) {
      LOG_INFO("chat: the rendered conversation differs from the cache; re-prefilling %zu tokens", n_ids);
      glm53_session_reset(s);
      n_fed = 0;
    }

    d.in_think = 1;
    d.answer_start = 0;
    d.nhold = 0;
    d.nall = 0;
    d.ntoks = 0;
    fputs(d.tty ? "\033[2m" : "[reasoning] ", stdout);
    p.sp.seed = seed0 + (uint64_t)turn++;
    g_cancel = 0;
    gen_result res;
    int grc = gen_run(s, tok, ids + start, (int)n_ids - start, &p, on_token, &d, &res);
    if (d.nhold) { show(&d, d.hold, d.nhold); d.nhold = 0; }
    if (d.in_think && d.tty) fputs("\033[0m", stdout);
    fputs("\n", stdout);
    /* what the session now holds: prompt part fed + generated minus the last */
    memcpy(fed + start, ids + start, (size_t)res.n_prompt_fed * sizeof(int32_t));
    n_fed = start + res.n_prompt_fed;
    int ngen_fed = res.n_generated > 0 ? res.n_generated - 1 : 0;
    if (ngen_fed > d.ntoks) ngen_fed = d.ntoks; /* cannot happen (only a final stop id is unreported) */
    memcpy(fed + n_fed, d.toks, (size_t)ngen_fed * sizeof(int32_t));
    n_fed += ngen_fed;
    if (n_fed != glm53_session_pos(s)) { /* error paths: do not trust the cache */
      glm53_session_reset(s);
      n_fed = 0;
    }
    free(ids);
    if (grc) {
      fprintf(stderr, "glm53 chat: %s\n", glm53_last_error());
      convo_pop(&cv);
      continue;
    }
    if (res.finish == GEN_CANCELLED) fputs("[interrupted]\n", stdout);
    else if (res.finish == GEN_LENGTH) fputs("[stopped: token limit or context end]\n", stdout);
    if (res.finish == GEN_CANCELLED && res.n_generated == 0) { convo_pop(&cv); continue; }
    chat_parsed cp;
    if (chat_parse_output(d.nall ? d.all : "", &cp) == 0) {
      convo_add(&cv, "assistant", cp.content ? cp.content : "", cp.reasoning);
      chat_parsed_free(&cp);
    } else {
      convo_add(&cv, "assistant", d.nall ? d.all : "", NULL);
    }
  }
  rc = 0;
out:
  fflush(stdout);
  convo_clear(&cv, 0);
  free(cv.m);
  free(fed);
  free(lr.buf);
  free(d.all);
  free(d.toks);
  glm53_session_free(s);
  tok_free(tok);
  glm53_model_free(m);
  free(stops);
  return rc;
}
