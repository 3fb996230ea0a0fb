/*
 * kernels.h — the only door between the CUDA C++ kernels and C (with
 * sinks.h, which folds attention sinks in around these launches).
 *
 * The kernels see packed device tensors: Q [B, Hq, Nq, dp], K and V
 * [B, Hkv, Nkv, dp], O [B, Hq, Nq, dp], where dp is head_dim rounded up to a
 * multiple of 8 and the padding columns of Q, K and V are zero (so every row
 * starts on a 16-byte boundary, which cp.async needs, and the padding adds
 * nothing to a dot product; O's padding columns come out zero). split_ws
 * and every tensor must be 16-byte aligned. The backend (cuda.c) packs and
 * unpacks; the
 * benchmark and the GPU tests call these functions on device buffers
 * directly.
 *
 * attn_cu_select() is the one place that decides which kernel runs a
 * request, with which tiles and how many key splits; the backend's
 * supports() is defined through it, and attn_cu_launch() runs what it chose.
 *
 * The backward pass (params.pass == ATTN_BACKWARD) reads the same packed Q,
 * K, V and O plus dO [B, Hq, Nq, dp] and the forward's lse (F32
 * [B, Hq, Nq], in p->lse), and writes packed dQ, dK, dV in the input dtype
 * (padding columns zero). It runs three kernels in one attn_cu_launch(): a
 * preprocess (D = rowsum(dO∘O) and lse in log2 units, into bwd_ws), one
 * block per (key block, KV head, batch) that owns dK and dV of its keys and
 * loops over the query blocks of every query head of its group, and one
 * block per (query block, query head, batch) that owns dQ: every output
 * element has one writer, so the result is deterministic (no atomics). A
 * caller without the forward's lse computes it first with a forward launch
 * (stats into p->lse).
 *
 * The atomic path (params.bwd_atomic_dq set, ATTN_CU_ATOMIC_DQ_BIT not off:
 * attnd's --deterministic off): the dK/dV blocks also add dS·K of each
 * step into an F32 dQ accumulator [B, Hq, Nq, dp] in bwd_ws with atomics,
 * and a post-kernel writes dQ = scale · accumulator in the input dtype
 * (padding columns zero); the preprocess zeroes the accumulator. No dQ
 * kernel runs (the choice's dq_grid is zero), so each (query tile, key
 * block) pair costs five matrix products instead of seven (S, dP, dV,
 * dK, dQ; the dQ kernel recomputes S and dP). Every instance has it, none
 * spills (the 256 one forms dQ one 16-row tile at a time). The order of
 * the atomic additions varies, so dQ varies in its last bits from run to
 * run; dK and dV are as on the deterministic path.
 *
 * Paged K/V (params.k_table set): a forward launch may read K and V
 * through page tables instead of the packed tensors, as FlashAttention's
 * block_table does for a session's KV cache (engine/kv/pages.h). Key j of
 * (batch b, KV head hk) is row j % page_tokens of page
 * k_table[(b·Hkv + hk)·pages_per_head + j / page_tokens] (V likewise with
 * v_table), and page n starts at page_base + n·page_bytes; a page's rows
 * are dp elements each, padding columns zero, as the packed layout's.
 * page_tokens is a multiple of 64, hence of every forward instance's key
 * tile, so a tile never straddles a page and the kernels look a page up
 * once per tile. Only the tensor-core, decode and F32 forward instances
 * read pages (ATTN_CU_PAGED_KERNELS: all but the 160 one, whose head dims
 * go to the 192 one when paged; the decode kernel's 16-key tiles divide
 * page_tokens too): a paged request never takes the Hopper
 * instances (TMA reads packed tensors) nor the backward (attn_cu_select
 * refuses it).
 *
 * Per-batch key lengths (params.seqused_k set, paged only), as
 * FlashAttention's seqused_k / cache_seqlens: a launch batches many
 * sessions' steps, entry b one session with its own tables and
 * seqused_k[b] cached keys. Its blocks see keys [0, seqused_k[b]) only
 * (the rest are past its sequence's end, never read, nor are the table
 * entries past them) and mask with the diagonal offset seqused_k[b] −
 * seq_q, bottom-right aligned as a session call's is, in place of off;
 * seq_kv is the largest length, which the grid, the tables' coverage and
 * the number of key splits are sized for. Each block divides its own
 * entry's visible tiles over the splits, so entry b's result is the one a
 * batch-1 launch of seq_kv = seqused_k[b] with the same nsplit gives; a
 * split (or a whole entry) with no key writes an empty partial (m −inf,
 * l 0), which the merge weighs 0, and a row that sees no key comes out
 * O = 0, m = lse = −inf, l = 0.
 */
#ifndef ATTN_CUDA_KERNELS_H
#define ATTN_CUDA_KERNELS_H

#include "engine.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Head dims are padded to this many elements. */
#define ATTN_CU_DPAD_ALIGN 8
/* The widest head dim (of q and k, and of v) the kernels take, below the
 * contract's ATTN_MAX_HEAD_DIM: wider requests are declined (cuda.c), so
 * backend auto runs them on the cpu. */
#define ATTN_CU_MAX_HEAD_DIM 256
/* gridDim.y and .z: query heads, and batch entries times key splits. */
#define ATTN_CU_MAX_GRID_YZ 65535
/* Sequence lengths at most this keep every in-kernel index in 32 bits. */
#define ATTN_CU_MAX_SEQ ((int64_t)1 << 30)

/* Tile shapes, shared by the selection (C) and the kernels (C++). The
 * tensor-core forward instances run blocks of ATTN_CU_MMA_WARPS warps and
 * ATTN_CU_BM_Dx query rows, so each warp owns BM / 4 rows (16 or 32: one or
 * two m16 tiles, FlashAttention-2's 128-row blocks where the registers and
 * shared memory allow), and stream K and V in tiles of ATTN_CU_BN_Dx keys,
 * double-buffered; (BM + 4 BN) (Dx + 8) 2 bytes of shared memory stays
 * under sm_89's 99 KB per block. */
#define ATTN_CU_MMA_WARPS 4
#define ATTN_CU_BM_D64 128
#define ATTN_CU_BN_D64 64
#define ATTN_CU_BM_D96 128
#define ATTN_CU_BN_D96 32
#define ATTN_CU_BM_D128 128
#define ATTN_CU_BN_D128 32
#define ATTN_CU_BM_D160 128
#define ATTN_CU_BN_D160 32
#define ATTN_CU_BM_D192 64
#define ATTN_CU_BN_D192 32
#define ATTN_CU_BM_D256 64
#define ATTN_CU_BN_D256 32
#define ATTN_CU_F32_BM 32
#define ATTN_CU_F32_BN 32
#define ATTN_CU_F32_THREADS 128
/* The decode kernel: warps per block, cp.async ring stages per warp (16
 * keys each), the most query rows of a group (heads × Nq) it takes, the
 * fewest visible keys for which it is chosen, blocks it aims at per
 * multiprocessor when splitting keys, and the fewest key tiles per split.
 * ((16 + 2 NW ST 16) (D + 8) 2 bytes of shared memory: 55 KB for d64, 75
 * KB for d128, 76 KB for d256 (two stages only), under sm_89's 99 KB.) */
#define ATTN_CU_DEC_WARPS 2
#define ATTN_CU_DEC_STAGES_D64 6
#define ATTN_CU_DEC_STAGES_D128 4
#define ATTN_CU_DEC_STAGES_D256 2
#define ATTN_CU_DEC_ROWS 16
#define ATTN_CU_DEC_MIN_KEYS 512
#define ATTN_CU_DEC_PER_SM 2
#define ATTN_CU_DEC_MIN_TILES 16
/* Most key splits of one query block. */
#define ATTN_CU_MAX_SPLITS 64

/* Backward tiles. The dK/dV kernel: 4 warps; a block owns BN keys (each
 * warp 16 keys and dpad / DSPLIT of the head dims: the 256 instance splits
 * the dims over two warps so its dK and dV accumulators fit in registers)
 * and steps through query rows ATTN_CU_BWD_BM at a time. The dQ kernel: 4
 * warps of 16 query rows, stepping through keys BN at a time. */
#define ATTN_CU_BWD_BM 32
#define ATTN_CU_BWD_BN_D64 64
#define ATTN_CU_BWD_BN_D128 64
#define ATTN_CU_BWD_BN_D256 32
#define ATTN_CU_BWDQ_BM 64
#define ATTN_CU_BWDQ_BN_D64 64
#define ATTN_CU_BWDQ_BN_D128 32
#define ATTN_CU_BWDQ_BN_D256 16
/* The F32 backward: a quad of threads per key (dK/dV) or per query row
 * (dQ), 32 of them per block, stepping 16 rows or keys at a time. */
#define ATTN_CU_BWD_F32_BN 32
#define ATTN_CU_BWD_F32_STEP 16

typedef enum attn_cu_kernel {
  /* tensor cores, one instance per padded head dim (dp <= 64, 96, ...) */
  ATTN_CU_MMA_D64 = 0,
  ATTN_CU_MMA_D96,
  ATTN_CU_MMA_D128,
  ATTN_CU_MMA_D160,
  ATTN_CU_MMA_D192,
  ATTN_CU_MMA_D256,    /* any dp <= 256 (the generic instance) */
  ATTN_CU_SIMT_F32,    /* F32 on the FMA units, exact F32, any dp <= 256 */
  ATTN_CU_BWD_MMA_D64, /* backward on tensor cores, dp <= 64 */
  ATTN_CU_BWD_MMA_D128,
  ATTN_CU_BWD_MMA_D256,
  ATTN_CU_BWD_SIMT_F32, /* backward in F32 on the FMA units */
  /* Hopper (sm_90a) forward: TMA, wgmma, warp specialization; chosen only
   * through attn_cu_select_hopper(), never by attn_cu_select(). */
  ATTN_CU_HOPPER_D64,
  ATTN_CU_HOPPER_D96,
  ATTN_CU_HOPPER_D128,
  ATTN_CU_HOPPER_D192,
  ATTN_CU_HOPPER_D256,
  /* The decode kernel (decode.cuh): keys in the MMA's M, a KV group's
   * <= ATTN_CU_DEC_ROWS query rows in N, dp <= 64, <= 128 and <= 256. */
  ATTN_CU_DECODE_D64,
  ATTN_CU_DECODE_D128,
  ATTN_CU_DECODE_D256,
  ATTN_CU_KERNEL_COUNT
} attn_cu_kernel;

/* What a launch needs, on device pointers. */
typedef struct attn_cu_params {
  attn_pass pass; /* ATTN_FORWARD (0) or ATTN_BACKWARD */
  const void *q, *k, *v;
  void *o;            /* forward: written; backward: read */
  float *m, *l, *lse; /* F32 [B, Hq, Nq], or NULL; backward: lse is read */
  /* Backward only: dO (read), dQ, dK, dV (written), and attn_cu_bwd_bytes()
   * of scratch (D and lse·log2 e, F32 [B, Hq, Nq] each). */
  const void *dout;
  void *dq, *dk, *dv;
  float *bwd_ws;
  /* Split-KV scratch, attn_cu_split_bytes() of it (NULL when nsplit is 1):
   * per split, F32 partial outputs [B, Hq, Nq, dp] normalized by their own
   * l, and (m in log2 units, l) pairs [B, Hq, Nq, 2]; for the decode
   * kernel then a 32-bit counter per (batch, KV head), which its launch
   * zeroes (decode_layout.h). */
  void *split_ws;
  attn_dtype dtype;
  int batch, heads_q, heads_kv, seq_q, seq_kv, head_dim, dp;
  float scale_log2; /* scale * log2(e) */
  float scale;      /* the scale itself (the backward's dQ and dK) */
  /* Effective window, causal folded in; -1 unbounded (as is anything past
   * 2^40, beyond every sequence the kernels take). */
  int64_t window_left, window_right;
  int64_t off; /* the mask's diagonal offset, attn_request_offset() */
  /* Issue 17's variants, in log2 units like scale_log2 (attn_cu_variant()
   * in layout.h): cap2 = softcap · log2 e (0: off) and its inverse; alibi2,
   * NULL when off, the per-(batch, head) −slope · log2 e, F32 [B, Hq] on
   * the device (4-byte aligned). Uniform per launch: a plain request's
   * kernels take one branch per tile, never per element. */
  float cap2, inv_cap2;
  const float *alibi2;
  /* The paged view of K and V (header comment): device arrays
   * [B·Hkv·pages_per_head] of page numbers, both set or both NULL (NULL:
   * K and V are the packed k and v, which a paged launch never reads);
   * the page pool's base, 16-byte aligned; bytes from one page to the
   * next, a multiple of 256 and at least page_tokens·dp·element size;
   * rows per page, a multiple of 64; table entries per (b, hk), at least
   * ceil(seq_kv / page_tokens), B·Hkv·pages_per_head of them below 2^31
   * (32-bit indices). The page numbers themselves are device
   * data: the caller vouches that each names a page of the pool. */
  const int32_t *k_table, *v_table;
  const unsigned char *page_base;
  size_t page_bytes;
  int page_tokens, pages_per_head;
  /* Device [B] or NULL: entry b attends keys [0, seqused_k[b]) only, and
   * its mask's diagonal offset is seqused_k[b] - seq_q (bottom-right
   * aligned, as a session call's is), replacing off; seq_kv is then the
   * largest of them (what the grid and the split-KV ranges are sized
   * for). Only with a paged view (k_table set); 4-byte aligned. Device
   * data again: the kernels clamp each to [0, seq_kv]. Last in the struct,
   * so the packed instances' parameter offsets stay as they were. */
  const int32_t *seqused_k;
  /* Backward: nonzero asks for the atomic path (header comment), which
   * attn_cu_select takes unless ATTN_CU_ATOMIC_DQ_BIT is off; bwd_ws then
   * holds the F32 dQ accumulator too. Appended last, as seqused_k. */
  int bwd_atomic_dq;
} attn_cu_params;

/* The decode kernel's instances (bit k: kernel k). */
#define ATTN_CU_DECODE_KERNELS \
  (1u << ATTN_CU_DECODE_D64 | 1u << ATTN_CU_DECODE_D128 | 1u << ATTN_CU_DECODE_D256)

/* page_tokens is a multiple of this, which every forward key tile divides. */
#define ATTN_CU_PAGE_ALIGN_TOKENS 64
#define ATTN_CU_PAGE_ALIGN_BYTES 256
/* The kernels with a paged instance (bit k: kernel k). Not the 160 one: at
 * 255 registers, its paged variant spills on sm_80 and sm_89, so a paged
 * dp in 129..160 takes the 192 instance (whose 64-row blocks suit the
 * decodes paging is for). */
#define ATTN_CU_PAGED_KERNELS                                                 \
  (1u << ATTN_CU_MMA_D64 | 1u << ATTN_CU_MMA_D96 | 1u << ATTN_CU_MMA_D128 |   \
   1u << ATTN_CU_MMA_D192 | 1u << ATTN_CU_MMA_D256 | 1u << ATTN_CU_SIMT_F32 | \
   ATTN_CU_DECODE_KERNELS)

/* The kernel chosen for a request and its launch shape. */
typedef struct attn_cu_choice {
  attn_cu_kernel kernel;
  int block_m, block_n, warps;
  int nsplit;        /* key ranges computed apart and merged by lse; >= 1 */
  size_t smem_bytes; /* dynamic shared memory of one block */
  /* Query heads per forward block: 1, or the GQA group Hq / Hkv stacked in
   * the block's rows (attn_cu_block_row in layout.h) when group · Nq fits
   * in block_m, so each K/V tile is read once per group (tensor-core
   * instances only). */
  int pack;
  unsigned grid[3]; /* query tiles, heads_q / pack, batch * nsplit */
  /* Backward: block_n keys per dK/dV block, block_m query rows per step,
   * smem_bytes and grid (key blocks, heads_kv, batch) of that kernel; the
   * dQ kernel's tiles, shared memory and grid (query tiles, heads_q,
   * batch). Zero for a forward pass, and on the backward's atomic path
   * (no dQ kernel: attn_cu_is_atomic_dq). */
  int dq_block_m, dq_block_n;
  size_t dq_smem_bytes;
  unsigned dq_grid[3];
} attn_cu_choice;

/* Whether kernel k is one of the decode kernel's instances. */
static inline bool attn_cu_is_decode(attn_cu_kernel k) {
  return (unsigned)k < 32 && (ATTN_CU_DECODE_KERNELS >> k & 1);
}
/* Whether a choice takes the backward's atomic dQ path: a backward kernel
 * with no dQ grid. */
static inline bool attn_cu_is_atomic_dq(const attn_cu_choice *c) {
  return c->kernel >= ATTN_CU_BWD_MMA_D64 && c->kernel <= ATTN_CU_BWD_SIMT_F32 &&
         c->dq_grid[0] == 0;
}

/* Names of the kernels, for logs and the benchmark ("mma_d128", ...). */
const char *attn_cu_kernel_name(attn_cu_kernel k);

/* dp for a head dim. */
int attn_cu_dp(int64_t head_dim);

/*
 * Picks the kernel for a request whose shape fields (dtype, batch, heads,
 * seq lengths, head_dim, dp, windows) are set, on a device with `sms`
 * multiprocessors. With seqused_k, seq_kv is the largest entry's length:
 * the choice (splits included) is the one for that length. Returns 0, or ATTN_EUNSUPPORTED with a
 * message when no kernel can run it (sequences longer than ATTN_CU_MAX_SEQ, grids past the
 * hardware's limits).
 */
int attn_cu_select(const attn_cu_params *p, int sms, attn_cu_choice *c, attn_status *st);

/*
 * The same, skipping what a start-up self-check disabled: bit k of off
 * (1u << ATTN_CU_MMA_D64, ...) turns kernel k off, and ATTN_CU_SPLIT_BIT
 * the split-KV path (its merge), ATTN_CU_PACK_BIT the GQA packing. A disabled head-dim instance
 * falls back to the next larger one; ATTN_EUNSUPPORTED when none is left. The Hopper instances are
 * the other way round: a clear bit (ATTN_CU_HOPPER_OFF) lets an F16/BF16 forward choice that needs
 * no key split take the Hopper instance of its head dim, which the backend allows only after the
 * self-check passed it; attn_cu_select() passes ATTN_CU_HOPPER_OFF.
 */
#define ATTN_CU_SPLIT_BIT (1u << ATTN_CU_KERNEL_COUNT)
/* ... and ATTN_CU_PACK_BIT the GQA packing (attn_cu_choice.pack). */
#define ATTN_CU_PACK_BIT (1u << (ATTN_CU_KERNEL_COUNT + 1))
/* ... and ATTN_CU_ATOMIC_DQ_BIT the backward's atomic path (the choice
 * is then the deterministic one whatever params.bwd_atomic_dq says). */
#define ATTN_CU_ATOMIC_DQ_BIT (1u << (ATTN_CU_KERNEL_COUNT + 2))
#define ATTN_CU_HOPPER_OFF                                                           \
  (1u << ATTN_CU_HOPPER_D64 | 1u << ATTN_CU_HOPPER_D96 | 1u << ATTN_CU_HOPPER_D128 | \
   1u << ATTN_CU_HOPPER_D192 | 1u << ATTN_CU_HOPPER_D256)
int attn_cu_select_masked(const attn_cu_params *p, int sms, unsigned off, attn_cu_choice *c,
                          attn_status *st);

/* Bytes of split-KV scratch the choice needs (0 when nsplit is 1). */
size_t attn_cu_split_bytes(const attn_cu_params *p, const attn_cu_choice *c);

/* Bytes of the backward's scratch (bwd_ws; 0 for a forward pass): D and
 * lse·log2 e, and with params.bwd_atomic_dq the F32 dQ accumulator
 * [B, Hq, Nq, dp] from float attn_cu_bwd_dq_at() (layout.h) on. */
size_t attn_cu_bwd_bytes(const attn_cu_params *p);

/*
 * The Hopper instance (hopper.cuh). It is compile-verified only, so
 * nothing selects it by default: attn_cu_select_masked() with its bit clear
 * (after the backend's self-check passed it on the device) turns a forward
 * choice into the Hopper one with attn_cu_select_hopper(), which returns 1
 * when it did (F16/BF16 forward, a positive scale, dp <= 256, no key split,
 * packed K and V) and 0, leaving c alone, otherwise. attn_cu_hopper_of()
 * names the instance of a padded head dim (64, 96, 128, 192, 256 classes).
 * attn_cu_hopper_built() says whether this build holds its sm_90a code
 * (CUDA_ARCHS with 90a); its launch returns cudaErrorNotSupported when not,
 * or when the device is not compute capability 9.0.
 */
int attn_cu_hopper_built(void);
int attn_cu_select_hopper(const attn_cu_params *p, int sms, attn_cu_choice *c);
attn_cu_kernel attn_cu_hopper_of(int dp);

/* Keys per K/V tile and ring depth of the Hopper instance of a padded head
 * dim class (64, 96, 128, 192, 256), within 227 KiB of shared memory
 * (attn_cu_hp_smem) and a consumer's 240 registers: O (dpad / 2 floats),
 * S (bn / 2) and P (bn / 4 words) per thread. The 96 class stores its
 * tiles as the 128 one does (dpad 128: whole 64-column panels, which the
 * 128-byte swizzle's N-major V operand needs) and saves the QKᵀ steps
 * of the zero columns (attn_cu_hp_qk_steps). */
#define ATTN_CU_HP_BN_D64 128
#define ATTN_CU_HP_BN_D96 128
#define ATTN_CU_HP_BN_D128 128
#define ATTN_CU_HP_BN_D192 64
#define ATTN_CU_HP_BN_D256 32
#define ATTN_CU_HP_STAGES_D64 3
#define ATTN_CU_HP_STAGES_D96 2
#define ATTN_CU_HP_STAGES_D128 2
#define ATTN_CU_HP_STAGES_D192 2
#define ATTN_CU_HP_STAGES_D256 3

/*
 * A TMA tensor map of the Hopper instance, as the host encodes it: a 3-D
 * view (dp, rows of a head, heads x batch) of a packed tensor, so a box
 * that runs past a head's last row is zero-filled (loads) or clipped
 * (stores) instead of touching the next head. dims in elements, strides in
 * bytes (dims 1 and 2), box in elements (64 columns: the 128-byte swizzle's
 * width).
 */
typedef enum attn_cu_tmap_which {
  ATTN_CU_TM_Q,
  ATTN_CU_TM_K,
  ATTN_CU_TM_V,
  ATTN_CU_TM_O
} attn_cu_tmap_which;
typedef struct attn_cu_tmap_spec {
  const void *base;
  unsigned long long dims[3], strides[2];
  unsigned box[3];
} attn_cu_tmap_spec;
void attn_cu_hp_tmap_spec(const attn_cu_params *p, const attn_cu_choice *c,
                          attn_cu_tmap_which which, attn_cu_tmap_spec *s);

/*
 * Once per device, with that device current: raises the kernels' dynamic
 * shared memory limits. Returns a cudaError_t (0 on success).
 */
int attn_cu_prepare(void);

/*
 * Whether a launch keeps the kernels' contract: every tensor the choice
 * reads or writes through cp.async or vector stores (q k v o, dout dq dk
 * dv, split_ws, bwd_ws) non-NULL and 16-byte aligned, the F32 statistics
 * 4-byte aligned, dp the head dim padded to a multiple of 8; a paged launch
 * (k_table set) its paged view's contract instead of k and v (the
 * attn_cu_params comment), on a forward instance that reads pages;
 * seqused_k only on a paged launch, 4-byte aligned; an atomic backward
 * choice (no dQ grid) only with params.bwd_atomic_dq, which sizes bwd_ws
 * for its accumulator. A
 * launch that breaks it would fault inside the kernel and poison the
 * context, so attn_cu_launch() refuses it first (cudaErrorInvalidValue),
 * which fails the job alone.
 */
bool attn_cu_launch_ok(const attn_cu_params *p, const attn_cu_choice *c);

/*
 * Queues the forward pass (and the split-KV merge), or for a backward
 * choice the backward's three kernels (on the atomic path: the preprocess,
 * the dK/dV kernel and dQ's conversion), on a cudaStream_t.
 * Returns a cudaError_t from the launch (0 on success; cudaErrorInvalidValue
 * without launching when attn_cu_launch_ok() is false); faults inside the
 * kernel surface later, on the stream.
 */
int attn_cu_launch(const attn_cu_params *p, const attn_cu_choice *c, void *stream);

/*
 * The input check, on the device: for each of n elements of x (dtype dt),
 * the largest finite magnitude goes to res->maxabs_bits (float bits, atomic
 * max) and the index of the first non-finite element to res->first_bad
 * (atomic min). res is device memory that must start as {first_bad = ~0,
 * maxabs_bits = 0}. Returns a cudaError_t.
 */
typedef struct attn_cu_scan_result {
  unsigned long long first_bad; /* ~0ull: none */
  unsigned int maxabs_bits;
  unsigned int pad_;
} attn_cu_scan_result;
int attn_cu_scan(const void *x, attn_dtype dt, size_t n, attn_cu_scan_result *res, void *stream);

/*
 * A paged job's new rows into their pages, on the device: row i, row_bytes
 * at src + i·row_bytes (packed, padding already zero), goes to base +
 * dst[i]. row_bytes, src, base and every dst[i] are multiples of 16.
 * Queued on the stream before the kernel that reads the pages. Returns a
 * cudaError_t.
 */
int attn_cu_put_rows(const void *src, const long long *dst, unsigned char *base, size_t rows,
                     size_t row_bytes, void *stream);

#ifdef __cplusplus
}
#endif
#endif
