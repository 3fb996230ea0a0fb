// hopper.cuh — the forward pass for Hopper (sm_90a): TMA loads into
// 128-byte-swizzled shared memory, wgmma, and warp specialization, after
// FlashAttention-3's design. COMPILE-VERIFIED ONLY: it has never run on a
// GPU, and nothing selects it until the start-up self-check has passed it
// (kernels.h, attn_cu_select_hopper).
//
// A CTA is three warpgroups on a persistent grid. Warpgroup 0, the
// producer, gives up registers (setmaxnreg) and one of its threads issues
// TMA loads: the work unit's Q tile once (128 rows), and its K and V tiles
// through a ring of STAGES slots, K and V each with their own full and
// empty mbarriers, K of a tile ahead of V of the one before.
// Warpgroups 1 and 2, the consumers, take the registers and 64 query rows
// each: S = Q Kᵀ by wgmma with both operands in shared memory, the online
// softmax in registers (a row's 4 values live in one quad, as in
// fwd_mma.cuh), P kept in registers as the A operand of O += P V, V read
// N-major from shared memory. Within a consumer, QKᵀ of tile n + 1 is issued
// with PV of tile n, and the softmax of n + 1 runs while PV is in flight;
// between consumers, named barriers alternate the bursts of wgmmas so one
// computes its softmax while the other uses the tensor cores. The softmax
// of a tile every row sees whole is compiled apart from the masked one, so
// no per-score test keeps ptxas from overlapping it with the PV wgmma (the
// SASS check in tests/sass/ holds it to that). The epilogue writes O with
// stmatrix into O's staging (same swizzle, apart from Q, so the next unit's
// Q loads meanwhile) and a TMA store; the statistics go out as fwd_mma.cuh
// writes them. The index arithmetic is in hopper_layout.h, tested on the
// CPU.
#ifndef ATTN_CUDA_HOPPER_CUH
#define ATTN_CUDA_HOPPER_CUH

#include "common.cuh"
#include "hopper_layout.h"
#include "hopper_wgmma.cuh"

#include <cuda.h>
#include <cudaTypedefs.h>

namespace attn_cu {

// An instance's tile shape, by head-dim class (hopper_layout.h's d).
template <int D> struct hp_cfg;
template <> struct hp_cfg<64> {
  static constexpr int BN = ATTN_CU_HP_BN_D64, STAGES = ATTN_CU_HP_STAGES_D64;
};
template <> struct hp_cfg<96> {
  static constexpr int BN = ATTN_CU_HP_BN_D96, STAGES = ATTN_CU_HP_STAGES_D96;
};
template <> struct hp_cfg<128> {
  static constexpr int BN = ATTN_CU_HP_BN_D128, STAGES = ATTN_CU_HP_STAGES_D128;
};
template <> struct hp_cfg<192> {
  static constexpr int BN = ATTN_CU_HP_BN_D192, STAGES = ATTN_CU_HP_STAGES_D192;
};
template <> struct hp_cfg<256> {
  static constexpr int BN = ATTN_CU_HP_BN_D256, STAGES = ATTN_CU_HP_STAGES_D256;
};

// Named barriers: 0 is __syncthreads; consumer c's turn is HP_BAR_TURN + c,
// its own epilogue HP_BAR_EPI + c.
constexpr int HP_BAR_TURN = 1, HP_BAR_EPI = 3;

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// ---- PTX wrappers (sm_90a) ------------------------------------------------

__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// An arrival by the threads where `on` holds, as one predicated instruction:
// a branch between a wgmma wait and the code it should overlap makes ptxas
// move the next wait above that code.
__device__ __forceinline__ void mbar_arrive_if(uint32_t bar, bool on) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %1, 0;\n"
               "@p mbarrier.arrive.shared::cta.b64 _, [%0];\n}\n" ::"r"(bar),
               "r"((int)on)
               : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, int parity) {
  uint32_t done;
  do {
    asm volatile("{\n.reg .pred p;\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                 "selp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done)
                 : "r"(bar), "r"(parity)
                 : "memory");
  } while (!done);
}

__device__ __forceinline__ void tma_load(uint32_t dst, const CUtensorMap *map, int c0, int c1,
                                         int c2, uint32_t bar) {
  asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
               " [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(dst),
               "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
               : "memory");
}
__device__ __forceinline__ void tma_store(const CUtensorMap *map, uint32_t src, int c0, int c1,
                                          int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.global.shared::cta.tile.bulk_group [%0, {%2, %3, %4}], [%1];\n" ::
          "l"(reinterpret_cast<uint64_t>(map)),
      "r"(src), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}
__device__ __forceinline__ void tma_store_drain() {
  asm volatile("cp.async.bulk.commit_group;\ncp.async.bulk.wait_group.read 0;\n" ::: "memory");
}
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

__device__ __forceinline__ void wg_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wg_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N> __device__ __forceinline__ void wg_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving reads or writes of an accumulator across
// the wgmma issue and wait (the asm above does not name the registers).
template <int N> __device__ __forceinline__ void wg_hold(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; i++)
    asm volatile("" : "+f"(d[i])::"memory");
}

__device__ __forceinline__ void bar_sync(int id, int n) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
__device__ __forceinline__ void bar_arrive(int id, int n) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}

__device__ __forceinline__ void stsm_x4(uint32_t addr, const uint32_t (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr),
               "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
}

// ---- the two roles -----------------------------------------------------------

// What both roles derive from a work unit.
struct hp_unit {
  int qt, h, b, t0, t1;
  __device__ hp_unit(const attn_cu_params &p, int64_t u, int qtiles, int section, int bn) {
    attn_cu_hp_unit(u, qtiles, p.heads_q, p.batch, section, &qt, &h, &b);
    const int i0 = qt * ATTN_CU_HP_BM, i1 = min(i0 + ATTN_CU_HP_BM, p.seq_q);
    attn_cu_block_tiles(i0, i1, p.off, p.window_left, p.window_right, p.seq_kv, bn, 1, 0, &t0, &t1);
  }
};
__device__ __forceinline__ int hp_section(const attn_cu_params &p) {
  return attn_cu_hp_section(p.seq_kv, p.dp, p.heads_q, p.heads_kv, p.batch, p.window_left,
                            p.window_right);
}

// One TMA load of `rows` rows of every panel, completing on bar.
template <int DPAD>
__device__ __forceinline__ void hp_load(uint32_t dst, const CUtensorMap *m, int rows, int row0,
                                        int z, uint32_t bar) {
  mbar_expect_tx(bar, rows * DPAD * 2);
#pragma unroll
  for (int pn = 0; pn < DPAD / ATTN_CU_HP_PANEL; pn++)
    tma_load(dst + pn * rows * 128, m, pn * ATTN_CU_HP_PANEL, row0, z, bar);
}

// The producer's view of one ring position: which tile of which KV head.
struct hp_tile {
  int64_t it;
  int t, z;
};
template <int DPAD, int BN, int STAGES>
__device__ __forceinline__ void hp_load_kv(const CUtensorMap *m, uint32_t base, const hp_tile &k,
                                           bool v) {
  const uint32_t bars = base + attn_cu_hp_bar_off(DPAD, BN, STAGES);
  int slot, parity;
  attn_cu_hp_ring(k.it, STAGES, &slot, &parity);
  (void)parity;
  mbar_wait(bars + (v ? attn_cu_hp_vempty(slot) : attn_cu_hp_kempty(slot)),
            attn_cu_hp_empty_parity(k.it, STAGES));
  hp_load<DPAD>(base + (v ? attn_cu_hp_v_off(DPAD, BN, slot) : attn_cu_hp_k_off(DPAD, BN, slot)), m,
                BN, k.t * BN, k.z, bars + (v ? attn_cu_hp_vfull(slot) : attn_cu_hp_kfull(slot)));
}

template <int DPAD>
__device__ __forceinline__ void hp_load_q(const attn_cu_params &p, const CUtensorMap *tq,
                                          uint32_t bars, uint32_t base, const hp_unit &w,
                                          int64_t done) {
  mbar_wait(bars + ATTN_CU_HP_QEMPTY, attn_cu_hp_empty_parity(done, 1));
  hp_load<DPAD>(base, tq, ATTN_CU_HP_BM, w.qt * ATTN_CU_HP_BM, w.b * p.heads_q + w.h,
                bars + ATTN_CU_HP_QFULL);
}

// The producer issues K of each tile before V of the one before it, so the
// consumers' S = Q Kᵀ, which comes first, never waits behind a V; and a
// unit's first K before the wait for Q's buffer, so the next unit's keys
// are on their way while this one finishes. The V still owed when a new
// unit starts goes before Q, which the consumers need later.
template <int DPAD, int BN, int STAGES>
__device__ void hp_produce(const attn_cu_params &p, const CUtensorMap *tq, const CUtensorMap *tk,
                           const CUtensorMap *tv, uint32_t base) {
  const uint32_t bars = base + attn_cu_hp_bar_off(DPAD, BN, STAGES);
  const int qtiles = (p.seq_q + ATTN_CU_HP_BM - 1) / ATTN_CU_HP_BM, section = hp_section(p);
  const int64_t units = (int64_t)qtiles * p.heads_q * p.batch;
  const int group = p.heads_q / p.heads_kv;
  int64_t it = 0, done = 0;
  hp_tile owed = {-1, 0, 0};
  for (int64_t u = blockIdx.x; u < units; u += gridDim.x, done++) {
    const hp_unit w(p, u, qtiles, section, BN);
    const int zkv = w.b * p.heads_kv + w.h / group;
    for (int t = w.t0; t < w.t1; t++, it++) {
      hp_load_kv<DPAD, BN, STAGES>(tk, base, hp_tile{it, t, zkv}, false);
      if (owed.it >= 0)
        hp_load_kv<DPAD, BN, STAGES>(tv, base, owed, true);
      if (t == w.t0)
        hp_load_q<DPAD>(p, tq, bars, base, w, done);
      owed = hp_tile{it, t, zkv};
    }
    if (w.t0 == w.t1) { // no keys: Q alone (the consumers still wait for it)
      if (owed.it >= 0)
        hp_load_kv<DPAD, BN, STAGES>(tv, base, owed, true);
      owed.it = -1;
      hp_load_q<DPAD>(p, tq, bars, base, w, done);
    }
  }
  if (owed.it >= 0)
    hp_load_kv<DPAD, BN, STAGES>(tv, base, owed, true);
}

// One consumer's running state for its 64 rows: this thread's rows a (g)
// and b (g + 8) of its warp's 16. m is in log2 units of the scaled score.
template <typename T, int D, int BN> struct hp_rows {
  static constexpr int DPAD = attn_cu_hp_dpad(D);
  float o[DPAD / 2];
  uint32_t pf[BN / 16][4];
  float m_a, m_b, l_a, l_b;
  int ra, rb, lo_a, hi_a, lo_b, hi_b;

  __device__ void start(const attn_cu_params &p, int r0, int x) {
#pragma unroll
    for (int i = 0; i < DPAD / 2; i++)
      o[i] = 0.0f;
    m_a = m_b = -INFINITY;
    l_a = l_b = 0.0f;
    int row, col;
    attn_cu_hp_acc(x, 0, &row, &col);
    ra = r0 + row, rb = ra + 8;
    const int64_t off = p.off; // the mask's diagonal (diag_offset or Nkv − Nq)
    attn_cu_row_bounds(ra, off, p.window_left, p.window_right, p.seq_kv, &lo_a, &hi_a);
    attn_cu_row_bounds(rb, off, p.window_left, p.window_right, p.seq_kv, &lo_b, &hi_b);
  }

  // Folds S (raw Q Kᵀ) into the running max and sum and turns it into the
  // weights; the returned factors rescale O once the PV in flight is done.
  // MASK: the tile is not wholly visible to every row, so each score is
  // tested; a whole tile's softmax is branch-free, which lets ptxas keep
  // the PV wgmma in flight across it. c2 = scale · log2 e > 0 (the select
  // refuses others), so the max of the raw scores scales to the max of the
  // scaled ones, and exp2(s · c2 − m) is one FFMA and one MUFU.EX2.
  template <bool MASK>
  __device__ __forceinline__ void softmax(float (&s)[BN / 2], float c2, int j0, int x, float *al_a,
                                          float *al_b) {
    float mx_a = -INFINITY, mx_b = -INFINITY;
#pragma unroll
    for (int i = 0; i < BN / 2; i++) {
      const bool a = i / 2 % 2 == 0;
      if (MASK) {
        int row, col;
        attn_cu_hp_acc(x, i, &row, &col);
        const int j = j0 + col;
        if (!(a ? (j >= lo_a && j <= hi_a) : (j >= lo_b && j <= hi_b)))
          s[i] = -INFINITY;
      }
      if (a)
        mx_a = fmaxf(mx_a, s[i]);
      else
        mx_b = fmaxf(mx_b, s[i]);
    }
    mx_a = fmaxf(m_a, quad_max(mx_a) * c2);
    mx_b = fmaxf(m_b, quad_max(mx_b) * c2);
    const float use_a = attn_cu_max_for_exp(mx_a), use_b = attn_cu_max_for_exp(mx_b);
    *al_a = fast_exp2(m_a - use_a);
    *al_b = fast_exp2(m_b - use_b);
    m_a = mx_a, m_b = mx_b;
    float sum_a = 0.0f, sum_b = 0.0f;
#pragma unroll
    for (int i = 0; i < BN / 2; i++) {
      const bool a = i / 2 % 2 == 0;
      s[i] = fast_exp2(fmaf(s[i], c2, a ? -use_a : -use_b));
      if (a)
        sum_a += s[i];
      else
        sum_b += s[i];
    }
    l_a = l_a * *al_a + sum_a; // this lane's share; the quad sums at the end
    l_b = l_b * *al_b + sum_b;
  }

  __device__ void rescale(float al_a, float al_b) {
#pragma unroll
    for (int i = 0; i < DPAD / 2; i++)
      o[i] *= i / 2 % 2 == 0 ? al_a : al_b;
  }
  __device__ void to_p(const float (&s)[BN / 2]) {
#pragma unroll
    for (int kk = 0; kk < BN / 16; kk++)
#pragma unroll
      for (int r = 0; r < 4; r++) {
        const int i = attn_cu_hp_acc_pair(kk, r);
        pf[kk][r] = mma_t<T>::pack(s[i], s[i + 1]);
      }
  }
};

template <typename T, int D, int BN>
__device__ __forceinline__ void hp_issue_qk(float (&s)[BN / 2], uint32_t sq, int c, uint32_t sk) {
#pragma unroll
  for (int kk = 0; kk < attn_cu_hp_qk_steps(D); kk++)
    wgmma_ss<T, BN>::run(s, attn_cu_hp_desc_k(sq, ATTN_CU_HP_BM, ATTN_CU_HP_WG_ROWS * c, kk),
                         attn_cu_hp_desc_k(sk, BN, 0, kk), kk > 0);
}
template <typename T, int D, int BN>
__device__ __forceinline__ void hp_issue_pv(hp_rows<T, D, BN> &r, uint32_t sv) {
  constexpr int DPAD = attn_cu_hp_dpad(D);
#pragma unroll
  for (int kk = 0; kk < BN / 16; kk++)
    wgmma_rs<T, DPAD>::run(r.o, r.pf[kk], attn_cu_hp_desc_mn(sv, BN, kk), 1);
}

// The epilogue of consumer c: O / l through stmatrix into its rows of O's
// staging, one TMA store per panel, then the statistics.
template <typename T, int D, int BN>
__device__ void hp_epilogue(hp_rows<T, D, BN> &r, const attn_cu_params &p, const CUtensorMap *to,
                            uint32_t base, const hp_unit &w, int c, int x) {
  constexpr int DPAD = attn_cu_hp_dpad(D);
  r.l_a = quad_sum(r.l_a);
  r.l_b = quad_sum(r.l_b);
  const float inv_a = r.l_a > 0.0f ? 1.0f / r.l_a : 0.0f;
  const float inv_b = r.l_b > 0.0f ? 1.0f / r.l_b : 0.0f;
  const uint32_t so = base + attn_cu_hp_o_off(DPAD);
  int lr, lc;
  attn_cu_ldsm_q(x % 32, &lr, &lc);
  const int row = ATTN_CU_HP_WG_ROWS * c + 16 * (x / 32) + lr;
  bar_sync(HP_BAR_EPI + c, ATTN_CU_HP_WG); // the last unit's store has read the staging
#pragma unroll
  for (int kk = 0; kk < DPAD / 16; kk++) {
    uint32_t v[4];
#pragma unroll
    for (int j = 0; j < 4; j++) {
      const int i = attn_cu_hp_acc_pair(kk, j);
      const float inv = j % 2 == 0 ? inv_a : inv_b;
      v[j] = mma_t<T>::pack(r.o[i] * inv, r.o[i + 1] * inv);
    }
    stsm_x4(so + attn_cu_hp_off(row, 16 * kk + lc, ATTN_CU_HP_BM), v);
  }
  fence_proxy_async(); // the TMA store reads what stmatrix wrote
  bar_sync(HP_BAR_EPI + c, ATTN_CU_HP_WG);
  if (x == 0) {
    const int i0 = w.qt * ATTN_CU_HP_BM + ATTN_CU_HP_WG_ROWS * c;
#pragma unroll
    for (int pn = 0; pn < DPAD / ATTN_CU_HP_PANEL; pn++)
      tma_store(to, so + pn * ATTN_CU_HP_BM * 128 + ATTN_CU_HP_WG_ROWS * c * 128,
                pn * ATTN_CU_HP_PANEL, i0, w.b * p.heads_q + w.h);
    tma_store_drain();
  }
  const size_t qrow0 = ((size_t)w.b * p.heads_q + w.h) * p.seq_q;
  rows_out out{&p, 1, 0, (size_t)p.batch * p.heads_q * p.seq_q};
  if (x % 4 == 0) {
    if (r.ra < p.seq_q)
      out.stats(qrow0 + r.ra, r.m_a, r.l_a);
    if (r.rb < p.seq_q)
      out.stats(qrow0 + r.rb, r.m_b, r.l_b);
  }
}

// A consumer's fixed facts for one unit.
struct hp_ctx {
  uint32_t base, bars;
  int c, x, mine, other, steps, n, t0;
  int64_t it;
  float c2;
};

// The first burst: QKᵀ of the unit's first tile alone (O is still zero).
template <typename T, int D, int BN, int STAGES>
__device__ __forceinline__ void hp_first(hp_rows<T, D, BN> &r, float (&s)[BN / 2], const hp_ctx &k,
                                         int *slot, int *parity) {
  constexpr int DPAD = attn_cu_hp_dpad(D);
  attn_cu_hp_ring(k.it, STAGES, slot, parity);
  mbar_wait(k.bars + attn_cu_hp_kfull(*slot), *parity);
  bar_sync(k.mine, 2 * ATTN_CU_HP_WG);
  wg_fence();
  hp_issue_qk<T, D, BN>(s, k.base, k.c, k.base + attn_cu_hp_k_off(DPAD, BN, *slot));
  wg_commit();
  if (attn_cu_hp_pp_arrives(k.c, 0, k.steps))
    bar_arrive(k.other, 2 * ATTN_CU_HP_WG);
  wg_wait<0>();
  wg_hold(s);
  // each warp has seen the wgmmas reading K (and Q) complete
  mbar_arrive_if(k.bars + attn_cu_hp_kempty(*slot), k.x % 32 == 0);
  mbar_arrive_if(k.bars + ATTN_CU_HP_QEMPTY, k.n == 1 && k.x % 32 == 0);
  // Masked whether or not it needs it: a second copy of the softmax here,
  // outside any overlap, made the 256 instance spill.
  float al_a, al_b;
  r.template softmax<true>(s, k.c2, k.t0 * BN, k.x, &al_a, &al_b);
  r.to_p(s);
}

// Step `step` (1 .. n − 1): QKᵀ of tile t0 + step with PV of the tile
// before it, K released once QKᵀ is done (wait 1), the softmax while PV
// runs, V released once PV is done (wait 0). Straight-line code (no
// wgmma under a condition), so ptxas keeps the wgmmas asynchronous.
template <bool MASK, typename T, int D, int BN, int STAGES>
__device__ __forceinline__ void hp_step(hp_rows<T, D, BN> &r, float (&s)[BN / 2], const hp_ctx &k,
                                        int step, int *slot, int *parity) {
  constexpr int DPAD = attn_cu_hp_dpad(D);
  const int pslot = *slot, pparity = *parity;
  attn_cu_hp_ring(k.it + step, STAGES, slot, parity);
  mbar_wait(k.bars + attn_cu_hp_vfull(pslot), pparity);
  mbar_wait(k.bars + attn_cu_hp_kfull(*slot), *parity);
  bar_sync(k.mine, 2 * ATTN_CU_HP_WG);
  wg_fence();
  hp_issue_qk<T, D, BN>(s, k.base, k.c, k.base + attn_cu_hp_k_off(DPAD, BN, *slot));
  wg_commit();
  hp_issue_pv<T, D, BN>(r, k.base + attn_cu_hp_v_off(DPAD, BN, pslot));
  wg_commit();
  if (attn_cu_hp_pp_arrives(k.c, step, k.steps))
    bar_arrive(k.other, 2 * ATTN_CU_HP_WG);
  wg_wait<1>();
  wg_hold(s);
  mbar_arrive_if(k.bars + attn_cu_hp_kempty(*slot), k.x % 32 == 0);
  // the unit's last read of Q is done
  mbar_arrive_if(k.bars + ATTN_CU_HP_QEMPTY, step == k.n - 1 && k.x % 32 == 0);
  float al_a, al_b;
  r.template softmax<MASK>(s, k.c2, (k.t0 + step) * BN, k.x, &al_a, &al_b);
  wg_wait<0>();
  wg_hold(r.o);
  mbar_arrive_if(k.bars + attn_cu_hp_vempty(pslot), k.x % 32 == 0);
  r.rescale(al_a, al_b);
  r.to_p(s);
}

// The last burst: PV of the last tile.
template <typename T, int D, int BN, int STAGES>
__device__ __forceinline__ void hp_last(hp_rows<T, D, BN> &r, const hp_ctx &k, int slot,
                                        int parity) {
  constexpr int DPAD = attn_cu_hp_dpad(D);
  mbar_wait(k.bars + attn_cu_hp_vfull(slot), parity);
  bar_sync(k.mine, 2 * ATTN_CU_HP_WG);
  wg_fence();
  hp_issue_pv<T, D, BN>(r, k.base + attn_cu_hp_v_off(DPAD, BN, slot));
  wg_commit();
  if (attn_cu_hp_pp_arrives(k.c, k.steps - 1, k.steps))
    bar_arrive(k.other, 2 * ATTN_CU_HP_WG);
  wg_wait<0>();
  wg_hold(r.o);
  mbar_arrive_if(k.bars + attn_cu_hp_vempty(slot), k.x % 32 == 0);
}

// One work unit of consumer c (0, 1), thread x of its warpgroup; `it`
// counts K/V tiles as the producer does. The tiles every row of this
// consumer sees whole form one run (attn_cu_hp_full_range) and take the
// unmasked softmax; the masked ones before and after it loop apart.
template <typename T, int D, int BN, int STAGES>
__device__ void hp_consume_unit(hp_rows<T, D, BN> &r, const attn_cu_params &p, const hp_unit &w,
                                uint32_t base, int c, int x, int64_t &it) {
  constexpr int DPAD = attn_cu_hp_dpad(D);
  const int n = w.t1 - w.t0;
  const hp_ctx k{base,
                 base + attn_cu_hp_bar_off(DPAD, BN, STAGES),
                 c,
                 x,
                 HP_BAR_TURN + c,
                 HP_BAR_TURN + 1 - c,
                 attn_cu_hp_pp_steps(n),
                 n,
                 w.t0,
                 it,
                 p.scale_log2};
  if (n == 0) {
    mbar_arrive_if(k.bars + ATTN_CU_HP_QEMPTY, x % 32 == 0);
    return;
  }
  const int r0 = w.qt * ATTN_CU_HP_BM + ATTN_CU_HP_WG_ROWS * c;
  const int r1 = max(min(r0 + ATTN_CU_HP_WG_ROWS, p.seq_q), r0 + 1);
  int f0, f1;
  attn_cu_hp_full_range(w.t0, w.t1, BN, r0, r1, p.off, p.window_left, p.window_right, p.seq_kv, &f0,
                        &f1);
  if (attn_cu_hp_pp_opens(c, k.steps))
    bar_arrive(k.other, 2 * ATTN_CU_HP_WG);
  float s[BN / 2];
  int slot, parity;
  hp_first<T, D, BN, STAGES>(r, s, k, &slot, &parity);
  const int a = min(max(f0 - w.t0, 1), n), z = min(max(f1 - w.t0, a), n);
  for (int step = 1; step < a; step++)
    hp_step<true, T, D, BN, STAGES>(r, s, k, step, &slot, &parity);
  for (int step = a; step < z; step++)
    hp_step<false, T, D, BN, STAGES>(r, s, k, step, &slot, &parity);
  for (int step = z; step < n; step++)
    hp_step<true, T, D, BN, STAGES>(r, s, k, step, &slot, &parity);
  hp_last<T, D, BN, STAGES>(r, k, slot, parity);
  it += n;
}

template <typename T, int D>
__global__ void __launch_bounds__(ATTN_CU_HP_THREADS, 1)
    hopper_fwd(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
               const __grid_constant__ CUtensorMap tv, const __grid_constant__ CUtensorMap to,
               const attn_cu_params p) {
  constexpr int DPAD = attn_cu_hp_dpad(D);
  constexpr int BN = hp_cfg<D>::BN, STAGES = hp_cfg<D>::STAGES;
  extern __shared__ __align__(1024) unsigned char hp_smem[];
  const uint32_t base = (smem_addr(hp_smem) + 1023u) & ~1023u;
  const uint32_t bars = base + attn_cu_hp_bar_off(DPAD, BN, STAGES);
  const int wg = threadIdx.x / ATTN_CU_HP_WG, x = threadIdx.x % ATTN_CU_HP_WG;
  if (threadIdx.x == 0) {
    mbar_init(bars + ATTN_CU_HP_QFULL, 1);  // the producer's expect_tx
    mbar_init(bars + ATTN_CU_HP_QEMPTY, 8); // one arrival per consumer warp
    for (int sl = 0; sl < STAGES; sl++) {
      mbar_init(bars + attn_cu_hp_kfull(sl), 1);
      mbar_init(bars + attn_cu_hp_vfull(sl), 1);
      mbar_init(bars + attn_cu_hp_kempty(sl), 8); // one arrival per consumer warp
      mbar_init(bars + attn_cu_hp_vempty(sl), 8);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  if (wg == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory");
    if (x == 0)
      hp_produce<DPAD, BN, STAGES>(p, &tq, &tk, &tv, base);
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n" ::: "memory");
    const int c = wg - 1;
    const int qtiles = (p.seq_q + ATTN_CU_HP_BM - 1) / ATTN_CU_HP_BM, section = hp_section(p);
    const int64_t units = (int64_t)qtiles * p.heads_q * p.batch;
    int64_t it = 0, done = 0;
    hp_rows<T, D, BN> r;
    for (int64_t u = blockIdx.x; u < units; u += gridDim.x, done++) {
      const hp_unit w(p, u, qtiles, section, BN);
      r.start(p, w.qt * ATTN_CU_HP_BM + ATTN_CU_HP_WG_ROWS * c, x);
      mbar_wait(bars + ATTN_CU_HP_QFULL, (int)(done % 2));
      hp_consume_unit<T, D, BN, STAGES>(r, p, w, base, c, x, it);
      hp_epilogue<T, D, BN>(r, p, &to, base, w, c, x);
    }
  }
}
#else
// Built for another architecture: never launched (the host checks the
// device), and a trap if it ever were.
template <typename T, int D>
__global__ void __launch_bounds__(ATTN_CU_HP_THREADS, 1)
    hopper_fwd(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
               const __grid_constant__ CUtensorMap tv, const __grid_constant__ CUtensorMap to,
               const attn_cu_params p) {
#ifdef __CUDA_ARCH__
  __trap();
#endif
}
#endif

// ---- the host side -------------------------------------------------------------

// Encodes one tensor map as attn_cu_hp_tmap_spec describes it: 2-byte
// elements, 128-byte swizzle, zero fill out of bounds. The driver's
// function comes through the runtime, so the static runtime suffices.
inline cudaError_t hp_encode(CUtensorMap *m, const attn_cu_params &p, const attn_cu_choice &c,
                             attn_cu_tmap_which which) {
  void *fn = nullptr;
  cudaDriverEntryPointQueryResult q;
  cudaError_t e =
      cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q);
  if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || !fn)
    return e != cudaSuccess ? e : cudaErrorNotSupported;
  attn_cu_tmap_spec s;
  attn_cu_hp_tmap_spec(&p, &c, which, &s);
  const cuuint64_t dims[3] = {s.dims[0], s.dims[1], s.dims[2]};
  const cuuint64_t strides[2] = {s.strides[0], s.strides[1]};
  const cuuint32_t box[3] = {s.box[0], s.box[1], s.box[2]}, unit[3] = {1, 1, 1};
  CUresult r = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn)(
      m, p.dtype == ATTN_F16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
      3, const_cast<void *>(s.base), dims, strides, box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE,
      CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

template <typename T, int D>
cudaError_t hp_launch_t(const attn_cu_params &p, const attn_cu_choice &c, cudaStream_t st) {
  CUtensorMap m[4];
  for (int w = 0; w < 4; w++) {
    cudaError_t e = hp_encode(&m[w], p, c, (attn_cu_tmap_which)w);
    if (e != cudaSuccess)
      return e;
  }
  cudaError_t e = cudaFuncSetAttribute(
      hopper_fwd<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)c.smem_bytes);
  if (e != cudaSuccess)
    return e;
  hopper_fwd<T, D><<<c.grid[0], ATTN_CU_HP_THREADS, c.smem_bytes, st>>>(m[0], m[1], m[2], m[3], p);
  return cudaGetLastError();
}

// Only with the sm_90a code built and on a compute capability 9.0 device.
template <int D>
cudaError_t hp_launch(const attn_cu_params &p, const attn_cu_choice &c, cudaStream_t st) {
  if (!attn_cu_hopper_built())
    return cudaErrorNotSupported;
  int dev, major, minor;
  cudaError_t e = cudaGetDevice(&dev);
  if (e == cudaSuccess)
    e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  if (e == cudaSuccess)
    e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
  if (e != cudaSuccess)
    return e;
  if (major != 9 || minor != 0 || p.pass != ATTN_FORWARD || c.nsplit != 1)
    return cudaErrorNotSupported;
  if (p.dtype == ATTN_F16)
    return hp_launch_t<__half, D>(p, c, st);
  if (p.dtype == ATTN_BF16)
    return hp_launch_t<__nv_bfloat16, D>(p, c, st);
  return cudaErrorNotSupported;
}

} // namespace attn_cu

#endif
