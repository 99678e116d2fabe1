/* Random inputs of one KDA layer for the emulated KDA kernel tests
 * (test_kda_chunk_emu, test_kda_recur_emu): a seeded xorshift in [-1, 1)
 * and the q | k | v rows with q and k L2-normalised per head as in the
 * model (q also by 1 / sqrt(hd)), the raw gates (shifted by gshift: 30 puts
 * every gate at its bound), beta logits, dt bias and A_log. */
#ifndef GLM53_TESTS_EMU_KDA_INPUTS_H
#define GLM53_TESTS_EMU_KDA_INPUTS_H
#include <cmath>
#include <cstdint>
#include <vector>

struct emu_rng {
  uint64_t s;
  float operator()() { /* [-1, 1) */
    s ^= s << 13; s ^= s >> 7; s ^= s << 17;
    return (float)((s >> 11) * (2.0 / 9007199254740992.0) - 1.0);
  }
};
static void kda_random_inputs(emu_rng &rf, int T, int H, int HD, float gshift, std::vector<float> &qkv,
                              std::vector<float> &graw, std::vector<float> &bl, std::vector<float> &dtb,
                              std::vector<float> &Al) {
  const int inner = H * HD, ch = 3 * inner;
  qkv.assign((size_t)T * ch, 0.f);
  graw.assign((size_t)T * inner, 0.f);
  bl.assign((size_t)T * H, 0.f);
  dtb.assign(inner, 0.f);
  Al.assign(H, 0.f);
  for (int t = 0; t < T; t++)
    for (int part = 0; part < 3; part++)
      for (int h = 0; h < H; h++) {
        float *v = &qkv[(size_t)t * ch + part * inner + h * HD];
        double ss = 0;
        for (int i = 0; i < HD; i++) v[i] = rf(), ss += (double)v[i] * v[i];
        const float sc = part == 2 ? 1.0f : (float)(1.0 / sqrt(ss + 1e-6)) * (part == 0 ? 1.0f / sqrtf((float)HD) : 1.0f);
        for (int i = 0; i < HD; i++) v[i] *= sc;
      }
  for (auto &x : graw) x = 3 * rf() + gshift;
  for (auto &x : bl) x = 2 * rf();
  for (auto &x : dtb) x = 0.5f * rf();
  for (auto &x : Al) x = 0.5f * rf();
}
#endif
