/*
 * flash_bwd_amx.h — the backward's five products on AMX-BF16 tiles, for
 * flash_bwd.c's amx instance (included after flash_bwd_bf16.h).
 *
 * A whole pair of blocks (BQ = 64 query rows against BK = 64 keys) with
 * head_dim a multiple of 32 runs here (amx_pair); partial blocks keep
 * VDPBF16PS (pair_bf16). Both read the same packed operands and accumulate
 * into the same F32 dKᵀ, dVᵀ and dQ partial, so a key block may mix them.
 * The tiles are used as amx.h sets them out: a 2×2 block of 16×16 F32
 * accumulators (32 × 32 of the output), two A tiles of 16 rows × 32 BF16
 * along the reduction, two B tiles of 16 rows × 16 BF16 pairs. One loop,
 * amx_mm, runs every product; what changes is where A and B come from:
 *   S    = Q·Kᵀ     rows i × j, over d:  A = Q rows in place,
 *                                        B = Kᵀ pairs over d (ktp)
 *   dP   = dO·Vᵀ    rows i × j, over d:  A = dO rows in place,
 *                                        B = Vᵀ pairs over d (vtp)
 *   dVᵀ += dOᵀ·P    rows d × j, over i:  A = dOᵀ (64 rows per element),
 *                                        B = P pairs over i (pip)
 *   dKᵀ += Qᵀ·dS    rows d × j, over i:  A = Qᵀ,  B = dS pairs over i (sip)
 *   dQ  += dS·K     rows i × d, over j:  A = dS rows in BF16 (dsr),
 *                                        B = K pairs over j (kjp)
 * ktp, vtp and kjp are packed once per key block (pack_kv_bf16); P and dS
 * are paired and rounded by pack_p_ds with vector shuffles, as the
 * VDPBF16PS path does; Qᵀ and dOᵀ are transposed per pair in vector
 * registers (amx_transpose64). dKᵀ and dVᵀ accumulate in the workspace
 * across the key block's query blocks and dQ in the chunk's partial, whose
 * rows of a whole block are all the pair's own: a tile row never reaches
 * another head's.
 *
 * Numbers: the tile unit sums each 32-element stretch of the reduction in
 * its own order before adding it to the F32 accumulator, so the bits differ
 * from VDPBF16PS's (not the error: P and dS are rounded the same way), but
 * depend only on the pair, never on the thread count.
 */
#ifndef ATTN_CPU_FLASH_BWD_AMX_H
#define ATTN_CPU_FLASH_BWD_AMX_H

#include "amx.h"

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

/* Whether the pair of query rows [i0, i0 + n) and the key block runs on
 * tiles: amx_pair's conditions. */
static inline bool amx_whole(const kb_ctx *x, int64_t n) {
  return x->amx && n == BQ && x->nkt == BK;
}

/* The BQ query rows from i0 of head h against the key block, on tiles. */
static void amx_pair(kb_ctx *x, int64_t h, int64_t i0) {
  const attn__bwd_args *a = x->a;
  const attn_request *r = a->r;
  const int64_t D = r->head_dim, ldq = r->q_stride[2] * 2, ldo = r->do_stride[2] * 2;
  const char *q = row_at(r, r->q, r->q_stride, x->b, h, i0);
  const char *g = row_at(r, r->dout, r->do_stride, x->b, h, i0);
  const bool full = pair_stats(x, h, i0, BQ);
  amx_mm((char *)x->s, BK * 4, q, ldq, (const char *)x->ktp, BK * 4, BQ, BK, D, false);
  amx_mm((char *)x->dp, BK * 4, g, ldo, (const char *)x->vtp, BK * 4, BQ, BK, D, false);
  softmax_grad(x, h, i0, BQ, full);
  pack_p_ds(x, BQ);
  amx_transpose64(q, (size_t)ldq, D, x->qtr);
  amx_transpose64(g, (size_t)ldo, D, x->gtr);
  amx_mm((char *)x->dvt, BK * 4, (const char *)x->gtr, BQ * 2, (const char *)x->pip, BK * 4, D, BK,
         BQ, true);
  amx_mm((char *)x->dkt, BK * 4, (const char *)x->qtr, BQ * 2, (const char *)x->sip, BK * 4, D, BK,
         BQ, true);
  amx_mm((char *)dq_part(a, x->c, x->b, h, i0), a->dld * 4, (const char *)x->dsr, BK * 2,
         (const char *)x->kjp, a->dld * 4, BQ, D, BK, true);
}

/* Phase 2's item on tiles: configured once, given back at its end. */
static void amx_keys_begin(const kb_ctx *x) {
  if (x->amx)
    amx_configure();
}

static void amx_keys_end(const kb_ctx *x) {
  if (x->amx)
    _tile_release();
}

#endif
