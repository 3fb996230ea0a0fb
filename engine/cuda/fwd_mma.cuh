// fwd_mma.cuh — the FlashAttention-2 forward pass on tensor cores
// (mma.sync m16n8k16, F16/BF16 inputs, F32 accumulators).
//
// One block per (query tile of BM rows, query head, batch · split), or for a
// GQA decode per (the pack query heads of a KV head, batch · split), their
// rows stacked in the block (attn_cu_block_row in layout.h); each of
// its warps owns 16 query rows, so a row's softmax statistics live in the 4
// lanes of one quad and need only two shuffles, never shared memory. Q is
// staged once; K and V tiles of BN keys are double-buffered in shared memory
// by cp.async while the previous tile is computed. Per tile a warp computes
// S = Q Kᵀ into registers, scales it by scale·log2 e, applies softcap and
// ALiBi when the launch asks (a uniform branch per tile), masks it only when the
// tile straddles a window or the sequence end, updates the running max m and
// sum l, rescales O, turns P into A fragments without leaving registers
// (the accumulator layout of S is the A layout of P) and accumulates O += P V
// with V read through ldmatrix.trans. O is divided by l once at the end.
//
// DPAD is the head dim the instance holds (runtime dp <= DPAD; columns past
// dp are zero-filled); QREG keeps Q's fragments in registers for the whole
// block (the fast instances), otherwise they are re-read from shared memory
// for every tile (the generic 256 instance, which needs its registers for O).
#ifndef ATTN_CUDA_FWD_MMA_CUH
#define ATTN_CUDA_FWD_MMA_CUH

#include "common.cuh"

namespace attn_cu {

// Copies rows [0, rows) x [0, DPAD) of a tile from global memory (row stride
// dp) into padded shared memory; rows >= valid and columns >= dp become 0.
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

// softcap and ALiBi (attn_cu_variant) on a warp's 16 x 8·NB scores in C
// layout, log2 units, rows queries and columns keys: the lane's row g is at
// distance |d0a − c| from key column c (d0a = i + off − j0) and has slope
// sla, row g + 8 likewise with d0b and slb. They are given apart because a
// packed GQA block's row g + 8 may be another head and query
// (attn_cu_block_row); unpacked, d0b = d0a + 8 and slb = sla.
template <int NB>
__device__ __forceinline__ void score_variants(float (*s)[4], const attn_cu_params &p, float sla,
                                               float d0a, float slb, float d0b, int lane) {
#pragma unroll
  for (int n = 0; n < NB; n++)
#pragma unroll
    for (int e = 0; e < 4; e++) {
      int row, col;
      attn_cu_frag_c(lane, e, &row, &col);
      float g;
      const bool top = row < 8;
      s[n][e] = attn_cu_variant(s[n][e], p.cap2, p.inv_cap2, top ? sla : slb,
                                attn_cu_dist(top ? d0a : d0b, n * 8 + col), &g);
    }
}

template <typename T, int DPAD, int BN, bool QREG>
__global__ void __launch_bounds__(ATTN_CU_MMA_WARPS * 32)
    fwd_mma(const attn_cu_params p, int nsplit, int pack) {
  constexpr int NW = ATTN_CU_MMA_WARPS, BM = 16 * NW, NT = NW * 32;
  constexpr int STR = DPAD + 8, KD = DPAD / 16, NB = BN / 8, DB = DPAD / 8;
  using M = mma_t<T>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T *sQ = reinterpret_cast<T *>(smem_raw);
  T *sK = sQ + BM * STR; // [2][BN][STR]
  T *sV = sK + 2 * BN * STR;

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int qt = gridDim.x - 1 - blockIdx.x; // longest (causal) tiles first
  const int h0 = blockIdx.y * pack, b = blockIdx.z / nsplit, split = blockIdx.z % nsplit;
  // Block rows [i0, i1) of the pack heads' rows (attn_cu_block_row), and
  // the queries [q0, q1) they hold.
  const int rows = pack * p.seq_q;
  int i0, i1, q0, q1;
  attn_cu_block_span(qt, BM, p.seq_q, pack, &i0, &i1, &q0, &q1);
  const int hkv = h0 / (p.heads_q / p.heads_kv);
  const int64_t off = p.off;
  const size_t qrow0 = ((size_t)b * p.heads_q + h0) * p.seq_q;
  const T *gQ = (const T *)p.q + (qrow0 + i0) * p.dp;
  const T *gK = (const T *)p.k + ((size_t)b * p.heads_kv + hkv) * p.seq_kv * p.dp;
  const T *gV = (const T *)p.v + ((size_t)b * p.heads_kv + hkv) * p.seq_kv * p.dp;

  int t0, t1;
  attn_cu_block_tiles(q0, q1, off, p.window_left, p.window_right, p.seq_kv, BN, nsplit, split, &t0,
                      &t1);

  // This lane's two rows: g and g + 8 of the warp's 16, block rows ra and
  // rb, queries ia and ib of heads h0 + dha and h0 + dhb.
  const int ra = i0 + warp * 16 + lane / 4, rb = ra + 8;
  int dha, ia, dhb, ib;
  attn_cu_block_row(ra, p.seq_q, pack, &dha, &ia);
  attn_cu_block_row(rb, p.seq_q, pack, &dhb, &ib);
  int lo_a, hi_a, lo_b, hi_b;
  attn_cu_row_bounds(ia, off, p.window_left, p.window_right, p.seq_kv, &lo_a, &hi_a);
  attn_cu_row_bounds(ib, off, p.window_left, p.window_right, p.seq_kv, &lo_b, &hi_b);

  const bool var = p.cap2 > 0.0f || p.alibi2;
  const float k = attn_cu_exp_factor(p.scale_log2, var); // 1: scores are scaled first
  const size_t hrow = (size_t)b * p.heads_q + h0;
  const float sla = p.alibi2 ? p.alibi2[hrow + dha] : 0.0f;
  const float slb = p.alibi2 ? p.alibi2[hrow + dhb] : 0.0f;

  float o[DB][4];
#pragma unroll
  for (int d = 0; d < DB; d++)
    o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
  float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.0f, l_b = 0.0f;
  uint32_t qf[QREG ? KD : 1][4];

  if (t0 < t1) {
    load_tile<T, BM, DPAD, NT>(sQ, gQ, i1 - i0, p.dp);
    load_tile<T, BN, DPAD, NT>(sK, gK + (size_t)t0 * BN * p.dp, p.seq_kv - t0 * BN, p.dp);
    load_tile<T, BN, DPAD, NT>(sV, gV + (size_t)t0 * BN * p.dp, p.seq_kv - t0 * BN, p.dp);
    cp_async_commit();
  }
  int qr, qc, kr, kc, vr, vc;
  attn_cu_ldsm_q(lane, &qr, &qc);
  attn_cu_ldsm_k(lane, &kr, &kc);
  attn_cu_ldsm_v(lane, &vr, &vc);
  const T *sQw = sQ + (warp * 16 + qr) * STR + qc;

  for (int t = t0; t < t1; t++) {
    const int buf = (t - t0) & 1;
    if (t + 1 < t1) {
      const size_t next = (size_t)(t + 1) * BN;
      load_tile<T, BN, DPAD, NT>(sK + (buf ^ 1) * BN * STR, gK + next * p.dp,
                                 p.seq_kv - (t + 1) * BN, p.dp);
      load_tile<T, BN, DPAD, NT>(sV + (buf ^ 1) * BN * STR, gV + next * p.dp,
                                 p.seq_kv - (t + 1) * BN, p.dp);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    if (QREG && t == t0) {
#pragma unroll
      for (int kk = 0; kk < (QREG ? KD : 1); kk++)
        ldsm_x4(qf[kk], sQw + kk * 16);
    }

    // S = Q Kᵀ for this warp's 16 rows and the tile's BN keys.
    const T *sKb = sK + buf * BN * STR;
    float s[NB][4];
#pragma unroll
    for (int n = 0; n < NB; n++)
      s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < KD; kk++) {
      uint32_t a[4];
      if (QREG) {
#pragma unroll
        for (int r = 0; r < 4; r++)
          a[r] = qf[QREG ? kk : 0][r];
      } else {
        ldsm_x4(a, sQw + kk * 16);
      }
#pragma unroll
      for (int n2 = 0; n2 < NB / 2; n2++) {
        uint32_t bk[4];
        ldsm_x4(bk, sKb + (n2 * 16 + kr) * STR + kk * 16 + kc);
        M::run(s[2 * n2], a, bk[0], bk[1]);
        M::run(s[2 * n2 + 1], a, bk[2], bk[3]);
      }
    }

    // Into log2 units: folded into the exponent (k) for a positive scale
    // without variants, else scaled here and the variants applied (one
    // uniform branch per tile); then the mask where the tile is not wholly
    // visible.
    const int j0 = t * BN;
    const bool full =
        attn_cu_tile_full(j0, BN, q0, q1, off, p.window_left, p.window_right, p.seq_kv);
    if (k == 1.0f) {
#pragma unroll
      for (int n = 0; n < NB; n++)
#pragma unroll
        for (int e = 0; e < 4; e++)
          s[n][e] *= p.scale_log2;
      if (var)
        score_variants<NB>(s, p, sla, attn_cu_dist0(ia, off, j0), slb, attn_cu_dist0(ib, off, j0),
                           lane);
    }
    if (!full) {
#pragma unroll
      for (int n = 0; n < NB; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
          int row, col;
          attn_cu_frag_c(lane, e, &row, &col);
          int j = j0 + n * 8 + col;
          bool vis = row < 8 ? (j >= lo_a && j <= hi_a) : (j >= lo_b && j <= hi_b);
          s[n][e] = vis ? s[n][e] : -INFINITY;
        }
    }

    // Online softmax: new running max, rescale, weights and their sums.
    float mx_a = -INFINITY, mx_b = -INFINITY;
#pragma unroll
    for (int n = 0; n < NB; n++) {
      mx_a = fmaxf(mx_a, fmaxf(s[n][0], s[n][1]));
      mx_b = fmaxf(mx_b, fmaxf(s[n][2], s[n][3]));
    }
    mx_a = fmaxf(m_a, quad_max(mx_a) * k); // k > 0: the max of k·s
    mx_b = fmaxf(m_b, quad_max(mx_b) * k);
    const float use_a = attn_cu_max_for_exp(mx_a), use_b = attn_cu_max_for_exp(mx_b);
    const float al_a = fast_exp2(m_a - use_a), al_b = fast_exp2(m_b - use_b);
    m_a = mx_a;
    m_b = mx_b;
    float sum_a = 0.0f, sum_b = 0.0f;
#pragma unroll
    for (int n = 0; n < NB; n++) {
      s[n][0] = fast_exp2(fmaf(s[n][0], k, -use_a));
      s[n][1] = fast_exp2(fmaf(s[n][1], k, -use_a));
      s[n][2] = fast_exp2(fmaf(s[n][2], k, -use_b));
      s[n][3] = fast_exp2(fmaf(s[n][3], k, -use_b));
      sum_a += s[n][0] + s[n][1];
      sum_b += s[n][2] + s[n][3];
    }
    l_a = l_a * al_a + sum_a; // this lane's share; the quad sums at the end
    l_b = l_b * al_b + sum_b;
#pragma unroll
    for (int d = 0; d < DB; d++) {
      o[d][0] *= al_a;
      o[d][1] *= al_a;
      o[d][2] *= al_b;
      o[d][3] *= al_b;
    }

    // O += P V: S's accumulators of key blocks 2k, 2k+1 are P's A fragment
    // for keys [16k, 16k + 16).
    const T *sVb = sV + buf * BN * STR;
#pragma unroll
    for (int k = 0; k < BN / 16; k++) {
      uint32_t a[4];
      a[0] = M::pack(s[2 * k][0], s[2 * k][1]);
      a[1] = M::pack(s[2 * k][2], s[2 * k][3]);
      a[2] = M::pack(s[2 * k + 1][0], s[2 * k + 1][1]);
      a[3] = M::pack(s[2 * k + 1][2], s[2 * k + 1][3]);
#pragma unroll
      for (int d2 = 0; d2 < DB / 2; d2++) {
        uint32_t bv[4];
        ldsm_x4_t(bv, sVb + (k * 16 + vr) * STR + d2 * 16 + vc);
        M::run(o[2 * d2], a, bv[0], bv[1]);
        M::run(o[2 * d2 + 1], a, bv[2], bv[3]);
      }
    }
    __syncthreads(); // the next iteration refills the other buffer
  }

  // Epilogue: the quad's sums, one division, and the stores.
  l_a = quad_sum(l_a);
  l_b = quad_sum(l_b);
  const float inv_a = l_a > 0.0f ? 1.0f / l_a : 0.0f, inv_b = l_b > 0.0f ? 1.0f / l_b : 0.0f;
  rows_out out{&p, nsplit, split, (size_t)p.batch * p.heads_q * p.seq_q};
#pragma unroll
  for (int d = 0; d < DB; d++) {
    int row, col;
    attn_cu_frag_c(lane, 0, &row, &col);
    col += d * 8;
    if (col < p.dp) {
      if (ra < rows)
        out.o2<T>(qrow0 + ra, col, o[d][0] * inv_a, o[d][1] * inv_a);
      if (rb < rows)
        out.o2<T>(qrow0 + rb, col, o[d][2] * inv_b, o[d][3] * inv_b);
    }
  }
  if (lane % 4 == 0) {
    if (ra < rows)
      out.stats(qrow0 + ra, m_a, l_a);
    if (rb < rows)
      out.stats(qrow0 + rb, m_b, l_b);
  }
}

template <int DPAD, int BN, bool QREG>
cudaError_t launch_mma(const attn_cu_params &p, const attn_cu_choice &c, cudaStream_t s) {
  dim3 grid(c.grid[0], c.grid[1], c.grid[2]), block(ATTN_CU_MMA_WARPS * 32);
  const int pack = c.pack > 1 ? c.pack : 1;
  if (p.dtype == ATTN_F16)
    fwd_mma<__half, DPAD, BN, QREG><<<grid, block, c.smem_bytes, s>>>(p, c.nsplit, pack);
  else
    fwd_mma<__nv_bfloat16, DPAD, BN, QREG><<<grid, block, c.smem_bytes, s>>>(p, c.nsplit, pack);
  return cudaGetLastError();
}

template <int DPAD, int BN, bool QREG> cudaError_t prepare_mma() {
  int bytes = (ATTN_CU_MMA_BM + 4 * BN) * (DPAD + 8) * 2;
  cudaError_t e = cudaFuncSetAttribute(fwd_mma<__half, DPAD, BN, QREG>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (e == cudaSuccess)
    e = cudaFuncSetAttribute(fwd_mma<__nv_bfloat16, DPAD, BN, QREG>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  return e;
}

} // namespace attn_cu

#endif
