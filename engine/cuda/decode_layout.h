/*
 * decode_layout.h — the index arithmetic of the decode kernel (decode.cuh),
 * as plain functions for the device and the host. The unit tests run them;
 * layout.h's conventions hold (lane l has groupID g = l / 4,
 * thread-in-group t = l % 4).
 *
 * The decode kernel puts KEYS in the M dimension of mma.sync.m16n8k16 and
 * the R <= 8 NB query rows of one KV group (the group's Hq / Hkv heads × Nq
 * queries, column c = query c % Nq of head c / Nq: attn_cu_block_row) in N,
 * so a 16-key tile costs NB n8 tiles of work instead of a 128-row block's.
 * Per 16-key tile and n8 column tile:
 *
 *   Sᵀ = K Qᵀ (16 keys × 8 columns, k = head dims):
 *     A = K, shared memory [key][dim]: ldmatrix.x4 (plain), lane l
 *       addresses key l % 16, dims 8 (l / 16) (attn_cu_dec_addr_k): its
 *       registers are A's 0..3 (keys 0-7 / 8-15 × dims 0-7 / 8-15).
 *     B = Qᵀ, shared memory Q [column][dim]: ldmatrix.x4 (plain), lane l
 *       addresses column l % 8 + 8 (l / 16), dims 8 ((l / 8) % 2)
 *       (attn_cu_dec_addr_q): registers 0, 1 are B of columns 0-7 (dims
 *       0-7, 8-15), 2, 3 B of columns 8-15. Held in registers for the
 *       whole key loop.
 *     C: element e of lane is key g + 8 (e / 2), column 2t + e % 2
 *       (attn_cu_frag_c): a lane holds two keys of two query columns, and
 *       a column's max over the tile is a max over the 8 lanes of one t
 *       (shuffles xor 4, 8, 16).
 *
 *   Oᵀ += Vᵀ Pᵀ (16 head dims × 8 columns, k = keys):
 *     B = Pᵀ (keys × columns) needs lane (g, t) to hold keys 2t, 2t+1
 *       (+8) of column g, which is Sᵀ's C transposed across lanes, so P
 *       goes through a 16 × 16 per-warp staging tile [key][column] (row
 *       stride 24: conflict-free both ways): each lane stores its C pairs
 *       (key g (+8), columns 2t, 2t+1) as one 32-bit word, and
 *       ldmatrix.x4.trans with lane l addressing key l % 8 + 8 ((l / 8) %
 *       2), column 8 (l / 16) (attn_cu_dec_addr_p) returns, in register j,
 *       (key 2t + h (+8 for odd j), column g (+8 for j >= 2)): B's
 *       registers 0, 1 of columns 0-7, then 0, 1 of columns 8-15.
 *     A = Vᵀ (dims × keys), shared memory V [key][dim]: ldmatrix.x4.trans
 *       with lane l addressing key l % 8 + 8 (l / 16), dims 8 ((l / 8) % 2)
 *       (attn_cu_dec_addr_v) returns, in register j, V[key 2t + h (+8 for
 *       j >= 2)][dim g (+8 for odd j)] = A[dim][key] in A's order.
 *     C: element e is dim g + 8 (e / 2), column 2t + e % 2: the same
 *       columns as Sᵀ's, so a lane's running max and sum (per column
 *       2t, 2t+1 of each n8 tile) rescale its own accumulators.
 *
 * Each warp streams its own tiles (warp w of a block takes tiles t0 + w,
 * t0 + w + NW, ... of the block's range: attn_cu_dec_warp_tile) through its
 * own cp.async ring; the block's warps are combined at the end
 * (attn_cu_dec_warp_weight), and the key splits of a (batch, KV head) by
 * the last of its blocks to finish, counted in split_ws after the
 * partials (attn_cu_dec_counter_at).
 */
#ifndef ATTN_CUDA_DECODE_LAYOUT_H
#define ATTN_CUDA_DECODE_LAYOUT_H

#include "layout.h"

#include <stddef.h>

/* Keys per tile (one m16 of Sᵀ) and the P staging tile's row stride. */
#define ATTN_CU_DEC_KT 16
#define ATTN_CU_DEC_PSTR 24

/*
 * Dynamic shared memory of a block of nw warps with st-stage rings, in
 * bytes: Q (16 rows), the rings (K and V tiles of 16 keys per stage), the
 * P staging tiles, the warps' (m2, l) per column and the last-block flag.
 * Rows are dpad + 8 elements of 2 bytes. The combine reuses the rings for
 * F32 O [nw][16][dpad + 4] and the merge for its weights [16][64].
 */
ATTN_HDC int attn_cu_dec_smem(int dpad, int nw, int st) {
  return (16 + nw * st * 2 * ATTN_CU_DEC_KT) * (dpad + 8) * 2 +
         nw * ATTN_CU_DEC_KT * ATTN_CU_DEC_PSTR * 2 + nw * 16 * 2 * 4 + 16;
}

/* K as A of Sᵀ = K Qᵀ: the key (row) and dim (column) lane addresses. */
ATTN_HD void attn_cu_dec_addr_k(int lane, int *key, int *dim) {
  *key = lane % 16;
  *dim = (lane / 16) * 8;
}
/* Q as B of Sᵀ: the query column and dim lane addresses. */
ATTN_HD void attn_cu_dec_addr_q(int lane, int *qcol, int *dim) {
  *qcol = lane % 8 + (lane / 16) * 8;
  *dim = ((lane / 8) % 2) * 8;
}
/* P (staged [key][column]) as B of Oᵀ, through ldmatrix.trans. */
ATTN_HD void attn_cu_dec_addr_p(int lane, int *key, int *qcol) {
  *key = lane % 8 + ((lane / 8) % 2) * 8;
  *qcol = (lane / 16) * 8;
}
/* V as A of Oᵀ = Vᵀ Pᵀ, through ldmatrix.trans. */
ATTN_HD void attn_cu_dec_addr_v(int lane, int *key, int *dim) {
  *key = lane % 8 + (lane / 16) * 8;
  *dim = ((lane / 8) % 2) * 8;
}

/* Tile i of warp w of nw, in a block whose range starts at tile t0. */
ATTN_HD int attn_cu_dec_warp_tile(int t0, int w, int nw, int i) { return t0 + w + nw * i; }

/* How many tiles of [t0, t1) warp w of nw takes. */
ATTN_HD int attn_cu_dec_warp_count(int t0, int t1, int w, int nw) {
  const int n = t1 - t0 - w;
  return n > 0 ? (n + nw - 1) / nw : 0;
}

/*
 * Weight of warp w's unnormalized accumulator (running max m2w in log2
 * units, sum lw) in the block's normalized output, given the block's (m2,
 * l) from attn_cu_merge over the warps: exp2(m2w − m2) / l; 0 for a warp
 * that saw no key or a column nothing saw (no NaN from −inf − −inf).
 */
ATTN_HD float attn_cu_dec_warp_weight(float m2w, float lw, float m2, float l) {
  return lw > 0.0f && l > 0.0f ? exp2f(m2w - m2) / l : 0.0f;
}

/*
 * split_ws of a decode launch with nsplit > 1: the forward's partials
 * (per split F32 O [nrows][dp] normalized, then (m2, l) pairs [nrows]),
 * then one 32-bit counter per (batch, KV head): the blocks of its splits
 * that have finished. Offset of counter bh, in 4-byte words from the start.
 */
ATTN_HD size_t attn_cu_dec_counter_at(int nsplit, size_t nrows, int dp, size_t bh) {
  return (size_t)nsplit * nrows * ((size_t)dp + 2) + bh;
}

/*
 * Key splits of a decode launch of `blocks` blocks per split ((batch, KV
 * head) pairs) whose rows see `tiles` key tiles, on `sms` multiprocessors
 * holding `per_sm` blocks each: enough to fill every multiprocessor's
 * blocks, but at least min_tiles tiles per split (each warp's ring needs
 * work to overlap) and at most ATTN_CU_MAX_SPLITS-sized scratch (`most`).
 */
ATTN_HD int attn_cu_dec_splits(long long blocks, int sms, int per_sm, long long tiles,
                               int min_tiles, int most) {
  if (blocks < 1 || sms < 1)
    return 1;
  const long long slots = (long long)sms * per_sm;
  long long want = (slots + blocks - 1) / blocks;
  long long room = tiles / (min_tiles > 0 ? min_tiles : 1);
  want = want < room ? want : room;
  want = want < most ? want : most;
  return want < 2 ? 1 : (int)want;
}

#endif
