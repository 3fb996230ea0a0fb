// fwd_mma.cuh — the FlashAttention-2 forward pass on tensor cores
// (mma.sync m16n8k16, F16/BF16 inputs, F32 accumulators).
//
// One block per (query tile of BM rows, query head, batch · split), or for a
// GQA decode per (the pack query heads of a KV head, batch · split), their
// rows stacked in the block (attn_cu_block_row in layout.h). Each of its
// four warps owns MT = BM / 64 m16 tiles of query rows (FlashAttention-2's
// 128-row blocks have two), so every K or V fragment a warp loads feeds
// 2·MT tensor-core ops, and a row's softmax statistics live in the 4 lanes
// of one quad and need only two shuffles, never shared memory. Q is staged
// in shared memory once; K and V tiles of BN keys are double-buffered there
// by cp.async (fully unrolled copies, row predicates only on a sequence's
// last tile) while the previous tile is computed; a paged launch runs the
// PAGED instance, which finds each tile's rows through the page tables
// (kv_src: one lookup per tile). Per tile a warp computes S = Q Kᵀ into
// registers, applies softcap and ALiBi when the launch asks (a uniform
// branch per tile), masks it only when the tile straddles a window or the
// sequence end, updates the running max m and sum l, rescales O, turns P
// into A fragments without leaving registers (the accumulator layout of S
// is the A layout of P) and accumulates O += P V with V read through
// ldmatrix.trans. At the end O is divided by l, staged through the warp's
// rows of Q's shared memory and stored 16 bytes at a time.
//
// DPAD is the head dim the instance holds (runtime dp <= DPAD; columns past
// dp are zero-filled). Q's fragments are re-read from shared memory for
// every tile, leaving the registers to O: kept in registers, they made
// even the 64 instance spill with two row tiles per warp.
#ifndef ATTN_CUDA_FWD_MMA_CUH
#define ATTN_CUDA_FWD_MMA_CUH

#include "common.cuh"

namespace attn_cu {

// Rows [0, ROWS) x [0, DPAD) of a tile between global memory (row stride
// dp) and padded shared memory, as attn_cu_copy_at lays the chunks out
// over the NT threads: each thread's base addresses are set once, and a
// (pass, panel)'s offset from them is attn_cu_copy_at of thread 0, a
// constant.
template <typename T, int ROWS, int DPAD, int NT> struct tile_copy {
  static constexpr int CH = DPAD / 8, STR = DPAD + 8, TPR = attn_cu_copy_tpr(CH);
  static constexpr int RPP = NT / TPR, PASSES = ROWS / RPP, PANELS = CH / TPR;
  static_assert(NT % TPR == 0 && ROWS % RPP == 0, "the tile must split evenly over the threads");
  int row0, col0;
  __device__ explicit tile_copy(int tid) {
    attn_cu_copy_at(tid, NT, CH, 0, 0, &row0, &col0);
    col0 *= 8;
  }

  // Rows >= valid (TAIL only: other tiles are whole) and columns >= dp
  // become 0.
  template <bool TAIL>
  __device__ __forceinline__ void load(T *s, const T *g, int valid, int dp) const {
    const T *gt = g + (size_t)row0 * dp + col0;
    T *st = s + row0 * STR + col0;
#pragma unroll
    for (int pn = 0; pn < PANELS; pn++) {
      int dr, dc;
      attn_cu_copy_at(0, NT, CH, 0, pn, &dr, &dc);
      const bool col_ok = col0 + dc * 8 < dp;
#pragma unroll
      for (int ps = 0; ps < PASSES; ps++) {
        attn_cu_copy_at(0, NT, CH, ps, pn, &dr, &dc);
        const bool ok = col_ok && (!TAIL || row0 + dr < valid);
        const T *src = gt + (size_t)dr * dp + dc * 8;
        cp_async16(st + dr * STR + dc * 8, ok ? src : g, ok);
      }
    }
  }
  __device__ __forceinline__ void load_any(T *s, const T *g, int valid, int dp) const {
    if (valid >= ROWS)
      load<false>(s, g, valid, dp);
    else
      load<true>(s, g, valid, dp);
  }
};

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

// A lane's rows: for each of the warp's MT m16 tiles, halves 0 and 1 (rows
// g and g + 8); their query index and ALiBi slope. (Their visible keys are
// recomputed on the tiles that need a mask: kept, they cost the 128-row
// instances the registers that made them spill.)
template <int MT> struct lane_rows {
  int qi[MT][2];
  float sl[MT][2];

  // For the warp's rows from block row w0 of a block of pack heads from
  // h0 in batch b.
  __device__ lane_rows(const attn_cu_params &p, int w0, int pack, int b, int h0, int lane) {
#pragma unroll
    for (int t = 0; t < MT; t++)
#pragma unroll
      for (int h = 0; h < 2; h++) {
        int dh;
        attn_cu_block_row(w0 + attn_cu_lane_row(0, MT, t, lane, h), p.seq_q, pack, &dh, &qi[t][h]);
        sl[t][h] = p.alibi2 ? p.alibi2[(size_t)b * p.heads_q + h0 + dh] : 0.0f;
      }
  }
};

// S = Q Kᵀ for the warp's MT x 16 rows and the tile's BN keys: each K
// fragment feeds the MT row tiles.
template <typename T, int DPAD, int BN, int MT>
__device__ __forceinline__ void qk_tile(float (&s)[MT][BN / 8][4], const T *sQw, const T *sKb,
                                        int kr, int kc) {
  constexpr int STR = DPAD + 8, KD = DPAD / 16, NB = BN / 8;
  using M = mma_t<T>;
#pragma unroll
  for (int t = 0; t < MT; t++)
#pragma unroll
    for (int n = 0; n < NB; n++)
      s[t][n][0] = s[t][n][1] = s[t][n][2] = s[t][n][3] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < KD; kk++) {
    uint32_t a[MT][4];
#pragma unroll
    for (int t = 0; t < MT; t++)
      ldsm_x4(a[t], sQw + t * 16 * STR + kk * 16);
#pragma unroll
    for (int n2 = 0; n2 < NB / 2; n2++) {
      uint32_t bk[4];
      ldsm_x4(bk, sKb + (n2 * 16 + kr) * STR + kk * 16 + kc);
#pragma unroll
      for (int t = 0; t < MT; t++) {
        M::run(s[t][2 * n2], a[t], bk[0], bk[1]);
        M::run(s[t][2 * n2 + 1], a[t], bk[2], bk[3]);
      }
    }
  }
}

// Into log2 units (unless k folds the scale into the exponent: then the
// scores stay raw), the variants, and the mask where the tile [j0, j0 +
// BN) is not wholly visible to the block.
// The block's mask is kv's off() and nkv() (kv_src: the batch entry's
// with seqused_k, else the launch's), read where they are used, as the
// packed instances always read p.off and p.seq_kv (cached in locals, they
// made the packed 128 instance spill).
template <int NB, typename KV>
__device__ __forceinline__ void scores_to_log2(float (&s)[NB][4], const attn_cu_params &p,
                                               const KV &kv, float k, bool var, bool full, int j0,
                                               const int (&qi)[2], const float (&sl)[2], int lane) {
  if (k == 1.0f) {
#pragma unroll
    for (int n = 0; n < NB; n++)
#pragma unroll
      for (int e = 0; e < 4; e++)
        s[n][e] *= p.scale_log2;
    if (var)
      score_variants<NB>(s, p, sl[0], attn_cu_dist0(qi[0], kv.off(p), j0), sl[1],
                         attn_cu_dist0(qi[1], kv.off(p), j0), lane);
  }
  if (!full) {
    int lo[2], hi[2];
#pragma unroll
    for (int h = 0; h < 2; h++)
      attn_cu_row_bounds(qi[h], kv.off(p), p.window_left, p.window_right, kv.nkv(p), &lo[h],
                         &hi[h]);
#pragma unroll
    for (int n = 0; n < NB; n++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        int row, col;
        attn_cu_frag_c(lane, e, &row, &col);
        const int h = row < 8 ? 0 : 1, j = j0 + n * 8 + col;
        s[n][e] = j >= lo[h] && j <= hi[h] ? s[n][e] : -INFINITY;
      }
  }
}

// The online softmax of one m16 tile: new running max (k > 0, so the max
// of k·s is k times the max), weights exp2(k·s − m) in place of the scores,
// the lane's share of their sums, and O rescaled.
template <int NB, int DB>
__device__ __forceinline__ void softmax_tile(float (&s)[NB][4], float (&o)[DB][4], float (&m)[2],
                                             float (&l)[2], float k) {
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int n = 0; n < NB; n++) {
    mx[0] = fmaxf(mx[0], fmaxf(s[n][0], s[n][1]));
    mx[1] = fmaxf(mx[1], fmaxf(s[n][2], s[n][3]));
  }
  float use[2], al[2], sum[2] = {0.0f, 0.0f};
#pragma unroll
  for (int h = 0; h < 2; h++) {
    mx[h] = fmaxf(m[h], quad_max(mx[h]) * k);
    use[h] = attn_cu_max_for_exp(mx[h]);
    al[h] = fast_exp2(m[h] - use[h]);
    m[h] = mx[h];
  }
#pragma unroll
  for (int n = 0; n < NB; n++)
#pragma unroll
    for (int e = 0; e < 4; e++) {
      s[n][e] = fast_exp2(fmaf(s[n][e], k, -use[e / 2]));
      sum[e / 2] += s[n][e];
    }
#pragma unroll
  for (int h = 0; h < 2; h++)
    l[h] = l[h] * al[h] + sum[h]; // this lane's share; the quad sums at the end
#pragma unroll
  for (int d = 0; d < DB; d++)
#pragma unroll
    for (int e = 0; e < 4; e++)
      o[d][e] *= al[e / 2];
}

// O += P V: S's accumulators of key blocks 2k, 2k+1 are P's A fragment for
// keys [16k, 16k + 16); each V fragment feeds the MT row tiles.
template <typename T, int DPAD, int BN, int MT>
__device__ __forceinline__ void pv_tile(float (&o)[MT][DPAD / 8][4],
                                        const float (&s)[MT][BN / 8][4], const T *sVb, int vr,
                                        int vc) {
  constexpr int STR = DPAD + 8, DB = DPAD / 8;
  using M = mma_t<T>;
#pragma unroll
  for (int k = 0; k < BN / 16; k++) {
    uint32_t a[MT][4];
#pragma unroll
    for (int t = 0; t < MT; t++) {
      a[t][0] = M::pack(s[t][2 * k][0], s[t][2 * k][1]);
      a[t][1] = M::pack(s[t][2 * k][2], s[t][2 * k][3]);
      a[t][2] = M::pack(s[t][2 * k + 1][0], s[t][2 * k + 1][1]);
      a[t][3] = M::pack(s[t][2 * k + 1][2], s[t][2 * k + 1][3]);
    }
#pragma unroll
    for (int d2 = 0; d2 < DB / 2; d2++) {
      uint32_t bv[4];
      ldsm_x4_t(bv, sVb + (k * 16 + vr) * STR + d2 * 16 + vc);
#pragma unroll
      for (int t = 0; t < MT; t++) {
        M::run(o[t][2 * d2], a[t], bv[0], bv[1]);
        M::run(o[t][2 * d2 + 1], a[t], bv[2], bv[3]);
      }
    }
  }
}

// The warp's normalized O (already divided by l) into its rows of shared
// memory sW (dtype T, row stride DPAD + 8), then to O 16 bytes at a time:
// block rows r0 + r below `valid` and columns below dp.
template <typename T, int DPAD, int MT>
__device__ __forceinline__ void store_o(const float (&o)[MT][DPAD / 8][4], T *sW, T *gO, int valid,
                                        int dp, int lane) {
  constexpr int STR = DPAD + 8, CH = DPAD / 8;
  __syncwarp();
#pragma unroll
  for (int t = 0; t < MT; t++)
#pragma unroll
    for (int d = 0; d < CH; d++)
#pragma unroll
      for (int h = 0; h < 2; h++) {
        int row, col;
        attn_cu_frag_c(lane, 2 * h, &row, &col);
        *reinterpret_cast<uint32_t *>(sW + (t * 16 + row) * STR + d * 8 + col) =
            mma_t<T>::pack(o[t][d][2 * h], o[t][d][2 * h + 1]);
      }
  __syncwarp();
#pragma unroll
  for (int it = 0; it < 16 * MT * CH / 32; it++) {
    int r, c;
    attn_cu_ostage_at(lane, it, CH, &r, &c);
    if (r < valid && c * 8 < dp)
      *reinterpret_cast<uint4 *>(gO + (size_t)r * dp + c * 8) =
          *reinterpret_cast<const uint4 *>(sW + r * STR + c * 8);
  }
}

// The epilogue of a busy warp whose first row is block row w0: the quads'
// sums and one division, then O (staged through sW) or a split's F32
// partials, and the statistics, for the rows below i1.
template <typename T, int DPAD, int MT>
__device__ __forceinline__ void
finish(const attn_cu_params &p, float (&o)[MT][DPAD / 8][4], const float (&m)[MT][2],
       float (&l)[MT][2], T *sW, size_t qrow0, int w0, int i1, int nsplit, int split, int lane) {
  constexpr int DB = DPAD / 8;
#pragma unroll
  for (int t = 0; t < MT; t++)
#pragma unroll
    for (int h = 0; h < 2; h++) {
      l[t][h] = quad_sum(l[t][h]);
      const float inv = l[t][h] > 0.0f ? 1.0f / l[t][h] : 0.0f;
#pragma unroll
      for (int d = 0; d < DB; d++) {
        o[t][d][2 * h] *= inv;
        o[t][d][2 * h + 1] *= inv;
      }
    }
  rows_out out{&p, nsplit, split, (size_t)p.batch * p.heads_q * p.seq_q};
  if (nsplit == 1)
    store_o<T, DPAD, MT>(o, sW, (T *)p.o + (qrow0 + w0) * p.dp, i1 - w0, p.dp, lane);
#pragma unroll
  for (int t = 0; t < MT; t++)
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const int br = w0 + attn_cu_lane_row(0, MT, t, lane, h);
      if (br >= i1)
        continue;
      if (nsplit > 1) {
#pragma unroll
        for (int d = 0; d < DB; d++) {
          const int col = d * 8 + 2 * (lane % 4);
          if (col < p.dp)
            out.o2<T>(qrow0 + br, col, o[t][d][2 * h], o[t][d][2 * h + 1]);
        }
      }
      if (lane % 4 == 0)
        out.stats(qrow0 + br, m[t][h], l[t][h]);
    }
}

template <typename T, int DPAD, int BM, int BN, bool PAGED>
__global__ void __launch_bounds__(ATTN_CU_MMA_WARPS * 32)
    fwd_mma(const attn_cu_params p, int nsplit, int pack) {
  constexpr int NW = ATTN_CU_MMA_WARPS, NT = NW * 32, MT = BM / (16 * NW);
  static_assert(BM == 16 * MT * NW && (MT == 1 || MT == 2), "a warp owns one or two m16 tiles");
  static_assert(ATTN_CU_PAGE_ALIGN_TOKENS % BN == 0, "a key tile never straddles a page");
  constexpr int STR = DPAD + 8, NB = BN / 8, DB = DPAD / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T *sQ = reinterpret_cast<T *>(smem_raw);
  T *sK = sQ + BM * STR; // [2][BN][STR]
  T *sV = sK + 2 * BN * STR;

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int qt = gridDim.x - 1 - blockIdx.x; // longest (causal) tiles first
  const int h0 = blockIdx.y * pack, b = blockIdx.z / nsplit, split = blockIdx.z % nsplit;
  // Block rows [i0, i1) of the pack heads' rows (attn_cu_block_row), and
  // the queries [q0, q1) they hold.
  int i0, i1, q0, q1;
  attn_cu_block_span(qt, BM, p.seq_q, pack, &i0, &i1, &q0, &q1);
  const int hkv = h0 / (p.heads_q / p.heads_kv);
  const size_t qrow0 = ((size_t)b * p.heads_q + h0) * p.seq_q;
  const T *gQ = (const T *)p.q + (qrow0 + i0) * p.dp;
  const size_t bh = (size_t)b * p.heads_kv + hkv;
  const kv_src<T, PAGED> kv(p, bh, b);
  // Keys past kv.nkv() are invisible, as past a sequence's end; a split
  // wholly past them has no tiles and writes an empty partial (m -inf, l 0).
  int t0, t1;
  attn_cu_block_tiles(q0, q1, kv.off(p), p.window_left, p.window_right, kv.nkv(p), BN, nsplit,
                      split, &t0, &t1);

  // A warp whose rows (from block row w0) all lie past the block's (a
  // short or packed block) only helps load.
  const int w0 = i0 + attn_cu_lane_row(warp, MT, 0, 0, 0);
  const bool busy = w0 < i1;
  const bool var = p.cap2 > 0.0f || p.alibi2;
  const float k = attn_cu_exp_factor(p.scale_log2, var); // 1: scores are scaled first
  const lane_rows<MT> lr(p, w0, pack, b, h0, lane);
  float o[MT][DB][4], m[MT][2], l[MT][2];
#pragma unroll
  for (int t = 0; t < MT; t++) {
#pragma unroll
    for (int d = 0; d < DB; d++)
      o[t][d][0] = o[t][d][1] = o[t][d][2] = o[t][d][3] = 0.0f;
    m[t][0] = m[t][1] = -INFINITY;
    l[t][0] = l[t][1] = 0.0f;
  }

  const tile_copy<T, BM, DPAD, NT> cq(threadIdx.x);
  const tile_copy<T, BN, DPAD, NT> ckv(threadIdx.x);
  if (t0 < t1) {
    cq.load_any(sQ, gQ, i1 - i0, p.dp);
    ckv.load_any(sK, kv.k_rows(p, (size_t)t0 * BN), kv.nkv(p) - t0 * BN, p.dp);
    ckv.load_any(sV, kv.v_rows(p, (size_t)t0 * BN), kv.nkv(p) - t0 * BN, p.dp);
    cp_async_commit();
  }
  int qr, qc, kr, kc, vr, vc;
  attn_cu_ldsm_q(lane, &qr, &qc);
  attn_cu_ldsm_k(lane, &kr, &kc);
  attn_cu_ldsm_v(lane, &vr, &vc);
  T *sW = sQ + (w0 - i0) * STR; // the warp's rows
  const T *sQw = sW + qr * STR + qc;

  for (int t = t0; t < t1; t++) {
    const int buf = (t - t0) & 1;
    if (t + 1 < t1) {
      const size_t next = (size_t)(t + 1) * BN;
      ckv.load_any(sK + (buf ^ 1) * BN * STR, kv.k_rows(p, next), kv.nkv(p) - (t + 1) * BN, p.dp);
      ckv.load_any(sV + (buf ^ 1) * BN * STR, kv.v_rows(p, next), kv.nkv(p) - (t + 1) * BN, p.dp);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    if (busy) {
      float s[MT][NB][4];
      qk_tile<T, DPAD, BN, MT>(s, sQw, sK + buf * BN * STR, kr, kc);
      const int j0 = t * BN;
      const bool full =
          attn_cu_tile_full(j0, BN, q0, q1, kv.off(p), p.window_left, p.window_right, kv.nkv(p));
#pragma unroll
      for (int r = 0; r < MT; r++) {
        scores_to_log2<NB>(s[r], p, kv, k, var, full, j0, lr.qi[r], lr.sl[r], lane);
        softmax_tile<NB, DB>(s[r], o[r], m[r], l[r], k);
      }
      pv_tile<T, DPAD, BN, MT>(o, s, sV + buf * BN * STR, vr, vc);
    }
    __syncthreads(); // the next iteration refills the other buffer
  }
  if (busy)
    finish<T, DPAD, MT>(p, o, m, l, sW, qrow0, w0, i1, nsplit, split, lane);
}

// PAGES: whether the instance has a paged variant (ATTN_CU_PAGED_KERNELS;
// the 160 one has none: attn_cu_launch_ok refuses a paged launch on it).
template <typename T, int DPAD, int BM, int BN, bool PAGES>
void launch_mma_t(const attn_cu_params &p, const attn_cu_choice &c, cudaStream_t s) {
  dim3 grid(c.grid[0], c.grid[1], c.grid[2]), block(ATTN_CU_MMA_WARPS * 32);
  const int pack = c.pack > 1 ? c.pack : 1;
  if constexpr (PAGES) {
    if (p.k_table) {
      fwd_mma<T, DPAD, BM, BN, true><<<grid, block, c.smem_bytes, s>>>(p, c.nsplit, pack);
      return;
    }
  }
  fwd_mma<T, DPAD, BM, BN, false><<<grid, block, c.smem_bytes, s>>>(p, c.nsplit, pack);
}

template <int DPAD, int BM, int BN, bool PAGES = true>
cudaError_t launch_mma(const attn_cu_params &p, const attn_cu_choice &c, cudaStream_t s) {
  if (!PAGES && p.k_table)
    return cudaErrorInvalidValue;
  if (p.dtype == ATTN_F16)
    launch_mma_t<__half, DPAD, BM, BN, PAGES>(p, c, s);
  else
    launch_mma_t<__nv_bfloat16, DPAD, BM, BN, PAGES>(p, c, s);
  return cudaGetLastError();
}

template <typename T, int DPAD, int BM, int BN, bool PAGES> cudaError_t prepare_mma_t(int bytes) {
  cudaError_t e = cudaFuncSetAttribute(fwd_mma<T, DPAD, BM, BN, false>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if constexpr (PAGES)
    if (e == cudaSuccess)
      e = cudaFuncSetAttribute(fwd_mma<T, DPAD, BM, BN, true>,
                               cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  return e;
}

template <int DPAD, int BM, int BN, bool PAGES = true> cudaError_t prepare_mma() {
  int bytes = (BM + 4 * BN) * (DPAD + 8) * 2;
  cudaError_t e = prepare_mma_t<__half, DPAD, BM, BN, PAGES>(bytes);
  if (e == cudaSuccess)
    e = prepare_mma_t<__nv_bfloat16, DPAD, BM, BN, PAGES>(bytes);
  return e;
}

} // namespace attn_cu

#endif
