/*
 * flash.h — the CPU FlashAttention kernel, one instance per instruction set.
 *
 * Internal to engine/cpu/. The kernel computes a block of up to
 * ATTN_FLASH_BQ query rows of one (batch, query head) against every visible
 * key, in key tiles of ATTN_FLASH_BK, keeping the tile's scores transposed
 * (keys × queries) so that the online softmax runs down the columns with
 * vertical vector operations only. Memory per call is the caller's
 * workspace of ATTN_FLASH_WS_FLOATS floats: O(tile), never O(seq_q·seq_kv).
 */
#ifndef ATTN_CPU_FLASH_H
#define ATTN_CPU_FLASH_H

#include "engine.h"

#include <math.h>

#define ATTN_FLASH_BQ 64
#define ATTN_FLASH_BK 64

/* The widest head dim the kernels take: engine/dv.c runs a request as one
 * of width W = max(D, Dv), so W reaches D's limit, not Dv's. */
#define ATTN_CPU_MAX_D ATTN_MAX_HEAD_DIM
/* Head dims up to this keep the workspace layout (and so the AMX slot
 * counts, flash_amx.h and flash_bwd_amx.h) they had when it was the limit;
 * wider ones lay it out for ATTN_CPU_MAX_D. */
#define ATTN_CPU_NARROW_D 256
/* Two query blocks of one head run as a pair (flash.c's rows_pair, cpu.c's
 * pairs_worth) up to this head dim: both fit a narrow block's workspace. */
#define ATTN_FLASH_PAIR_MAX_D (ATTN_CPU_NARROW_D / 2)

/* The head dim a block's workspace is laid out for (its regions' rows). */
static inline int64_t attn__cpu_ws_d(int64_t d) {
  return d <= ATTN_CPU_NARROW_D ? ATTN_CPU_NARROW_D : ATTN_CPU_MAX_D;
}

/* How many columns of V (and of O, dO) the products need: head_dim, or
 * for dv.c's padded job its v_cols rounded up to the tiles' 32 (the
 * columns between are zero padding, or a latent session's columns that
 * reach only O's cut ones). So P·V, and the backward's dP = dO·Vᵀ and
 * dVᵀ += dOᵀ·P, leave out the padding: at MLA's D 192, Dv 128 a third of
 * each. Only zero terms (or cut columns) are left out: the same sums. */
static inline int64_t attn__flash_v_width(const attn_request *r) {
  const int64_t w = (r->v_cols + 31) / 32 * 32;
  return r->v_cols && w < r->head_dim ? w : r->head_dim;
}

#include "scan.h"
#include "flash_bwd.h"

typedef struct attn__flash_args {
  const attn_request *r;    /* validated, strides filled */
  attn__flash_seen seen[3]; /* q, k, v; updated with GCC atomics */
  float scale2;             /* scale·log2(e): scores come out in base 2 */
  int64_t wl, wr;           /* effective window, causal folded in */
  int64_t off;              /* attn_request_offset() */
  int64_t group;            /* heads_q / heads_kv */
  /* The F32 products' intel tuning (cpu.c): 6-row register blocks and V
   * prefetched during Q·Kᵀ (flash.c, simd.h's MR_WIDE); the same bits as
   * without, only faster on cores with two 512-bit FMA pipes. */
  bool wide;
  attn__variants var; /* softcap and ALiBi */
  /* The amx kernel's key tiles packed once per job (pack_keys below: Vᵀ,
   * and F16's split K and V), or NULL: each block packs its own tiles. */
  const uint16_t *kvpack;
} attn__flash_args;

/* A block of query rows: positions [i0, i0 + nq) of the nh query heads
 * h0 .. h0 + nh - 1 of batch b, which all read one KV head; nh·nq <=
 * ATTN_FLASH_BQ. Packing the heads of a GQA group into one block lets a
 * decode step (nq = 1) read each K/V tile once for the whole group. */
/* A block may also cover only the keys [j0, j1) (decode splits its keys
 * across threads); it then leaves its unnormalized O rows (nh·nq × D, row
 * ii at po + ii·D), running max m (base 2) and sum l in po, pm, pl for the
 * caller to merge. po == NULL: the block is whole and writes the request's
 * O and statistics. */
typedef struct attn__flash_block {
  int64_t b, h0, nh, i0, nq;
  int64_t j0, j1;
  float *po, *pm, *pl;
} attn__flash_block;

/*
 * A row's statistics with its head's sink t folded in (attn_request.sinks:
 * one more key, of logit t and value zero): from the running max m
 * (natural units) and sum l of its keys to m' = max(m, t) and l' = l·e^(m -
 * m') + e^(t - m'), returning e^(m - m'), the factor the row's
 * unnormalized O takes. In double, so a sink far above the scores gives O
 * = 0 and l' = 1, never an overflow; m = -inf (no key seen) gives m' = t.
 */
static inline double attn__sink_fold(double t, double *m, double *l) {
  const double mn = *m > t ? *m : t, a = exp(*m - mn);
  *l = *l * a + exp(t - mn);
  *m = mn;
  return a;
}

/* The amx kernel's packed key tiles of a request (pack_keys below): how many
 * per (batch, KV head) — BF16 its whole tiles, F16 all, the last padded —
 * and the 16-bit words of each: Vᵀ, and for F16 Vᵀ's lo part, K's hi and
 * lo parts (flash_amx.h). 0 words: nothing is packed for this dtype. */
static inline int64_t attn__flash_pack_tiles(const attn_request *r) {
  return r->dtype == ATTN_F16 ? (r->seq_kv + ATTN_FLASH_BK - 1) / ATTN_FLASH_BK
                              : r->seq_kv / ATTN_FLASH_BK;
}

static inline int64_t attn__flash_pack_words(const attn_request *r) {
  const int64_t parts = r->dtype == ATTN_F16 ? 4 : r->dtype == ATTN_BF16 ? 1 : 0;
  return r->head_dim % 32 ? 0 : parts * ATTN_FLASH_BK * r->head_dim;
}

typedef struct attn__flash_isa {
  const char *name;
  /* Computes nblk (1 or 2) blocks: writes their rows of O and the requested
   * statistics. Two blocks of one KV head share the loads of each K/V tile
   * (see rows_pair in flash.c); the results are those of one at a time. */
  void (*rows)(const attn__flash_args *a, const attn__flash_block *blk, int nblk, void *ws);
  /* Scans keys [j0, j1) of K and V of (batch b, KV head hk) into a->seen
   * without computing: for keys no block visits. */
  void (*scan_keys)(const attn__flash_args *a, int64_t b, int64_t hk, int64_t j0, int64_t j1);
  /* n rows of d elements, rows `stride` elements apart: the largest |x| into
   * *pmax; returns the index (row·d + col) of the first non-finite element,
   * or -1 when all are finite. */
  int64_t (*scan)(const void *p, attn_dtype dt, int64_t n, int64_t d, int64_t stride, float *pmax);
  /* y = 2^x with the kernel's vector exp2, for the tests of its error. */
  void (*exp2)(const float *x, float *y, int64_t n);
  /* y = tanh(x) with the kernel's vector tanh (softcap), for the same tests. */
  void (*tanh)(const float *x, float *y, int64_t n);
  /* The backward pass (flash_bwd.h), from flash_bwd.c's instance. */
  const attn__bwd_kernel *bwd;
  /* NULL, or (amx) packs key tiles t0 .. t1-1 of (batch b, KV head hk)
   * into a->kvpack's layout at dst, the tiles of that head: tile t at dst +
   * t·attn__flash_pack_words(r), and scans the V (F16: K and V) rows it
   * reads into a->seen. Every block of the head then reads them instead of
   * packing each tile itself, nor scans them again; worth it when a head
   * has several query blocks. */
  void (*pack_keys)(const attn__flash_args *a, int64_t b, int64_t hk, int64_t t0, int64_t t1,
                    uint16_t *dst);
  /* Whether the instance has the wide F32 products (AVX-512: a->wide). */
  bool wide;
} attn__flash_isa;

/* The kernel for want (isa.c; NULL or "auto": the best this CPU runs; "amx",
 * "avx512bf16", "avx512", "avx2", "generic"), or NULL with a message when
 * the CPU (or, for AMX, the kernel's permission) lacks it. */
const attn__flash_isa *attn__flash_select(const char *want, attn_status *st);

extern const attn__flash_isa attn__flash_amx;
extern const attn__flash_isa attn__flash_avx512bf16;
extern const attn__flash_isa attn__flash_avx512;
extern const attn__flash_isa attn__flash_avx2;
extern const attn__flash_isa attn__flash_generic;
/* The amx kernel on tests/lib/amx_emu.h's emulation of the tile instructions
 * (cpu_isa "amxemu"): only the unit-test binary links it, so the reference
 * is weak and its address is NULL in libattn's other users (attnd, attn). */
extern const attn__flash_isa attn__flash_amxemu __attribute__((weak));

/* Workspace one worker needs, for any head_dim up to the maximum: Qᵀ and
 * Oᵀ (D × BQ each), the score tile (BK × BQ), converted K and V tiles
 * (BK × D each), and m, l, alpha (BQ each); two blocks of D ≤
 * ATTN_FLASH_PAIR_MAX_D fit in it as well (flash.c's block_layout).
 * ALiBi's per-lane slopes and positions live on the stack (2 × BQ floats).
 * At D 576 that is 593 KiB a worker: the tiles keep their size, so a wide
 * head's block does the same work per load as a narrow one's. A block
 * touches the first ATTN_FLASH_WS_FLOATS_D(attn__cpu_ws_d(D)) of it: 272
 * KiB up to D 256. */
#define ATTN_FLASH_WS_FLOATS_D(wd)                                                       \
  (2 * ATTN_FLASH_BQ * (wd) + ATTN_FLASH_BK * ATTN_FLASH_BQ + 2 * ATTN_FLASH_BK * (wd) + \
   3 * ATTN_FLASH_BQ)
/* and past that, a quantized tile's K and V rows dequantized (BK × wd
 * elements of up to 4 bytes each; flash_blk.h's dq_tile). */
#define ATTN_FLASH_WS_FLOATS \
  (ATTN_FLASH_WS_FLOATS_D(ATTN_CPU_MAX_D) + 2 * ATTN_FLASH_BK * ATTN_CPU_MAX_D)

#endif
