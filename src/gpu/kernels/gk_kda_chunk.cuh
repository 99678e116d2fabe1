/* The kernels of the chunked KDA prefill form (gk_kda_chunk.cu has the
 * math and the host side). Apart so that tests/unit/test_kda_chunk_emu.cpp
 * can run them on the host through tests/emu/cuda_emu.h: the includer
 * provides gk_device.cuh, float4, __shfl_xor_sync and GK_PDL_BEGIN. */
#ifndef GLM53_GPU_GK_KDA_CHUNK_CUH
#define GLM53_GPU_GK_KDA_CHUNK_CUH
#define KCB 32  /* value columns per block of the pass */
#define KCT 256 /* threads per block */
#define KC_MIN 64 /* chunked from this longest segment on (gk_kda_chunk_use) */

/* FACT: the pair products through the 16-token factorised decay (below);
 * its three 16-row tiles with rows padded to HD + 4 floats */
#define KC_LP(HD) ((HD) + 4)
template <int HD, int KC, bool FACT> __host__ __device__ constexpr size_t kc_prep_floats() {
  return 2 * KC * HD + KC * KC + KC + (FACT ? 48 * KC_LP(HD) : 0);
}
/* largest |lower bound| for FACT: 15 tokens of decay stay below e^80 */
#define KC_FACT_LB 5.3f
/* KC: tokens per chunk (32 or 64, a multiple of 16). The pass's first buffer holds W [KC][HD], then Aqk [KC][KC] */
template <int HD, int KC> __host__ __device__ constexpr int kc_abuf() { return KC * (HD > KC ? HD : KC); }
template <int HD, int KC> __host__ __device__ constexpr size_t kc_pass_floats() {
  return HD * KCB + kc_abuf<HD, KC>() + KC * HD + KC * KCB + HD;
}


template <int HD, int KC, bool FACT>
__global__ void __launch_bounds__(KCT, 2) kda_chunk_prep_k(gk_batch b, float *qkv, float *graw, const float *dt_bias,
                                                            const float *A_log, float lb, const float *bl, int H,
                                                            float *aqk, float *glb) {
  GK_PDL_BEGIN();
  GK_DYN_SMEM(float, kc_sh);
  /* Gs / ks become the right-hand sides (and solutions) Xu / Xw of step 3;
   * MT is M transposed (MT[s][r] = M[r][s], zero where unset) */
  float *Gs = kc_sh, *ks = Gs + KC * HD, *MT = ks + KC * HD, *bs = MT + KC * KC;
  const gk_seg sg = b.seg[blockIdx.z];
  const int c = blockIdx.x, h = blockIdx.y, tid = threadIdx.x;
  if (c * KC >= sg.len) return;
  const int tb = sg.t0 + c * KC, n = min(KC, sg.len - c * KC), inner = H * HD;
  const size_t rs = (size_t)3 * inner; /* qkv row: q | k | v */
  for (int e = tid; e < KC * HD; e += KCT) {
    const int u = e / HD, i = e % HD;
    float gv = 0.f, kv = 0.f;
    if (u < n) {
      const size_t t = (size_t)tb + u;
      gv = kda_gate1(graw[t * inner + h * HD + i], dt_bias, A_log, h, h * HD + i, lb);
      kv = qkv[t * rs + inner + h * HD + i];
    }
    Gs[e] = gv;
    ks[e] = kv;
  }
  for (int e = tid; e < KC * KC; e += KCT) MT[e] = 0.f;
  for (int u = tid; u < KC; u += KCT) bs[u] = u < n ? sigm(bl[((size_t)tb + u) * H + h]) : 0.f;
  __syncthreads();
  for (int i = tid; i < HD; i += KCT) { /* cumulative log decay, in token order */
    float acc = 0.f;
    for (int u = 0; u < n; u++) {
      acc += Gs[u * HD + i];
      Gs[u * HD + i] = acc;
    }
  }
  __syncthreads();
  if (FACT) {
    /* 1'. pair products by 16-row blocks. For rows r of block B (first row
     * p) and columns s <= r: exp(G_r - G_s) = exp(G_r - G_p) exp(G_p - G_s),
     * so M and Aqk of the tile (B, S) are products of Kf = k exp(G - G_p),
     * Qf = q exp(G - G_p) (rows of B) and Kb = k exp(G_p - G) (rows of S):
     * O(KC HD) exponentials instead of one per pair and channel. Off the
     * diagonal both factors are <= 1; on it Kb reaches exp(15 |lb|) (the
     * host's KC_FACT_LB keeps that finite). */
    constexpr int LP = KC_LP(HD);
    float *Kf = bs + KC, *Qf = Kf + 16 * LP, *Kb = Qf + 16 * LP;
    const int rl = tid >> 4, sl = tid & 15;
    for (int p = 0; p < n; p += 16) {
      const int r = p + rl;
      __syncthreads(); /* the previous block's tiles are consumed */
      for (int e = tid; e < 16 * HD; e += KCT) {
        const int u = e / HD, i = e % HD, rr = p + u;
        float kf = 0.f, qf = 0.f;
        if (rr < n) {
          const float d = expf(Gs[rr * HD + i] - Gs[p * HD + i]);
          kf = ks[rr * HD + i] * d;
          qf = qkv[((size_t)tb + rr) * rs + h * HD + i] * d;
        }
        Kf[u * LP + i] = kf;
        Qf[u * LP + i] = qf;
      }
      for (int s0 = 0; s0 <= p; s0 += 16) {
        if (s0) __syncthreads(); /* the previous Kb is consumed */
        for (int e = tid; e < 16 * HD; e += KCT) {
          const int u = e / HD, i = e % HD, ss = s0 + u;
          Kb[u * LP + i] = ss < n ? ks[ss * HD + i] * expf(Gs[p * HD + i] - Gs[ss * HD + i]) : 0.f;
        }
        __syncthreads();
        float mk = 0.f, aq = 0.f;
        const float4 *kf4 = (const float4 *)(Kf + rl * LP), *qf4 = (const float4 *)(Qf + rl * LP),
                     *kb4 = (const float4 *)(Kb + sl * LP);
#pragma unroll 8
        for (int i4 = 0; i4 < HD / 4; i4++) {
          const float4 a = kf4[i4], q = qf4[i4], k = kb4[i4];
          mk = fmaf(a.x, k.x, fmaf(a.y, k.y, fmaf(a.z, k.z, fmaf(a.w, k.w, mk))));
          aq = fmaf(q.x, k.x, fmaf(q.y, k.y, fmaf(q.z, k.z, fmaf(q.w, k.w, aq))));
        }
        const int s = s0 + sl;
        if (r < n && s <= r) {
          if (s < r) MT[s * KC + r] = bs[r] * mk;
          aqk[(((size_t)tb + r) * H + h) * KC + s] = aq;
        }
      }
    }
  }
  /* 1. pair products: warp w owns rows r = w, w + 8, ...; lane l channels l + 32 m */
  constexpr int MM = HD / 32;
  const int w = tid >> 5, lane = tid & 31;
  for (int r = w; r < (FACT ? 0 : n); r += KCT / 32) {
    float kr[MM], gr[MM], qr[MM];
    const size_t t = (size_t)tb + r;
#pragma unroll
    for (int m = 0; m < MM; m++) {
      const int i = lane + 32 * m;
      kr[m] = ks[r * HD + i];
      gr[m] = Gs[r * HD + i];
      qr[m] = qkv[t * rs + h * HD + i];
    }
    float *arow = aqk + (t * H + h) * KC;
    for (int s = 0; s <= r; s++) {
      float mk = 0.f, aq = 0.f;
#pragma unroll
      for (int m = 0; m < MM; m++) {
        const int i = lane + 32 * m;
        const float kk = ks[s * HD + i] * expf(gr[m] - Gs[s * HD + i]);
        mk += kr[m] * kk;
        aq += qr[m] * kk;
      }
      mk = warp_sum(mk);
      aq = warp_sum(aq);
      if (lane == 0) {
        if (s < r) MT[s * KC + r] = bs[r] * mk;
        arow[s] = aq;
      }
    }
  }
  __syncthreads(); /* M complete; every read of q is done */
  /* 2. qg over q, kd over k, gl */
  for (int e = tid; e < n * HD; e += KCT) {
    const int u = e / HD, i = e % HD;
    const size_t t = (size_t)tb + u;
    float *qp = qkv + t * rs + h * HD + i;
    *qp = *qp * expf(Gs[e]);
    qkv[t * rs + inner + h * HD + i] = ks[e] * expf(Gs[(n - 1) * HD + i] - Gs[e]);
  }
  for (int i = tid; i < HD; i += KCT) glb[((size_t)tb * H + h) * HD + i] = expf(Gs[(n - 1) * HD + i]);
  __syncthreads(); /* Gs, ks read for the last time */
  /* 3. right-hand sides in place: Xw = beta k exp(G) over ks, Xu = beta v over Gs */
  for (int e = tid; e < KC * HD; e += KCT) {
    const int u = e / HD, i = e % HD;
    ks[e] = bs[u] * (ks[e] * expf(Gs[e]));
    Gs[e] = u < n ? bs[u] * qkv[((size_t)tb + u) * rs + 2 * inner + h * HD + i] : 0.f;
  }
  __syncthreads();
  /* 4. (I + M) X = rhs, one column per thread, rows in blocks of 16 (the
   * block's rows in registers, earlier rows read back from shared memory;
   * every row subtracts its terms in ascending s, as on the CPU) */
  for (int col = tid; col < 2 * HD; col += KCT) {
    float *X = (col < HD ? Gs : ks) + (col < HD ? col : col - HD);
    for (int R = 0; R < n; R += 16) {
      float acc[16];
#pragma unroll
      for (int q = 0; q < 16; q++) acc[q] = X[(R + q) * HD];
      for (int s = 0; s < R; s++) {
        const float xs = X[s * HD];
#pragma unroll
        for (int q = 0; q < 16; q += 4) {
          const float4 m4 = *(const float4 *)(MT + s * KC + R + q);
          acc[q] -= m4.x * xs;
          acc[q + 1] -= m4.y * xs;
          acc[q + 2] -= m4.z * xs;
          acc[q + 3] -= m4.w * xs;
        }
      }
#pragma unroll
      for (int q = 0; q < 16; q++) {
#pragma unroll
        for (int q2 = q + 1; q2 < 16; q2++) acc[q2] -= MT[(R + q) * KC + R + q2] * acc[q];
        X[(R + q) * HD] = acc[q];
      }
    }
  }
  __syncthreads();
  /* 5. U over v, W over graw */
  for (int e = tid; e < n * HD; e += KCT) {
    const int u = e / HD, i = e % HD;
    const size_t t = (size_t)tb + u;
    qkv[t * rs + 2 * inner + h * HD + i] = Gs[e];
    graw[t * inner + h * HD + i] = ks[e];
  }
}

/* One block per (head, 32 value columns, segment), chunks in order. The
 * state slice S[:, c0 + lane] lives in registers (rows grp * SI + m) and in
 * shared memory for the products that read it by column. */
template <int HD, int KC>
__global__ void __launch_bounds__(KCT) kda_chunk_pass_k(gk_batch b, const float *qkv, const float *wg, const float *aqk,
                                                         const float *glb, int H, float *o) {
  GK_PDL_BEGIN();
  GK_DYN_SMEM(float, kc_sh);
  float *Ss = kc_sh;           /* [HD][KCB] */
  float *As = Ss + HD * KCB;   /* [KC][HD]: W, then Aqk [KC][KC] */
  float *Bs = As + kc_abuf<HD, KC>(); /* [KC][HD]: qg, then kd */
  float *Vs = Bs + KC * HD;    /* [KC][KCB]: V' */
  float *gls = Vs + KC * KCB;  /* [HD] */
  constexpr int SI = HD / (KCT / 32), RM = KC / (KCT / 32), H4 = HD / 4;
  const gk_seg sg = b.seg[blockIdx.z];
  const int h = blockIdx.x, c0 = blockIdx.y * KCB, tid = threadIdx.x, j = tid & 31, grp = tid >> 5;
  const int inner = H * HD;
  const size_t rs = (size_t)3 * inner;
  float *S = sg.ls[b.layer].p[GK_ST_S] + ((size_t)h * HD + c0 + j) * HD; /* column c0 + j: [H][dv][dk] */
  float sr[SI];
#pragma unroll
  for (int m = 0; m < SI; m++) {
    sr[m] = S[grp * SI + m];
    Ss[(grp * SI + m) * KCB + j] = sr[m];
  }
  for (int cs = 0; cs < sg.len; cs += KC) {
    const int tb = sg.t0 + cs, n = min(KC, sg.len - cs);
    __syncthreads(); /* Ss written, the previous chunk's buffers consumed */
    for (int e = tid; e < KC * H4; e += KCT) {
      const int u = e / H4, i = 4 * (e % H4);
      float4 wv = make_float4(0.f, 0.f, 0.f, 0.f), qv = wv;
      if (u < n) {
        const size_t t = (size_t)tb + u;
        wv = *(const float4 *)(wg + t * inner + h * HD + i);
        qv = *(const float4 *)(qkv + t * rs + h * HD + i);
      }
      *(float4 *)(As + u * HD + i) = wv;
      *(float4 *)(Bs + u * HD + i) = qv;
    }
    __syncthreads();
    float av[RM], ao[RM];
#pragma unroll
    for (int m = 0; m < RM; m++) av[m] = ao[m] = 0.f;
    for (int i = 0; i < HD; i += 4) {
      const float s0 = Ss[i * KCB + j], s1 = Ss[(i + 1) * KCB + j], s2 = Ss[(i + 2) * KCB + j], s3 = Ss[(i + 3) * KCB + j];
#pragma unroll
      for (int m = 0; m < RM; m++) {
        const int r = grp * RM + m;
        const float4 wv = *(const float4 *)(As + r * HD + i), qv = *(const float4 *)(Bs + r * HD + i);
        av[m] = fmaf(wv.x, s0, fmaf(wv.y, s1, fmaf(wv.z, s2, fmaf(wv.w, s3, av[m]))));
        ao[m] = fmaf(qv.x, s0, fmaf(qv.y, s1, fmaf(qv.z, s2, fmaf(qv.w, s3, ao[m]))));
      }
    }
#pragma unroll
    for (int m = 0; m < RM; m++) {
      const int r = grp * RM + m;
      Vs[r * KCB + j] = r < n ? qkv[((size_t)tb + r) * rs + 2 * inner + h * HD + c0 + j] - av[m] : 0.f;
    }
    __syncthreads(); /* As / Bs free, V' complete */
    for (int e = tid; e < KC * KC; e += KCT) {
      const int u = e / KC, s = e % KC;
      As[e] = u < n && s <= u ? aqk[(((size_t)tb + u) * H + h) * KC + s] : 0.f;
    }
    for (int e = tid; e < KC * H4; e += KCT) {
      const int u = e / H4, i = 4 * (e % H4);
      *(float4 *)(Bs + u * HD + i) =
          u < n ? *(const float4 *)(qkv + ((size_t)tb + u) * rs + inner + h * HD + i) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    for (int i = tid; i < HD; i += KCT) gls[i] = glb[((size_t)tb * H + h) * HD + i];
    __syncthreads();
#pragma unroll
    for (int m = 0; m < RM; m++) {
      const int r = grp * RM + m;
      if (r >= n) break;
      float acc = ao[m];
      for (int s = 0; s <= r; s++) acc = fmaf(As[r * KC + s], Vs[s * KCB + j], acc);
      o[((size_t)tb + r) * inner + h * HD + c0 + j] = acc;
    }
    float acc[SI];
#pragma unroll
    for (int m = 0; m < SI; m++) acc[m] = gls[grp * SI + m] * sr[m];
    for (int r = 0; r < n; r++) {
      const float v = Vs[r * KCB + j];
#pragma unroll
      for (int m = 0; m < SI; m += 4) {
        const float4 k4 = *(const float4 *)(Bs + r * HD + grp * SI + m);
        acc[m] = fmaf(k4.x, v, acc[m]);
        acc[m + 1] = fmaf(k4.y, v, acc[m + 1]);
        acc[m + 2] = fmaf(k4.z, v, acc[m + 2]);
        acc[m + 3] = fmaf(k4.w, v, acc[m + 3]);
      }
    }
#pragma unroll
    for (int m = 0; m < SI; m++) {
      sr[m] = acc[m];
      Ss[(grp * SI + m) * KCB + j] = acc[m];
    }
  }
#pragma unroll
  for (int m = 0; m < SI; m++) S[grp * SI + m] = sr[m];
}

#endif
