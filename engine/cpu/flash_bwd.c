/*
 * flash_bwd.c — FlashAttention-2 backward on the CPU, one key block at a time.
 *
 * Compiled once per instruction set, like flash.c (see simd.h); cpu_bwd.c
 * runs the phases (flash_bwd.h). All arithmetic is F32 whatever the dtype:
 * narrow inputs are widened exactly, outputs rounded once at the end. BF16
 * on the avx512bf16 and amx instances is the exception: the same five
 * products on BF16 pairs, P and dS rounded to BF16 (flash_bwd_bf16.h, and
 * AMX tiles for whole pairs of blocks in flash_bwd_amx.h).
 *
 * Layout choice. The forward keeps its tiles transposed (keys × queries) so
 * that the online softmax runs down vector lanes; the backward needs no
 * online softmax (P comes from the lse), so its tiles are query rows × key
 * lanes: S[i][j] = Σ_d Q[i][d]·Kᵀ[d][j] broadcasts Q elements (read in
 * place when F32) against Kᵀ vectors, and Kᵀ, Vᵀ are packed once per key
 * block and reused by every query block of the group. The five products
 * are then one micro-kernel, C[r][lanes] (+)= Σ_k A[r, k]·B[k][lanes], with
 * A read at any two strides:
 *   S    = Q·Kᵀ        rows i, lanes j, over d   (A = Q rows, B = Kᵀ)
 *   dP   = dO·Vᵀ       rows i, lanes j, over d   (A = dO rows, B = Vᵀ)
 *   dVᵀ += dOᵀ·P       rows d, lanes j, over i   (A = dO by column, B = P)
 *   dKᵀ += Qᵀ·dS       rows d, lanes j, over i   (A = Q by column, B = dS)
 *   dQ  += dS·K        rows i, lanes d, over j   (A = dS, B = K rows)
 * dK and dV stay transposed in the workspace until their key block is done;
 * dQ goes to the chunk's F32 partial, rows padded to a whole vector.
 *
 * Masks. A key block visits only the query rows that see one of its keys;
 * a pair of blocks wholly inside every row's window runs unmasked, others
 * zero P outside each row's window (and past the last key), so dS = 0 there
 * too. A row with no visible key has lse = -inf; its P is computed against
 * FLT_MAX instead, which gives 0, never -inf - -inf.
 *
 * Scale. P uses scale·log2(e) on the scores; dQ and dK are sums of dS times
 * K or Q, multiplied by scale once when they are written.
 */
#include "flash.h"
#include "simd.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>

#include "flash_bwd_pair.h"

#if ATTN_DPBF16 || ATTN_AMX
#include "flash_bwd_bf16.h"
#else
/* Without BF16 products x->bf16 is always false: never called. */
static void kb_bf16_carve(kb_ctx *x) { (void)x; }
static void pack_kv_bf16(kb_ctx *x) { (void)x; }
static void pair_bf16(kb_ctx *x, int64_t h, int64_t i0, int64_t n) {
  (void)x, (void)h, (void)i0, (void)n;
}
#endif
#if ATTN_AMX
#include "flash_bwd_amx.h"
#else
/* Without AMX x->amx is always false. */
static bool amx_whole(const kb_ctx *x, int64_t n) { return (void)x, (void)n, false; }
static void amx_pair(kb_ctx *x, int64_t h, int64_t i0) { (void)x, (void)h, (void)i0; }
static void amx_flush(kb_ctx *x) { (void)x; }
static void amx_keys_begin(kb_ctx *x) { (void)x; }
static void amx_keys_end(const kb_ctx *x) { (void)x; }
#endif

/* Query rows [i0, i0 + n) of head h against the key block, on the
 * instance's best products for them; the others share the workspace with
 * the AMX path's waiting products, which go first. */
static void pair_any(kb_ctx *x, int64_t h, int64_t i0, int64_t n) {
  if (amx_whole(x, n)) {
    amx_pair(x, h, i0);
    return;
  }
  amx_flush(x);
  if (x->bf16)
    pair_bf16(x, h, i0, n);
  else
    pair(x, h, i0, n);
}

/* The block's rows of dK (times scale) and dV, from their transposes; z
 * sums x·0 over them, NaN iff some x is not finite. */
static void store_kv(const kb_ctx *x) {
  const attn__bwd_args *a = x->a;
  const attn_request *r = a->r;
  const int64_t D = r->head_dim, ld = a->dld;
  float *tk = x->qr, *tv = x->qr + 16 * ld;
  vf z = vset1(0.0f);
  for (int64_t jj0 = 0; jj0 < x->nkt; jj0 += 16) {
    vcols16_to_rows(x->dkt, BK, D, jj0, tk, ld);
    vcols16_to_rows(x->dvt, BK, D, jj0, tv, ld);
    for (int64_t jj = jj0; jj < jj0 + 16 && jj < x->nkt; jj++) {
      float *k = tk + (jj - jj0) * ld, *v = tv + (jj - jj0) * ld;
      for (int64_t d = 0; d < ld; d += VL) {
        const vf kd = vmul(vload(k + d), vset1(a->scale));
        vstore(k + d, kd);
        z = vfma(kd, vset1(0.0f), vfma(vload(v + d), vset1(0.0f), z));
      }
      store_row(out_row(r, r->dk, r->dk_stride, x->b, x->hk, x->j0 + jj), k, r->dtype, D);
      store_row(out_row(r, r->dv, r->dv_stride, x->b, x->hk, x->j0 + jj), v, r->dtype, D);
    }
  }
  if (vany_nan(z))
    __atomic_store_n(a->overflow, 1, __ATOMIC_RELAXED);
}

/* Every query row of the group that sees a key of [j0, j0 + nkt). */
static void key_block(kb_ctx *x) {
  const attn__bwd_args *a = x->a;
  const attn_request *r = a->r;
  const int64_t D = r->head_dim, jlast = x->j0 + x->nkt - 1;
  if (x->bf16)
    pack_kv_bf16(x);
  else
    pack_kv(x);
  for (int64_t e = 0; e < D * BK; e++)
    x->dkt[e] = x->dvt[e] = 0.0f;
  /* Query i sees key j iff j - off - wr <= i <= j - off + wl. */
  int64_t ilo = a->wr < 0 ? 0 : x->j0 - a->off - a->wr;
  int64_t ihi = a->wl < 0 ? r->seq_q - 1 : jlast - a->off + a->wl;
  ilo = ilo < 0 ? 0 : ilo;
  ihi = ihi > r->seq_q - 1 ? r->seq_q - 1 : ihi;
  for (int64_t g = 0; g < a->group; g++)
    for (int64_t i0 = ilo; i0 <= ihi; i0 += BQ)
      pair_any(x, x->hk * a->group + g, i0, ihi - i0 + 1 < BQ ? ihi - i0 + 1 : BQ);
  amx_flush(x);
  store_kv(x);
}

static void keys(const attn__bwd_args *a, int64_t b, int64_t hk, int64_t c, void *ws) {
  const attn_request *r = a->r;
  const int64_t es = (int64_t)attn_dtype_size(r->dtype);
  kb_ctx x = {.a = a, .b = b, .hk = hk, .c = c};
  const int64_t wd = x.wd = attn__cpu_ws_d(r->head_dim);
  x.vw = attn__flash_v_width(r);
  x.kt = ws;
  x.vt = x.kt + wd * BK;
  x.dkt = x.vt + wd * BK;
  x.dvt = x.dkt + wd * BK;
  x.kr = x.dvt + wd * BK;
  x.s = x.kr + BK * wd;
  x.dp = x.s + BQ * BK;
  x.qr = x.dp + BQ * BK;
  x.dor = x.qr + BQ * wd;
  x.mu = x.dor + BQ * wd;
  x.di = x.mu + BQ;
  x.bf16 = r->dtype == ATTN_BF16 && r->head_dim % 2 == 0 && (ATTN_DPBF16 || ATTN_AMX);
  x.amx = x.bf16 && r->head_dim % 32 == 0 && ATTN_AMX;
  if (x.bf16)
    kb_bf16_carve(&x);
  x.kbase = (const char *)r->k + (b * r->k_stride[0] + hk * r->k_stride[1]) * es;
  x.vbase = (const char *)r->v + (b * r->v_stride[0] + hk * r->v_stride[1]) * es;
  /* This item alone writes chunk c of the group's dQ partial. */
  for (int64_t g = 0; g < a->group; g++) {
    float *p = dq_part(a, c, b, hk * a->group + g, 0);
    for (int64_t e = 0; e < r->seq_q * a->dld; e++)
      p[e] = 0.0f;
  }
  const int64_t nkb = (r->seq_kv + BK - 1) / BK, kb0 = c * a->chunk_blocks;
  const int64_t kb1 = kb0 + a->chunk_blocks < nkb ? kb0 + a->chunk_blocks : nkb;
  amx_keys_begin(&x);
  for (int64_t kb = kb0; kb < kb1; kb++) {
    x.j0 = kb * BK;
    x.nkt = r->seq_kv - x.j0 < BK ? r->seq_kv - x.j0 : BK;
    key_block(&x);
  }
  amx_keys_end(&x);
}

/* ---- phases 1 and 3 ------------------------------------------------------------ */

/* Horizontal sum, lanes in order (off the hot path). */
static float vhsum(vf x) {
  float t[VL], s = 0.0f;
  memcpy(t, &x, sizeof t);
  for (int i = 0; i < VL; i++)
    s += t[i];
  return s;
}

static void rowdot(const attn__bwd_args *a, int64_t b, int64_t h, int64_t i0, int64_t n) {
  const attn_request *r = a->r;
  const int64_t D = attn__flash_v_width(r);
  float o[ATTN_CPU_MAX_D], g[ATTN_CPU_MAX_D];
  for (int64_t i = i0; i < i0 + n; i++) {
    load_row(o, row_at(r, r->o, r->o_stride, b, h, i), r->dtype, D);
    load_row(g, row_at(r, r->dout, r->do_stride, b, h, i), r->dtype, D);
    vf acc = vset1(0.0f);
    int64_t d = 0;
    for (; d + VL <= D; d += VL)
      acc = vfma(vload(o + d), vload(g + d), acc);
    float s = vhsum(acc);
    for (; d < D; d++)
      s += o[d] * g[d];
    a->di[(b * r->heads_q + h) * r->seq_q + i] = s;
  }
}

static void store_dq(const attn__bwd_args *a, int64_t b, int64_t h, int64_t i0, int64_t n,
                     void *ws) {
  const attn_request *r = a->r;
  float *t = ws;
  const vf sc = vset1(a->scale);
  vf z = vset1(0.0f); /* NaN iff some element is not finite, as in store_kv */
  for (int64_t i = i0; i < i0 + n; i++) {
    for (int64_t d = 0; d < a->dld; d += VL) {
      vf s = vload(dq_part(a, 0, b, h, i) + d);
      for (int64_t c = 1; c < a->nchunk; c++)
        s = vadd(s, vload(dq_part(a, c, b, h, i) + d));
      s = vmul(s, sc);
      vstore(t + d, s);
      z = vfma(s, vset1(0.0f), z);
    }
    store_row(out_row(r, r->dq, r->dq_stride, b, h, i), t, r->dtype, r->head_dim);
  }
  if (vany_nan(z))
    __atomic_store_n(a->overflow, 1, __ATOMIC_RELAXED);
}

const attn__bwd_kernel CAT(attn__bwd_, SUFFIX) = {
    /* .rowdot   = */ rowdot,
    /* .keys     = */ keys,
    /* .store_dq = */ store_dq,
};
