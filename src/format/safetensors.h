/* Read-only, mmap-based safetensors reader: a single file, or a Hugging Face
 * checkpoint directory (model.safetensors, model.safetensors.index.json with
 * shards, or any *.safetensors files). Every header is validated on open, so
 * after st_open succeeds each tensor's data lies inside its mapping and has
 * exactly numel * dtype-size bytes. See docs/format-safetensors.md. */
#ifndef GLM53_FORMAT_SAFETENSORS_H
#define GLM53_FORMAT_SAFETENSORS_H
#include <stddef.h>
#include <stdint.h>

enum st_dtype { ST_F32, ST_F16, ST_BF16, ST_F8_E4M3, ST_I8, ST_U8, ST_I32, ST_I64, ST_F64, ST_BOOL };

#define ST_MAX_DIMS 8

typedef struct {
  char *name;
  int dtype;                 /* enum st_dtype */
  int ndim;
  int64_t shape[ST_MAX_DIMS];
  const void *data;          /* points into the mmap; may be unaligned */
  size_t nbytes;
  int shard;                 /* index of the file it lives in */
} st_tensor;

typedef struct st_set st_set;

/* path = a .safetensors file, or a directory (see above). NULL + glm53_err on
 * failure. */
st_set *st_open(const char *path);
void st_close(st_set *s);
int st_count(const st_set *s);
const st_tensor *st_at(const st_set *s, int i);
const st_tensor *st_find(const st_set *s, const char *name); /* NULL if absent */
int64_t st_numel(const st_tensor *t);
const char *st_dtype_name(int dtype);
size_t st_dtype_size(int dtype);

/* Converts tensor `name` to fp32 into out (numel floats). F32/F16/BF16/F64
 * convert directly; F8_E4M3 needs the sibling "<name>_scale_inv" (2-D block
 * scales, W[i][j] = q[i][j] * s[i/bo][j/bi], block 128 unless the grid implies
 * another size). When shape != NULL the tensor's shape must equal
 * shape[0..ndim) exactly. Returns 0, or -1 with glm53_err set. */
int st_read_f32(const st_set *s, const char *name, int ndim, const int64_t *shape, float *out);

#endif
