/* glm53 serve: the OpenAI-compatible HTTP server (docs/server.md), and
 * `glm53 serve --stop --pid-file F` to stop one started with that pid file. */
#include "cli/cli.h"
#include "core/err.h"
#include "core/log.h"
#include "core/util.h"
#include "server/server.h"
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void usage(void) {
  printf("usage: glm53 serve [--model PATH] [--host 127.0.0.1] [--port 8080] [options]\n"
         "       glm53 serve --stop --pid-file F\n\n"
         "  --model PATH           model directory or .g53 (default: the embedded model)\n"
         "  --model-name NAME      id in /v1/models and responses (default: model dir name)\n"
         "  --backend auto|cpu|gpu, --threads N\n"
         "  --host ADDR            bind address (default 127.0.0.1; use 0.0.0.0 to expose)\n"
         "  --port N               TCP port (default 8080; 0 = any free port, printed at start)\n"
         "  --api-key KEY          require 'Authorization: Bearer KEY' on /v1/* (default: $GLM53_API_KEY)\n"
         "  --ctx N                tokens per request, prompt + output (default 4096)\n"
         "  --parallel N           requests generated at once (default 4)\n"
         "  --queue N              requests that may wait beyond those (default 64; more get 429)\n"
         "  --max-body BYTES       request body limit (default 1048576; more get 413)\n"
         "  --prefill-chunk N      prompt tokens per scheduler step (default 64)\n"
         "  --on-gpu-error fail|cpu  on a backend error: fail that request, or rebuild it on the CPU and go on\n"
         "  --grace SECONDS        on SIGTERM/SIGINT, let in-flight requests finish this long (default 30)\n"
         "  --pid-file F           write the process id to F (removed at exit)\n"
         "  --stop                 stop the server whose pid is in --pid-file (SIGTERM, waits for exit)\n");
}

static int int_opt(int argc, char **argv, const char *name, int def, int lo, int hi, int *out) {
  const char *v = cli_opt(argc, argv, name);
  if (!v) { *out = def; return 0; }
  char *end;
  errno = 0;
  long x = strtol(v, &end, 10);
  if (errno || *end || end == v || x < lo || x > hi) {
    fprintf(stderr, "glm53 serve: %s must be an integer in [%d, %d] (got '%s')\n", name, lo, hi, v);
    return -1;
  }
  *out = (int)x;
  return 0;
}

/* 1 if /proc/PID/cmdline is a `glm53 serve` process. */
static int is_glm53_serve(long pid) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%ld/cmdline", pid);
  FILE *f = fopen(path, "rb"); /* /proc files report size 0: read_file cannot be used */
  if (!f) return 0;
  char c[4096];
  size_t n = fread(c, 1, sizeof c - 1, f);
  fclose(f);
  c[n] = 0;
  int prog = 0, serve = 0, i = 0;
  for (size_t off = 0; off < n; off += strlen(c + off) + 1, i++) {
    const char *a = c + off, *base = strrchr(a, '/');
    base = base ? base + 1 : a;
    if (i == 0 && strstr(base, "glm53")) prog = 1;
    if (i == 1 && !strcmp(a, "serve")) serve = 1;
  }
  return prog && serve;
}

static int do_stop(const char *pid_file) {
  if (!pid_file) { fprintf(stderr, "glm53 serve: --stop needs --pid-file F\n"); return 2; }
  size_t n;
  char *t = read_file(pid_file, &n);
  if (!t) { fprintf(stderr, "glm53 serve: cannot read pid file %s: %s\n", pid_file, glm53_last_error()); return 1; }
  char *end;
  long pid = strtol(t, &end, 10);
  int bad = end == t || pid <= 1;
  free(t);
  if (bad) { fprintf(stderr, "glm53 serve: %s does not hold a process id\n", pid_file); return 1; }
  if (!is_glm53_serve(pid)) {
    fprintf(stderr, "glm53 serve: process %ld from %s is not a running 'glm53 serve'; not signalling it\n", pid, pid_file);
    return 1;
  }
  if (kill((pid_t)pid, SIGTERM)) { fprintf(stderr, "glm53 serve: cannot signal %ld: %s\n", pid, strerror(errno)); return 1; }
  for (int i = 0; i < 1200; i++) { /* up to 60 s */
    if (!is_glm53_serve(pid)) { fprintf(stderr, "glm53 serve: stopped server %ld\n", pid); return 0; }
    struct timespec ts = {0, 50 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  fprintf(stderr, "glm53 serve: server %ld did not exit within 60 s\n", pid);
  return 1;
}

int cmd_serve(int argc, char **argv) {
  static const char *const known[] = {"--model=", "--model-name=", "--backend=", "--threads=", "--host=", "--port=",
                                      "--api-key=", "--ctx=", "--parallel=", "--queue=", "--max-body=",
                                      "--prefill-chunk=", "--on-gpu-error=", "--grace=", "--pid-file=", "--stop",
                                      "--help", NULL};
  if (cli_flag(argc, argv, "--help") || cli_flag(argc, argv, "-h")) { usage(); return 0; }
  if (cli_check_opts(argc, argv, "serve", known)) return 2;
  const char *pid_file = cli_opt(argc, argv, "--pid-file");
  if (cli_flag(argc, argv, "--stop")) return do_stop(pid_file);

  srv_opts o;
  srv_opts_default(&o);
  int max_body = 0, grace = 0;
  if (int_opt(argc, argv, "--port", 8080, 0, 65535, &o.port) || int_opt(argc, argv, "--ctx", 4096, 2, 1 << 24, &o.ctx) ||
      int_opt(argc, argv, "--parallel", 4, 1, 1024, &o.parallel) || int_opt(argc, argv, "--queue", 64, 0, 1 << 20, &o.queue) ||
      int_opt(argc, argv, "--max-body", 1 << 20, 1024, 1 << 30, &max_body) ||
      int_opt(argc, argv, "--prefill-chunk", 64, 1, 1 << 16, &o.prefill_chunk) ||
      int_opt(argc, argv, "--grace", 30, 0, 3600, &grace))
    return 2;
  o.max_body = (size_t)max_body;
  o.max_connections = o.parallel + o.queue + 64;
  if (cli_opt(argc, argv, "--host")) o.host = cli_opt(argc, argv, "--host");
  o.api_key = cli_opt(argc, argv, "--api-key");
  if (!o.api_key) o.api_key = getenv("GLM53_API_KEY");
  o.model_name = cli_opt(argc, argv, "--model-name");
  const char *oe = cli_opt(argc, argv, "--on-gpu-error");
  if (oe && strcmp(oe, "fail") && strcmp(oe, "cpu")) {
    fprintf(stderr, "glm53 serve: --on-gpu-error must be 'fail' or 'cpu' (got '%s')\n", oe);
    return 2;
  }
  o.on_gpu_error_cpu = oe && !strcmp(oe, "cpu");

  glm53_model *m = cli_load_model(argc, argv);
  if (!m) return 1;
  char tpath[4096];
  snprintf(tpath, sizeof tpath, "%s/tokenizer.json", glm53_model_dir(m) ? glm53_model_dir(m) : ".");
  glm53_tokenizer *tok = tok_load(tpath);
  if (!tok) {
    fprintf(stderr, "glm53 serve: %s\n", glm53_last_error());
    glm53_model_free(m);
    return 1;
  }
  /* Signals go to sigwait below, not to whichever thread happens to run. */
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, NULL);
  signal(SIGPIPE, SIG_IGN);

  srv *S = srv_start(m, tok, &o);
  if (!S) {
    fprintf(stderr, "glm53 serve: %s\n", glm53_last_error());
    tok_free(tok);
    glm53_model_free(m);
    return 1;
  }
  char pidtxt[32];
  int pn = snprintf(pidtxt, sizeof pidtxt, "%ld\n", (long)getpid());
  if (pid_file && write_file_atomic(pid_file, pidtxt, (size_t)pn)) {
    fprintf(stderr, "glm53 serve: cannot write pid file %s: %s\n", pid_file, glm53_last_error());
    srv_stop(S, 0);
    tok_free(tok);
    glm53_model_free(m);
    return 1;
  }
  fprintf(stderr,
          "glm53 serve: listening on http://%s:%d (backend %s, ctx %d, parallel %d = max decode batch, queue %d%s)\n",
          o.host, srv_port(S), glm53_model_backend(m), o.ctx, o.parallel, o.queue, o.api_key ? ", api key required" : "");
  int sig = 0;
  sigwait(&set, &sig);
  fprintf(stderr, "glm53 serve: %s received, finishing in-flight requests (up to %d s)\n", sig == SIGINT ? "SIGINT" : "SIGTERM",
          grace);
  srv_stop(S, grace);
  if (pid_file) { /* remove it only if it is still ours */
    size_t n;
    char *t = read_file(pid_file, &n);
    if (t && strtol(t, NULL, 10) == (long)getpid()) unlink(pid_file);
    free(t);
  }
  tok_free(tok);
  glm53_model_free(m);
  fprintf(stderr, "glm53 serve: stopped\n");
  return 0;
}
