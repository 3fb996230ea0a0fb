// fwd_f32.cu — the forward pass for F32 inputs on the FMA units.
//
// The tensor cores' F32 mode (TF32) rounds inputs to 10 mantissa bits, which
// the contract's F32 accuracy does not allow, so F32 runs here in plain F32
// arithmetic. A block of 128 threads owns 32 query rows; the 4 threads of a
// quad share a row: each computes 8 of a tile's 32 scores and a quarter of
// the row's output columns, and the quad exchanges max, sum and the tile's
// weights by shuffles. Shared memory holds Q, K and V tiles only (96 KiB at
// head dim 256, under the 99 KiB a block gets on sm_89). A paged launch
// runs the PAGED instance, which finds each K/V tile's rows through the
// page tables (kv_src) and takes its batch entry's key count from
// seqused_k when set.
#include "common.cuh"

namespace attn_cu {

constexpr int BM = ATTN_CU_F32_BM, BN = ATTN_CU_F32_BN, NT = ATTN_CU_F32_THREADS;
constexpr int DMAX = ATTN_CU_MAX_HEAD_DIM, PER = DMAX / 4; // output columns per thread
static_assert(NT == 4 * BM, "a quad of threads per query row");
static_assert(BN == 4 * 8, "8 scores per thread");
static_assert(ATTN_CU_PAGE_ALIGN_TOKENS % BN == 0, "a key tile never straddles a page");

// PAGED: K and V read through the page tables (kv_src in common.cuh).
template <bool PAGED>
__global__ void __launch_bounds__(NT) fwd_f32(const attn_cu_params p, int nsplit) {
  extern __shared__ __align__(16) float smem_f[];
  const int dp = p.dp, ks = dp + 1;
  float *sQ = smem_f;       // [BM][dp]
  float *sK = sQ + BM * dp; // [BN][dp + 1]
  float *sV = sK + BN * ks; // [BN][dp]

  const int r = threadIdx.x / 4, sub = threadIdx.x % 4;
  const int qt = gridDim.x - 1 - blockIdx.x;
  const int h = blockIdx.y, b = blockIdx.z / nsplit, split = blockIdx.z % nsplit;
  const int i0 = qt * BM, i1 = min(i0 + BM, p.seq_q), i = i0 + r;
  const int hkv = h / (p.heads_q / p.heads_kv);
  // The block's mask offset and keys (kv.nkv(), read where used, as
  // p.seq_kv was): the batch entry's with seqused_k. Keys past them are
  // invisible, and a split wholly past them stays empty. off before kv,
  // where the packed kernel always read it (its code stays the same).
  const int64_t off = kv_src<float, PAGED>::entry_off(p, b);
  const size_t qrow0 = ((size_t)b * p.heads_q + h) * p.seq_q;
  const float *gQ = (const float *)p.q + (qrow0 + i0) * dp;
  const kv_src<float, PAGED> kv(p, (size_t)b * p.heads_kv + hkv, b);

  int t0, t1, lo, hi;
  attn_cu_block_tiles(i0, i1, off, p.window_left, p.window_right, kv.nkv(p), BN, nsplit, split, &t0,
                      &t1);
  attn_cu_row_bounds(i, off, p.window_left, p.window_right, kv.nkv(p), &lo, &hi);

  const bool var = p.cap2 > 0.0f || p.alibi2;
  const float slope2 = p.alibi2 ? p.alibi2[(size_t)b * p.heads_q + h] : 0.0f;

  float acc[PER];
#pragma unroll
  for (int k = 0; k < PER; k++)
    acc[k] = 0.0f;
  float m = -INFINITY, l = 0.0f;

  if (t0 < t1)
    for (int x = threadIdx.x; x < BM * dp; x += NT)
      sQ[x] = x / dp < i1 - i0 ? gQ[x] : 0.0f;

  for (int t = t0; t < t1; t++) {
    const int j0 = t * BN, nvalid = min(BN, kv.nkv(p) - j0);
    const float *tK = kv.k_rows(p, j0), *tV = kv.v_rows(p, j0);
    __syncthreads(); // the previous tile is no longer read
    for (int x = threadIdx.x; x < BN * dp; x += NT) {
      int jr = x / dp, d = x % dp;
      bool ok = jr < nvalid;
      sK[jr * ks + d] = ok ? tK[x] : 0.0f;
      sV[x] = ok ? tV[x] : 0.0f;
    }
    __syncthreads();

    float s[8];
#pragma unroll
    for (int c = 0; c < 8; c++)
      s[c] = 0.0f;
    for (int d = 0; d < dp; d++) {
      float q = sQ[r * dp + d];
#pragma unroll
      for (int c = 0; c < 8; c++)
        s[c] = fmaf(q, sK[(sub + 4 * c) * ks + d], s[c]);
    }
#pragma unroll
    for (int c = 0; c < 8; c++)
      s[c] *= p.scale_log2;
    if (var) { // softcap and ALiBi: one uniform branch per tile when off
      const float d0 = attn_cu_dist0(i, off, j0);
#pragma unroll
      for (int c = 0; c < 8; c++) {
        float g;
        s[c] = attn_cu_variant(s[c], p.cap2, p.inv_cap2, slope2, attn_cu_dist(d0, sub + 4 * c), &g);
      }
    }
    float mx = -INFINITY;
#pragma unroll
    for (int c = 0; c < 8; c++) {
      int j = j0 + sub + 4 * c;
      s[c] = j >= lo && j <= hi ? s[c] : -INFINITY;
      mx = fmaxf(mx, s[c]);
    }
    mx = fmaxf(m, quad_max(mx));
    const float use = attn_cu_max_for_exp(mx), alpha = exp2f(m - use);
    m = mx;
    float sum = 0.0f;
#pragma unroll
    for (int c = 0; c < 8; c++) {
      s[c] = exp2f(s[c] - use);
      sum += s[c];
    }
    l = l * alpha + sum; // this thread's share; the quad sums at the end
#pragma unroll
    for (int k = 0; k < PER; k++)
      acc[k] *= alpha;
    // Key c's weight sits in register c / 4 of quad lane c % 4.
    const int quad0 = (threadIdx.x % 32) & ~3;
#pragma unroll
    for (int c = 0; c < BN; c++) {
      float w = __shfl_sync(0xffffffffu, s[c / 4], quad0 + c % 4);
      const float *vr = sV + c * dp + sub;
#pragma unroll
      for (int k = 0; k < PER; k++)
        if (sub + 4 * k < dp)
          acc[k] = fmaf(w, vr[4 * k], acc[k]);
    }
  }

  l = quad_sum(l);
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
  rows_out out{&p, nsplit, split, (size_t)p.batch * p.heads_q * p.seq_q};
  if (i < p.seq_q) {
#pragma unroll
    for (int k = 0; k < PER; k++)
      if (sub + 4 * k < dp)
        out.o1f(qrow0 + i, sub + 4 * k, acc[k] * inv);
    if (sub == 0)
      out.stats(qrow0 + i, m, l);
  }
}

cudaError_t launch_simt_f32(const attn_cu_params &p, const attn_cu_choice &c, cudaStream_t s) {
  dim3 grid(c.grid[0], c.grid[1], c.grid[2]);
  if (p.k_table)
    fwd_f32<true><<<grid, NT, c.smem_bytes, s>>>(p, c.nsplit);
  else
    fwd_f32<false><<<grid, NT, c.smem_bytes, s>>>(p, c.nsplit);
  return cudaGetLastError();
}

cudaError_t prepare_simt_f32() {
  int dp = DMAX;
  int bytes = 4 * (BM * dp + BN * (dp + 1) + BN * dp);
  cudaError_t e =
      cudaFuncSetAttribute(fwd_f32<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (e == cudaSuccess)
    e = cudaFuncSetAttribute(fwd_f32<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  return e;
}

} // namespace attn_cu
