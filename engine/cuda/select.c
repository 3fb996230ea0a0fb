/*
 * select.c — which kernel runs a request, with which tiles and how many key
 * splits. Host code only (it needs no device), so the unit tests run it.
 *
 * Head dims go to the smallest tensor-core instance that holds them (64,
 * 96, 128, 160, 192, else the generic 256; each with its own query rows
 * and key tile, from kernels.h), F32 to the FMA kernel. On tensor cores, a
 * GQA request whose group of query heads times Nq fits in one block's rows
 * (decoding) packs the group into one block per KV head. A launch with fewer
 * query blocks than multiprocessors (decoding: a short query, long keys)
 * splits each block's keys into ranges computed by separate blocks and
 * merged by their log-sum-exp, aiming at two blocks per multiprocessor
 * while keeping at least four key tiles per range.
 *
 * A forward decode (F16/BF16, a KV group's heads × Nq at most 16 rows,
 * 512 visible keys or more) then goes to the decode kernel (decode.cuh)
 * of its head dim instead: one block per (KV head, batch · split), keys
 * split so every multiprocessor gets two blocks of 16 tiles or more; its
 * splits are merged by its own last block, so its choice needs no merge
 * kernel, only its counters after the partials in split_ws.
 *
 * A backward pass picks the smallest backward instance that holds its head
 * dim (64, 128, 256; or the F32 one) and never splits: its dK/dV blocks
 * are as many as key blocks times KV heads, its dQ blocks as many as the
 * forward's, or none on the atomic path (params.bwd_atomic_dq, unless
 * disabled), whose dK/dV blocks also hold a dS tile.
 *
 * A paged request (k_table set: K and V read through page tables,
 * kernels.h) takes the same forward instances, splits and packing (but
 * the 192 instance for the 160 one's head dims), never the Hopper
 * instances (their TMA reads packed K and V) and never the
 * backward (it reads packed K and V too): that is refused. With per-entry
 * key lengths (seqused_k) seq_kv is the largest, and the choice is the
 * one for it.
 *
 * Instances a device's start-up self-check found wrong are skipped: a
 * head-dim class falls back to the next larger instance (256 holds every
 * dp), split-KV to one range; with nothing left the request is refused
 * and backend "auto" leaves it to the CPU.
 */
#include "decode_layout.h"
#include "kernels.h"
#include "layout.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

static const char *const names[ATTN_CU_KERNEL_COUNT] = {
    "mma_d64",      "mma_d96",    "mma_d128",    "mma_d160",     "mma_d192",
    "mma_d256",     "simt_f32",   "bwd_mma_d64", "bwd_mma_d128", "bwd_mma_d256",
    "bwd_simt_f32", "hopper_d64", "hopper_d96",  "hopper_d128",  "hopper_d192",
    "hopper_d256",  "decode_d64", "decode_d128", "decode_d256"};

/* A tensor-core instance: the padded head dim it holds, its query rows and
 * keys per tile. */
typedef struct instance {
  attn_cu_kernel kernel;
  int dpad, bm, bn;
} instance;

/* In head-dim order: a request takes the first that holds its dp. The
 * backward's tiles depend on more than these (select_backward() sets
 * them), so its table says only which instance holds which dp. */
static const instance fwd_instances[] = {
    {ATTN_CU_MMA_D64, 64, ATTN_CU_BM_D64, ATTN_CU_BN_D64},
    {ATTN_CU_MMA_D96, 96, ATTN_CU_BM_D96, ATTN_CU_BN_D96},
    {ATTN_CU_MMA_D128, 128, ATTN_CU_BM_D128, ATTN_CU_BN_D128},
    {ATTN_CU_MMA_D160, 160, ATTN_CU_BM_D160, ATTN_CU_BN_D160},
    {ATTN_CU_MMA_D192, 192, ATTN_CU_BM_D192, ATTN_CU_BN_D192},
    {ATTN_CU_MMA_D256, 256, ATTN_CU_BM_D256, ATTN_CU_BN_D256},
};
static const instance bwd_instances[] = {
    {ATTN_CU_BWD_MMA_D64, 64, 0, 0},
    {ATTN_CU_BWD_MMA_D128, 128, 0, 0},
    {ATTN_CU_BWD_MMA_D256, 256, 0, 0},
};
#define NFWD (int)(sizeof fwd_instances / sizeof *fwd_instances)
#define NBWD (int)(sizeof bwd_instances / sizeof *bwd_instances)

const char *attn_cu_kernel_name(attn_cu_kernel k) {
  return (unsigned)k < ATTN_CU_KERNEL_COUNT ? names[k] : "?";
}

int attn_cu_dp(int64_t head_dim) {
  return (int)((head_dim + ATTN_CU_DPAD_ALIGN - 1) / ATTN_CU_DPAD_ALIGN * ATTN_CU_DPAD_ALIGN);
}

/* Shared memory of the tensor-core kernels: Q (bm rows), then K and V
 * twice (double buffered), rows padded by 8 two-byte elements. */
static size_t mma_smem(const instance *in) {
  return (size_t)(in->bm + 4 * in->bn) * (size_t)(in->dpad + 8) * 2;
}

/* The FMA kernel's: Q and V tiles, and K with rows padded by one float (the
 * score loop reads K across rows). */
static size_t f32_smem(int dp) {
  return 4 * ((size_t)ATTN_CU_F32_BM * (size_t)dp + (size_t)ATTN_CU_F32_BN * (size_t)(dp + 1) +
              (size_t)ATTN_CU_F32_BN * (size_t)dp);
}

/* The backward's tensor-core shared memory. dK/dV: K and V of the block,
 * Q and dO of `stages` query steps, and each step's lse and D (F32). dQ: Q
 * and dO of the block, K and V of `stages` key steps. */
static size_t bwd_smem(int dpad, int bn, int stages) {
  return (size_t)(2 * bn + 2 * stages * ATTN_CU_BWD_BM) * (size_t)(dpad + 8) * 2 +
         (size_t)stages * 2 * ATTN_CU_BWD_BM * sizeof(float);
}
static size_t bwdq_smem(int dpad, int bn, int stages) {
  return (size_t)(2 * ATTN_CU_BWDQ_BM + 2 * stages * bn) * (size_t)(dpad + 8) * 2;
}

/* F32 backward: four tiles with rows padded by one float, block rows
 * (ATTN_CU_BWD_F32_BN) of two tensors and step rows of the other two, plus
 * the step's lse and D in the dK/dV kernel. */
static size_t bwd_f32_smem(int dp) {
  return 4 * ((size_t)(2 * ATTN_CU_BWD_F32_BN + 2 * ATTN_CU_BWD_F32_STEP) * (size_t)(dp + 1) +
              2 * ATTN_CU_BWD_F32_STEP);
}

/* The tensor-core instance for the request's pass and head dim: the
 * smallest that holds dp, or the next larger when that one is disabled (bit
 * k of off turns kernel k off); NULL when none is left. */
static const instance *pick_mma(const attn_cu_params *p, unsigned off) {
  const bool bwd = p->pass == ATTN_BACKWARD;
  const instance *t = bwd ? bwd_instances : fwd_instances;
  if (p->k_table) /* a paged request: only the instances with a paged variant */
    off |= ~ATTN_CU_PAGED_KERNELS & ((1u << ATTN_CU_KERNEL_COUNT) - 1);
  for (int i = 0, n = bwd ? NBWD : NFWD; i < n; i++)
    if (t[i].dpad >= p->dp && !(off & (1u << t[i].kernel)))
      return &t[i];
  return NULL;
}

/* The kernel for the request: the F32 one of its pass, else pick_mma()'s
 * (in *in); ATTN_CU_KERNEL_COUNT when what it needs is disabled. */
static attn_cu_kernel pick(const attn_cu_params *p, unsigned off, const instance **in) {
  *in = NULL;
  if (p->dtype == ATTN_F32) {
    attn_cu_kernel k = p->pass == ATTN_BACKWARD ? ATTN_CU_BWD_SIMT_F32 : ATTN_CU_SIMT_F32;
    return off & (1u << k) ? ATTN_CU_KERNEL_COUNT : k;
  }
  *in = pick_mma(p, off);
  return *in ? (*in)->kernel : ATTN_CU_KERNEL_COUNT;
}

/* The atomic path's choice: no dQ kernel, and the dK/dV blocks' dS tile
 * (BM rows of block_n keys, padded by 8 elements; F32: 16 rows of 32 + 1). */
static void select_atomic_dq(attn_cu_choice *c) {
  c->smem_bytes += c->kernel == ATTN_CU_BWD_SIMT_F32
                       ? (size_t)ATTN_CU_BWD_F32_STEP * (ATTN_CU_BWD_F32_BN + 1) * sizeof(float)
                       : (size_t)ATTN_CU_BWD_BM * (size_t)(c->block_n + 8) * 2;
  c->dq_block_m = c->dq_block_n = 0;
  c->dq_smem_bytes = 0;
  memset(c->dq_grid, 0, sizeof c->dq_grid);
}

static void select_backward(const attn_cu_params *p, attn_cu_kernel k, unsigned off,
                            attn_cu_choice *c) {
  c->kernel = k;
  c->warps = ATTN_CU_MMA_WARPS;
  c->block_m = ATTN_CU_BWD_BM;
  c->dq_block_m = ATTN_CU_BWDQ_BM;
  if (k == ATTN_CU_BWD_SIMT_F32) {
    c->block_m = ATTN_CU_BWD_F32_STEP;
    c->block_n = ATTN_CU_BWD_F32_BN;
    c->dq_block_m = ATTN_CU_BWD_F32_BN;
    c->dq_block_n = ATTN_CU_BWD_F32_STEP;
    c->smem_bytes = c->dq_smem_bytes = bwd_f32_smem(p->dp);
  } else if (k == ATTN_CU_BWD_MMA_D64) {
    c->block_n = ATTN_CU_BWD_BN_D64;
    c->dq_block_n = ATTN_CU_BWDQ_BN_D64;
    c->smem_bytes = bwd_smem(64, ATTN_CU_BWD_BN_D64, 2);
    c->dq_smem_bytes = bwdq_smem(64, ATTN_CU_BWDQ_BN_D64, 2);
  } else if (k == ATTN_CU_BWD_MMA_D128) {
    c->block_n = ATTN_CU_BWD_BN_D128;
    c->dq_block_n = ATTN_CU_BWDQ_BN_D128;
    c->smem_bytes = bwd_smem(128, ATTN_CU_BWD_BN_D128, 2);
    c->dq_smem_bytes = bwdq_smem(128, ATTN_CU_BWDQ_BN_D128, 2);
  } else {
    c->block_n = ATTN_CU_BWD_BN_D256;
    c->dq_block_n = ATTN_CU_BWDQ_BN_D256;
    c->smem_bytes = bwd_smem(256, ATTN_CU_BWD_BN_D256, 1);
    c->dq_smem_bytes = bwdq_smem(256, ATTN_CU_BWDQ_BN_D256, 1);
  }
  c->nsplit = c->pack = 1;
  c->grid[0] = (unsigned)((p->seq_kv + c->block_n - 1) / c->block_n);
  c->grid[1] = (unsigned)p->heads_kv;
  c->grid[2] = (unsigned)p->batch;
  c->dq_grid[0] = (unsigned)((p->seq_q + c->dq_block_m - 1) / c->dq_block_m);
  c->dq_grid[1] = (unsigned)p->heads_q;
  c->dq_grid[2] = (unsigned)p->batch;
  if (p->bwd_atomic_dq && !(off & ATTN_CU_ATOMIC_DQ_BIT))
    select_atomic_dq(c);
}

/* Key tiles of bn keys that some query row sees: from the first row's
 * lowest visible key to the last row's highest (both bounds grow with the
 * row), so a windowed decode does not count the tiles outside its window. */
static int64_t visible_tiles(const attn_cu_params *p, int bn) {
  int lo, hi, lo2, hi2;
  const int64_t off = (int64_t)p->seq_kv - p->seq_q;
  attn_cu_row_bounds(0, off, p->window_left, p->window_right, p->seq_kv, &lo, &hi2);
  attn_cu_row_bounds(p->seq_q - 1, off, p->window_left, p->window_right, p->seq_kv, &lo2, &hi);
  return lo > hi ? 0 : hi / bn - lo / bn + 1;
}

/* A forward choice on kernel k: the instance in's tiles (NULL: the F32
 * kernel's), GQA packing, key splits. */
static void select_forward(const attn_cu_params *p, int sms, attn_cu_kernel k, const instance *in,
                           unsigned off, attn_cu_choice *c) {
  const bool split = !(off & ATTN_CU_SPLIT_BIT), pack = !(off & ATTN_CU_PACK_BIT);
  c->kernel = k;
  c->warps = ATTN_CU_MMA_WARPS;
  if (in) {
    c->block_m = in->bm;
    c->block_n = in->bn;
    c->smem_bytes = mma_smem(in);
  } else {
    c->block_m = ATTN_CU_F32_BM;
    c->block_n = ATTN_CU_F32_BN;
    c->warps = ATTN_CU_F32_THREADS / 32;
    c->smem_bytes = f32_smem(p->dp);
  }
  const int group = p->heads_q / p->heads_kv;
  c->pack = pack && k != ATTN_CU_SIMT_F32 && group > 1 && (int64_t)group * p->seq_q <= c->block_m
                ? group
                : 1;
  int64_t qtiles = ((int64_t)c->pack * p->seq_q + c->block_m - 1) / c->block_m;
  int64_t blocks = qtiles * (p->heads_q / c->pack) * p->batch;
  int64_t tiles = visible_tiles(p, c->block_n);
  int64_t nsplit = 1;
  if (split && sms > 0 && blocks < sms) {
    int64_t want = (2 * (int64_t)sms + blocks - 1) / blocks;
    int64_t most = tiles / 4 < ATTN_CU_MAX_SPLITS ? tiles / 4 : ATTN_CU_MAX_SPLITS;
    nsplit = want < most ? want : most;
    if (nsplit < 2)
      nsplit = 1;
  }
  c->nsplit = (int)nsplit;
  c->grid[0] = (unsigned)qtiles;
  c->grid[1] = (unsigned)(p->heads_q / c->pack);
  c->grid[2] = (unsigned)(p->batch * nsplit);
}

/* The decode kernel's instances in head-dim order: the padded head dim
 * each holds and its ring stages. */
static const struct {
  attn_cu_kernel kernel;
  int dpad, stages;
} dec_instances[] = {
    {ATTN_CU_DECODE_D64, 64, ATTN_CU_DEC_STAGES_D64},
    {ATTN_CU_DECODE_D128, 128, ATTN_CU_DEC_STAGES_D128},
    {ATTN_CU_DECODE_D256, 256, ATTN_CU_DEC_STAGES_D256},
};

/* The decode kernel's instance for the request (the smallest holding dp
 * that is not off), or -1: an F16/BF16 forward whose KV group's rows
 * (heads × Nq) fit in its N, with enough visible keys that streaming them
 * dominates (shorter ones stay on the tiled forward, which needs no warp
 * combine). */
static int decode_instance(const attn_cu_params *p, unsigned off) {
  const int64_t rows = (int64_t)(p->heads_q / p->heads_kv) * p->seq_q;
  if (p->pass != ATTN_FORWARD || (p->dtype != ATTN_F16 && p->dtype != ATTN_BF16) ||
      rows > ATTN_CU_DEC_ROWS ||
      visible_tiles(p, ATTN_CU_DEC_KT) * ATTN_CU_DEC_KT < ATTN_CU_DEC_MIN_KEYS)
    return -1;
  for (int i = 0; i < (int)(sizeof dec_instances / sizeof *dec_instances); i++)
    if (dec_instances[i].dpad >= p->dp && !(off & (1u << dec_instances[i].kernel)))
      return i;
  return -1;
}

/* The decode kernel takes over a forward choice it suits: one block per
 * (KV head, batch · split), the group's heads in its columns (pack), and
 * key splits that give every multiprocessor ATTN_CU_DEC_PER_SM blocks
 * (unless the split path is off). Returns whether it did. */
static bool maybe_decode(const attn_cu_params *p, int sms, unsigned off, attn_cu_choice *c) {
  const int i = decode_instance(p, off);
  if (i < 0)
    return false;
  c->kernel = dec_instances[i].kernel;
  c->block_m = ATTN_CU_DEC_ROWS;
  c->block_n = ATTN_CU_DEC_KT;
  c->warps = ATTN_CU_DEC_WARPS;
  c->smem_bytes =
      (size_t)attn_cu_dec_smem(dec_instances[i].dpad, ATTN_CU_DEC_WARPS, dec_instances[i].stages);
  c->pack = p->heads_q / p->heads_kv;
  const int64_t blocks = (int64_t)p->batch * p->heads_kv;
  c->nsplit =
      off & ATTN_CU_SPLIT_BIT
          ? 1
          : attn_cu_dec_splits(blocks, sms, ATTN_CU_DEC_PER_SM, visible_tiles(p, ATTN_CU_DEC_KT),
                               ATTN_CU_DEC_MIN_TILES, ATTN_CU_MAX_SPLITS);
  c->grid[0] = 1;
  c->grid[1] = (unsigned)p->heads_kv;
  c->grid[2] = (unsigned)(p->batch * c->nsplit);
  return true;
}

int attn_cu_select(const attn_cu_params *p, int sms, attn_cu_choice *c, attn_status *st) {
  return attn_cu_select_masked(p, sms, ATTN_CU_HOPPER_OFF, c, st);
}

/* The Hopper instance of the head dim takes over the forward choice when
 * off allows it (kernels.h), except a packed GQA decode: the Hopper
 * instance would read each K/V tile once per query head, not per group. */
static void maybe_hopper(const attn_cu_params *p, int sms, unsigned off, attn_cu_choice *c) {
  if (c->pack > 1 || p->k_table) /* nor a paged one: TMA reads packed K and V */
    return;
  if (!(off & (1u << attn_cu_hopper_of(p->dp))))
    attn_cu_select_hopper(p, sms, c);
}

int attn_cu_select_masked(const attn_cu_params *p, int sms, unsigned off, attn_cu_choice *c,
                          attn_status *st) {
  if (p->seq_q < 1 || p->seq_kv < 1 || p->head_dim < 1 || p->head_dim > ATTN_CU_MAX_HEAD_DIM ||
      p->dp != attn_cu_dp(p->head_dim) || p->batch < 1 || p->heads_kv < 1 ||
      p->heads_q % p->heads_kv != 0)
    return attn_status_set(st, ATTN_EINVAL, "cuda: inconsistent launch parameters");
  memset(c, 0, sizeof *c);
  if (p->pass == ATTN_BACKWARD && (p->k_table || p->v_table))
    return attn_status_set(st, ATTN_EUNSUPPORTED,
                           "the cuda backward pass reads packed K and V, not pages");
  if (p->seq_q > ATTN_CU_MAX_SEQ || p->seq_kv > ATTN_CU_MAX_SEQ)
    return attn_status_set(st, ATTN_EUNSUPPORTED,
                           "the cuda backend takes sequences of at most %lld (got seq_q %d, "
                           "seq_kv %d)",
                           (long long)ATTN_CU_MAX_SEQ, p->seq_q, p->seq_kv);
  const instance *in;
  attn_cu_kernel k = pick(p, off, &in);
  if (k == ATTN_CU_KERNEL_COUNT)
    return attn_status_set(st, ATTN_EUNSUPPORTED,
                           "the cuda kernels for this dtype and head dim failed the device's "
                           "start-up self-check and are disabled");
  if (p->pass == ATTN_BACKWARD)
    select_backward(p, k, off, c);
  else {
    select_forward(p, sms, k, in, off, c);
    if (!maybe_decode(p, sms, off, c))
      maybe_hopper(p, sms, off, c);
  }
  if (p->heads_q > ATTN_CU_MAX_GRID_YZ || (int64_t)p->batch * c->nsplit > ATTN_CU_MAX_GRID_YZ)
    return attn_status_set(st, ATTN_EUNSUPPORTED,
                           "the cuda backend takes at most %d query heads and %d batch entries "
                           "(got %d and %d)",
                           ATTN_CU_MAX_GRID_YZ, ATTN_CU_MAX_GRID_YZ, p->heads_q, p->batch);
  return 0;
}

size_t attn_cu_split_bytes(const attn_cu_params *p, const attn_cu_choice *c) {
  if (c->nsplit <= 1)
    return 0;
  size_t rows = (size_t)p->batch * (size_t)p->heads_q * (size_t)p->seq_q;
  /* The decode kernel's split counters follow the partials, one word per
   * (batch, KV head) (decode_layout.h), rounded to 16 bytes. */
  size_t counters = attn_cu_is_decode(c->kernel)
                        ? ((size_t)p->batch * (size_t)p->heads_kv * 4 + 15) / 16 * 16
                        : 0;
  return (size_t)c->nsplit * rows * ((size_t)p->dp + 2) * sizeof(float) + counters;
}

size_t attn_cu_bwd_bytes(const attn_cu_params *p) {
  if (p->pass != ATTN_BACKWARD)
    return 0;
  const size_t rows = (size_t)p->batch * (size_t)p->heads_q * (size_t)p->seq_q;
  if (!p->bwd_atomic_dq)
    return 2 * rows * sizeof(float);
  return ((size_t)attn_cu_bwd_dq_at(rows) + rows * (size_t)p->dp) * sizeof(float);
}

static bool aligned(const void *x, uintptr_t a) { return x && (uintptr_t)x % a == 0; }

/* The paged view's contract (kernels.h): both tables, an aligned pool,
 * pages that hold page_tokens rows, tables that cover seq_kv, and a
 * forward instance that reads pages (whose key tile divides page_tokens). */
static bool paged_ok(const attn_cu_params *p, const attn_cu_choice *c) {
  if (!aligned(p->k_table, 4) || !aligned(p->v_table, 4) || !aligned(p->page_base, 16) ||
      p->page_tokens < ATTN_CU_PAGE_ALIGN_TOKENS || p->page_tokens % ATTN_CU_PAGE_ALIGN_TOKENS ||
      p->page_bytes % ATTN_CU_PAGE_ALIGN_BYTES || p->pass == ATTN_BACKWARD ||
      (unsigned)c->kernel >= ATTN_CU_KERNEL_COUNT || !(ATTN_CU_PAGED_KERNELS >> c->kernel & 1) ||
      c->block_n < 1 || p->page_tokens % c->block_n)
    return false;
  const int64_t need = ((int64_t)p->seq_kv + p->page_tokens - 1) / p->page_tokens;
  /* The kernels index the tables in 32 bits (a block's first entry). */
  const int64_t entries = (int64_t)p->batch * p->heads_kv * p->pages_per_head;
  return p->pages_per_head >= need && entries <= INT32_MAX &&
         p->page_bytes / attn_dtype_size(p->dtype) / (size_t)p->dp >= (size_t)p->page_tokens;
}

bool attn_cu_launch_ok(const attn_cu_params *p, const attn_cu_choice *c) {
  const bool paged = p->k_table || p->v_table; /* then k and v are not read */
  /* Per-entry lengths only where the paged instances read them. */
  if (p->seqused_k && (!p->k_table || !aligned(p->seqused_k, 4)))
    return false;
  if (p->dp % ATTN_CU_DPAD_ALIGN != 0 || p->dp != attn_cu_dp(p->head_dim) || !aligned(p->q, 16) ||
      (paged ? !paged_ok(p, c) : !aligned(p->k, 16) || !aligned(p->v, 16)) || !aligned(p->o, 16) ||
      (p->alibi2 && !aligned(p->alibi2, 4)))
    return false;
  /* The atomic choice (no dQ grid) adds into an accumulator that bwd_ws
   * holds only when the params ask for it (attn_cu_bwd_bytes). */
  if (p->pass == ATTN_BACKWARD)
    return aligned(p->dout, 16) && aligned(p->dq, 16) && aligned(p->dk, 16) && aligned(p->dv, 16) &&
           aligned(p->lse, 4) && aligned(p->bwd_ws, 16) && (c->dq_grid[0] != 0 || p->bwd_atomic_dq);
  const float *const stats[3] = {p->m, p->l, p->lse};
  for (int i = 0; i < 3; i++)
    if (stats[i] && !aligned(stats[i], 4))
      return false;
  return c->nsplit <= 1 || aligned(p->split_ws, 16);
}
