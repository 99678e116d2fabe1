/* The C chat renderer against @huggingface/jinja rendering the official
 * template (tests/node/chat_reference.mjs): byte-identical for every case in
 * $GLM53_CHAT_REF ("expected" overrides "rendered" where that JS engine
 * differs from Python Jinja2). Driven by
 * tests/integration/test_chat_template.sh; without the file: SKIP, exit 0. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "core/err.h"
#include "core/util.h"
#include "test_util.h"
#include "tokenizer/chat.h"

int main(void) {
  const char *path = getenv("GLM53_CHAT_REF");
  if (!path || !*path) {
    printf("SKIP: GLM53_CHAT_REF not set (tests/integration/test_chat_template.sh runs this check)\n");
    return 0;
  }
  size_t len;
  char *buf = read_file(path, &len);
  CHECK(buf != NULL, "%s", glm53_last_error());
  if (!buf) TEST_DONE();
  cJSON *root = cJSON_Parse(buf);
  free(buf);
  const cJSON *c;
  int n = 0, bad = 0;
  cJSON_ArrayForEach(c, cJSON_GetObjectItem(root, "cases")) {
    const char *name = cJSON_GetObjectItem(c, "name")->valuestring;
    const cJSON *exp = cJSON_GetObjectItem(c, "expected");
    const char *want = (exp ? exp : cJSON_GetObjectItem(c, "rendered"))->valuestring;
    char *kw = cJSON_PrintUnformatted(cJSON_GetObjectItem(c, "kwargs"));
    char *out = chat_render_json(kw);
    int ok = out && !strcmp(out, want);
    CHECK(ok, "case %s:\n got: %s\nwant: %s", name, out ? out : glm53_last_error(), want);
    bad += !ok;
    free(out);
    free(kw);
    n++;
  }
  CHECK(n >= 20, "only %d cases", n);
  printf("chat template: %d cases, %d differ\n", n, bad);
  cJSON_Delete(root);
  TEST_DONE();
}
