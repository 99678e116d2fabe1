/* Model loading and session lifetime (public API in include/glm53.h). */
#include "model/model.h"
#include "model/backend.h"
#include "model/session.h"
#include "core/err.h"
#include "core/log.h"
#include "core/util.h"
#include "format/g53.h"
#include <omp.h>
#include <stdlib.h>
#include <sys/stat.h>

/* Limits the reference forward relies on, beyond glm53_config_validate. */
static int check_supported(const glm53_config *c) {
  if (c->hc_mult > GLM53_MAX_HC) return glm53_err("config: hc_mult %d above the supported %d", c->hc_mult, GLM53_MAX_HC);
  if (c->index_kpool > 64) return glm53_err("config: index_kpool %d above the supported 64", c->index_kpool);
  int seen_full = 0;
  for (int l = 0; l < c->num_hidden_layers; l++) {
    if (c->layer_types[l] != ATTN_MLA) continue;
    if (c->indexer_types[l] == INDEX_FULL) seen_full = 1;
    else if (!seen_full) return glm53_err("config: DSA layer %d is \"shared\" but no earlier layer runs a full indexer", l);
  }
  return 0;
}

/* A converted model: config from the header, matrices bound into the mmap.
 * Cheap integrity checks always run (g53_open); full checksums only when
 * GLM53_VERIFY=1 (or glm53 info --verify), since they read every byte. */
static int load_g53(glm53_model *m, const char *path) {
  g53_file *f = g53_open(path);
  if (!f) return -1;
  m->st = f;
  free(m->dir);
  m->dir = xstrdup(g53_dir(f));
  const char *v = getenv("GLM53_VERIFY");
  if (v && *v && strcmp(v, "0") && g53_verify(f, 1)) return -1;
  if (glm53_config_parse(g53_config_json(f), &m->cfg) || glm53_config_validate(&m->cfg) || check_supported(&m->cfg)) return -1;
  return model_bind_g53(m, f);
}

glm53_model *glm53_model_load(const char *path, const glm53_load_opts *opts) {
  (void)opts;
  struct stat sb;
  if (stat(path, &sb) != 0) { glm53_err("model path %s does not exist", path); return NULL; }
  int is_g53 = g53_is_g53(path);
  if (!is_g53 && !S_ISDIR(sb.st_mode)) { glm53_err("model path %s: expected a checkpoint directory or a .g53 model", path); return NULL; }
  glm53_model *m = xcalloc(1, sizeof *m);
  m->dir = xstrdup(path);
  m->backend = glm53_cpu_backend();
  m->gpu_expert_gb = opts ? opts->gpu_expert_gb : 0;
  if (opts && opts->n_threads > 0) omp_set_num_threads(opts->n_threads); /* CPU threads for this process */
  double t0 = now_sec();
  int rc = is_g53 ? load_g53(m, path)
                  : (glm53_config_load_dir(path, &m->cfg) || glm53_config_validate(&m->cfg) || check_supported(&m->cfg) ||
                     model_bind_safetensors(m, path));
  if (rc || glm53_backend_select(m, opts ? opts->backend : NULL)) {
    glm53_err_ctx("%s", path);
    glm53_model_free(m);
    return NULL;
  }
  const glm53_config *c = &m->cfg;
  int nkda = 0;
  for (int l = 0; l < c->num_hidden_layers; l++) nkda += c->layer_types[l] == ATTN_KDA;
  LOG_INFO("loaded %s: %d layers (%d KDA, %d MLA), hidden %d, vocab %d, %d experts top-%d; %.1f MB %s weights in %.2f s",
           path, c->num_hidden_layers, nkda, c->num_hidden_layers - nkda, c->hidden_size, c->vocab_size, c->n_routed_experts,
           c->num_experts_per_tok, m->weight_bytes / 1e6, is_g53 ? ".g53 (mmapped)" : "fp32", now_sec() - t0);
  return m;
}

static void free_mlp(mlp_weights *w) {
  wmat_free(&w->gate);
  wmat_free(&w->up);
  wmat_free(&w->down);
}

void model_free_weights(glm53_model *m) {
  const glm53_config *c = &m->cfg;
  wmat_free(&m->embed);
  wmat_free(&m->lm_head);
  free(m->final_norm);
  if (m->layers) {
    for (int l = 0; l < c->num_hidden_layers; l++) {
      layer_weights *L = &m->layers[l];
      free(L->input_norm); free(L->post_attn_norm);
      mhc_weights *hs[2] = {&L->hc_attn, &L->hc_ffn};
      for (int i = 0; i < 2; i++) { free(hs[i]->fn); free(hs[i]->base); free(hs[i]->scale); }
      kda_weights *k = &L->kda;
      wmat *km[] = {&k->q_proj, &k->k_proj, &k->v_proj, &k->f_a, &k->f_b, &k->b_proj, &k->g_a, &k->g_b, &k->o_proj};
      for (size_t i = 0; i < sizeof km / sizeof *km; i++) wmat_free(km[i]);
      free(k->conv); free(k->dt_bias); free(k->A_log); free(k->o_norm);
      mla_weights *a = &L->mla;
      wmat *am[] = {&a->q_a, &a->q_b, &a->kv_a, &a->kv_b, &a->o_proj, &a->idx.wq_b, &a->idx.wk, &a->idx.weights_proj, &a->idx.gate};
      for (size_t i = 0; i < sizeof am / sizeof *am; i++) wmat_free(am[i]);
      free(a->kv_b_f32);
      free(a->q_a_norm); free(a->kv_a_norm); free(a->idx.k_norm_w); free(a->idx.k_norm_b); free(a->idx.ape);
      free_mlp(&L->dense);
      wmat_free(&L->moe.router);
      free(L->moe.bias);
      free_mlp(&L->moe.shared);
      if (L->moe.experts)
        for (int e = 0; e < c->n_routed_experts; e++) free_mlp(&L->moe.experts[e]);
      free(L->moe.experts);
    }
  }
  free(m->layers);
  m->layers = NULL;
}

void glm53_model_free(glm53_model *m) {
  if (!m) return;
  if (m->backend && m->backend->model_free) m->backend->model_free(m);
  model_free_weights(m);
  if (m->st) g53_close(m->st);
  free(m->dir);
  free(m);
}

int glm53_model_vocab_size(const glm53_model *m) { return m->cfg.vocab_size; }
const char *glm53_model_dir(const glm53_model *m) { return m->dir; }

/* The cpu backend's per-session caches (session.h). A session on another
 * backend gets them only when it falls back to the cpu
 * (glm53_session_fallback_cpu), so GPU sessions hold no host copies. */
void session_cpu_state_alloc(glm53_session *s) {
  const glm53_config *c = &s->m->cfg;
  const int max_ctx = s->max_ctx;
  size_t inner = (size_t)c->linear_num_heads * c->linear_head_dim, hd = c->index_head_dim;
  for (int l = 0; l < c->num_hidden_layers; l++) {
    if (c->layer_types[l] == ATTN_KDA) {
      if (s->kda[l].S) continue;
      s->kda[l].conv = xcalloc((size_t)(c->linear_conv_kernel_dim - 1) * 3 * inner + 1, sizeof(float));
      s->kda[l].S = xcalloc(inner * c->linear_head_dim, sizeof(float));
    } else {
      if (s->mla[l].latent) continue;
      s->mla[l].latent = xcalloc((size_t)max_ctx * c->kv_lora_rank, sizeof(float));
      if (c->indexer_types[l] == INDEX_FULL) {
        s->mla[l].ik = xcalloc((size_t)max_ctx * hd, sizeof(float));
        s->mla[l].is = xcalloc((size_t)max_ctx * hd, sizeof(float));
        s->mla[l].pool = xcalloc((size_t)(max_ctx / c->index_kpool + 1) * hd, sizeof(float));
      }
    }
  }
}

glm53_session *glm53_session_new(glm53_model *m, int max_ctx) {
  const glm53_config *c = &m->cfg;
  if (max_ctx <= 0) { glm53_err("session: context length must be positive"); return NULL; }
  glm53_session *s = xcalloc(1, sizeof *s);
  s->m = m;
  s->max_ctx = max_ctx;
  int L = c->num_hidden_layers;
  s->kda = xcalloc((size_t)L, sizeof(kda_state));
  s->mla = xcalloc((size_t)L, sizeof(mla_state));
  s->history = xcalloc((size_t)max_ctx, sizeof(int32_t));
  s->backend = m->backend;
  if (s->backend == glm53_cpu_backend()) session_cpu_state_alloc(s);
  if (s->backend->session_init && s->backend->session_init(s)) {
    s->backend = glm53_cpu_backend(); /* nothing backend-side to free */
    glm53_session_free(s);
    return NULL;
  }
  return s;
}

void glm53_session_reset(glm53_session *s) {
  const glm53_config *c = &s->m->cfg;
  size_t inner = (size_t)c->linear_num_heads * c->linear_head_dim;
  for (int l = 0; l < c->num_hidden_layers; l++)
    if (s->kda[l].S) {
      memset(s->kda[l].conv, 0, ((size_t)(c->linear_conv_kernel_dim - 1) * 3 * inner + 1) * sizeof(float));
      memset(s->kda[l].S, 0, inner * c->linear_head_dim * sizeof(float));
    }
  /* MLA/indexer caches are overwritten position by position; pos bounds reads */
  s->pos = 0;
  if (s->backend->session_reset) s->backend->session_reset(s);
}

void glm53_session_free(glm53_session *s) {
  if (!s) return;
  for (int l = 0; l < s->m->cfg.num_hidden_layers; l++) {
    free(s->kda[l].conv); free(s->kda[l].S);
    free(s->mla[l].latent); free(s->mla[l].ik); free(s->mla[l].is); free(s->mla[l].pool);
  }
  if (s->backend->session_free) s->backend->session_free(s);
  free(s->kda);
  free(s->mla);
  free(s->history);
  free(s);
}

int glm53_session_pos(const glm53_session *s) { return s->pos; }
int glm53_session_max_ctx(const glm53_session *s) { return s->max_ctx; }
