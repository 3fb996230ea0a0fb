/*
 * flash_bwd_amx.h — the backward's five products on AMX-BF16 tiles, for
 * flash_bwd.c's amx instance (included after flash_bwd_bf16.h).
 *
 * A whole pair of blocks (BQ = 64 query rows against BK = 64 keys) with
 * head_dim a multiple of 32 runs here (amx_pair); partial blocks keep
 * VDPBF16PS (pair_bf16). Both accumulate into the same F32 dKᵀ, dVᵀ and dQ
 * partial, so a key block may mix them. The tiles are used as amx.h sets
 * them out: a 2×2 block of 16×16 F32 accumulators (32 × 32 of the output),
 * two A tiles of 16 rows × 32 BF16 along the reduction, two B tiles of 16
 * rows × 16 BF16 pairs. One loop, amx_mm, runs every product; what changes
 * is where A and B come from:
 *   S    = Q·Kᵀ     rows i × j, over d:  A = Q rows in place,
 *                                        B = Kᵀ pairs over d (ktp)
 *   dP   = dO·Vᵀ    rows i × j, over d:  A = dO rows in place,
 *                                        B = Vᵀ pairs over d (vtp)
 *   dVᵀ += dOᵀ·P    rows d × j, over i:  A = dOᵀ (rows of query rows),
 *                                        B = P pairs over i
 *   dKᵀ += Qᵀ·dS    rows d × j, over i:  A = Qᵀ,  B = dS pairs over i
 *   dQ  += dS·K     rows i × d, over j:  A = dS rows in BF16,
 *                                        B = K pairs over j (kjp)
 * ktp, vtp and kjp are packed once per key block (pack_kv_bf16); P and dS
 * are paired and rounded by pack_p_ds with vector shuffles, as the
 * VDPBF16PS path does, and Qᵀ and dOᵀ transposed per pair in vector
 * registers (amx_transpose64), which run beside the tile unit's products.
 * (Transposing them once per job instead, in phase 1, was no faster: read
 * back from L2 they cost the tile loads what the transposes had cost.)
 *
 * dQ goes to the chunk's partial at once: the rows of a whole block are
 * all the pair's own, so a tile row never reaches another head's. dKᵀ
 * and dVᵀ accumulate in the workspace across the key block's query
 * blocks, their products waiting for up to four pairs (amx_flush): one
 * load and store of each accumulator tile per 256 query rows rather than
 * per 64.
 *
 * Numbers: the tile unit adds its products into the F32 accumulators in
 * its own order and rounding (TDPBF16PS), and the waiting products change
 * the order of the sums over query rows, so the bits differ from the
 * VDPBF16PS path's (not the error: P and dS are rounded the same way); they
 * depend on the shape alone, never on the thread count.
 */
#ifndef ATTN_CPU_FLASH_BWD_AMX_H
#define ATTN_CPU_FLASH_BWD_AMX_H

#include "amx.h"
#include "flash_bwd_bf16.h"
#include "flash_bwd_pair.h"

_Static_assert(BQ == 64 && BK == 64, "amx_transpose64 transposes blocks of 64 rows");

/* C (M × N F32, rows ldc bytes apart) (+)= A·B over K BF16: A is M rows of
 * K BF16 (lda bytes apart), B K/2 rows of N pairs (ldb bytes apart). M, N
 * and K are multiples of 32. */
static void amx_mm(char *C, int64_t ldc, const char *A, int64_t lda, const char *B, int64_t ldb,
                   int64_t M, int64_t N, int64_t K, bool acc) {
  for (int64_t m = 0; m < M; m += 32)
    for (int64_t n = 0; n < N; n += 32) {
      char *c = C + m * ldc + n * 4;
      if (acc) {
        _tile_loadd(0, c, ldc);
        _tile_loadd(1, c + 64, ldc);
        _tile_loadd(2, c + 16 * ldc, ldc);
        _tile_loadd(3, c + 16 * ldc + 64, ldc);
      } else {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
      }
      const char *a = A + m * lda, *b = B + n * 4;
      for (int64_t k = 0; k < K; k += 32, a += 64, b += 16 * ldb) {
        _tile_loadd(4, a, lda);
        _tile_loadd(5, a + 16 * lda, lda);
        _tile_loadd(6, b, ldb);
        _tile_loadd(7, b + 64, ldb);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
      }
      _tile_stored(0, c, ldc);
      _tile_stored(1, c + 64, ldc);
      _tile_stored(2, c + 16 * ldc, ldc);
      _tile_stored(3, c + 16 * ldc + 64, ldc);
    }
}

/* Up to this many pairs' dVᵀ and dKᵀ products wait: as many as the
 * workspace holds at this head_dim (amx_carve). */
enum { AMX_SLOTS = 4 };

/* The AMX path's slots in the workspace, beside the BF16 path's views
 * (kb_bf16_carve): dOᵀ and Qᵀ of slot g in columns [g·BQ, g·BQ + BQ) of
 * D rows of slots·BQ (the query and dO row regions, 64 KiB each), P and
 * dS pairs of slot g in rows [g·BQ/2, g·BQ/2 + BQ/2) past the largest Kᵀ
 * and Vᵀ pairs, dS rows past the largest K pairs. */
static void amx_carve(kb_ctx *x) {
  const int64_t wd = x->wd, fit = 2 * wd / x->a->r->head_dim;
  x->slots = fit < AMX_SLOTS ? (int)fit : AMX_SLOTS;
  x->npend = 0;
  x->gts = (uint16_t *)x->dor;
  x->qts = (uint16_t *)x->qr;
  x->pps = x->ktp + wd / 2 * BK;
  x->sps = x->vtp + wd / 2 * BK;
  x->dsa = (uint16_t *)(x->kjp + BK / 2 * wd);
}
/* The layout's narrower width (attn__cpu_ws_d) leaves room enough. */
_Static_assert(ATTN_CPU_NARROW_D / 2 * BK + AMX_SLOTS * BQ / 2 * BK <= ATTN_CPU_NARROW_D * BK,
               "P and dS pair slots fit past Kᵀ and Vᵀ pairs");
_Static_assert(BK / 2 * ATTN_CPU_NARROW_D + BQ * BK / 2 <= BK * ATTN_CPU_NARROW_D,
               "dS rows fit past the K pairs");

/* dVᵀ += dOᵀ·P and dKᵀ += Qᵀ·dS over the waiting pairs' query rows. */
static void amx_flush(kb_ctx *x) {
  if (!x->npend)
    return;
  const int64_t D = x->a->r->head_dim, lda = (int64_t)x->slots * BQ * 2, K = x->npend * BQ;
  amx_mm((char *)x->dvt, BK * 4, (const char *)x->gts, lda, (const char *)x->pps, BK * 4, x->vw, BK,
         K, true);
  amx_mm((char *)x->dkt, BK * 4, (const char *)x->qts, lda, (const char *)x->sps, BK * 4, D, BK, K,
         true);
  x->npend = 0;
}

/* Whether the pair of query rows [i0, i0 + n) and the key block runs on
 * tiles: amx_pair's conditions. */
static inline bool amx_whole(const kb_ctx *x, int64_t n) {
  return x->amx && n == BQ && x->nkt == BK;
}

/* The BQ query rows from i0 of head h against the key block, on tiles:
 * S, dP, then dQ at once, dVᵀ and dKᵀ once the slots are full. */
static void amx_pair(kb_ctx *x, int64_t h, int64_t i0) {
  const attn__bwd_args *a = x->a;
  const attn_request *r = a->r;
  const int64_t D = r->head_dim, ldq = r->q_stride[2] * 2, ldo = r->do_stride[2] * 2;
  const int64_t g = x->npend, ld = (int64_t)x->slots * BQ;
  const char *q = row_at(r, r->q, r->q_stride, x->b, h, i0);
  const char *o = row_at(r, r->dout, r->do_stride, x->b, h, i0);
  const bool full = pair_stats(x, h, i0, BQ);
  amx_mm((char *)x->s, BK * 4, q, ldq, (const char *)x->ktp, BK * 4, BQ, BK, D, false);
  amx_mm((char *)x->dp, BK * 4, o, ldo, (const char *)x->vtp, BK * 4, BQ, BK, x->vw, false);
  softmax_grad(x, h, i0, BQ, full);
  pack_p_ds(x, BQ, x->pps + g * BQ / 2 * BK, x->sps + g * BQ / 2 * BK, x->dsa);
  amx_transpose64(q, (size_t)ldq, D, x->qts + g * BQ, ld);
  amx_transpose64(o, (size_t)ldo, x->vw, x->gts + g * BQ, ld);
  amx_mm((char *)dq_part(a, x->c, x->b, h, i0), a->dld * 4, (const char *)x->dsa, BK * 2,
         (const char *)x->kjp, a->dld * 4, BQ, D, BK, true);
  if (++x->npend == x->slots)
    amx_flush(x);
}

/* Phase 2's item on tiles: configured once, given back at its end. */
static void amx_keys_begin(kb_ctx *x) {
  if (!x->amx)
    return;
  amx_carve(x);
  amx_configure();
}

static void amx_keys_end(const kb_ctx *x) {
  if (x->amx)
    _tile_release();
}

#endif
