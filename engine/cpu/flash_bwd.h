/*
 * flash_bwd.h — the CPU FlashAttention-2 backward kernel, one instance per
 * instruction set (flash_bwd.c, compiled like flash.c).
 *
 * Internal to engine/cpu/. cpu_bwd.c runs a backward job in three phases on
 * the pool; the kernel supplies the per-item work of each:
 *   1. rowdot: Dᵢ = rowsum(dO∘O) for a block of query rows (the forward
 *      kernel recomputes the lse in the same phase when none was given);
 *   2. keys: for one (batch, KV head, chunk of key blocks), every query row
 *      that sees a key of the chunk, in every query head of the group:
 *      P = 2^(S·scale·log2 e − lse·log2 e) recomputed from Q and K, then
 *      dV += Pᵀ·dO, dS = P∘(dO·Vᵀ − Dᵢ), dK += dSᵀ·Q (written once the
 *      chunk's key block is done), and dQ += dS·K into the chunk's own F32
 *      partial of dQ;
 *   3. store_dq: the chunks' partials summed in chunk order, times scale,
 *      rounded to the dtype.
 * The chunking depends on the shape only, so the sums, and the bits, are
 * the same for any thread count. Memory: the per-worker workspace of
 * ATTN_BWD_WS_FLOATS floats, plus the caller's O(B·Hq·Nq·D) partials.
 */
#ifndef ATTN_CPU_FLASH_BWD_H
#define ATTN_CPU_FLASH_BWD_H

#include "engine.h"

#include <math.h>

#define ATTN_BWD_BQ 64
#define ATTN_BWD_BK 64
/* Row stride of dQ partials and padded K rows: head_dim rounded up to this
 * (a multiple of every ISA's vector length). */
#define ATTN_BWD_DALIGN 16

/* The score variants as the kernels (forward and backward) apply them, in
 * their base-2 units: s2 = s·log2(e) becomes cap2·tanh(s2 / cap2), then
 * gets -slope·log2(e)·|i + off - j|. */
typedef struct attn__variants {
  float cap2, inv_cap2; /* softcap·log2(e) and its inverse; 0: no softcap */
  bool alibi;           /* the request has alibi_slopes */
  bool on;              /* either: the tiles' scores go through the variant step */
} attn__variants;

/* The variants of a validated request r, as both passes' jobs set them up. */
static inline void attn__variants_init(const attn_request *r, attn__variants *v) {
  const double cap2 = r->softcap * M_LOG2E;
  v->cap2 = (float)cap2;
  v->inv_cap2 = r->softcap > 0 ? (float)(1.0 / cap2) : 0.0f;
  v->alibi = r->alibi_slopes != NULL;
  v->on = r->softcap > 0 || v->alibi;
}

typedef struct attn__bwd_args {
  const attn_request *r; /* validated backward request, strides filled */
  const float *lse;      /* [B, Hq, Nq], natural log: lse_in or recomputed */
  float *di;             /* [B, Hq, Nq]: rowsum(dO∘O), written by phase 1 */
  float *dqp;            /* nchunk × [B, Hq, Nq, dld] F32 partials of dQ/scale */
  int64_t dld;           /* head_dim rounded up to ATTN_BWD_DALIGN */
  int64_t nchunk;        /* key chunks per (batch, KV head) */
  int64_t chunk_blocks;  /* key blocks of ATTN_BWD_BK per chunk */
  float scale, scale2;   /* scale, and scale·log2(e) */
  int64_t wl, wr, off, group;
  attn__variants var;
  int *overflow; /* set (atomically) when an output is not finite */
} attn__bwd_args;

/* A workspace for phase 2: Kᵀ, Vᵀ, dKᵀ, dVᵀ (D × BK each), K rows
 * (BK × D), S/P and dP/dS (BQ × BK each), Q and dO rows (BQ × D each),
 * and two vectors of BQ; for D up to flash.h's ATTN_CPU_MAX_D (1185 KiB
 * a worker), of which a key block at D touches ATTN_BWD_WS_FLOATS_D of
 * attn__cpu_ws_d(D) (545 KiB up to D 256). */
#define ATTN_BWD_WS_FLOATS_D(wd)                                                     \
  (5 * ATTN_BWD_BK * (wd) + 2 * ATTN_BWD_BQ * ATTN_BWD_BK + 2 * ATTN_BWD_BQ * (wd) + \
   ATTN_BWD_BK * (wd) + 2 * ATTN_BWD_BQ)
#define ATTN_BWD_WS_FLOATS ATTN_BWD_WS_FLOATS_D(ATTN_CPU_MAX_D)

typedef struct attn__bwd_kernel {
  /* Dᵢ of rows [i0, i0 + n) of (batch b, query head h) into a->di. */
  void (*rowdot)(const attn__bwd_args *a, int64_t b, int64_t h, int64_t i0, int64_t n);
  /* Phase 2 for chunk c of (batch b, KV head hk): writes the chunk's rows
   * of dK and dV (zero for keys no query sees) and its dQ partial. */
  void (*keys)(const attn__bwd_args *a, int64_t b, int64_t hk, int64_t c, void *ws);
  /* Rows [i0, i0 + n) of dQ for (b, h) from the partials; ws holds D floats. */
  void (*store_dq)(const attn__bwd_args *a, int64_t b, int64_t h, int64_t i0, int64_t n, void *ws);
} attn__bwd_kernel;

extern const attn__bwd_kernel attn__bwd_amx;
/* The unit tests' amxemu instance (flash.h's attn__flash_amxemu) points here. */
extern const attn__bwd_kernel attn__bwd_amxemu;
extern const attn__bwd_kernel attn__bwd_avx512bf16;
extern const attn__bwd_kernel attn__bwd_avx512;
extern const attn__bwd_kernel attn__bwd_avx2;
extern const attn__bwd_kernel attn__bwd_generic;

#endif
