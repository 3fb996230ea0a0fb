// decode.cuh — the decode kernel: few query rows (one KV group's heads ×
// Nq <= 16), long keys, F16/BF16 on mma.sync.m16n8k16 (sm_80+).
//
// One block per (KV head, batch · split) of NW warps. Keys sit in the
// MMA's M dimension and the group's R query rows in N (NB n8 tiles, R <=
// 8 NB), so nothing is spent on a 128-row block's empty rows: per 16-key
// tile a warp computes Sᵀ = K Qᵀ, its online softmax per query column,
// stages P through a small per-warp tile (the transposition Pᵀ's B
// fragment needs) and accumulates Oᵀ += Vᵀ Pᵀ. The fragment maps are
// decode_layout.h's. Each warp streams its own tiles through its own
// ST-stage cp.async ring (per-warp commit / wait_group and __syncwarp, no
// block barrier in the key loop) with its own (m, l) and accumulators;
// the warps are combined in shared memory at the end (one barrier), and
// a (batch, KV head)'s key splits by the last of its blocks to finish (a
// counter in split_ws after the partials, zeroed by a memset the
// launcher queues first and reset by that block): one kernel, no merge
// kernel. Masks, negative scales, softcap, ALiBi, statistics, paged K/V
// and seqused_k follow the forward kernels' rules (fwd_mma.cuh; kv_src in
// common.cuh). Up to 128 dims a warp holds Qᵀ's fragments in registers;
// the 256 instance re-reads them from shared memory. Compile-verified
// only: it has not run on a GPU (docs/cuda.md).
#ifndef ATTN_CUDA_DECODE_CUH
#define ATTN_CUDA_DECODE_CUH

#include "common.cuh"
#include "decode_layout.h"

namespace attn_cu {

__device__ __forceinline__ void ldsm_x2_t(uint32_t &r0, uint32_t &r1, const void *p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r0), "=r"(r1)
               : "r"(smem_addr(p)));
}

__device__ __forceinline__ float warp_cols_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 4));
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 8));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 16));
}
__device__ __forceinline__ float warp_cols_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 4);
  x += __shfl_xor_sync(0xffffffffu, x, 8);
  return x + __shfl_xor_sync(0xffffffffu, x, 16);
}

// A lane's query columns 2t + c of each n8 tile: query index and ALiBi
// slope (attn_cu_block_row: column q is query q % Nq of head q / Nq).
template <int NB> struct dec_cols {
  int qi[NB][2];
  float sl[NB][2];
  __device__ dec_cols(const attn_cu_params &p, int pack, int b, int h0, int lane) {
#pragma unroll
    for (int n = 0; n < NB; n++)
#pragma unroll
      for (int c = 0; c < 2; c++) {
        int dh;
        int key, col; // C element c's column (its key does not matter here)
        attn_cu_frag_c(lane, c, &key, &col);
        attn_cu_block_row(n * 8 + col, p.seq_q, pack, &dh, &qi[n][c]);
        sl[n][c] = p.alibi2 ? p.alibi2[(size_t)b * p.heads_q + h0 + dh] : 0.0f;
      }
  }
};

// One 16-key tile [j0, j0 + 16) of K or V into a warp's ring stage: lane
// copies chunk idx % CH of row idx / CH, idx = lane + 32 it; rows past the
// sequence's keys (nkv − j0) and columns past dp become 0.
template <typename T, int DPAD>
__device__ __forceinline__ void dec_load(T *s, const T *g, int valid, int dp, int lane) {
  constexpr int CH = DPAD / 8, STR = DPAD + 8;
#pragma unroll
  for (int it = 0; it < ATTN_CU_DEC_KT * CH / 32; it++) {
    int r, c;
    attn_cu_ostage_at(lane, it, CH, &r, &c);
    const bool ok = r < valid && c * 8 < dp;
    cp_async16(s + r * STR + c * 8, ok ? g + (size_t)r * dp + c * 8 : g, ok);
  }
}

// Qᵀ's B fragments a warp keeps in registers for the whole key loop: all
// of them up to 128 dims; none at 256 (they would cost the 256 instance 64
// of the registers its accumulators need), which re-reads them from sQ.
template <int DPAD> __host__ __device__ constexpr int dec_qregs() {
  return DPAD <= 128 ? DPAD / 16 : 1;
}

// Sᵀ = K Qᵀ for one tile: A = K by ldmatrix, B = Qᵀ from registers (or
// from sQ at 256 dims).
template <typename T, int DPAD, int NB>
__device__ __forceinline__ void dec_qk(float (&s)[NB][4],
                                       const uint32_t (&qf)[dec_qregs<DPAD>()][4], const T *sQ,
                                       const T *sK, int lane) {
  constexpr int STR = DPAD + 8;
  int kr, kc, qc, qd;
  attn_cu_dec_addr_k(lane, &kr, &kc);
  attn_cu_dec_addr_q(lane, &qc, &qd);
#pragma unroll
  for (int n = 0; n < NB; n++)
    s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < DPAD / 16; kk++) {
    uint32_t a[4], b[4];
    ldsm_x4(a, sK + kr * STR + kk * 16 + kc);
    if constexpr (DPAD <= 128) {
#pragma unroll
      for (int n = 0; n < NB; n++)
        mma_t<T>::run(s[n], a, qf[kk][2 * n], qf[kk][2 * n + 1]);
    } else {
      ldsm_x4(b, sQ + qc * STR + kk * 16 + qd);
#pragma unroll
      for (int n = 0; n < NB; n++)
        mma_t<T>::run(s[n], a, b[2 * n], b[2 * n + 1]);
    }
  }
}

// Into log2 units (unless k folds the scale into the exponent), the
// variants, and the mask where the tile is not wholly visible: element e
// of n8 tile n is key j0 + g + 8 (e / 2) of column n·8 + 2t + e % 2.
template <int NB>
__device__ __forceinline__ void dec_scores(float (&s)[NB][4], const attn_cu_params &p, float k,
                                           bool var, bool full, int64_t off, int nkv, int j0,
                                           const dec_cols<NB> &cl, int lane) {
  if (k == 1.0f) {
#pragma unroll
    for (int n = 0; n < NB; n++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        s[n][e] *= p.scale_log2;
        if (var) {
          int key, col;
          attn_cu_frag_c(lane, e, &key, &col);
          float dg;
          const float d0 = attn_cu_dist0(cl.qi[n][e % 2], off, j0);
          s[n][e] = attn_cu_variant(s[n][e], p.cap2, p.inv_cap2, cl.sl[n][e % 2],
                                    attn_cu_dist(d0, key), &dg);
        }
      }
  }
  if (!full) {
#pragma unroll
    for (int n = 0; n < NB; n++)
#pragma unroll
      for (int c = 0; c < 2; c++) {
        int lo, hi;
        attn_cu_row_bounds(cl.qi[n][c], off, p.window_left, p.window_right, nkv, &lo, &hi);
#pragma unroll
        for (int h = 0; h < 2; h++) {
          int key, col;
          attn_cu_frag_c(lane, 2 * h + c, &key, &col);
          const int j = j0 + key;
          s[n][2 * h + c] = j >= lo && j <= hi ? s[n][2 * h + c] : -INFINITY;
        }
      }
  }
}

// The online softmax per query column: a column's max over the tile is
// over the lanes of one t (warp_cols_max), then weights in place of the
// scores, the lane's share of the sums, and Oᵀ rescaled.
template <int NB, int MD>
__device__ __forceinline__ void dec_softmax(float (&s)[NB][4], float (&o)[MD][NB][4],
                                            float (&m)[NB][2], float (&l)[NB][2], float k) {
#pragma unroll
  for (int n = 0; n < NB; n++)
#pragma unroll
    for (int c = 0; c < 2; c++) {
      const float mx = fmaxf(m[n][c], warp_cols_max(fmaxf(s[n][c], s[n][c + 2])) * k);
      const float use = attn_cu_max_for_exp(mx);
      const float al = fast_exp2(m[n][c] - use);
      m[n][c] = mx;
      s[n][c] = fast_exp2(fmaf(s[n][c], k, -use));
      s[n][c + 2] = fast_exp2(fmaf(s[n][c + 2], k, -use));
      l[n][c] = l[n][c] * al + s[n][c] + s[n][c + 2];
#pragma unroll
      for (int d = 0; d < MD; d++) {
        o[d][n][c] *= al;
        o[d][n][c + 2] *= al;
      }
    }
}

// Oᵀ += Vᵀ Pᵀ: P through the warp's staging tile sP ([key][column],
// decode_layout.h), then A = Vᵀ by ldmatrix.trans.
template <typename T, int DPAD, int NB>
__device__ __forceinline__ void dec_pv(float (&o)[DPAD / 16][NB][4], const float (&s)[NB][4], T *sP,
                                       const T *sV, int lane) {
  constexpr int STR = DPAD + 8, PS = ATTN_CU_DEC_PSTR;
  using M = mma_t<T>;
#pragma unroll
  for (int n = 0; n < NB; n++)
#pragma unroll
    for (int h = 0; h < 2; h++) {
      int key, col; // of C element 2h (and 2h + 1, the next column)
      attn_cu_frag_c(lane, 2 * h, &key, &col);
      *reinterpret_cast<uint32_t *>(sP + key * PS + n * 8 + col) =
          M::pack(s[n][2 * h], s[n][2 * h + 1]);
    }
  __syncwarp();
  uint32_t pb[4];
  int pk, pc;
  attn_cu_dec_addr_p(lane, &pk, &pc);
  if constexpr (NB == 2)
    ldsm_x4_t(pb, sP + pk * PS + pc);
  else
    ldsm_x2_t(pb[0], pb[1], sP + pk * PS + pc);
  int vk, vd;
  attn_cu_dec_addr_v(lane, &vk, &vd);
#pragma unroll
  for (int dm = 0; dm < DPAD / 16; dm++) {
    uint32_t a[4];
    ldsm_x4_t(a, sV + vk * STR + dm * 16 + vd);
#pragma unroll
    for (int n = 0; n < NB; n++)
      M::run(o[dm][n], a, pb[2 * n], pb[2 * n + 1]);
  }
}

// What a block works on: its (batch, KV head), split, rows and keys.
template <typename T, bool PAGED> struct dec_block {
  int b, hkv, split, h0, rows;
  size_t qrow0, bh;
  kv_src<T, PAGED> kv;
  int t0, t1;
  __device__ dec_block(const attn_cu_params &p, int nsplit, int pack)
      : b(blockIdx.z / nsplit), hkv(blockIdx.y), split(blockIdx.z % nsplit), h0(hkv * pack),
        rows(pack * p.seq_q), qrow0(((size_t)b * p.heads_q + h0) * p.seq_q),
        bh((size_t)b * p.heads_kv + hkv), kv(p, bh, b) {
    attn_cu_block_tiles(0, p.seq_q, kv.off(p), p.window_left, p.window_right, kv.nkv(p),
                        ATTN_CU_DEC_KT, nsplit, split, &t0, &t1);
  }
};

// Q's R rows into sQ (16 rows, the rest zero), by the whole block.
template <typename T, int DPAD, int NT>
__device__ __forceinline__ void dec_load_q(T *sQ, const T *gQ, int rows, int dp) {
  constexpr int CH = DPAD / 8, STR = DPAD + 8;
  for (int idx = threadIdx.x; idx < 16 * CH; idx += NT) {
    const int r = idx / CH, c = idx % CH;
    const bool ok = r < rows && c * 8 < dp;
    cp_async16(sQ + r * STR + c * 8, ok ? gQ + (size_t)r * dp + c * 8 : gQ, ok);
  }
  cp_async_commit();
  cp_async_wait<0>();
}

// A warp's pass over its tiles of the block's range: the ring, the scores,
// the softmax and Oᵀ.
template <typename T, int DPAD, int NB, int NW, int ST, bool PAGED>
__device__ __forceinline__ void
dec_warp_loop(const attn_cu_params &p, const dec_block<T, PAGED> &bk,
              const uint32_t (&qf)[dec_qregs<DPAD>()][4], const T *sQ, T *ring, T *sP, int pack,
              float (&o)[DPAD / 16][NB][4], float (&m)[NB][2], float (&l)[NB][2]) {
  constexpr int TILE = ATTN_CU_DEC_KT * (DPAD + 8), KT = ATTN_CU_DEC_KT;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int n = attn_cu_dec_warp_count(bk.t0, bk.t1, warp, NW);
  const bool var = p.cap2 > 0.0f || p.alibi2;
  const float k = attn_cu_exp_factor(p.scale_log2, var);
  const dec_cols<NB> cl(p, pack, bk.b, bk.h0, lane);
#pragma unroll
  for (int i = 0; i < ST - 1; i++) {
    if (i < n) {
      const int j0 = attn_cu_dec_warp_tile(bk.t0, warp, NW, i) * KT;
      dec_load<T, DPAD>(ring + 2 * i * TILE, bk.kv.k_rows(p, j0), bk.kv.nkv(p) - j0, p.dp, lane);
      dec_load<T, DPAD>(ring + (2 * i + 1) * TILE, bk.kv.v_rows(p, j0), bk.kv.nkv(p) - j0, p.dp,
                        lane);
    }
    cp_async_commit();
  }
  for (int i = 0; i < n; i++) {
    __syncwarp(); // every lane is done with the stage refilled below
    const int nx = i + ST - 1;
    if (nx < n) {
      const int j0 = attn_cu_dec_warp_tile(bk.t0, warp, NW, nx) * KT, st = nx % ST;
      dec_load<T, DPAD>(ring + 2 * st * TILE, bk.kv.k_rows(p, j0), bk.kv.nkv(p) - j0, p.dp, lane);
      dec_load<T, DPAD>(ring + (2 * st + 1) * TILE, bk.kv.v_rows(p, j0), bk.kv.nkv(p) - j0, p.dp,
                        lane);
    }
    cp_async_commit();
    cp_async_wait<ST - 1>(); // tile i's group is complete
    __syncwarp();            // ... for every lane's chunks
    const int j0 = attn_cu_dec_warp_tile(bk.t0, warp, NW, i) * KT, st = i % ST;
    float s[NB][4];
    dec_qk<T, DPAD, NB>(s, qf, sQ, ring + 2 * st * TILE, lane);
    const bool full = attn_cu_tile_full(j0, KT, 0, p.seq_q, bk.kv.off(p), p.window_left,
                                        p.window_right, bk.kv.nkv(p));
    dec_scores<NB>(s, p, k, var, full, bk.kv.off(p), bk.kv.nkv(p), j0, cl, lane);
    dec_softmax<NB, DPAD / 16>(s, o, m, l, k);
    dec_pv<T, DPAD, NB>(o, s, sP, ring + (2 * st + 1) * TILE, lane);
  }
  cp_async_wait<0>();
}

// The warp's statistics and Oᵀ into shared memory for the combine: (m2, l)
// pairs sML[w][column], O sO[w][column][dim] (row stride DPAD + 4: the
// lanes' columns 2t land in distinct banks).
template <int DPAD, int NB>
__device__ __forceinline__ void dec_warp_out(const float (&o)[DPAD / 16][NB][4],
                                             const float (&m)[NB][2], float (&l)[NB][2], float *sML,
                                             float *sO, int warp, int lane) {
  constexpr int OS = DPAD + 4;
#pragma unroll
  for (int n = 0; n < NB; n++)
#pragma unroll
    for (int c = 0; c < 2; c++) {
      int row, col;
      attn_cu_frag_c(lane, c, &row, &col);
      l[n][c] = warp_cols_sum(l[n][c]);
      if (row == 0) {
        sML[2 * (warp * 16 + n * 8 + col)] = m[n][c];
        sML[2 * (warp * 16 + n * 8 + col) + 1] = l[n][c];
      }
    }
#pragma unroll
  for (int dm = 0; dm < DPAD / 16; dm++)
#pragma unroll
    for (int n = 0; n < NB; n++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        int dim, col; // Oᵀ's C: rows head dims, columns queries
        attn_cu_frag_c(lane, e, &dim, &col);
        sO[(warp * 16 + n * 8 + col) * OS + dm * 16 + dim] = o[dm][n][e];
      }
}

// The block's result from its warps': O normalized by the block's l, and
// (m2, l); the output and statistics with one split, else the split's F32
// partials (rows_out).
template <typename T, int DPAD, int NW>
__device__ __forceinline__ void dec_combine(const attn_cu_params &p, const float *sML,
                                            const float *sO, size_t qrow0, int rows, int nsplit,
                                            int split) {
  constexpr int OS = DPAD + 4;
  const rows_out out{&p, nsplit, split, (size_t)p.batch * p.heads_q * p.seq_q};
  for (int idx = threadIdx.x; idx < rows * p.dp; idx += NW * 32) {
    const int col = idx / p.dp, d = idx % p.dp;
    float m2, l;
    attn_cu_merge(sML + 2 * col, 16, NW, &m2, &l);
    float acc = 0.0f;
#pragma unroll
    for (int w = 0; w < NW; w++)
      acc += attn_cu_dec_warp_weight(sML[2 * (w * 16 + col)], sML[2 * (w * 16 + col) + 1], m2, l) *
             sO[(w * 16 + col) * OS + d];
    if (nsplit == 1)
      ((T *)p.o)[(qrow0 + col) * p.dp + d] = T(acc);
    else
      out.o1f(qrow0 + col, d, acc);
    if (d == 0)
      out.stats(qrow0 + col, m2, l);
  }
}

// The last block of a (batch, KV head) merges its splits' partials, read
// through L2 (__ldcg: other multiprocessors wrote them): warp by warp each
// column's merged (m2, l), its statistics and the splits' weights (into
// sWt[column][split]), then every output element 4 columns at a time.
template <typename T, int NW>
__device__ __forceinline__ void dec_merge(const attn_cu_params &p, float *sWt, size_t qrow0,
                                          int rows, int nsplit) {
  const size_t nrows = (size_t)p.batch * p.heads_q * p.seq_q;
  const float *po = (const float *)p.split_ws, *pml = po + (size_t)nsplit * nrows * p.dp;
  const rows_out fin{&p, 1, 0, nrows};
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int col = warp; col < rows; col += NW) {
    const size_t row = qrow0 + col;
    float m2 = -INFINITY, l = 0.0f;
    for (int s = lane; s < nsplit; s += 32) {
      const float2 ml = __ldcg(reinterpret_cast<const float2 *>(pml + 2 * (s * nrows + row)));
      m2 = ml.y > 0.0f ? fmaxf(m2, ml.x) : m2;
    }
    m2 = fmaxf(m2, __shfl_xor_sync(0xffffffffu, m2, 1));
    m2 = fmaxf(m2, __shfl_xor_sync(0xffffffffu, m2, 2));
    m2 = warp_cols_max(m2);
    for (int s = lane; s < nsplit; s += 32) {
      const float2 ml = __ldcg(reinterpret_cast<const float2 *>(pml + 2 * (s * nrows + row)));
      l += ml.y > 0.0f ? ml.y * exp2f(ml.x - m2) : 0.0f;
    }
    l = warp_cols_sum(quad_sum(l));
    for (int s = lane; s < nsplit; s += 32) {
      const float2 ml = __ldcg(reinterpret_cast<const float2 *>(pml + 2 * (s * nrows + row)));
      sWt[col * ATTN_CU_MAX_SPLITS + s] = attn_cu_merge_weight(ml.x, ml.y, m2, l);
    }
    if (lane == 0)
      fin.stats(row, m2, l);
  }
  __syncthreads();
  const int d4 = p.dp / 4;
  for (int idx = threadIdx.x; idx < rows * d4; idx += NW * 32) {
    const int col = idx / d4, d = 4 * (idx % d4);
    const size_t row = qrow0 + col;
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 8
    for (int s = 0; s < nsplit; s++) {
      const float w = sWt[col * ATTN_CU_MAX_SPLITS + s];
      const float4 v = __ldcg(reinterpret_cast<const float4 *>(po + (s * nrows + row) * p.dp + d));
      acc.x += w * v.x, acc.y += w * v.y, acc.z += w * v.z, acc.w += w * v.w;
    }
    uint2 pk = make_uint2(mma_t<T>::pack(acc.x, acc.y), mma_t<T>::pack(acc.z, acc.w));
    *reinterpret_cast<uint2 *>((T *)p.o + row * p.dp + d) = pk;
  }
}

// Whether this block is the last of its (batch, KV head) to finish: its
// partials are fenced before the count, and the last resets the counter
// for the next launch.
__device__ __forceinline__ bool dec_is_last(const attn_cu_params &p, size_t bh, int nsplit,
                                            int *sFlag) {
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    const size_t nrows = (size_t)p.batch * p.heads_q * p.seq_q;
    unsigned *cnt = (unsigned *)p.split_ws + attn_cu_dec_counter_at(nsplit, nrows, p.dp, bh);
    const bool last = atomicAdd(cnt, 1u) == (unsigned)nsplit - 1;
    if (last)
      atomicExch(cnt, 0u);
    *sFlag = last;
  }
  __syncthreads();
  if (!*sFlag)
    return false;
  __threadfence();
  return true;
}

template <typename T, int DPAD, int NB, int NW, int ST, bool PAGED>
__global__ void __launch_bounds__(NW * 32)
    decode_kernel(const attn_cu_params p, int nsplit, int pack) {
  static_assert(ATTN_CU_PAGE_ALIGN_TOKENS % ATTN_CU_DEC_KT == 0, "a tile never straddles a page");
  static_assert(NB == 1 || NB == 2, "8 or 16 query columns");
  constexpr int STR = DPAD + 8, TILE = ATTN_CU_DEC_KT * STR, MD = DPAD / 16;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T *sQ = reinterpret_cast<T *>(smem_raw);
  T *sRing = sQ + 16 * STR; // [NW][ST][K, V][16][STR]
  T *sP = sRing + NW * ST * 2 * TILE;
  float *sML = reinterpret_cast<float *>(sP + NW * ATTN_CU_DEC_KT * ATTN_CU_DEC_PSTR);
  int *sFlag = reinterpret_cast<int *>(sML + NW * 16 * 2);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const dec_block<T, PAGED> bk(p, nsplit, pack);

  dec_load_q<T, DPAD, NW * 32>(sQ, (const T *)p.q + bk.qrow0 * p.dp, bk.rows, p.dp);
  __syncthreads();
  uint32_t qf[dec_qregs<DPAD>()][4];
  if constexpr (DPAD <= 128) {
    int qc, qd;
    attn_cu_dec_addr_q(lane, &qc, &qd);
#pragma unroll
    for (int kk = 0; kk < MD; kk++)
      ldsm_x4(qf[kk], sQ + qc * STR + kk * 16 + qd);
  }

  float o[MD][NB][4], m[NB][2], l[NB][2];
#pragma unroll
  for (int n = 0; n < NB; n++) {
#pragma unroll
    for (int d = 0; d < MD; d++)
      o[d][n][0] = o[d][n][1] = o[d][n][2] = o[d][n][3] = 0.0f;
    m[n][0] = m[n][1] = -INFINITY;
    l[n][0] = l[n][1] = 0.0f;
  }
  dec_warp_loop<T, DPAD, NB, NW, ST, PAGED>(p, bk, qf, sQ, sRing + warp * ST * 2 * TILE,
                                            sP + warp * ATTN_CU_DEC_KT * ATTN_CU_DEC_PSTR, pack, o,
                                            m, l);
  __syncthreads(); // every warp is done with the ring: it holds the combine now
  float *sO = reinterpret_cast<float *>(sRing);
  dec_warp_out<DPAD, NB>(o, m, l, sML, sO, warp, lane);
  __syncthreads();
  dec_combine<T, DPAD, NW>(p, sML, sO, bk.qrow0, bk.rows, nsplit, bk.split);
  if (nsplit > 1 && dec_is_last(p, bk.bh, nsplit, sFlag))
    dec_merge<T, NW>(p, sO, bk.qrow0, bk.rows, nsplit);
}

template <typename T, int DPAD, int NW, int ST, bool PAGED>
void launch_decode_t(const attn_cu_params &p, const attn_cu_choice &c, cudaStream_t s) {
  dim3 grid(c.grid[0], c.grid[1], c.grid[2]), block(NW * 32);
  const int pack = c.pack > 1 ? c.pack : 1;
  if (pack * p.seq_q <= 8)
    decode_kernel<T, DPAD, 1, NW, ST, PAGED><<<grid, block, c.smem_bytes, s>>>(p, c.nsplit, pack);
  else
    decode_kernel<T, DPAD, 2, NW, ST, PAGED><<<grid, block, c.smem_bytes, s>>>(p, c.nsplit, pack);
}

// The split counters start at zero (split_ws is the caller's scratch, not
// zeroed): a memset of B·Hkv words on the stream, before the kernel.
template <int DPAD, int NW, int ST>
cudaError_t launch_decode(const attn_cu_params &p, const attn_cu_choice &c, cudaStream_t s) {
  if (c.pack * p.seq_q > 16 || c.grid[0] != 1)
    return cudaErrorInvalidValue;
  if (c.nsplit > 1) {
    const size_t nrows = (size_t)p.batch * p.heads_q * p.seq_q;
    unsigned *cnt = (unsigned *)p.split_ws + attn_cu_dec_counter_at(c.nsplit, nrows, p.dp, 0);
    cudaError_t e = cudaMemsetAsync(cnt, 0, (size_t)p.batch * p.heads_kv * sizeof(unsigned), s);
    if (e != cudaSuccess)
      return e;
  }
  const bool paged = p.k_table != nullptr;
  if (p.dtype == ATTN_F16)
    paged ? launch_decode_t<__half, DPAD, NW, ST, true>(p, c, s)
          : launch_decode_t<__half, DPAD, NW, ST, false>(p, c, s);
  else
    paged ? launch_decode_t<__nv_bfloat16, DPAD, NW, ST, true>(p, c, s)
          : launch_decode_t<__nv_bfloat16, DPAD, NW, ST, false>(p, c, s);
  return cudaGetLastError();
}

template <typename T, int DPAD, int NW, int ST> cudaError_t prepare_decode_t(int bytes) {
  const void *fs[4] = {(const void *)decode_kernel<T, DPAD, 1, NW, ST, false>,
                       (const void *)decode_kernel<T, DPAD, 2, NW, ST, false>,
                       (const void *)decode_kernel<T, DPAD, 1, NW, ST, true>,
                       (const void *)decode_kernel<T, DPAD, 2, NW, ST, true>};
  cudaError_t e = cudaSuccess;
  for (int i = 0; i < 4 && e == cudaSuccess; i++)
    e = cudaFuncSetAttribute(fs[i], cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  return e;
}

template <int DPAD, int NW, int ST> cudaError_t prepare_decode() {
  constexpr int bytes = attn_cu_dec_smem(DPAD, NW, ST);
  cudaError_t e = prepare_decode_t<__half, DPAD, NW, ST>(bytes);
  if (e == cudaSuccess)
    e = prepare_decode_t<__nv_bfloat16, DPAD, NW, ST>(bytes);
  return e;
}

} // namespace attn_cu

#endif
