/* The .g53 converted-model format (docs/format.md): a directory holding
 * model.g53 (weights + JSON header) and the tokenizer files. Tensors are
 * 64-byte aligned and mmap-able; quantized tensors are one blob of packed
 * values followed by their 16-bit group scales. Every tensor carries an
 * xxh64 of its blob. The header sits at the end of the file so that the
 * converter can write tensors in one sequential pass. */
#ifndef GLM53_FORMAT_G53_H
#define GLM53_FORMAT_G53_H
#include <stddef.h>
#include <stdint.h>

#define G53_FILE "model.g53"
#define G53_MAGIC "GLM53G53"
#define G53_VERSION 1

/* Storage formats; numbering equals enum wmat_fmt. */
enum g53_dtype { G53_F32 = 1, G53_BF16 = 2, G53_Q8 = 3, G53_Q4 = 4 };

typedef struct {
  char *name;
  int dtype;
  int ndim;
  int64_t shape[4];
  int group;            /* Q4/Q8: group size along the last dim */
  int scale_bf16;       /* Q4/Q8: scales bf16 (1) or f16 (0) */
  uint64_t offset;      /* blob start, from the start of the file, 64-aligned */
  uint64_t nbytes;      /* blob size (values, padding, scales) */
  uint64_t scale_off;   /* Q4/Q8: scales start, relative to the blob */
  uint64_t xxh;         /* xxh64 (seed 0) of the blob */
  const uint8_t *data;  /* blob in the mmap */
} g53_tensor;

typedef struct g53_file g53_file;

/* path: a .g53 directory or the model.g53 file itself. Validates the fixed
 * preamble, the header checksum, the file size (truncation) and that every
 * tensor lies inside the file; does not read tensor data. */
g53_file *g53_open(const char *path);
void g53_close(g53_file *f);
int g53_count(const g53_file *f);
const g53_tensor *g53_at(const g53_file *f, int i);
const g53_tensor *g53_find(const g53_file *f, const char *name);
const char *g53_config_json(const g53_file *f); /* embedded config.json text */
const char *g53_dir(const g53_file *f);         /* directory holding the tokenizer files */
const char *g53_meta_json(const g53_file *f);   /* "convert" object of the header (JSON text) */
uint64_t g53_file_size(const g53_file *f);
/* Full check: recomputes every tensor's xxh64. progress may be NULL. */
int g53_verify(const g53_file *f, int show_progress);
/* 1 if path is a .g53 directory or file. */
int g53_is_g53(const char *path);
const char *g53_dtype_name(int dtype);
/* Blob layout of a tensor: value bytes, offset of the scales, total bytes. */
void g53_blob_layout(int dtype, int64_t rows, int64_t cols, int group, uint64_t *vbytes, uint64_t *scale_off,
                     uint64_t *total);

/* Streaming writer: tensors are appended in call order. */
typedef struct g53_writer g53_writer;
g53_writer *g53_writer_open(const char *dir);
/* values: vbytes (see g53_blob_layout); scales: rows*cols/group uint16 for Q4/Q8. */
int g53_writer_add(g53_writer *w, const char *name, int dtype, int ndim, const int64_t *shape, int group,
                   int scale_bf16, const void *values, const void *scales);
/* Writes header (config text, meta object JSON text), fsyncs, renames into
 * place. Frees w. */
int g53_writer_finish(g53_writer *w, const char *config_json, const char *meta_json);
void g53_writer_abort(g53_writer *w);

#endif
