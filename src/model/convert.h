/* HF checkpoint (BF16 / F32 / block-FP8 safetensors, either expert layout,
 * either name style) -> .g53 directory. Streams tensor by tensor from the
 * mmap in model_walk order (routed experts gate, up, down adjacent), so peak
 * RAM is about two fp32 copies of the largest tensor (the embedding). */
#ifndef GLM53_MODEL_CONVERT_H
#define GLM53_MODEL_CONVERT_H

typedef struct {
  const char *in, *out;
  int bits;              /* 4 (default), 8, 16 (bf16) for attention/MLP/expert matrices */
  int group;             /* 32 (default), 64, 128 */
  int scale_bf16;        /* group scales as bf16 instead of f16 */
  const char *keep_bf16; /* comma-separated fnmatch patterns on canonical names -> stored bf16 */
  int embed_bits;        /* embed_tokens/lm_head: 8 (default) or 16 */
  int verify;            /* re-open and check every checksum after writing */
  int progress;          /* progress bar with ETA on stderr */
} g53_convert_opts;

int g53_convert(const g53_convert_opts *o);

#endif
