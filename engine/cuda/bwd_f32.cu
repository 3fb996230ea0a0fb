// bwd_f32.cu — the backward pass for F32 inputs on the FMA units (exact
// F32, as the forward's fwd_f32.cu, for the same reason: TF32 would round
// the inputs).
//
// Both kernels give a group of G threads one row of their output: a key in
// bwd_dkdv_f32 (dK and dV, one block per 32 keys of a KV head, stepping
// through 16 query rows at a time over every query head of the group; G =
// 8, so its two accumulators of 256 / 8 columns fit in registers), a query
// row in bwd_dq_f32 (one block per 32 query rows, stepping through 16 keys
// at a time; G = 4). Within a step each thread computes 16 / G of the 16
// scores (and dP) of its row, the group exchanges the weights by shuffles,
// and each thread accumulates 1 / G of the row's output columns. Every shared
// tile has rows padded by one float: the score loops read down columns.
// Shared memory: 4 (2·32 + 2·16)(dp + 1) bytes and a little, 98.9 KiB at
// head dim 256, under the 99 KiB a block gets on sm_89.
//
// The atomic path (kernels.h) runs bwd_dkdv_f32<true> alone: each step
// also leaves dS in shared memory (16 x 33 floats more: 98.6 KiB at 256)
// and every thread adds dS K for one query row and 1/16 of the dims into
// the F32 dQ accumulator with atomics.
#include "common.cuh"

namespace attn_cu {

namespace {

constexpr int BN = ATTN_CU_BWD_F32_BN, STEP = ATTN_CU_BWD_F32_STEP;
constexpr int GKV = 8, GQ = 4; // threads per key, per query row
constexpr int NT_KV = GKV * BN, NT_Q = GQ * BN;

// rows x dp of a packed tensor into a tile of row stride dp + 1; rows >=
// valid become 0.
__device__ __forceinline__ void load_f32(float *s, const float *g, int rows, int valid, int dp) {
  for (int x = threadIdx.x; x < rows * dp; x += blockDim.x) {
    int r = x / dp, d = x % dp;
    s[r * (dp + 1) + d] = r < valid ? g[(size_t)r * dp + d] : 0.0f;
  }
}

// Dot products of this thread's row (a, b: rows of two tiles) with rows
// sub + G·c (c < STEP / G) of two other tiles: x[c] = a·A[sub + G·c],
// y[c] = b·B[sub + G·c].
template <int G>
__device__ __forceinline__ void dots(const float *a, const float *b, const float *A, const float *B,
                                     int sub, int dp, float *x, float *y) {
  const int ks = dp + 1;
#pragma unroll
  for (int c = 0; c < STEP / G; c++)
    x[c] = y[c] = 0.0f;
  for (int d = 0; d < dp; d++) {
    float av = a[d], bv = b[d];
#pragma unroll
    for (int c = 0; c < STEP / G; c++) {
      x[c] = fmaf(av, A[(sub + G * c) * ks + d], x[c]);
      y[c] = fmaf(bv, B[(sub + G * c) * ks + d], y[c]);
    }
  }
}

// The atomic path's dQ += dS K for one step: thread t takes query row t / 16
// of the step and dims t % 16 + 16 k, sums over the block's keys (dS in
// sdS, rows of BN + 1) and adds into the accumulator rows at gacc (row
// stride dp), rows >= nrows left out. Unscaled: the post-kernel scales.
__device__ __forceinline__ void dq_atomic_f32(float *gacc, const float *sdS, const float *sK,
                                              int nrows, int dp) {
  constexpr int LANES = NT_KV / STEP, PER = ATTN_CU_MAX_HEAD_DIM / LANES;
  const int q = threadIdx.x / LANES, d0 = threadIdx.x % LANES;
  if (q >= nrows)
    return;
  float acc[PER];
#pragma unroll
  for (int k = 0; k < PER; k++)
    acc[k] = 0.0f;
  for (int j = 0; j < BN; j++) {
    const float w = sdS[q * (BN + 1) + j];
    const float *krow = sK + j * (dp + 1) + d0;
#pragma unroll
    for (int k = 0; k < PER; k++)
      if (d0 + LANES * k < dp)
        acc[k] = fmaf(w, krow[LANES * k], acc[k]);
  }
#pragma unroll
  for (int k = 0; k < PER; k++)
    if (d0 + LANES * k < dp)
      atomicAdd(gacc + (size_t)q * dp + d0 + LANES * k, acc[k]);
}

template <bool ATOMIC>
__global__ void __launch_bounds__(NT_KV) bwd_dkdv_f32(const attn_cu_params p) {
  constexpr int G = GKV, NC = STEP / G, PER = ATTN_CU_MAX_HEAD_DIM / G;
  extern __shared__ __align__(16) float smem_f[];
  const int dp = p.dp, ks = dp + 1;
  float *sK = smem_f, *sV = sK + BN * ks, *sQ = sV + BN * ks, *sO = sQ + STEP * ks;
  float *sL = sO + STEP * ks, *sD = sL + STEP;
  float *sdS = sD + STEP; // ATOMIC: dS, [STEP][BN + 1]

  const int r = threadIdx.x / G, sub = threadIdx.x % G, lead = (threadIdx.x % 32) & ~(G - 1);
  const int hkv = blockIdx.y, b = blockIdx.z, group = p.heads_q / p.heads_kv;
  const int j0 = blockIdx.x * BN, nvalid = min(BN, p.seq_kv - j0), j = j0 + r;
  const int64_t off = p.off;
  const size_t krow0 = ((size_t)b * p.heads_kv + hkv) * p.seq_kv + j0;
  const float *lse2 = p.bwd_ws + (size_t)p.batch * p.heads_q * p.seq_q;
  int qt0, qt1, lo, hi;
  attn_cu_key_block_qtiles(j0, j0 + nvalid, off, p.window_left, p.window_right, p.seq_q, p.seq_kv,
                           STEP, &qt0, &qt1);
  attn_cu_key_bounds(j, off, p.window_left, p.window_right, p.seq_q, p.seq_kv, &lo, &hi);
  const int nqt = qt1 - qt0;
  const bool var = p.cap2 > 0.0f || p.alibi2;

  float dk[PER], dv[PER];
#pragma unroll
  for (int k = 0; k < PER; k++)
    dk[k] = dv[k] = 0.0f;
  if (nqt > 0) {
    load_f32(sK, (const float *)p.k + krow0 * dp, BN, nvalid, dp);
    load_f32(sV, (const float *)p.v + krow0 * dp, BN, nvalid, dp);
  }
  for (int s = 0; s < nqt * group; s++) {
    const int h = hkv * group + s / nqt, i0 = (qt0 + s % nqt) * STEP;
    const size_t qrow = ((size_t)b * p.heads_q + h) * p.seq_q + i0;
    __syncthreads(); // the previous step's tiles are no longer read
    load_f32(sQ, (const float *)p.q + qrow * dp, STEP, p.seq_q - i0, dp);
    load_f32(sO, (const float *)p.dout + qrow * dp, STEP, p.seq_q - i0, dp);
    if (threadIdx.x < STEP) {
      bool ok = i0 + (int)threadIdx.x < p.seq_q;
      sL[threadIdx.x] = ok ? lse2[qrow + threadIdx.x] : INFINITY;
      sD[threadIdx.x] = ok ? p.bwd_ws[qrow + threadIdx.x] : 0.0f;
    }
    __syncthreads();

    // Sᵀ and dPᵀ for key j and queries i0 + sub + G·c, then P and dS.
    float pt[NC], ds[NC];
    dots<G>(sK + r * ks, sV + r * ks, sQ, sO, sub, dp, pt, ds);
    float g[NC];
#pragma unroll
    for (int c = 0; c < NC; c++) {
      pt[c] *= p.scale_log2;
      g[c] = 1.0f;
    }
    if (var) { // softcap and ALiBi: a uniform branch per step when off
      const float d0 = attn_cu_dist0(i0, off, j);
      const float slope2 = p.alibi2 ? p.alibi2[(size_t)b * p.heads_q + h] : 0.0f;
#pragma unroll
      for (int c = 0; c < NC; c++)
        pt[c] = attn_cu_variant(pt[c], p.cap2, p.inv_cap2, slope2, attn_cu_dist(d0, -(sub + G * c)),
                                &g[c]);
    }
#pragma unroll
    for (int c = 0; c < NC; c++) {
      const int q = sub + G * c, i = i0 + q;
      float x = i >= lo && i <= hi ? exp2f(pt[c] - sL[q]) : 0.0f;
      pt[c] = x;
      ds[c] = x * g[c] * (ds[c] - sD[q]);
      if (ATOMIC)
        sdS[q * (BN + 1) + r] = ds[c];
    }
    // dV += Pᵀ dO, dK += dSᵀ Q: query c's weights sit in register c / G of
    // group lane c % G.
#pragma unroll
    for (int c = 0; c < STEP; c++) {
      float w = __shfl_sync(0xffffffffu, pt[c / G], lead + c % G);
      float wd = __shfl_sync(0xffffffffu, ds[c / G], lead + c % G);
      const float *orow = sO + c * ks + sub, *qrow_s = sQ + c * ks + sub;
#pragma unroll
      for (int k = 0; k < PER; k++)
        if (sub + G * k < dp) {
          dv[k] = fmaf(w, orow[G * k], dv[k]);
          dk[k] = fmaf(wd, qrow_s[G * k], dk[k]);
        }
    }
    if (ATOMIC) {
      __syncthreads(); // every key's dS is in sdS
      float *gacc = p.bwd_ws + attn_cu_bwd_dq_at((uint64_t)p.batch * p.heads_q * p.seq_q);
      dq_atomic_f32(gacc + qrow * dp, sdS, sK, p.seq_q - i0, dp);
    }
  }
  if (r < nvalid) {
    float *gk = (float *)p.dk + (krow0 + r) * dp, *gv = (float *)p.dv + (krow0 + r) * dp;
#pragma unroll
    for (int k = 0; k < PER; k++)
      if (sub + G * k < dp) {
        gk[sub + G * k] = dk[k] * p.scale;
        gv[sub + G * k] = dv[k];
      }
  }
}

__global__ void __launch_bounds__(NT_Q) bwd_dq_f32(const attn_cu_params p) {
  constexpr int G = GQ, NC = STEP / G, PER = ATTN_CU_MAX_HEAD_DIM / G;
  extern __shared__ __align__(16) float smem_f[];
  const int dp = p.dp, ks = dp + 1;
  float *sQ = smem_f, *sO = sQ + BN * ks, *sK = sO + BN * ks, *sV = sK + STEP * ks;

  const int r = threadIdx.x / G, sub = threadIdx.x % G, lead = (threadIdx.x % 32) & ~(G - 1);
  const int qt = gridDim.x - 1 - blockIdx.x;
  const int h = blockIdx.y, b = blockIdx.z;
  const int i0 = qt * BN, i1 = min(i0 + BN, p.seq_q), i = i0 + r;
  const int hkv = h / (p.heads_q / p.heads_kv);
  const int64_t off = p.off;
  const size_t qrow0 = ((size_t)b * p.heads_q + h) * p.seq_q;
  const size_t kbase = ((size_t)b * p.heads_kv + hkv) * p.seq_kv * dp;
  const float *lse2 = p.bwd_ws + (size_t)p.batch * p.heads_q * p.seq_q;
  int t0, t1, lo, hi;
  attn_cu_block_tiles(i0, i1, off, p.window_left, p.window_right, p.seq_kv, STEP, 1, 0, &t0, &t1);
  attn_cu_row_bounds(i, off, p.window_left, p.window_right, p.seq_kv, &lo, &hi);
  const float l2 = i < p.seq_q ? lse2[qrow0 + i] : INFINITY;
  const float dd = i < p.seq_q ? p.bwd_ws[qrow0 + i] : 0.0f;
  const bool var = p.cap2 > 0.0f || p.alibi2;
  const float slope2 = p.alibi2 ? p.alibi2[(size_t)b * p.heads_q + h] : 0.0f;

  float dq[PER];
#pragma unroll
  for (int k = 0; k < PER; k++)
    dq[k] = 0.0f;
  if (t0 < t1) {
    load_f32(sQ, (const float *)p.q + (qrow0 + i0) * dp, BN, i1 - i0, dp);
    load_f32(sO, (const float *)p.dout + (qrow0 + i0) * dp, BN, i1 - i0, dp);
  }
  for (int t = t0; t < t1; t++) {
    const int j0 = t * STEP;
    __syncthreads(); // the previous tile is no longer read
    load_f32(sK, (const float *)p.k + kbase + (size_t)j0 * dp, STEP, p.seq_kv - j0, dp);
    load_f32(sV, (const float *)p.v + kbase + (size_t)j0 * dp, STEP, p.seq_kv - j0, dp);
    __syncthreads();

    float s[NC], ds[NC];
    dots<G>(sQ + r * ks, sO + r * ks, sK, sV, sub, dp, s, ds);
    float g[NC];
#pragma unroll
    for (int c = 0; c < NC; c++) {
      s[c] *= p.scale_log2;
      g[c] = 1.0f;
    }
    if (var) { // softcap and ALiBi: a uniform branch per tile when off
      const float d0 = attn_cu_dist0(i, off, j0);
#pragma unroll
      for (int c = 0; c < NC; c++)
        s[c] =
            attn_cu_variant(s[c], p.cap2, p.inv_cap2, slope2, attn_cu_dist(d0, sub + G * c), &g[c]);
    }
#pragma unroll
    for (int c = 0; c < NC; c++) {
      const int jj = j0 + sub + G * c;
      float x = jj >= lo && jj <= hi ? exp2f(s[c] - l2) : 0.0f;
      ds[c] = x * g[c] * (ds[c] - dd);
    }
    // dQ += dS K: key c's weight sits in register c / G of group lane c % G.
#pragma unroll
    for (int c = 0; c < STEP; c++) {
      float wd = __shfl_sync(0xffffffffu, ds[c / G], lead + c % G);
      const float *krow = sK + c * ks + sub;
#pragma unroll
      for (int k = 0; k < PER; k++)
        if (sub + G * k < dp)
          dq[k] = fmaf(wd, krow[G * k], dq[k]);
    }
  }
  if (i < p.seq_q) {
    float *g = (float *)p.dq + (qrow0 + i) * dp;
#pragma unroll
    for (int k = 0; k < PER; k++)
      if (sub + G * k < dp)
        g[sub + G * k] = dq[k] * p.scale;
  }
}

} // namespace

// Both kernels, or on the atomic path (no dQ grid) the dK/dV kernel alone.
cudaError_t launch_bwd_f32(const attn_cu_params &p, const attn_cu_choice &c, cudaStream_t s) {
  dim3 g1(c.grid[0], c.grid[1], c.grid[2]), g2(c.dq_grid[0], c.dq_grid[1], c.dq_grid[2]);
  if (attn_cu_is_atomic_dq(&c)) {
    bwd_dkdv_f32<true><<<g1, NT_KV, c.smem_bytes, s>>>(p);
    return cudaGetLastError();
  }
  bwd_dkdv_f32<false><<<g1, NT_KV, c.smem_bytes, s>>>(p);
  bwd_dq_f32<<<g2, NT_Q, c.dq_smem_bytes, s>>>(p);
  return cudaGetLastError();
}

cudaError_t prepare_bwd_f32() {
  int bytes = 4 * ((2 * BN + 2 * STEP) * (ATTN_CU_MAX_HEAD_DIM + 1) + 2 * STEP);
  const cudaFuncAttribute a = cudaFuncAttributeMaxDynamicSharedMemorySize;
  cudaError_t e = cudaFuncSetAttribute(bwd_dkdv_f32<false>, a, bytes);
  if (e == cudaSuccess)
    e = cudaFuncSetAttribute(bwd_dkdv_f32<true>, a, bytes + 4 * STEP * (BN + 1));
  if (e == cudaSuccess)
    e = cudaFuncSetAttribute(bwd_dq_f32, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  return e;
}

} // namespace attn_cu
