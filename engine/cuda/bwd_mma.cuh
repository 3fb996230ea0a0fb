// bwd_mma.cuh — the FlashAttention-2 backward pass on tensor cores
// (mma.sync m16n8k16, F16/BF16 inputs, F32 accumulators).
//
// Two kernels, each the only writer of its outputs (deterministic: no
// atomics), after the preprocess in launch.cu has stored D = rowsum(dO∘O)
// and lse·log2 e per query row:
//
// bwd_dkdv: one block per (key block of BN keys, KV head, batch). K and V
// of the block stay in shared memory; the block walks the query tiles of
// BM rows that see any of its keys, for every query head of its GQA group,
// with Q, dO, lse and D of the next tile prefetched by cp.async (STAGES 2)
// while the current one is computed. Per tile each warp recomputes, for its
// 16 keys, Sᵀ = K Qᵀ, Pᵀ = exp2(Sᵀ·scale·log2 e − lse·log2 e) (0 where
// masked), accumulates dV += Pᵀ dO, forms dPᵀ = V dOᵀ and
// dSᵀ = Pᵀ∘(dPᵀ − D) (softcap: times 1 − tanh² of the score; ALiBi adds
// −slope·|i + off − j| to the score before exp2), and accumulates dK += dSᵀ Q; the accumulator
// layout of Pᵀ and dSᵀ is the A layout of the next product, so neither leaves registers. dK is
// scaled once at the end.
//
// bwd_dq: one block per (query tile, query head, batch), warps of 16 rows
// as in the forward: per key tile S = Q Kᵀ, P, dP = dO Vᵀ, dS = P∘(dP − D),
// dQ += dS K (K through ldmatrix.trans); dQ is scaled once at the end.
//
// The atomic path (bwd_dkdv with ATOMIC, chosen when the launch is not
// deterministic, kernels.h): each step also stores dS in shared memory and
// the block adds dS K to an F32 dQ accumulator with atomics, so dQ costs
// one product per step instead of bwd_dq's three (S, dP and dQ again):
// five products per (query tile, key block) pair instead of seven. The
// order of the additions varies from run to run, hence the last bits of dQ.
// A post-kernel (launch.cu) scales and converts the accumulator into dQ.
//
// Rows with no visible key have every P masked to 0 (and lse·log2 e = +inf
// from the preprocess, so exp2 gives 0 even unmasked): they contribute
// nothing and get dQ = 0.
#ifndef ATTN_CUDA_BWD_MMA_CUH
#define ATTN_CUDA_BWD_MMA_CUH

#include "fwd_mma.cuh"

namespace attn_cu {

// Copies rows [0, rows) x [0, DPAD) of a tile from global memory (row stride
// dp) into padded shared memory; rows >= valid and columns >= dp become 0.
// A strided loop, not the forward's unrolled tile_copy: unrolled, the
// addresses cost the d64 dK/dV kernel 16 bytes of spills on sm_90.
template <typename T, int ROWS, int DPAD, int NT>
__device__ __forceinline__ void load_tile(T *s, const T *g, int valid, int dp) {
  constexpr int CH = DPAD / 8, STR = DPAD + 8;
#pragma unroll
  for (int idx = threadIdx.x; idx < ROWS * CH; idx += NT) {
    int r = idx / CH, c = (idx % CH) * 8;
    bool ok = r < valid && c < dp;
    cp_async16(s + r * STR + c, ok ? g + (size_t)r * dp + c : g, ok);
  }
}

// lse·log2 e and D of query rows [i0, i0 + BM) into shared memory; rows past
// nq get +inf and 0 (P = 0 there).
template <int BM>
__device__ __forceinline__ void load_rowstats(float *sL, float *sD, const float *lse2,
                                              const float *delta, int i0, int nq) {
  for (int r = threadIdx.x; r < BM; r += blockDim.x) {
    bool ok = i0 + r < nq;
    sL[r] = ok ? lse2[i0 + r] : INFINITY;
    sD[r] = ok ? delta[i0 + r] : 0.0f;
  }
}

// acc[NB][4] (16 x 8·NB, C layout) += A (16 x 16·KD, smem rows `a`, row
// stride STR) times the transpose of the tile at `b` (8·NB rows x 16·KD):
// both operands plain ldmatrix, as S = Q Kᵀ in the forward.
template <typename T, int KD, int NB, int STR>
__device__ __forceinline__ void mma_abt(float (*acc)[4], const T *a, const T *b, int lane) {
  int ar, ac, br, bc;
  attn_cu_ldsm_q(lane, &ar, &ac);
  attn_cu_ldsm_k(lane, &br, &bc);
#pragma unroll
  for (int kk = 0; kk < KD; kk++) {
    uint32_t af[4];
    ldsm_x4(af, a + ar * STR + kk * 16 + ac);
#pragma unroll
    for (int n2 = 0; n2 < NB / 2; n2++) {
      uint32_t bf[4];
      ldsm_x4(bf, b + (n2 * 16 + br) * STR + kk * 16 + bc);
      mma_t<T>::run(acc[2 * n2], af, bf[0], bf[1]);
      mma_t<T>::run(acc[2 * n2 + 1], af, bf[2], bf[3]);
    }
  }
}

// acc[DB][4] (16 x 8·DB) += X B, where X (16 x 16·KS) is held in C layout
// as x[2·KS][4] (the accumulators of a previous product) and B is the tile
// at `b` (16·KS rows, row stride STR; columns from b on), read through
// ldmatrix.trans as V in O += P V.
template <typename T, int KS, int DB, int STR>
__device__ __forceinline__ void mma_xb(float (*acc)[4], const float (*x)[4], const T *b, int lane) {
  using M = mma_t<T>;
  int vr, vc;
  attn_cu_ldsm_v(lane, &vr, &vc);
#pragma unroll
  for (int k = 0; k < KS; k++) {
    uint32_t a[4];
    a[0] = M::pack(x[2 * k][0], x[2 * k][1]);
    a[1] = M::pack(x[2 * k][2], x[2 * k][3]);
    a[2] = M::pack(x[2 * k + 1][0], x[2 * k + 1][1]);
    a[3] = M::pack(x[2 * k + 1][2], x[2 * k + 1][3]);
#pragma unroll
    for (int d2 = 0; d2 < DB / 2; d2++) {
      uint32_t bv[4];
      ldsm_x4_t(bv, b + (k * 16 + vr) * STR + d2 * 16 + vc);
      M::run(acc[2 * d2], a, bv[0], bv[1]);
      M::run(acc[2 * d2 + 1], a, bv[2], bv[3]);
    }
  }
}

template <int N> __device__ __forceinline__ void zero(float (*x)[4]) {
#pragma unroll
  for (int n = 0; n < N; n++)
    x[n][0] = x[n][1] = x[n][2] = x[n][3] = 0.0f;
}

// Stores a warp's 16 x 8·DB accumulator tile (times mul) as rows r0 + (g,
// g + 8) of a packed [.., dp] tensor of T, columns col0 on; rows >= nrows
// and columns >= dp are left out.
template <typename T, int DB>
__device__ __forceinline__ void store_tile(T *out, const float (*acc)[4], int r0, int nrows,
                                           int col0, int dp, float mul, int lane) {
  int row, col;
  attn_cu_frag_c(lane, 0, &row, &col);
#pragma unroll
  for (int d = 0; d < DB; d++) {
    int c = col0 + d * 8 + col;
    if (c >= dp)
      continue;
    if (r0 + row < nrows)
      *reinterpret_cast<uint32_t *>(out + (size_t)(r0 + row) * dp + c) =
          mma_t<T>::pack(acc[d][0] * mul, acc[d][1] * mul);
    if (r0 + row + 8 < nrows)
      *reinterpret_cast<uint32_t *>(out + (size_t)(r0 + row + 8) * dp + c) =
          mma_t<T>::pack(acc[d][2] * mul, acc[d][3] * mul);
  }
}

// g[0] += a, g[1] += b in global memory (g 8-byte aligned): one vector
// reduction on sm_90, whose atomicAdd takes a float2; two scalar ones on
// sm_80 and sm_89, which have no vector form.
__device__ __forceinline__ void atomic_add2(float *g, float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float2 *>(g), make_float2(a, b));
#else
  atomicAdd(g, a);
  atomicAdd(g + 1, b);
#endif
}

// A warp's dSᵀ (16 keys from key0 x BM queries, C layout) into sdS, rows
// the queries (attn_cu_bwd_dq_col0's comment in layout.h): the A operand
// of dQ += dS K, which the registers hold transposed.
template <typename T, int NB, int LDS>
__device__ __forceinline__ void store_ds(T *sdS, const float (*dst)[4], int key0, int lane) {
#pragma unroll
  for (int n = 0; n < NB; n++)
#pragma unroll
    for (int e = 0; e < 4; e++) {
      int row, col;
      attn_cu_frag_c(lane, e, &row, &col);
      sdS[attn_cu_bwd_ds_at(n, row, col, key0, LDS)] = T(dst[n][e]);
    }
}

// Row tiles [m0, m0 + MT) of the warp's share of dQ += dS K for one query
// step: those rows of dS (sdS, BN keys) times the block's K (sK, through
// ldmatrix.trans as V in O += P V), head dims [col0, col0 + DPAD / 4),
// added into the step's rows of the F32 accumulator (gacc, row stride dp;
// rows >= nrows and columns >= dp left out). Unscaled: the post-kernel
// scales.
template <typename T, int DPAD, int BN, int MT>
__device__ __forceinline__ void dq_rows(float *gacc, const T *sdS, const T *sK, int m0, int col0,
                                        int nrows, int dp, int lane) {
  constexpr int STR = DPAD + 8, LDS = BN + 8, DQ = DPAD / ATTN_CU_MMA_WARPS / 8;
  static_assert(DQ % 2 == 0, "pairs of 8-dim blocks per ldmatrix.x4");
  float acc[MT][DQ][4];
#pragma unroll
  for (int m = 0; m < MT; m++)
    zero<DQ>(acc[m]);
  int ar, ac, vr, vc;
  attn_cu_ldsm_q(lane, &ar, &ac);
  attn_cu_ldsm_v(lane, &vr, &vc);
#pragma unroll
  for (int k = 0; k < BN / 16; k++) {
    uint32_t a[MT][4];
#pragma unroll
    for (int m = 0; m < MT; m++)
      ldsm_x4(a[m], sdS + ((m0 + m) * 16 + ar) * LDS + k * 16 + ac);
#pragma unroll
    for (int d2 = 0; d2 < DQ / 2; d2++) {
      uint32_t bv[4];
      ldsm_x4_t(bv, sK + (k * 16 + vr) * STR + col0 + d2 * 16 + vc);
#pragma unroll
      for (int m = 0; m < MT; m++) {
        mma_t<T>::run(acc[m][2 * d2], a[m], bv[0], bv[1]);
        mma_t<T>::run(acc[m][2 * d2 + 1], a[m], bv[2], bv[3]);
      }
    }
  }
  int row, col;
  attn_cu_frag_c(lane, 0, &row, &col);
#pragma unroll
  for (int m = 0; m < MT; m++)
#pragma unroll
    for (int d = 0; d < DQ; d++) {
      const int c = col0 + d * 8 + col, r = (m0 + m) * 16 + row;
      if (c >= dp)
        continue;
      if (r < nrows)
        atomic_add2(gacc + (size_t)r * dp + c, acc[m][d][0], acc[m][d][1]);
      if (r + 8 < nrows)
        atomic_add2(gacc + (size_t)(r + 8) * dp + c, acc[m][d][2], acc[m][d][3]);
    }
}

// The warp's share of dQ += dS K for one query step: both row tiles at
// once (each K fragment read once), or at 256 dims one after the other,
// whose 64 accumulators a tile would otherwise spill on sm_80 and sm_89.
template <typename T, int DPAD, int BN>
__device__ __forceinline__ void dq_atomic(float *gacc, const T *sdS, const T *sK, int col0,
                                          int nrows, int dp, int lane) {
  constexpr int MT = ATTN_CU_BWD_BM / 16;
  if constexpr (DPAD > 128) {
#pragma unroll 1
    for (int m = 0; m < MT; m++)
      dq_rows<T, DPAD, BN, 1>(gacc, sdS, sK, m, col0, nrows, dp, lane);
  } else {
    dq_rows<T, DPAD, BN, MT>(gacc, sdS, sK, 0, col0, nrows, dp, lane);
  }
}

// Where one query step of the dK/dV kernel reads: query head h, tile qt.
struct bwd_step {
  int h, i0;
};
__device__ __forceinline__ bwd_step step_of(int step, int nqt, int qt0, int hkv, int group,
                                            int bm) {
  return bwd_step{hkv * group + step / nqt, (qt0 + step % nqt) * bm};
}

template <typename T, int DPAD, int BN, int DSPLIT, int STAGES, bool ATOMIC>
__global__ void __launch_bounds__(ATTN_CU_MMA_WARPS * 32) bwd_dkdv(const attn_cu_params p) {
  constexpr int NW = ATTN_CU_MMA_WARPS, NT = NW * 32, BM = ATTN_CU_BWD_BM;
  constexpr int STR = DPAD + 8, KD = DPAD / 16, NB = BM / 8, DB = DPAD / DSPLIT / 8;
  static_assert(BN == 16 * NW / DSPLIT, "each warp owns 16 keys and 1/DSPLIT of the dims");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T *sK = reinterpret_cast<T *>(smem_raw);
  T *sV = sK + BN * STR;
  T *sQ = sV + BN * STR;                                         // [STAGES][BM][STR]
  T *sO = sQ + STAGES * BM * STR;                                // dO, [STAGES][BM][STR]
  float *sL = reinterpret_cast<float *>(sO + STAGES * BM * STR); // [STAGES][BM]
  float *sD = sL + STAGES * BM;
  T *sdS = reinterpret_cast<T *>(sD + STAGES * BM); // ATOMIC: dS, [BM][BN + 8]

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int hkv = blockIdx.y, b = blockIdx.z, group = p.heads_q / p.heads_kv;
  const int j0 = blockIdx.x * BN, nvalid = min(BN, p.seq_kv - j0);
  const int64_t off = p.off;
  const size_t krow0 = ((size_t)b * p.heads_kv + hkv) * p.seq_kv + j0;
  int key0, dim0;
  attn_cu_bwd_warp(warp, DSPLIT, DPAD, &key0, &dim0);
  int qt0, qt1;
  attn_cu_key_block_qtiles(j0, j0 + nvalid, off, p.window_left, p.window_right, p.seq_q, p.seq_kv,
                           BM, &qt0, &qt1);
  const int nqt = qt1 - qt0, nsteps = nqt * group;
  // This lane's two keys and the query rows that see each.
  const int ja = j0 + key0 + lane / 4, jb = ja + 8;
  int lo_a, hi_a, lo_b, hi_b;
  attn_cu_key_bounds(ja, off, p.window_left, p.window_right, p.seq_q, p.seq_kv, &lo_a, &hi_a);
  attn_cu_key_bounds(jb, off, p.window_left, p.window_right, p.seq_q, p.seq_kv, &lo_b, &hi_b);
  const float *lse2 = p.bwd_ws + (size_t)p.batch * p.heads_q * p.seq_q;

  // Query step s's tiles into stage buffer buf (cp.async; lse and D plain).
  auto load_step = [&](int s, int buf) {
    bwd_step st = step_of(s, nqt, qt0, hkv, group, BM);
    const size_t qrow = ((size_t)b * p.heads_q + st.h) * p.seq_q + st.i0;
    load_tile<T, BM, DPAD, NT>(sQ + buf * BM * STR, (const T *)p.q + qrow * p.dp, p.seq_q - st.i0,
                               p.dp);
    load_tile<T, BM, DPAD, NT>(sO + buf * BM * STR, (const T *)p.dout + qrow * p.dp,
                               p.seq_q - st.i0, p.dp);
    load_rowstats<BM>(sL + buf * BM, sD + buf * BM, lse2 + (qrow - st.i0),
                      p.bwd_ws + (qrow - st.i0), st.i0, p.seq_q);
  };

  const bool var = p.cap2 > 0.0f || p.alibi2;
  float dk[DB][4], dv[DB][4];
  zero<DB>(dk);
  zero<DB>(dv);
  if (nsteps > 0) {
    load_tile<T, BN, DPAD, NT>(sK, (const T *)p.k + krow0 * p.dp, nvalid, p.dp);
    load_tile<T, BN, DPAD, NT>(sV, (const T *)p.v + krow0 * p.dp, nvalid, p.dp);
    load_step(0, 0);
    cp_async_commit();
  }
  for (int s = 0; s < nsteps; s++) {
    const int buf = STAGES == 2 ? s & 1 : 0;
    if (STAGES == 1 && s > 0) {
      load_step(s, 0);
      cp_async_commit();
    }
    if (STAGES == 2 && s + 1 < nsteps) {
      load_step(s + 1, buf ^ 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const T *sQb = sQ + buf * BM * STR, *sOb = sO + buf * BM * STR;
    const float *sLb = sL + buf * BM, *sDb = sD + buf * BM;
    const int i0 = step_of(s, nqt, qt0, hkv, group, BM).i0;
    const bool full =
        i0 + BM <= p.seq_q && j0 + BN <= p.seq_kv &&
        attn_cu_tile_full(j0, BN, i0, i0 + BM, off, p.window_left, p.window_right, p.seq_kv);

    // Sᵀ for this warp's 16 keys and the step's BM queries, Pᵀ from it,
    // dV += Pᵀ dO; dSᵀ = Pᵀ∘(dPᵀ − D), dPᵀ = V dOᵀ, and dK += dSᵀ Q. With
    // softcap dSᵀ takes the factor 1 − tanh² of each score, so the variant
    // path (one uniform branch per step) forms dPᵀ before Pᵀ and both in
    // one pass; the plain path keeps the order that holds fewer registers.
    auto body = [&](auto var_tag) {
      constexpr bool VAR = decltype(var_tag)::value;
      float st[NB][4], dpt[NB][4];
      zero<NB>(st);
      mma_abt<T, KD, NB, STR>(st, sK + key0 * STR, sQb, lane);
      float d0 = 0.0f, slope2 = 0.0f;
      if constexpr (VAR) {
        zero<NB>(dpt);
        mma_abt<T, KD, NB, STR>(dpt, sV + key0 * STR, sOb, lane);
        d0 = attn_cu_dist0(i0, off, ja); // key ja to query i0; key jb is 8 nearer
        if (p.alibi2)
          slope2 = p.alibi2[(size_t)b * p.heads_q + step_of(s, nqt, qt0, hkv, group, BM).h];
      }
#pragma unroll
      for (int n = 0; n < NB; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
          int row, col;
          attn_cu_frag_c(lane, e, &row, &col);
          const int q = n * 8 + col, i = i0 + q;
          float x = st[n][e] * p.scale_log2, g = 1.0f;
          if constexpr (VAR)
            x = attn_cu_variant(x, p.cap2, p.inv_cap2, slope2, attn_cu_frag_dist(d0, -1, row, q),
                                &g);
          x = fast_exp2(x - sLb[q]);
          if (!full) {
            bool vis = row < 8 ? (i >= lo_a && i <= hi_a) : (i >= lo_b && i <= hi_b);
            x = vis ? x : 0.0f;
          }
          st[n][e] = x;
          if constexpr (VAR)
            dpt[n][e] = x * g * (dpt[n][e] - sDb[q]);
        }
      mma_xb<T, BM / 16, DB, STR>(dv, st, sOb + dim0, lane);
      if constexpr (!VAR) {
        zero<NB>(dpt);
        mma_abt<T, KD, NB, STR>(dpt, sV + key0 * STR, sOb, lane);
#pragma unroll
        for (int n = 0; n < NB; n++)
#pragma unroll
          for (int e = 0; e < 4; e++) {
            int row, col;
            attn_cu_frag_c(lane, e, &row, &col);
            dpt[n][e] = st[n][e] * (dpt[n][e] - sDb[n * 8 + col]);
          }
      }
      mma_xb<T, BM / 16, DB, STR>(dk, dpt, sQb + dim0, lane);
      if constexpr (ATOMIC)
        if (dim0 == 0) // with DSPLIT 2, both warps of a key slice hold the same dSᵀ
          store_ds<T, NB, BN + 8>(sdS, dpt, key0, lane);
    };
    if (var)
      body(std::true_type{});
    else
      body(std::false_type{});
    if constexpr (ATOMIC) {
      __syncthreads(); // every warp's dS is in sdS
      const bwd_step at = step_of(s, nqt, qt0, hkv, group, BM);
      float *gacc = p.bwd_ws + attn_cu_bwd_dq_at((uint64_t)p.batch * p.heads_q * p.seq_q) +
                    (((size_t)b * p.heads_q + at.h) * p.seq_q + at.i0) * p.dp;
      dq_atomic<T, DPAD, BN>(gacc, sdS, sK, attn_cu_bwd_dq_col0(warp, DPAD), p.seq_q - at.i0, p.dp,
                             lane);
    }
    __syncthreads(); // the next step refills the buffers read here (sdS too)
  }

  store_tile<T, DB>((T *)p.dk + krow0 * p.dp, dk, key0, nvalid, dim0, p.dp, p.scale, lane);
  store_tile<T, DB>((T *)p.dv + krow0 * p.dp, dv, key0, nvalid, dim0, p.dp, 1.0f, lane);
}

template <typename T, int DPAD, int BN, bool QREG, int STAGES>
__global__ void __launch_bounds__(ATTN_CU_MMA_WARPS * 32) bwd_dq(const attn_cu_params p) {
  constexpr int NW = ATTN_CU_MMA_WARPS, NT = NW * 32, BM = ATTN_CU_BWDQ_BM;
  constexpr int STR = DPAD + 8, KD = DPAD / 16, NB = BN / 8, DB = DPAD / 8;
  static_assert(BM == 16 * NW, "warps of 16 query rows");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T *sQ = reinterpret_cast<T *>(smem_raw);
  T *sO = sQ + BM * STR;          // dO
  T *sK = sO + BM * STR;          // [STAGES][BN][STR]
  T *sV = sK + STAGES * BN * STR; // [STAGES][BN][STR]

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int qt = gridDim.x - 1 - blockIdx.x; // longest (causal) tiles first
  const int h = blockIdx.y, b = blockIdx.z;
  const int i0 = qt * BM, i1 = min(i0 + BM, p.seq_q);
  const int hkv = h / (p.heads_q / p.heads_kv);
  const int64_t off = p.off;
  const size_t qrow0 = ((size_t)b * p.heads_q + h) * p.seq_q;
  const size_t kbase = ((size_t)b * p.heads_kv + hkv) * p.seq_kv * p.dp;
  const T *gK = (const T *)p.k + kbase, *gV = (const T *)p.v + kbase;
  int t0, t1;
  attn_cu_block_tiles(i0, i1, off, p.window_left, p.window_right, p.seq_kv, BN, 1, 0, &t0, &t1);

  const int ra = i0 + warp * 16 + lane / 4, rb = ra + 8;
  int lo_a, hi_a, lo_b, hi_b;
  attn_cu_row_bounds(ra, off, p.window_left, p.window_right, p.seq_kv, &lo_a, &hi_a);
  attn_cu_row_bounds(rb, off, p.window_left, p.window_right, p.seq_kv, &lo_b, &hi_b);
  const float *lse2 = p.bwd_ws + (size_t)p.batch * p.heads_q * p.seq_q;
  const float l2a = ra < p.seq_q ? lse2[qrow0 + ra] : INFINITY;
  const float l2b = rb < p.seq_q ? lse2[qrow0 + rb] : INFINITY;
  const float da = ra < p.seq_q ? p.bwd_ws[qrow0 + ra] : 0.0f;
  const float db = rb < p.seq_q ? p.bwd_ws[qrow0 + rb] : 0.0f;

  auto load_kv = [&](int t, int buf) {
    load_tile<T, BN, DPAD, NT>(sK + buf * BN * STR, gK + (size_t)t * BN * p.dp, p.seq_kv - t * BN,
                               p.dp);
    load_tile<T, BN, DPAD, NT>(sV + buf * BN * STR, gV + (size_t)t * BN * p.dp, p.seq_kv - t * BN,
                               p.dp);
  };

  const bool var = p.cap2 > 0.0f || p.alibi2;
  float dq[DB][4];
  zero<DB>(dq);
  uint32_t qf[QREG ? KD : 1][4], of[QREG ? KD : 1][4];
  int ar, ac, br, bc;
  attn_cu_ldsm_q(lane, &ar, &ac);
  attn_cu_ldsm_k(lane, &br, &bc);
  const T *sQw = sQ + (warp * 16 + ar) * STR + ac, *sOw = sO + (warp * 16 + ar) * STR + ac;
  if (t0 < t1) {
    load_tile<T, BM, DPAD, NT>(sQ, (const T *)p.q + (qrow0 + i0) * p.dp, i1 - i0, p.dp);
    load_tile<T, BM, DPAD, NT>(sO, (const T *)p.dout + (qrow0 + i0) * p.dp, i1 - i0, p.dp);
    load_kv(t0, 0);
    cp_async_commit();
  }
  for (int t = t0; t < t1; t++) {
    const int buf = STAGES == 2 ? (t - t0) & 1 : 0;
    if (STAGES == 1 && t > t0) {
      load_kv(t, 0);
      cp_async_commit();
    }
    if (STAGES == 2 && t + 1 < t1) {
      load_kv(t + 1, buf ^ 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    if (QREG && t == t0) {
#pragma unroll
      for (int kk = 0; kk < (QREG ? KD : 1); kk++) {
        ldsm_x4(qf[kk], sQw + kk * 16);
        ldsm_x4(of[kk], sOw + kk * 16);
      }
    }
    const T *sKb = sK + buf * BN * STR, *sVb = sV + buf * BN * STR;

    // S = Q Kᵀ and dP = dO Vᵀ, sharing the loop over head dims.
    float s[NB][4], dp[NB][4];
    zero<NB>(s);
    zero<NB>(dp);
#pragma unroll
    for (int kk = 0; kk < KD; kk++) {
      uint32_t a[4], o[4];
      if (QREG) {
#pragma unroll
        for (int r = 0; r < 4; r++) {
          a[r] = qf[QREG ? kk : 0][r];
          o[r] = of[QREG ? kk : 0][r];
        }
      } else {
        ldsm_x4(a, sQw + kk * 16);
        ldsm_x4(o, sOw + kk * 16);
      }
#pragma unroll
      for (int n2 = 0; n2 < NB / 2; n2++) {
        uint32_t bk[4], bv[4];
        ldsm_x4(bk, sKb + (n2 * 16 + br) * STR + kk * 16 + bc);
        ldsm_x4(bv, sVb + (n2 * 16 + br) * STR + kk * 16 + bc);
        mma_t<T>::run(s[2 * n2], a, bk[0], bk[1]);
        mma_t<T>::run(s[2 * n2 + 1], a, bk[2], bk[3]);
        mma_t<T>::run(dp[2 * n2], o, bv[0], bv[1]);
        mma_t<T>::run(dp[2 * n2 + 1], o, bv[2], bv[3]);
      }
    }

    // dS = P∘(dP − D), P = 0 where masked. With a variant, a pass first
    // (one uniform branch per tile) turns S into the variant's scores in
    // log2 units and dP − D into (dP − D)(1 − tanh²), so the common loop
    // below then scales by 1 and subtracts 0: the plain path keeps its
    // instructions, and the variant's registers stay out of that loop.
    const int j0 = t * BN;
    const bool full =
        attn_cu_tile_full(j0, BN, i0, i1, off, p.window_left, p.window_right, p.seq_kv);
    float sc = p.scale_log2, sub_a = da, sub_b = db;
    if (var) {
      const float d0 = attn_cu_dist0(ra, off, j0);
      const float slope2 = p.alibi2 ? p.alibi2[(size_t)b * p.heads_q + h] : 0.0f;
#pragma unroll
      for (int n = 0; n < NB; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
          int row, col;
          attn_cu_frag_c(lane, e, &row, &col);
          const bool lo = row < 8;
          float g;
          s[n][e] = attn_cu_variant(s[n][e] * p.scale_log2, p.cap2, p.inv_cap2, slope2,
                                    attn_cu_frag_dist(d0, 1, row, n * 8 + col), &g);
          dp[n][e] = (dp[n][e] - (lo ? da : db)) * g;
        }
      sc = 1.0f, sub_a = sub_b = 0.0f;
    }
#pragma unroll
    for (int n = 0; n < NB; n++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        int row, col;
        attn_cu_frag_c(lane, e, &row, &col);
        const bool lo = row < 8;
        float x = fast_exp2(s[n][e] * sc - (lo ? l2a : l2b));
        if (!full) {
          int j = j0 + n * 8 + col;
          bool vis = lo ? (j >= lo_a && j <= hi_a) : (j >= lo_b && j <= hi_b);
          x = vis ? x : 0.0f;
        }
        dp[n][e] = x * (dp[n][e] - (lo ? sub_a : sub_b));
      }
    mma_xb<T, BN / 16, DB, STR>(dq, dp, sKb, lane);
    __syncthreads(); // the next iteration refills the buffer read here
  }

  store_tile<T, DB>((T *)p.dq + qrow0 * p.dp, dq, i0 + warp * 16, p.seq_q, 0, p.dp, p.scale, lane);
}

// The dK/dV kernel, then the dQ kernel; or, for an atomic choice (no dQ
// grid), the dK/dV kernel that accumulates dQ too (launch.cu converts it).
template <typename T, int DPAD, int BN, int DSPLIT, int STAGES, int QBN, bool QREG, int QSTAGES>
void launch_bwd_t(const attn_cu_params &p, const attn_cu_choice &c, cudaStream_t s) {
  dim3 g1(c.grid[0], c.grid[1], c.grid[2]), g2(c.dq_grid[0], c.dq_grid[1], c.dq_grid[2]);
  dim3 block(ATTN_CU_MMA_WARPS * 32);
  if (attn_cu_is_atomic_dq(&c)) {
    bwd_dkdv<T, DPAD, BN, DSPLIT, STAGES, true><<<g1, block, c.smem_bytes, s>>>(p);
    return;
  }
  bwd_dkdv<T, DPAD, BN, DSPLIT, STAGES, false><<<g1, block, c.smem_bytes, s>>>(p);
  bwd_dq<T, DPAD, QBN, QREG, QSTAGES><<<g2, block, c.dq_smem_bytes, s>>>(p);
}

template <int DPAD, int BN, int DSPLIT, int STAGES, int QBN, bool QREG, int QSTAGES>
cudaError_t launch_bwd(const attn_cu_params &p, const attn_cu_choice &c, cudaStream_t s) {
  if (p.dtype == ATTN_F16)
    launch_bwd_t<__half, DPAD, BN, DSPLIT, STAGES, QBN, QREG, QSTAGES>(p, c, s);
  else
    launch_bwd_t<__nv_bfloat16, DPAD, BN, DSPLIT, STAGES, QBN, QREG, QSTAGES>(p, c, s);
  return cudaGetLastError();
}

template <int DPAD, int BN, int DSPLIT, int STAGES, int QBN, bool QREG, int QSTAGES>
cudaError_t prepare_bwd() {
  constexpr int STR2 = (DPAD + 8) * 2, BM = ATTN_CU_BWD_BM, QBM = ATTN_CU_BWDQ_BM;
  int b1 = (2 * BN + 2 * STAGES * BM) * STR2 + STAGES * 2 * BM * 4;
  int b1a = b1 + BM * (BN + 8) * 2; // and the atomic path's dS tile
  int b2 = (2 * QBM + 2 * QSTAGES * QBN) * STR2;
  cudaError_t e;
  const cudaFuncAttribute a = cudaFuncAttributeMaxDynamicSharedMemorySize;
  if ((e = cudaFuncSetAttribute(bwd_dkdv<__half, DPAD, BN, DSPLIT, STAGES, false>, a, b1)) ||
      (e = cudaFuncSetAttribute(bwd_dkdv<__nv_bfloat16, DPAD, BN, DSPLIT, STAGES, false>, a, b1)) ||
      (e = cudaFuncSetAttribute(bwd_dkdv<__half, DPAD, BN, DSPLIT, STAGES, true>, a, b1a)) ||
      (e = cudaFuncSetAttribute(bwd_dkdv<__nv_bfloat16, DPAD, BN, DSPLIT, STAGES, true>, a, b1a)) ||
      (e = cudaFuncSetAttribute(bwd_dq<__half, DPAD, QBN, QREG, QSTAGES>, a, b2)) ||
      (e = cudaFuncSetAttribute(bwd_dq<__nv_bfloat16, DPAD, QBN, QREG, QSTAGES>, a, b2)))
    return e;
  return cudaSuccess;
}

} // namespace attn_cu

#endif
