/* GLM-5.3 prompt structure against the real id sequences in
 * tests/data/glm5/token_vectors.json (from shared/data/glm5). The official
 * tokenizer.json is not available, so we build a skeleton tokenizer: the 256
 * byte tokens plus the 36 GLM added tokens at their real ids
 * (special_tokens.json). Then: (1) the chat renderer reproduces each vector's
 * text, (2) encoding it puts exactly the vector's special ids (>= 154820) in
 * the same order, and (3) the text between them is the text the vector's
 * plain ids stand for, as far as the vector tells us (its single-token words). */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "core/err.h"
#include "core/util.h"
#include "test_util.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"

#define GLM_FIRST_ADDED 154820

/* tokenizer.json text: byte-level vocab 0..255 + the GLM added tokens. */
static char *skeleton_json(const cJSON *special) {
  cJSON *root = cJSON_CreateObject(), *model = cJSON_AddObjectToObject(root, "model");
  cJSON_AddStringToObject(model, "type", "BPE");
  cJSON *vocab = cJSON_AddObjectToObject(model, "vocab");
  cJSON_AddArrayToObject(model, "merges");
  int n = 0;
  for (int b = 0; b < 256; b++) { /* GPT-2 byte-level characters */
    int printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    unsigned cp = printable ? (unsigned)b : 256u + (unsigned)n++;
    char s[4] = {0};
    if (cp < 0x80) s[0] = (char)cp;
    else { s[0] = (char)(0xC0 | cp >> 6); s[1] = (char)(0x80 | (cp & 0x3F)); }
    cJSON_AddNumberToObject(vocab, s, b);
  }
  cJSON *pre = cJSON_AddObjectToObject(root, "pre_tokenizer");
  cJSON_AddStringToObject(pre, "type", "ByteLevel");
  cJSON_AddFalseToObject(pre, "use_regex");
  cJSON *added = cJSON_AddArrayToObject(root, "added_tokens");
  const cJSON *e;
  cJSON_ArrayForEach(e, cJSON_GetObjectItem(special, "added_tokens")) {
    cJSON *a = cJSON_CreateObject();
    cJSON_AddNumberToObject(a, "id", cJSON_GetObjectItem(e, "id")->valuedouble);
    cJSON_AddStringToObject(a, "content", cJSON_GetObjectItem(e, "content")->valuestring);
    cJSON_AddTrueToObject(a, "special");
    cJSON_AddItemToArray(added, a);
  }
  char *s = cJSON_PrintUnformatted(root);
  cJSON_Delete(root);
  return s;
}

static cJSON *load_json(const char *path) {
  char *buf = read_file(path, NULL);
  CHECK(buf != NULL, "%s", glm53_last_error());
  cJSON *j = buf ? cJSON_Parse(buf) : NULL;
  free(buf);
  return j;
}

int main(void) {
  cJSON *special = load_json("tests/data/glm5/special_tokens.json");
  cJSON *vec = load_json("tests/data/glm5/token_vectors.json");
  if (!special || !vec) TEST_DONE();
  char *js = skeleton_json(special);
  glm53_tokenizer *t = tok_load_json(js, strlen(js));
  free(js);
  CHECK(t != NULL, "%s", glm53_last_error());
  if (!t) TEST_DONE();
  CHECK(tok_token_id(t, "[gMASK]") == 154822 && tok_token_id(t, "<sop>") == 154824);
  CHECK(tok_token_id(t, "<|user|>") == 154827 && tok_token_id(t, "<|assistant|>") == 154828);
  CHECK(tok_token_id(t, "<think>") == 154841 && tok_token_id(t, "</think>") == 154842);
  CHECK(tok_token_id(t, "<|endoftext|>") == 154820 && tok_token_id(t, "<|observation|>") == 154829);

  const cJSON *single = cJSON_GetObjectItem(vec, "derived_single_tokens_from_the_two_vectors");
  const cJSON *v;
  int nv = 0;
  cJSON_ArrayForEach(v, cJSON_GetObjectItem(vec, "vectors")) {
    const char *text = cJSON_GetObjectItem(v, "text")->valuestring;
    const cJSON *ids = cJSON_GetObjectItem(v, "ids");
    nv++;
    /* (1) the renderer makes this text (effort from the system line, one user turn) */
    const char *user = strstr(text, "<|user|>") + 8;
    char *u = xstrdup(user);
    *strstr(u, "<|assistant|>") = 0;
    chat_message m = {.role = "user", .content = u};
    chat_request r = {.messages = &m, .n_messages = 1, .add_generation_prompt = 1,
                      .reasoning_effort = strstr(text, "Effort: Low") ? "low" : strstr(text, "Effort: High") ? "high" : NULL};
    char *out = chat_render(&r);
    CHECK(out && !strcmp(out, text), "render: %s", out ? out : glm53_last_error());
    free(out);
    /* (2) special ids in order */
    int32_t *ours;
    size_t n;
    CHECK(tok_encode(t, text, strlen(text), 1, &ours, &n) == 0);
    int32_t sa[64], sb[64];
    int na = 0, nb = 0;
    for (size_t i = 0; i < n && na < 64; i++)
      if (ours[i] >= GLM_FIRST_ADDED) sa[na++] = ours[i];
    const cJSON *e;
    cJSON_ArrayForEach(e, ids) if (e->valueint >= GLM_FIRST_ADDED && nb < 64) sb[nb++] = e->valueint;
    CHECK(na == nb && na > 0 && !memcmp(sa, sb, (size_t)na * sizeof *sa), "special ids differ (%d vs %d)", na, nb);
    /* (3) the user text is one real token here: its id is in the derived table */
    const cJSON *uid = cJSON_GetObjectItem(single, u);
    CHECK(cJSON_IsNumber(uid), "no single-token id for '%s'", u);
    if (cJSON_IsNumber(uid)) {
      int pos = -1, k = 0; /* the id right after <|user|> in the vector */
      cJSON_ArrayForEach(e, ids) {
        if (pos == k) CHECK(e->valueint == uid->valueint, "user token %d vs %d", e->valueint, uid->valueint);
        if (e->valueint == 154827) pos = k + 1;
        k++;
      }
    }
    free(ours);
    free(u);
  }
  CHECK(nv == 2, "expected 2 vectors, got %d", nv);
  tok_free(t);
  cJSON_Delete(special);
  cJSON_Delete(vec);
  TEST_DONE();
}
