/*
 * layout.h — the index arithmetic of the CUDA kernels, as plain functions
 * that compile both for the device and for the host, so the unit tests can
 * check them on a machine without a GPU.
 *
 * Fragments follow the PTX ISA's description of mma.sync.m16n8k16 (F16/BF16
 * inputs, F32 accumulators) and ldmatrix.m8n8.x4 (b16). In a warp, lane l
 * has groupID g = l / 4 and thread-in-group t = l % 4.
 *
 *   A (16x16, row-major): register r holds two elements, lower column first:
 *     rows g (r = 0, 2) or g + 8 (r = 1, 3); columns 2t, 2t+1, plus 8 for
 *     r = 2, 3.
 *   B (16x8, "col"): register r holds rows (k) 2t, 2t+1 (+ 8 for r = 1) of
 *     column (n) g.
 *   C, D (16x8, F32): element i sits at row g (+ 8 for i = 2, 3), column
 *     2t + i % 2.
 *   ldmatrix.x4: lane l gives the address of row l % 8 of matrix l / 8 and
 *     receives, in register j, row l / 4 of matrix j, elements 2t and 2t+1
 *     (.trans: column l / 4, rows 2t and 2t+1).
 *
 * Shared-memory tiles are row-major with each row padded by 8 elements (16
 * bytes), so the 8 rows one ldmatrix phase reads start in 8 different bank
 * quads and no swizzle is needed.
 *
 * Masks: with off = Nkv - Nq (or the request's diag_offset), key j is visible to query i when
 * i + off - wl <= j <= i + off + wr (a side of -1 is unbounded; docs/design.md).
 * Both bounds grow with i, which is what lets a block of rows skip or fully
 * accept whole key tiles.
 */
#ifndef ATTN_CUDA_LAYOUT_H
#define ATTN_CUDA_LAYOUT_H

#include <math.h>
#include <stdint.h>

#ifdef __CUDACC__
#define ATTN_HD static inline __host__ __device__
/* ... and usable in the kernels' constant expressions (tile shapes). */
#define ATTN_HDC static constexpr __host__ __device__
#else
#define ATTN_HD static inline
#define ATTN_HDC static inline
#endif

/* ---- fragments ----------------------------------------------------------- */

/* Element e (0..7: register e / 2, half e % 2) of A held by lane. */
ATTN_HD void attn_cu_frag_a(int lane, int e, int *row, int *col) {
  int r = e / 2;
  *row = lane / 4 + 8 * (r % 2);
  *col = 2 * (lane % 4) + e % 2 + 8 * (r / 2);
}

/* Element e (0..3: register e / 2, half e % 2) of B held by lane. */
ATTN_HD void attn_cu_frag_b(int lane, int e, int *k, int *n) {
  *k = 2 * (lane % 4) + e % 2 + 8 * (e / 2);
  *n = lane / 4;
}

/* Accumulator element i (0..3) held by lane. */
ATTN_HD void attn_cu_frag_c(int lane, int i, int *row, int *col) {
  *row = lane / 4 + 8 * (i / 2);
  *col = 2 * (lane % 4) + i % 2;
}

/* Element h (0, 1) of register j that ldmatrix.x4 gives lane, as (row, col)
 * of matrix j; trans for the .trans form. */
ATTN_HD void attn_cu_ldsm_elem(int lane, int h, int trans, int *row, int *col) {
  if (trans) {
    *row = 2 * (lane % 4) + h;
    *col = lane / 4;
  } else {
    *row = lane / 4;
    *col = 2 * (lane % 4) + h;
  }
}

/*
 * The rows each lane addresses for the three operand loads of the kernels,
 * relative to the top-left of the 16x16 piece being loaded:
 *
 *   Q as A (x4): matrices (rows 0-7, cols 0-7), (8-15, 0-7), (0-7, 8-15),
 *     (8-15, 8-15), so registers 0..3 are A's registers 0..3.
 *   K as B of S = Q Kᵀ (x4; rows are keys, columns head dims): matrices
 *     (keys 0-7, dims 0-7), (0-7, 8-15), (8-15, 0-7), (8-15, 8-15): registers
 *     0, 1 are B for keys 0-7 and registers 2, 3 B for keys 8-15.
 *   V as B of O = P V (x4 .trans; rows are keys, columns head dims): matrices
 *     (keys 0-7, dims 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15): registers
 *     0, 1 are B for dims 0-7 and registers 2, 3 B for dims 8-15.
 */
ATTN_HD void attn_cu_ldsm_q(int lane, int *row, int *col) {
  *row = lane % 16;
  *col = (lane / 16) * 8;
}
ATTN_HD void attn_cu_ldsm_k(int lane, int *row, int *col) {
  *row = lane % 8 + (lane / 16) * 8;
  *col = ((lane / 8) % 2) * 8;
}
ATTN_HD void attn_cu_ldsm_v(int lane, int *row, int *col) {
  *row = lane % 8 + ((lane / 8) % 2) * 8;
  *col = (lane / 16) * 8;
}

/*
 * The backward's operand loads are these three patterns again, named by the
 * shape of the operand in shared memory (row-major tiles, rows padded):
 *
 *   an A operand whose rows are the tile's rows (K or V in the dK/dV kernel,
 *     Q or dO in the dQ kernel): attn_cu_ldsm_q, plain;
 *   a B operand whose n index runs along the tile's rows (Qᵀ and dOᵀ in
 *     Sᵀ = K Qᵀ and dPᵀ = V dOᵀ; Kᵀ and Vᵀ in S = Q Kᵀ and dP = dO Vᵀ):
 *     attn_cu_ldsm_k, plain;
 *   a B operand whose k index runs along the tile's rows (dO in dV += Pᵀ dO,
 *     Q in dK += dSᵀ Q, K in dQ += dS K): attn_cu_ldsm_v with .trans.
 *
 * In the dK/dV kernel warp w owns keys [16 (w / dsplit), +16) of the block
 * and head dims [(w % dsplit) dpad / dsplit, +dpad / dsplit) of dK and dV:
 * with dsplit 2 the two warps of a key slice both compute its Sᵀ and dPᵀ
 * over every dim, and each accumulates half of the dims.
 */
ATTN_HD void attn_cu_bwd_warp(int warp, int dsplit, int dpad, int *key0, int *dim0) {
  *key0 = 16 * (warp / dsplit);
  *dim0 = (warp % dsplit) * (dpad / dsplit);
}

/*
 * The atomic-dQ path (kernels.h): after dK += dSᵀ Q, each dK/dV warp with
 * dim0 0 stores its dSᵀ fragment into a shared tile of BM rows (the step's
 * queries) and attn_cu_smem_stride(bn) columns (the block's keys): C
 * element (row, col) of key block n goes to row n·8 + col, column key0 +
 * row. After a barrier warp w forms dS K for all BM rows and the head
 * dims [attn_cu_bwd_dq_col0(w, dpad), + dpad / 4), and adds it to the F32
 * accumulator in bwd_ws, which starts attn_cu_bwd_dq_at(rows) floats in
 * (after D and lse·log2 e, rounded up to 4 floats so its rows, dp a
 * multiple of 8, start on 16 bytes for the vector atomics and loads).
 */
ATTN_HD int attn_cu_bwd_dq_col0(int warp, int dpad) { return warp * (dpad / 4); }
/* Where C element (row, col) of key block n of the warp at key0 goes in the
 * dS tile of row stride lds. */
ATTN_HD int attn_cu_bwd_ds_at(int n, int row, int col, int key0, int lds) {
  return (n * 8 + col) * lds + key0 + row;
}
ATTN_HD uint64_t attn_cu_bwd_dq_at(uint64_t rows) { return (2 * rows + 3) / 4 * 4; }

/* Row stride, in elements, of a padded shared-memory tile of width cols. */
ATTN_HD int attn_cu_smem_stride(int cols) { return cols + 8; }

/*
 * The forward's warps and their rows: warp w of a block owns mt m16 tiles
 * (one, or two in the 128-row blocks), rows [16 mt w, 16 mt (w + 1)) of the
 * block, and lane's accumulator half h (0: rows g, 1: g + 8) of tile t is
 * block row 16 (mt w + t) + g + 8 h.
 */
ATTN_HD int attn_cu_lane_row(int warp, int mt, int t, int lane, int h) {
  return 16 * (mt * warp + t) + lane / 4 + 8 * h;
}

/*
 * Tile copies from global to shared memory, 16 bytes (8 elements, a
 * "chunk") per cp.async, fully unrolled: a row of ch chunks is copied by
 * tpr threads (the largest power of two dividing ch, at most 32), so each
 * thread keeps one column for the whole tile and its chunk (pass, panel)
 * is row tid / tpr + pass · nt / tpr, chunk tid % tpr + panel · tpr: the
 * addresses are a per-thread base plus constants and multiples of the row
 * stride, with no division in the loop. A tile of rows rows takes
 * rows / (nt / tpr) passes and ch / tpr panels.
 */
ATTN_HDC int attn_cu_copy_tpr(int ch) {
  int t = 1;
  while (t < 32 && ch % (2 * t) == 0)
    t *= 2;
  return t;
}
ATTN_HD void attn_cu_copy_at(int tid, int nt, int ch, int pass, int panel, int *row, int *chunk) {
  const int tpr = attn_cu_copy_tpr(ch);
  *row = tid / tpr + pass * (nt / tpr);
  *chunk = tid % tpr + panel * tpr;
}

/*
 * The forward's epilogue stages a warp's normalized O (rows 16 mt, ch
 * chunks each) in shared memory, then stores it 16 bytes at a time: in
 * step it lane copies chunk idx % ch of row idx / ch, idx = lane + 32 it,
 * so the warp's 32 lanes write consecutive chunks of consecutive rows.
 */
ATTN_HD void attn_cu_ostage_at(int lane, int it, int ch, int *row, int *chunk) {
  const int idx = lane + 32 * it;
  *row = idx / ch;
  *chunk = idx % ch;
}

/*
 * GQA packing (attn_cu_choice.pack): a forward block of a decode or short
 * query may hold all pack = Hq / Hkv query heads of one KV head, each with
 * its Nq rows, so every K/V tile it loads serves the whole group. Block row
 * r is query i = r % Nq of head h0 + r / Nq, where h0 = kv head · pack;
 * those heads' rows are consecutive in the packed layout ((b·Hq + h)·Nq +
 * i), so Q and O stay one contiguous run of rows from (b·Hq + h0)·Nq, and
 * only the mask (the query index) and ALiBi (the head) see the mapping.
 * Rows past pack·Nq (a block's padding) repeat the last row; they are
 * computed and never stored. pack 1 is a plain block: row r is query r.
 */
ATTN_HD void attn_cu_block_row(int r, int nq, int pack, int *dh, int *i) {
  if (pack <= 1) {
    *dh = 0;
    *i = r;
    return;
  }
  r = r < pack * nq ? r : pack * nq - 1;
  *dh = r / nq;
  *i = r % nq;
}

/* Block qt's rows [*i0, *i1) of its pack heads' pack·nq rows (bm per
 * block), and the queries [*q0, *q1) they hold, which bound its key tiles
 * and masks: all nq of them when the heads are packed. */
ATTN_HD void attn_cu_block_span(int qt, int bm, int nq, int pack, int *i0, int *i1, int *q0,
                                int *q1) {
  const int rows = pack * nq;
  *i0 = qt * bm;
  *i1 = *i0 + bm < rows ? *i0 + bm : rows;
  *q0 = pack > 1 ? 0 : *i0;
  *q1 = pack > 1 ? nq : *i1;
}

/* ---- masks and key ranges ------------------------------------------------- */

/*
 * Visible keys of query row i: [*lo, *hi], clamped to [0, nkv - 1]; empty
 * when *lo > *hi. wl, wr: effective window sides, -1 unbounded.
 */
ATTN_HD void attn_cu_row_bounds(int64_t i, int64_t off, int64_t wl, int64_t wr, int64_t nkv,
                                int *lo, int *hi) {
  /* Sides past 2^40 reach beyond any sequence the kernels take (2^30) and
   * are unbounded; this keeps the sums below in int64. */
  const int64_t far = (int64_t)1 << 40;
  int64_t a = wl < 0 || wl > far ? 0 : i + off - wl;
  int64_t b = wr < 0 || wr > far ? nkv - 1 : i + off + wr;
  a = a < 0 ? 0 : a > nkv ? nkv : a;
  b = b > nkv - 1 ? nkv - 1 : b < -1 ? -1 : b;
  *lo = (int)a;
  *hi = (int)b;
}

/*
 * The key tiles (of bn keys) that query rows [i0, i1) must visit, split
 * nsplit ways: split s gets tiles [*t0, *t1), possibly empty. Tiles wholly
 * outside every row's window are never visited.
 */
ATTN_HD void attn_cu_block_tiles(int64_t i0, int64_t i1, int64_t off, int64_t wl, int64_t wr,
                                 int64_t nkv, int bn, int nsplit, int s, int *t0, int *t1) {
  int lo, hi, lo2, hi2;
  attn_cu_row_bounds(i0, off, wl, wr, nkv, &lo, &hi2);
  attn_cu_row_bounds(i1 - 1, off, wl, wr, nkv, &lo2, &hi);
  (void)hi2;
  (void)lo2;
  if (lo > hi) {
    *t0 = *t1 = 0;
    return;
  }
  int first = lo / bn, end = hi / bn + 1;
  int per = (end - first + nsplit - 1) / nsplit;
  int a = first + s * per, b = a + per;
  b = b < end ? b : end;
  *t0 = a < b ? a : b;
  *t1 = b;
}

/*
 * Query rows that see key j: [*lo, *hi] (i + off - wl <= j <= i + off + wr
 * solved for i), clamped to [0, nq - 1]; empty (*lo > *hi) when none does
 * or when j >= nkv (a padding key of the last block).
 */
ATTN_HD void attn_cu_key_bounds(int64_t j, int64_t off, int64_t wl, int64_t wr, int64_t nq,
                                int64_t nkv, int *lo, int *hi) {
  const int64_t far = (int64_t)1 << 40;
  int64_t a = wr < 0 || wr > far ? 0 : j - off - wr;
  int64_t b = wl < 0 || wl > far ? nq - 1 : j - off + wl;
  a = a < 0 ? 0 : a > nq ? nq : a;
  b = b > nq - 1 ? nq - 1 : b < -1 ? -1 : b;
  if (j >= nkv) {
    a = 1;
    b = 0;
  }
  *lo = (int)a;
  *hi = (int)b;
}

/*
 * The query tiles (of bm rows) that see any key of [j0, j1), j1 <= nkv:
 * [*t0, *t1), possibly empty. Both bounds of attn_cu_key_bounds grow with
 * j, so the first key's lower and the last key's upper bound suffice.
 */
ATTN_HD void attn_cu_key_block_qtiles(int64_t j0, int64_t j1, int64_t off, int64_t wl, int64_t wr,
                                      int64_t nq, int64_t nkv, int bm, int *t0, int *t1) {
  int lo, hi, lo2, hi2;
  attn_cu_key_bounds(j0, off, wl, wr, nq, nkv, &lo, &hi2);
  attn_cu_key_bounds(j1 - 1, off, wl, wr, nq, nkv, &lo2, &hi);
  (void)hi2;
  (void)lo2;
  if (j0 >= j1 || lo > hi) {
    *t0 = *t1 = 0;
    return;
  }
  *t0 = lo / bm;
  *t1 = hi / bm + 1;
}

/* Whether every key of tile [j0, j0 + bn) is visible to every query row of
 * [i0, i1): such a tile needs no mask. */
ATTN_HD int attn_cu_tile_full(int64_t j0, int bn, int64_t i0, int64_t i1, int64_t off, int64_t wl,
                              int64_t wr, int64_t nkv) {
  int lo, hi, lo_last, hi_first;
  attn_cu_row_bounds(i0, off, wl, wr, nkv, &lo, &hi_first);
  attn_cu_row_bounds(i1 - 1, off, wl, wr, nkv, &lo_last, &hi);
  return j0 >= lo_last && j0 + bn - 1 <= hi_first;
}

/* ---- issue 17's variants on a score -------------------------------------------- */

/*
 * A score in log2 units, x = q·k · scale · log2 e, through FlashAttention's
 * variants in their order: softcap (cap2 = softcap · log2 e, 0 off; then
 * cap2 · tanh(x / cap2) is softcap · tanh(s / softcap) in log2 units), then
 * ALiBi (slope2 = −slope · log2 e, dist = |i + off − j|). *dcap gets
 * 1 − tanh², the factor by which the backward scales dS (1 without softcap;
 * the bias is a constant and leaves dS alone). Not tanh.approx: its 2^-11
 * error, times a cap of 30, would move weights past F16's tolerance.
 */
/* tanh as 1 − 2 / (e^2|x| + 1) with the sign put back: absolute error a
 * few ulp of 1 everywhere (all that a capped score cap·tanh needs), and
 * none of tanhf's branches; the fast division, because IEEE division's
 * slow-path call made the tensor-core backward spill. */
ATTN_HD float attn_cu_tanh(float x) {
  float e = expf(2.0f * fabsf(x)) + 1.0f;
#ifdef __CUDA_ARCH__
  float t = 1.0f - __fdividef(2.0f, e); /* 0 past 2^126: t = 1, as it should */
#else
  float t = 1.0f - 2.0f / e;
#endif
  return copysignf(t, x);
}

ATTN_HD float attn_cu_variant(float x, float cap2, float inv_cap2, float slope2, float dist,
                              float *dcap) {
  float g = 1.0f;
  if (cap2 > 0.0f) {
    float t = attn_cu_tanh(x * inv_cap2);
    x = cap2 * t;
    g = 1.0f - t * t;
  }
  *dcap = g;
  return fmaf(slope2, dist, x);
}

/*
 * i + off − j0 for a row i and a tile's first key j0, as a float: a lane's
 * distances within the tile are then |d0 − jj| (attn_cu_dist), exact while
 * they stay under 2^24, as in the CPU kernels; one int64 sum per row and
 * tile instead of one per element.
 */
ATTN_HD float attn_cu_dist0(int64_t i, int64_t off, int64_t j0) { return (float)(i + off - j0); }
ATTN_HD float attn_cu_dist(float d0, int jj) { return fabsf(d0 - (float)jj); }

/*
 * The distance of accumulator element (row, c) of a warp's tile, row from
 * attn_cu_frag_c and c the tile column (n·8 + col), from d0 of the lane's
 * row g. sign 1: rows are queries and columns keys (S in the forward and
 * dQ kernels; d0 = i_g + off − j0); −1: rows are keys and columns queries
 * (Sᵀ in the dK/dV kernel; d0 = i0 + off − j_g). Row g + 8 is 8 further
 * along the rows' axis.
 */
ATTN_HD float attn_cu_frag_dist(float d0, int sign, int row, int c) {
  return attn_cu_dist(row < 8 ? d0 : d0 + 8.0f * (float)sign, sign * c);
}

/* ---- the online softmax and the split-KV merge ----------------------------- */

/*
 * Scores are kept in log2 units (scale · log2 e folded into the scale), so
 * weights are exp2(s - m). A row that has seen no visible key has m = -inf;
 * it subtracts 0 instead, so every weight, and the factor that rescales its
 * (zero) accumulator, is exp2(-inf) = 0 and never NaN.
 */
ATTN_HD float attn_cu_max_for_exp(float m) { return m == -INFINITY ? 0.0f : m; }

/*
 * The factor k by which the forward kernel's exponent scales a score it
 * holds: weights are exp2(fmaf(s, k, -m)), one FFMA per element, and the
 * running max is k times the max of the raw scores (masked ones -inf). That
 * is sound only for a positive scale with no variant: softcap and ALiBi
 * need the scaled score, a negative scale would turn the max of the raw
 * scores into their min and a masked -inf into +inf, and a zero one would
 * make 0 · -inf a NaN. Then k is 1 and the kernel scales the scores first.
 */
ATTN_HD float attn_cu_exp_factor(float scale_log2, int variants) {
  return !variants && scale_log2 > 0.0f ? scale_log2 : 1.0f;
}

/*
 * Merges the partial statistics of n key ranges, (m2, l) pairs at
 * ml[2 * s * stride], into the row's (m2, l). Empty ranges (l = 0) weigh
 * nothing; all empty gives m2 = -inf, l = 0.
 */
ATTN_HD void attn_cu_merge(const float *ml, long stride, int n, float *pm2, float *pl) {
  float m = -INFINITY;
  for (int s = 0; s < n; s++)
    if (ml[2 * s * stride + 1] > 0.0f && ml[2 * s * stride] > m)
      m = ml[2 * s * stride];
  float l = 0.0f;
  for (int s = 0; s < n; s++) {
    float ls = ml[2 * s * stride + 1];
    l += ls > 0.0f ? ls * exp2f(ml[2 * s * stride] - m) : 0.0f;
  }
  *pm2 = m;
  *pl = l;
}

/* Weight of a range's normalized output in the merged one (O = sum w_s O_s),
 * given the merged (m2, l). */
ATTN_HD float attn_cu_merge_weight(float m2s, float ls, float m2, float l) {
  return ls > 0.0f && l > 0.0f ? ls * exp2f(m2s - m2) / l : 0.0f;
}

/* Natural-log statistics from the log2 running max and the sum. */
ATTN_HD void attn_cu_stats(float m2, float l, float *m, float *lse) {
  const float ln2 = 0.69314718055994531f;
  if (l > 0.0f) {
    *m = m2 * ln2;
    *lse = (m2 + log2f(l)) * ln2;
  } else {
    *m = -INFINITY;
    *lse = -INFINITY;
  }
}

#endif
