/*
 * hopper_layout.h — the index arithmetic of the Hopper (sm_90a) forward
 * instance (hopper.cuh), as plain functions that compile for the device and
 * the host, so the unit tests check them without a GPU (layout.h's style).
 *
 * Warpgroups. 128 consecutive threads (4 warps) issue one wgmma. In the
 * warpgroup, thread x has warp w = x / 32, groupID g = x % 32 / 4 and
 * thread-in-group t = x % 4. Following the PTX ISA's figures for
 * wgmma.mma_async.m64nNk16 (F16/BF16 in, F32 accumulators):
 *
 *   D (64xN): element i (0 .. N/2 - 1) sits at row 16w + g + 8 (i / 2 % 2),
 *     column 8 (i / 4) + 2t + i % 2: the mma.sync C layout of each warp's
 *     16 rows, repeated every 8 columns.
 *   A from registers (64x16): element e (0..7, register e / 2) at row
 *     16w + g + 8 (e / 2 % 2), column 2t + e % 2 + 8 (e / 4): mma.sync's A
 *     layout per warp. So S's accumulators of keys [16k, 16k + 16) are P's
 *     A fragment for that k step: register r takes elements 8k + 2r, +1.
 *
 * Shared memory. Tiles are stored as TMA writes them with
 * CU_TENSOR_MAP_SWIZZLE_128B and a box 64 elements (128 bytes) wide: a
 * [rows][DPAD] tile is DPAD / 64 column panels of [rows][64], each panel
 * rows x 128 bytes, and inside a panel the 16-byte chunk c of row r lives at
 * chunk c ^ (r % 8). The XOR uses address bits 7..9, so every panel starts
 * on a 1024-byte boundary (the descriptors' base offset is then 0).
 *
 * Descriptors (PTX ISA "Matrix Descriptor Format"): bits 0-13 start
 * address >> 4, 16-29 leading byte offset >> 4, 32-45 stride byte offset
 * >> 4, 62-63 swizzle mode (1 = 128B). Q and K are K-major operands (the
 * head dim is contiguous): SBO = 1024 (8 rows of 128 bytes), LBO unused;
 * the k step kk starts 32 bytes further into the panel (kk % 4) of panel
 * kk / 4. V is the B operand of O = P V with N (the head dim) contiguous,
 * "MN-major" (imm-trans-b = 1): LBO = the panel size (the next 64 head
 * dims), SBO = 1024 (the next 8 keys), and the k step kk (16 keys) starts
 * 16 rows further.
 *
 * The epilogue writes O through stmatrix.x4 into its (swizzled) staging:
 * lane l addresses row l % 16, column 8 (l / 16) of a 16x16 piece (the
 * pattern of attn_cu_ldsm_q), and register j carries accumulator elements
 * 8k + 2j, +1 — the same pairs as P's A fragment.
 */
#ifndef ATTN_CUDA_HOPPER_LAYOUT_H
#define ATTN_CUDA_HOPPER_LAYOUT_H

#include "layout.h"

/* Threads of a warpgroup, and the CTA: one producer and two consumers. */
#define ATTN_CU_HP_WG 128
#define ATTN_CU_HP_THREADS (3 * ATTN_CU_HP_WG)
/* Query rows of a consumer warpgroup and of the CTA. */
#define ATTN_CU_HP_WG_ROWS 64
#define ATTN_CU_HP_BM (2 * ATTN_CU_HP_WG_ROWS)
/* Elements of one swizzled panel row (128 bytes of F16/BF16). */
#define ATTN_CU_HP_PANEL 64

/* An instance's head-dim class d (64, 96, 128, 192, 256) stores its tiles
 * in whole panels, dpad columns; S = Q Kᵀ takes d / 16 k steps of 16, so
 * the 96 class skips the two steps over the zero columns (TMA fills past
 * dp) that the 128 one would compute. */
ATTN_HDC int attn_cu_hp_dpad(int d) {
  return (d + ATTN_CU_HP_PANEL - 1) / ATTN_CU_HP_PANEL * ATTN_CU_HP_PANEL;
}
ATTN_HDC int attn_cu_hp_qk_steps(int d) { return d / 16; }

/*
 * Shared memory of a CTA, from a 1024-byte aligned base: Q [BM][dpad]; O's
 * staging [BM][dpad], apart from Q so that the next unit's Q loads while
 * this one's O is stored; then K and V of each of `stages` ring slots
 * [bn][dpad] (K of slot s at attn_cu_hp_k_off, V after it); then the
 * mbarriers: Q full, Q empty, and per slot K full, V full, K empty and
 * V empty, so a K slot is refilled once S = Q Kᵀ has read it and a V slot
 * once O += P V has. Q empty takes one arrival per consumer warp, once its
 * last S = Q Kᵀ of the unit has completed. The dynamic allocation adds
 * 1024 bytes so the kernel can align its base.
 */
ATTN_HD uint32_t attn_cu_hp_o_off(int dpad) { return (uint32_t)(ATTN_CU_HP_BM * dpad * 2); }
ATTN_HD uint32_t attn_cu_hp_k_off(int dpad, int bn, int slot) {
  return 2 * attn_cu_hp_o_off(dpad) + (uint32_t)(2 * slot * bn * dpad * 2);
}
ATTN_HD uint32_t attn_cu_hp_v_off(int dpad, int bn, int slot) {
  return attn_cu_hp_k_off(dpad, bn, slot) + (uint32_t)(bn * dpad * 2);
}
ATTN_HD uint32_t attn_cu_hp_bar_off(int dpad, int bn, int stages) {
  return attn_cu_hp_k_off(dpad, bn, stages);
}
/* The barriers, as offsets from the barriers' base: Q's, and ring slot sl's. */
#define ATTN_CU_HP_QFULL 0u
#define ATTN_CU_HP_QEMPTY 8u
ATTN_HD uint32_t attn_cu_hp_kfull(int sl) { return 16 + 32 * (uint32_t)sl; }
ATTN_HD uint32_t attn_cu_hp_vfull(int sl) { return 24 + 32 * (uint32_t)sl; }
ATTN_HD uint32_t attn_cu_hp_kempty(int sl) { return 32 + 32 * (uint32_t)sl; }
ATTN_HD uint32_t attn_cu_hp_vempty(int sl) { return 40 + 32 * (uint32_t)sl; }
ATTN_HD uint32_t attn_cu_hp_smem(int dpad, int bn, int stages) {
  return 1024 + attn_cu_hp_bar_off(dpad, bn, stages) + (uint32_t)(2 + 4 * stages) * 8;
}

/* ---- fragments ----------------------------------------------------------- */

/* Accumulator element i of warpgroup thread x (m64nN). */
ATTN_HD void attn_cu_hp_acc(int x, int i, int *row, int *col) {
  *row = 16 * (x / 32) + x % 32 / 4 + 8 * (i / 2 % 2);
  *col = 8 * (i / 4) + 2 * (x % 4) + i % 2;
}

/* Element e (0..7) of the register A operand held by thread x (m64k16). */
ATTN_HD void attn_cu_hp_frag_a(int x, int e, int *row, int *col) {
  *row = 16 * (x / 32) + x % 32 / 4 + 8 * (e / 2 % 2);
  *col = 2 * (x % 4) + e % 2 + 8 * (e / 4);
}

/* The accumulator element that becomes the low half of A register r of the
 * k step kk (16 columns of S), and of stmatrix register r of 16x16 piece
 * kk; the high half is the next element. */
ATTN_HD int attn_cu_hp_acc_pair(int kk, int r) { return 8 * kk + 2 * r; }

/* ---- the 128-byte swizzle -------------------------------------------------- */

/* Byte offset of element (row, col) (2-byte elements, col < DPAD) in a
 * [rows][DPAD] tile of DPAD / 64 swizzled panels. */
ATTN_HD uint32_t attn_cu_hp_off(int row, int col, int rows) {
  uint32_t panel = (uint32_t)(col / ATTN_CU_HP_PANEL), b = (uint32_t)(col % ATTN_CU_HP_PANEL) * 2;
  uint32_t chunk = (b / 16) ^ (uint32_t)(row % 8);
  return panel * (uint32_t)rows * 128 + (uint32_t)row * 128 + chunk * 16 + b % 16;
}

/* ---- wgmma shared-memory descriptors ---------------------------------------- */

ATTN_HD uint64_t attn_cu_hp_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return (uint64_t)((addr & 0x3ffff) >> 4) | (uint64_t)((lbo & 0x3ffff) >> 4) << 16 |
         (uint64_t)((sbo & 0x3ffff) >> 4) << 32 | (uint64_t)1 << 62;
}

/* K-major operand (Q as A, K as B of S = Q Kᵀ): rows [r0, r0 + 64 or N) of
 * a tile of `rows` rows at shared address base, k step kk (16 head dims). */
ATTN_HD uint64_t attn_cu_hp_desc_k(uint32_t base, int rows, int r0, int kk) {
  uint32_t a = base + (uint32_t)(kk / 4) * (uint32_t)rows * 128 + (uint32_t)r0 * 128 +
               (uint32_t)(kk % 4) * 32;
  return attn_cu_hp_desc(a, 16, 1024);
}

/* MN-major operand (V as B of O = P V): k step kk (keys [16kk, +16)) of a
 * tile of `rows` keys at shared address base, every head dim. */
ATTN_HD uint64_t attn_cu_hp_desc_mn(uint32_t base, int rows, int kk) {
  return attn_cu_hp_desc(base + (uint32_t)kk * 16 * 128, (uint32_t)rows * 128, 1024);
}

/* ---- the K/V ring ------------------------------------------------------------ */

/*
 * The producer and the consumers walk the same sequence of K/V tiles, all
 * tiles of all work units of the CTA, counting them in `it`. Tile it uses
 * ring slot it % stages; an mbarrier completes one phase per use of its
 * slot, so the waiter for use it / stages of a slot waits for the phase of
 * that parity. The producer waits for the slot's previous use to be
 * released: parity (it / stages + 1) % 2, which a fresh barrier (that has
 * completed no phase, "phase -1") satisfies at once.
 */
ATTN_HD void attn_cu_hp_ring(int64_t it, int stages, int *slot, int *parity) {
  *slot = (int)(it % stages);
  *parity = (int)(it / stages % 2);
}
ATTN_HD int attn_cu_hp_empty_parity(int64_t it, int stages) { return (int)((it / stages + 1) % 2); }

/* ---- the persistent scheduler -------------------------------------------------- */

/*
 * Work unit u of the persistent grid (CTA c takes units c, c + grid, ...):
 * query tile *qt of head *h of batch entry *b, pairs (b, h) numbered head
 * fastest so that neighbours share a KV head.
 *
 * section 0 (every row sees the same keys): query tiles fastest, so the
 * CTAs at work at once read the K and V of a few heads, which stay in L2.
 * section > 0 (a causal mask, or any window whose edge moves with the
 * row): the pairs go in sections of that many, and within a section the
 * last query tiles come first, since they see the most keys: the longest
 * units start first and short ones fill the tail, while the section's K
 * and V (attn_cu_hp_section sizes it) stay in L2.
 */
ATTN_HD void attn_cu_hp_unit(int64_t u, int qtiles, int heads, int batch, int section, int *qt,
                             int *h, int *b) {
  int64_t pair;
  if (section <= 0) {
    *qt = (int)(u % qtiles);
    pair = u / qtiles;
  } else {
    const int64_t pairs = (int64_t)heads * batch, per = (int64_t)section * qtiles;
    const int64_t first = u / per * section, r = u % per;
    const int64_t np = pairs - first < section ? pairs - first : section;
    *qt = qtiles - 1 - (int)(r / np);
    pair = first + r % np;
  }
  *h = (int)(pair % heads);
  *b = (int)(pair / heads);
}

/* L2 bytes the K and V of one section may take: H100 and H200 have 50 MB,
 * and Q, O and other CTAs' traffic need the rest. */
#define ATTN_CU_HP_L2_BUDGET ((int64_t)32 << 20)

/* The section of attn_cu_hp_unit: 0 when every row of the mask sees the
 * same keys (no window edge), else the pairs whose K and V fit the budget,
 * in whole GQA groups (at least one). */
ATTN_HD int attn_cu_hp_section(int64_t seq_kv, int dp, int heads_q, int heads_kv, int batch,
                               int64_t wl, int64_t wr) {
  if (wl < 0 && wr < 0)
    return 0;
  const int64_t per_kv = seq_kv * dp * 4, pairs = (int64_t)heads_q * batch;
  int64_t groups = ATTN_CU_HP_L2_BUDGET / (per_kv > 0 ? per_kv : 1);
  int64_t n = (groups > 1 ? groups : 1) * (heads_q / heads_kv);
  return (int)(n < pairs ? n : pairs);
}

/*
 * The key tiles [*f0, *f1) of [t0, t1) that every row of [r0, r1) sees
 * whole (attn_cu_tile_full): the consumer runs them through the softmax
 * without a mask, the others through the masked one. They are contiguous,
 * since a row's visible keys [lo, hi] never move left as the row grows:
 * a tile is whole for all rows when it starts at or after the last row's
 * lo and ends at or before the first row's hi. None whole: both t1.
 */
ATTN_HD void attn_cu_hp_full_range(int t0, int t1, int bn, int64_t r0, int64_t r1, int64_t off,
                                   int64_t wl, int64_t wr, int64_t nkv, int *f0, int *f1) {
  int lo, hi, lo_last, hi_first;
  attn_cu_row_bounds(r0, off, wl, wr, nkv, &lo, &hi_first);
  attn_cu_row_bounds(r1 - 1, off, wl, wr, nkv, &lo_last, &hi);
  int a = (lo_last + bn - 1) / bn, z = (hi_first + 1) / bn;
  a = a > t0 ? a : t0;
  z = z < t1 ? z : t1;
  *f0 = a < z ? a : t1;
  *f1 = a < z ? z : t1;
}

/* ---- ping-pong between the two consumer warpgroups --------------------------- */

/*
 * Each consumer issues its wgmmas of a work unit in `steps` bursts (the
 * first QKᵀ, then QKᵀ of tile n + 1 with PV of tile n, then the last PV:
 * key tiles + 1 of them). Before a burst it waits on its own named barrier;
 * after it, it arrives on the other's, so the tensor cores alternate
 * between the warpgroups while the other one does its softmax. Consumer 0
 * goes first: consumer 1 arrives once on consumer 0's barrier at the start
 * of a unit and skips its arrival after its last burst, so every wait is
 * matched by exactly one arrival and no arrival is left over for the next
 * unit. A unit with no key tiles has no bursts and no arrivals.
 */
ATTN_HD int attn_cu_hp_pp_steps(int tiles) { return tiles > 0 ? tiles + 1 : 0; }
ATTN_HD int attn_cu_hp_pp_opens(int wg, int steps) { return wg == 1 && steps > 0; }
ATTN_HD int attn_cu_hp_pp_arrives(int wg, int step, int steps) {
  return !(wg == 1 && step == steps - 1);
}

#endif
