/*
 * test_cuda_hopper.c — the Hopper instance's index arithmetic (hopper_layout.h,
 * hopper_select.c) on the CPU.
 *
 * The PTX ISA's definitions are written here independently of the header:
 * the wgmma m64nNk16 register fragments (figures "WGMMA .m64nNk16 register
 * fragment layout" for A and D), the 128-byte swizzle as the tensor copy
 * applies it (16-byte chunk bits 4-6 of an address XORed with bits 7-9),
 * the matrix descriptor's fields and the canonical K-major and MN-major
 * 128B-swizzled layouts it describes, stmatrix, and mbarrier phases. A
 * warpgroup is then emulated: TMA writes Q, K and V into a byte-addressed
 * shared memory, wgmma reads them through the descriptors hopper.cuh builds,
 * S = Q Kᵀ and O = P V must match float64, and O goes back out through
 * stmatrix and a TMA store. The ring, the ping-pong barriers and the
 * persistent schedule are run as small simulations.
 */
#include "cuda/hopper_layout.h"
#include "cuda/kernels.h"
#include "helpers.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- the PTX ISA's definitions ---------------------------------------------- */

/* D of m64nN: thread x's element i. */
static void ptx_d(int x, int i, int *row, int *col) {
  int warp = x >> 5, lane = x & 31;
  *row = warp * 16 + (lane >> 2) + ((i >> 1) & 1) * 8;
  *col = (i >> 2) * 8 + (lane & 3) * 2 + (i & 1);
}
/* A of m64k16 in registers: a0..a7. */
static void ptx_a(int x, int i, int *row, int *col) {
  int warp = x >> 5, lane = x & 31;
  static const int dr[8] = {0, 0, 8, 8, 0, 0, 8, 8}, dc[8] = {0, 1, 0, 1, 8, 9, 8, 9};
  *row = warp * 16 + (lane >> 2) + dr[i];
  *col = (lane & 3) * 2 + dc[i];
}
/* The 128B swizzle on a shared-memory byte address. */
static uint32_t swz(uint32_t a) { return a ^ (((a >> 7) & 7) << 4); }

/* Descriptor fields. */
typedef struct desc {
  uint32_t start, lbo, sbo;
  int mode;
} desc;
static desc decode(uint64_t d) {
  desc r = {(uint32_t)(d & 0x3fff) << 4, (uint32_t)(d >> 16 & 0x3fff) << 4,
            (uint32_t)(d >> 32 & 0x3fff) << 4, (int)(d >> 62)};
  cr_assert_eq((d >> 49) & 7, 0, "base offset must be 0 (panels are 1024-aligned)");
  return r;
}
/* Canonical 128B-swizzled layouts of 2-byte elements (8 per 16 bytes):
 * K-major ((8,m),(T,8 chunks)) with 8-row groups SBO apart; MN-major with
 * 64 MN elements per 128-byte row, 64-element groups LBO apart, rows along
 * K, 8-row groups SBO apart. */
static uint32_t kmajor(desc d, int mn, int k) {
  return swz(d.start + (uint32_t)(mn / 8) * d.sbo + (uint32_t)(mn % 8) * 128 + (uint32_t)k * 2);
}
static uint32_t mnmajor(desc d, int k, int mn) {
  return swz(d.start + (uint32_t)(mn / 64) * d.lbo + (uint32_t)(mn % 64) * 2 +
             (uint32_t)(k % 8) * 128 + (uint32_t)(k / 8) * d.sbo);
}

/* ---- fragments ---------------------------------------------------------------- */

Test(cuda_hopper, fragments_match_ptx_figures) {
  for (int n = 64; n <= 256; n *= 2) {
    char *seen = calloc((size_t)64 * n, 1);
    for (int x = 0; x < 128; x++)
      for (int i = 0; i < n / 2; i++) {
        int r, c, pr, pc;
        attn_cu_hp_acc(x, i, &r, &c);
        ptx_d(x, i, &pr, &pc);
        cr_assert(r == pr && c == pc, "D n%d thread %d d%d: (%d,%d), PTX (%d,%d)", n, x, i, r, c,
                  pr, pc);
        seen[r * n + c]++;
      }
    for (int e = 0; e < 64 * n; e++)
      cr_assert_eq(seen[e], 1, "D n%d element %d held %d times", n, e, seen[e]);
    free(seen);
  }
  char seen_a[64][16] = {{0}};
  for (int x = 0; x < 128; x++)
    for (int e = 0; e < 8; e++) {
      int r, c, pr, pc;
      attn_cu_hp_frag_a(x, e, &r, &c);
      ptx_a(x, e, &pr, &pc);
      cr_assert(r == pr && c == pc, "A thread %d a%d: (%d,%d), PTX (%d,%d)", x, e, r, c, pr, pc);
      seen_a[r][c]++;
    }
  for (int r = 0; r < 64; r++)
    for (int c = 0; c < 16; c++)
      cr_assert_eq(seen_a[r][c], 1);
  /* S's accumulator pairs become P's A registers in place: same thread,
   * same row, column shifted by the k step. */
  for (int x = 0; x < 128; x++)
    for (int kk = 0; kk < 8; kk++)
      for (int e = 0; e < 8; e++) {
        int ar, ac, dr, dc;
        attn_cu_hp_frag_a(x, e, &ar, &ac);
        attn_cu_hp_acc(x, attn_cu_hp_acc_pair(kk, e / 2) + e % 2, &dr, &dc);
        cr_assert(dr == ar && dc == 16 * kk + ac, "thread %d k%d a%d", x, kk, e);
      }
}

/* ---- the swizzle -------------------------------------------------------------- */

/* Where a TMA load with SWIZZLE_128B and a 64-element box puts element
 * (row, col) of panel col / 64, the panel's box landing at base + panel x
 * rows x 128 (base 1024-aligned). */
static uint32_t tma_place(uint32_t base, int row, int col, int rows) {
  return swz(base + (uint32_t)(col / 64) * (uint32_t)rows * 128 + (uint32_t)row * 128 +
             (uint32_t)(col % 64) * 2);
}

Test(cuda_hopper, swizzle_matches_the_tensor_copy) {
  for (int rows = 64; rows <= 128; rows *= 2)
    for (int dpad = 64; dpad <= 256; dpad *= 2) {
      char *seen = calloc((size_t)rows * dpad * 2, 1);
      for (int r = 0; r < rows; r++)
        for (int c = 0; c < dpad; c++) {
          uint32_t off = attn_cu_hp_off(r, c, rows);
          cr_assert_eq(off, tma_place(0, r, c, rows), "rows %d (%d,%d)", rows, r, c);
          cr_assert_lt(off, (uint32_t)(rows * dpad * 2));
          seen[off]++;
          /* 8 consecutive elements of a chunk stay contiguous (stmatrix
           * and the 16-byte rows of a core matrix need it). */
          if (c % 8)
            cr_assert_eq(off, attn_cu_hp_off(r, c - 1, rows) + 2);
        }
      for (int b = 0; b < rows * dpad * 2; b += 2)
        cr_assert_eq(seen[b], 1, "byte %d", b);
      free(seen);
    }
  /* The 8 rows of a core matrix (one 16-byte chunk column) hit 8 distinct
   * bank quads: the point of the swizzle. */
  for (int c = 0; c < 64; c += 8) {
    int quads = 0;
    for (int r = 0; r < 8; r++)
      quads |= 1 << (attn_cu_hp_off(r, c, 64) % 128 / 16);
    cr_assert_eq(quads, 0xff, "chunk %d", c / 8);
  }
}

Test(cuda_hopper, descriptor_fields) {
  uint64_t d = attn_cu_hp_desc(0x12340, 0x2000, 1024);
  desc f = decode(d);
  cr_assert(f.start == 0x12340 && f.lbo == 0x2000 && f.sbo == 1024 && f.mode == 1);
  cr_assert_eq(d >> 62, 1, "128B swizzle is mode 1");
  /* The descriptors of the kernel's tiles start on 16 bytes and, for the
   * first k step, on a 1024-byte panel boundary. */
  for (int kk = 0; kk < 16; kk++) {
    desc q = decode(attn_cu_hp_desc_k(0, ATTN_CU_HP_BM, 64, kk));
    cr_assert_eq(q.start % 16, 0);
    cr_assert_eq((q.start - (uint32_t)(kk % 4) * 32) % 1024, 0);
    cr_assert_eq(q.sbo, 1024);
  }
}

/* ---- a warpgroup, emulated ------------------------------------------------------ */

/* Shared memory as float per 2-byte slot, addressed in bytes. */
typedef struct smem {
  float *v;
  uint32_t bytes;
} smem;
static float *at(smem *m, uint32_t a) {
  cr_assert(a % 2 == 0 && a < m->bytes, "address %u outside %u bytes", a, m->bytes);
  return &m->v[a / 2];
}

/* wgmma m64nNk16 with A from a descriptor (K-major) or from registers
 * (a[x][e], PTX figure), B from a descriptor (K-major, or N-major for
 * trans_b), D per the PTX figure: d[x][i] += sum_k A B. */
static void emu_wgmma(smem *m, int n, const uint64_t *da, float (*a)[8], uint64_t db, int trans_b,
                      float (*d)[128]) {
  static double A[64][16], B[16][256];
  if (da) {
    desc f = decode(*da);
    for (int r = 0; r < 64; r++)
      for (int k = 0; k < 16; k++)
        A[r][k] = *at(m, kmajor(f, r, k));
  } else {
    for (int x = 0; x < 128; x++)
      for (int e = 0; e < 8; e++) {
        int r, k;
        ptx_a(x, e, &r, &k);
        A[r][k] = a[x][e];
      }
  }
  desc f = decode(db);
  cr_assert_eq(f.mode, 1);
  for (int k = 0; k < 16; k++)
    for (int j = 0; j < n; j++)
      B[k][j] = *at(m, trans_b ? mnmajor(f, k, j) : kmajor(f, j, k));
  for (int x = 0; x < 128; x++)
    for (int i = 0; i < n / 2; i++) {
      int r, c;
      ptx_d(x, i, &r, &c);
      double acc = d[x][i];
      for (int k = 0; k < 16; k++)
        acc += A[r][k] * B[k][c];
      d[x][i] = (float)acc;
    }
}

/* stmatrix.m8n8.x4 of one warp: lane l gives the address of row l % 8 of
 * matrix l / 8; register j of lane l holds row l / 4, elements 2(l % 4)
 * and +1, of matrix j. */
static void emu_stsm(smem *m, const uint32_t addr[32], float r[32][4][2]) {
  for (int l = 0; l < 32; l++)
    for (int j = 0; j < 4; j++)
      for (int h = 0; h < 2; h++)
        *at(m, addr[8 * j + l / 4] + (uint32_t)(2 * (l % 4) + h) * 2) = r[l][j][h];
}

/* One consumer warpgroup c's 64 rows of a work unit: Q (128 x dp), one K/V
 * tile of bn keys, cls the instance's head-dim class (its tiles dpad wide). */
static void wg_tile(int cls, int dp, int bn, int stages, int c, uint64_t seed) {
  const int bm = ATTN_CU_HP_BM, slot = stages - 1, dpad = attn_cu_hp_dpad(cls);
  smem m = {NULL, attn_cu_hp_bar_off(dpad, bn, stages)};
  m.v = malloc(m.bytes / 2 * sizeof(float));
  for (uint32_t i = 0; i < m.bytes / 2; i++)
    m.v[i] = NAN; /* nothing the kernel reads may be unwritten */
  double *Q = malloc(sizeof(double) * (size_t)bm * dpad);
  double *K = malloc(sizeof(double) * (size_t)bn * dpad);
  double *V = malloc(sizeof(double) * (size_t)bn * dpad);
  /* TMA zero-fills columns past dp (outside the tensor map's dim 0). */
  for (int r = 0; r < bm; r++)
    for (int col = 0; col < dpad; col++) {
      Q[r * dpad + col] = col < dp ? tuniform(&seed) : 0.0;
      *at(&m, tma_place(0, r, col, bm)) = (float)Q[r * dpad + col];
    }
  const uint32_t sk = attn_cu_hp_k_off(dpad, bn, slot), sv = attn_cu_hp_v_off(dpad, bn, slot);
  cr_assert(sk % 1024 == 0 && sv % 1024 == 0, "slots must be 1024-aligned");
  for (int r = 0; r < bn; r++)
    for (int col = 0; col < dpad; col++) {
      K[r * dpad + col] = col < dp ? tuniform(&seed) : 0.0;
      V[r * dpad + col] = col < dp ? tuniform(&seed) : 0.0;
      *at(&m, tma_place(sk, r, col, bn)) = (float)K[r * dpad + col];
      *at(&m, tma_place(sv, r, col, bn)) = (float)V[r * dpad + col];
    }
  /* S = Q Kᵀ as hp_issue_qk issues it (the 96 class stops short of the
   * zero columns; the reference sums over all of dpad). */
  float(*s)[128] = calloc(128, sizeof *s), (*o)[128] = calloc(128, sizeof *o);
  for (int kk = 0; kk < attn_cu_hp_qk_steps(cls); kk++) {
    uint64_t da = attn_cu_hp_desc_k(0, bm, ATTN_CU_HP_WG_ROWS * c, kk);
    emu_wgmma(&m, bn, &da, NULL, attn_cu_hp_desc_k(sk, bn, 0, kk), 0, s);
  }
  static double S[64][256];
  for (int x = 0; x < 128; x++)
    for (int i = 0; i < bn / 2; i++) {
      int r, j;
      attn_cu_hp_acc(x, i, &r, &j);
      double ref = 0;
      for (int d = 0; d < dpad; d++)
        ref += Q[(64 * c + r) * dpad + d] * K[j * dpad + d];
      S[r][j] = ref;
      cr_assert(fabs(s[x][i] - ref) <= 1e-4 * (1 + fabs(ref)), "S[%d][%d]: %g, expected %g", r, j,
                s[x][i], ref);
    }
  /* O = P V with P = S from registers, as hp_issue_pv issues it. */
  for (int kk = 0; kk < bn / 16; kk++) {
    float(*a)[8] = calloc(128, sizeof *a);
    for (int x = 0; x < 128; x++)
      for (int e = 0; e < 8; e++)
        a[x][e] = s[x][attn_cu_hp_acc_pair(kk, e / 2) + e % 2];
    emu_wgmma(&m, dpad, NULL, a, attn_cu_hp_desc_mn(sv, bn, kk), 1, o);
    free(a);
  }
  static double O[64][256];
  for (int x = 0; x < 128; x++)
    for (int i = 0; i < dpad / 2; i++) {
      int r, d;
      attn_cu_hp_acc(x, i, &r, &d);
      double ref = 0;
      for (int j = 0; j < bn; j++)
        ref += S[r][j] * V[j * dpad + d];
      O[r][d] = ref;
      cr_assert(fabs(o[x][i] - ref) <= 1e-3 * (1 + fabs(ref)), "O[%d][%d]: %g, expected %g", r, d,
                o[x][i], ref);
    }
  /* The epilogue: stmatrix into O's staging, as hp_epilogue addresses it,
   * then a TMA store of the 64-row box of each panel reads it back; Q's
   * space, where the next unit's Q may be loading, is left alone. */
  const uint32_t so = attn_cu_hp_o_off(dpad);
  cr_assert(so % 1024 == 0 && so >= (uint32_t)(bm * dpad * 2) &&
            so + (uint32_t)(bm * dpad * 2) <= attn_cu_hp_k_off(dpad, bn, 0));
  for (int w = 0; w < 4; w++)
    for (int kk = 0; kk < dpad / 16; kk++) {
      uint32_t addr[32];
      float r[32][4][2];
      for (int l = 0; l < 32; l++) {
        int lr, lc, x = 32 * w + l;
        attn_cu_ldsm_q(l, &lr, &lc);
        addr[l] = so + attn_cu_hp_off(ATTN_CU_HP_WG_ROWS * c + 16 * w + lr, 16 * kk + lc, bm);
        for (int j = 0; j < 4; j++) {
          int i = attn_cu_hp_acc_pair(kk, j);
          r[l][j][0] = o[x][i], r[l][j][1] = o[x][i + 1];
        }
      }
      emu_stsm(&m, addr, r);
    }
  for (int pn = 0; pn < dpad / 64; pn++) {
    uint32_t box = so + (uint32_t)(pn * bm * 128 + ATTN_CU_HP_WG_ROWS * c * 128);
    cr_assert_eq(box % 1024, 0);
    for (int r = 0; r < ATTN_CU_HP_WG_ROWS; r++)
      for (int d = 0; d < 64; d++) {
        float got = *at(&m, swz(box + (uint32_t)r * 128 + (uint32_t)d * 2));
        double ref = O[r][64 * pn + d];
        cr_assert(fabs(got - ref) <= 1e-3 * (1 + fabs(ref)), "stored O[%d][%d]: %g, expected %g", r,
                  64 * pn + d, got, ref);
      }
  }
  for (int r = 0; r < bm; r++)
    for (int col = 0; col < dpad; col++)
      cr_assert_eq(*at(&m, tma_place(0, r, col, bm)), (float)Q[r * dpad + col],
                   "the epilogue wrote into Q's space at (%d, %d)", r, col);
  free(m.v), free(Q), free(K), free(V), free(s), free(o);
}

Test(cuda_hopper, warpgroup_emulation_d64) {
  wg_tile(64, 64, ATTN_CU_HP_BN_D64, ATTN_CU_HP_STAGES_D64, 0, 1);
  wg_tile(64, 40, ATTN_CU_HP_BN_D64, ATTN_CU_HP_STAGES_D64, 1, 2);
}
Test(cuda_hopper, warpgroup_emulation_d96) {
  /* stored as the 128 class is, two of its eight QKᵀ steps saved */
  cr_assert(attn_cu_hp_dpad(96) == 128 && attn_cu_hp_qk_steps(96) == 6);
  wg_tile(96, 96, ATTN_CU_HP_BN_D96, ATTN_CU_HP_STAGES_D96, 0, 9);
  wg_tile(96, 72, ATTN_CU_HP_BN_D96, ATTN_CU_HP_STAGES_D96, 1, 10);
}
Test(cuda_hopper, warpgroup_emulation_d128) {
  wg_tile(128, 128, ATTN_CU_HP_BN_D128, ATTN_CU_HP_STAGES_D128, 1, 3);
  wg_tile(128, 72, ATTN_CU_HP_BN_D128, ATTN_CU_HP_STAGES_D128, 0, 4);
}
Test(cuda_hopper, warpgroup_emulation_d192) {
  wg_tile(192, 192, ATTN_CU_HP_BN_D192, ATTN_CU_HP_STAGES_D192, 0, 7);
  wg_tile(192, 136, ATTN_CU_HP_BN_D192, ATTN_CU_HP_STAGES_D192, 1, 8);
}
Test(cuda_hopper, warpgroup_emulation_d256) {
  wg_tile(256, 256, ATTN_CU_HP_BN_D256, ATTN_CU_HP_STAGES_D256, 0, 5);
  wg_tile(256, 200, ATTN_CU_HP_BN_D256, ATTN_CU_HP_STAGES_D256, 1, 6);
}

/* Every instance's regions lie apart, each 1024-aligned (the swizzle's and
 * the descriptors' base), and fit what one block may opt into on sm_90. */
Test(cuda_hopper, shared_memory_regions_apart_and_within_the_limit) {
  static const int cfg[][3] = {{64, ATTN_CU_HP_BN_D64, ATTN_CU_HP_STAGES_D64},
                               {96, ATTN_CU_HP_BN_D96, ATTN_CU_HP_STAGES_D96},
                               {128, ATTN_CU_HP_BN_D128, ATTN_CU_HP_STAGES_D128},
                               {192, ATTN_CU_HP_BN_D192, ATTN_CU_HP_STAGES_D192},
                               {256, ATTN_CU_HP_BN_D256, ATTN_CU_HP_STAGES_D256}};
  for (int i = 0; i < 5; i++) {
    const int dpad = attn_cu_hp_dpad(cfg[i][0]), bn = cfg[i][1], stages = cfg[i][2];
    uint32_t start[2 + 2 * 4], size[2 + 2 * 4];
    int nr = 0;
    start[nr] = 0, size[nr++] = (uint32_t)(ATTN_CU_HP_BM * dpad * 2);
    start[nr] = attn_cu_hp_o_off(dpad), size[nr++] = (uint32_t)(ATTN_CU_HP_BM * dpad * 2);
    for (int sl = 0; sl < stages; sl++) {
      start[nr] = attn_cu_hp_k_off(dpad, bn, sl), size[nr++] = (uint32_t)(bn * dpad * 2);
      start[nr] = attn_cu_hp_v_off(dpad, bn, sl), size[nr++] = (uint32_t)(bn * dpad * 2);
    }
    const uint32_t bars = attn_cu_hp_bar_off(dpad, bn, stages);
    for (int a = 0; a < nr; a++) {
      cr_assert_eq(start[a] % 1024, 0, "d%d region %d at %u", dpad, a, start[a]);
      cr_assert_leq(start[a] + size[a], bars, "d%d region %d runs into the barriers", dpad, a);
      for (int b = 0; b < a; b++)
        cr_assert(start[a] >= start[b] + size[b] || start[b] >= start[a] + size[a],
                  "d%d regions %d and %d overlap", dpad, a, b);
    }
    /* Q full, Q empty and four per slot, 8 bytes each, all distinct. */
    char used[2 + 4 * 4] = {0};
    used[ATTN_CU_HP_QFULL / 8]++, used[ATTN_CU_HP_QEMPTY / 8]++;
    for (int sl = 0; sl < stages; sl++) {
      used[attn_cu_hp_kfull(sl) / 8]++, used[attn_cu_hp_vfull(sl) / 8]++;
      used[attn_cu_hp_kempty(sl) / 8]++, used[attn_cu_hp_vempty(sl) / 8]++;
    }
    for (int b = 0; b < 2 + 4 * stages; b++)
      cr_assert_eq(used[b], 1, "d%d barrier %d used %d times", dpad, b, used[b]);
    cr_assert_eq(attn_cu_hp_smem(dpad, bn, stages), 1024 + bars + (2 + 4 * stages) * 8);
    cr_assert_leq(attn_cu_hp_smem(dpad, bn, stages), 232448, "d%d", dpad);
  }
}

/* ---- the K/V ring, simulated --------------------------------------------------- */

/* An mbarrier as the PTX ISA defines it: a phase completes when its
 * pending arrivals reach zero; try_wait.parity(P) succeeds once the phase
 * of parity P has completed, i.e. while the current phase's parity is not
 * P (a fresh barrier is in phase 0, so waiting on parity 1 passes). */
typedef struct mbar {
  int count, pending, phase;
} mbar;
static void mb_init(mbar *b, int count) { *b = (mbar){count, count, 0}; }
static void mb_arrive(mbar *b) {
  cr_assert_gt(b->pending, 0);
  if (--b->pending == 0)
    b->phase++, b->pending = b->count;
}
static bool mb_ready(const mbar *b, int parity) { return b->phase % 2 != parity; }

/*
 * The protocol of hopper.cuh's producer and consumers over a CTA's units,
 * as programs of steps: wait on a barrier's parity, take a buffer (its
 * content must be the one expected, and it counts as being read until
 * dropped), drop it (arrivals on its empty barrier), fill it (nobody may be
 * reading it; then its full barrier completes). The producer: per tile, K
 * of the tile, then the V owed for the tile before, then at a unit's first
 * tile its Q; a unit with no tiles, the owed V and its Q. A consumer (4
 * warps, each arriving): per unit, Q; the first tile's K, dropped once
 * S = Q Kᵀ is done; per later tile, the V before it and its K, K dropped
 * after S, V after O += P V; Q dropped after the unit's last S; then the
 * last V. Random interleavings must finish, read what was meant, and never
 * fill a buffer under a reader.
 */
enum { R_Q, R_K, R_V = R_K + 4, R_N = R_V + 4 }; /* buffers: Q, K and V slots */
enum { OP_WAIT, OP_TAKE, OP_DROP, OP_FILL };
typedef struct rop {
  int op, res, parity;
  int64_t id;
} rop;
typedef struct ring_sim {
  mbar full[R_N], empty[R_N];
  int64_t data[R_N];
  int readers[R_N];
} ring_sim;

static int emit(rop *p, int n, int op, int res, int parity, int64_t id) {
  p[n] = (rop){op, res, parity, id};
  return n + 1;
}
/* Producer fill of a buffer on its use `use` (0, 1, ...) with content id. */
static int fill(rop *p, int n, int res, int64_t use, int stages, int64_t id) {
  n = emit(p, n, OP_WAIT, -1 - res, attn_cu_hp_empty_parity(use, stages), 0);
  return emit(p, n, OP_FILL, res, 0, id);
}
static int take(rop *p, int n, int res, int64_t use, int stages, int64_t id) {
  int slot, parity;
  attn_cu_hp_ring(use, stages, &slot, &parity);
  n = emit(p, n, OP_WAIT, res, parity, 0);
  return emit(p, n, OP_TAKE, res, 0, id);
}
static int producer(rop *p, const int *tiles, int units, int stages) {
  int n = 0;
  int64_t it = 0, owed = -1;
  for (int u = 0; u < units; u++) {
    for (int t = 0; t < tiles[u]; t++, it++) {
      n = fill(p, n, R_K + (int)(it % stages), it, stages, it);
      if (owed >= 0)
        n = fill(p, n, R_V + (int)(owed % stages), owed, stages, owed);
      if (t == 0)
        n = fill(p, n, R_Q, u, 1, u);
      owed = it;
    }
    if (tiles[u] == 0) {
      if (owed >= 0)
        n = fill(p, n, R_V + (int)(owed % stages), owed, stages, owed);
      owed = -1;
      n = fill(p, n, R_Q, u, 1, u);
    }
  }
  if (owed >= 0)
    n = fill(p, n, R_V + (int)(owed % stages), owed, stages, owed);
  return n;
}
static int consumer(rop *p, const int *tiles, int units, int stages) {
  int n = 0;
  int64_t it = 0;
  for (int u = 0; u < units; u++) {
    n = take(p, n, R_Q, u, 1, u);
    for (int t = 0; t < tiles[u]; t++) {
      const int ks = R_K + (int)((it + t) % stages), vs = R_V + (int)((it + t - 1) % stages);
      if (t > 0)
        n = take(p, n, vs, it + t - 1, stages, it + t - 1);
      n = take(p, n, ks, it + t, stages, it + t);
      n = emit(p, n, OP_DROP, ks, 0, 0); /* S = Q Kᵀ done */
      if (t == tiles[u] - 1)
        n = emit(p, n, OP_DROP, R_Q, 0, 0);
      if (t > 0)
        n = emit(p, n, OP_DROP, vs, 0, 0); /* O += P V of the tile before done */
    }
    if (tiles[u] == 0)
      n = emit(p, n, OP_DROP, R_Q, 0, 0);
    else {
      const int vs = R_V + (int)((it + tiles[u] - 1) % stages);
      n = take(p, n, vs, it + tiles[u] - 1, stages, it + tiles[u] - 1);
      n = emit(p, n, OP_DROP, vs, 0, 0);
    }
    it += tiles[u];
  }
  return n;
}
/* One step of an actor; false when it is blocked. */
static bool ring_step(ring_sim *r, const rop *o) {
  switch (o->op) {
  case OP_WAIT:
    return o->res < 0 ? mb_ready(&r->empty[-1 - o->res], o->parity)
                      : mb_ready(&r->full[o->res], o->parity);
  case OP_TAKE:
    cr_assert_eq(r->data[o->res], o->id, "buffer %d holds %lld, read as %lld", o->res,
                 (long long)r->data[o->res], (long long)o->id);
    r->readers[o->res]++;
    return true;
  case OP_DROP:
    r->readers[o->res]--;
    for (int w = 0; w < 4; w++)
      mb_arrive(&r->empty[o->res]);
    return true;
  default:
    cr_assert_eq(r->readers[o->res], 0, "buffer %d filled under a reader", o->res);
    r->data[o->res] = o->id;
    mb_arrive(&r->full[o->res]);
    return true;
  }
}

Test(cuda_hopper, ring_phases_keep_producer_and_consumers_in_step) {
  uint64_t seed = 9;
  enum { MAXOPS = 4000 };
  rop *prog[3];
  for (int a = 0; a < 3; a++)
    prog[a] = malloc(MAXOPS * sizeof(rop));
  for (int stages = 2; stages <= 4; stages++)
    for (int trial = 0; trial < 100; trial++) {
      int units = 1 + (int)(trand(&seed) % 8), tiles[8];
      for (int u = 0; u < units; u++)
        tiles[u] = (int)(trand(&seed) % 6); /* 0: a unit that sees no key */
      ring_sim r;
      memset(&r, 0, sizeof r);
      for (int b = 0; b < R_N; b++)
        mb_init(&r.full[b], 1), mb_init(&r.empty[b], 8), r.data[b] = -1; /* 4 warps x 2 */
      int len[3] = {producer(prog[0], tiles, units, stages), 0, 0}, pc[3] = {0, 0, 0};
      len[1] = len[2] = consumer(prog[1], tiles, units, stages);
      memcpy(prog[2], prog[1], (size_t)len[1] * sizeof(rop));
      cr_assert_lt(len[0], MAXOPS);
      for (int guard = 0; guard < 1000000 && (pc[0] < len[0] || pc[1] < len[1] || pc[2] < len[2]);
           guard++) {
        int a = (int)(trand(&seed) % 3);
        if (pc[a] < len[a] && ring_step(&r, &prog[a][pc[a]]))
          pc[a]++;
      }
      cr_assert(pc[0] == len[0] && pc[1] == len[1] && pc[2] == len[2],
                "stalled: stages %d, units %d, at %d/%d %d/%d %d/%d", stages, units, pc[0], len[0],
                pc[1], len[1], pc[2], len[2]);
    }
  for (int a = 0; a < 3; a++)
    free(prog[a]);
}

/* ---- ping-pong between the consumers, simulated ----------------------------------- */

/* Named barrier of 256 threads: a warpgroup's bar.sync completes once the
 * other warpgroup has arrived (bar.arrive) as often as it has waited. */
Test(cuda_hopper, ping_pong_turns_alternate_and_balance) {
  uint64_t seed = 3;
  for (int trial = 0; trial < 300; trial++) {
    int arrivals[2] = {0, 0}, syncs[2] = {0, 0}; /* on barrier of consumer c */
    int units = 1 + (int)(trand(&seed) % 6), last = -1, turns = 0;
    int tiles[6];
    for (int u = 0; u < units; u++)
      tiles[u] = (int)(trand(&seed) % 5); /* 0: a unit with nothing visible */
    int unit[2] = {0, 0}, step[2] = {0, 0}, opened[2] = {0, 0};
    for (int guard = 0; guard < 10000 && (unit[0] < units || unit[1] < units); guard++) {
      int c = (int)(trand(&seed) % 2);
      if (unit[c] >= units)
        continue;
      int steps = attn_cu_hp_pp_steps(tiles[unit[c]]);
      if (!opened[c]) {
        arrivals[1 - c] += attn_cu_hp_pp_opens(c, steps);
        opened[c] = 1;
      }
      if (step[c] < steps) {
        if (arrivals[c] <= syncs[c])
          continue; /* blocked in bar.sync */
        syncs[c]++;
        cr_assert_neq(last, c, "consumer %d issued twice in a row", c);
        last = c, turns++;
        if (attn_cu_hp_pp_arrives(c, step[c], steps))
          arrivals[1 - c]++;
        step[c]++;
      }
      if (step[c] == steps)
        unit[c]++, step[c] = 0, opened[c] = 0;
    }
    cr_assert(unit[0] == units && unit[1] == units, "deadlock in trial %d", trial);
    cr_assert(arrivals[0] == syncs[0] && arrivals[1] == syncs[1], "arrivals left over");
    int want = 0;
    for (int u = 0; u < units; u++)
      want += 2 * attn_cu_hp_pp_steps(tiles[u]);
    cr_assert_eq(turns, want);
  }
}

/* ---- the persistent schedule and tile skipping ------------------------------------- */

/* Both orders visit every unit once. Sectioned (causal): within a section
 * the key tiles per unit never grow along the order, the first wave is the
 * last query tiles, and a section's pairs are consecutive. Unsectioned:
 * query tiles fastest, so the units at work at once share few heads. */
Test(cuda_hopper, schedule_covers_every_unit_in_its_order) {
  const int qtiles = 13, heads = 5, batch = 3, bn = 128;
  const int64_t nq = (int64_t)qtiles * ATTN_CU_HP_BM - 37, nkv = nq;
  const int64_t units = (int64_t)qtiles * heads * batch;
  for (int section = 0; section <= 16; section++) {
    char seen[13][5][3] = {{{0}}};
    int prev = 1 << 30;
    for (int64_t u = 0; u < units; u++) {
      int qt, h, b;
      attn_cu_hp_unit(u, qtiles, heads, batch, section, &qt, &h, &b);
      cr_assert(qt >= 0 && qt < qtiles && h >= 0 && h < heads && b >= 0 && b < batch);
      cr_assert_eq(seen[qt][h][b]++, 0, "section %d: unit (%d,%d,%d) twice", section, qt, h, b);
      const int pair = b * heads + h;
      if (section == 0) {
        cr_assert_eq(qt, (int)(u % qtiles), "query tiles go fastest");
        cr_assert_eq(pair, (int)(u / qtiles));
        continue;
      }
      const int64_t per = (int64_t)section * qtiles;
      cr_assert_eq(pair / section, (int)(u / per), "section %d: pair %d out of its section",
                   section, pair);
      int t0, t1;
      int64_t i0 = (int64_t)qt * ATTN_CU_HP_BM,
              i1 = i0 + ATTN_CU_HP_BM < nq ? i0 + ATTN_CU_HP_BM : nq;
      attn_cu_block_tiles(i0, i1, nkv - nq, -1, 0, nkv, bn, 1, 0, &t0, &t1);
      if (u % per == 0) {
        cr_assert_eq(qt, qtiles - 1, "a section starts with its longest units");
        prev = 1 << 30;
      }
      cr_assert_leq(t1 - t0, prev, "unit %lld has more tiles than the one before", (long long)u);
      prev = t1 - t0;
    }
  }
}

/* The section: none without a window edge; otherwise whole GQA groups whose
 * K and V fit the L2 budget, at least one group, at most every pair. */
Test(cuda_hopper, section_fits_l2_in_whole_groups) {
  cr_assert_eq(attn_cu_hp_section(4096, 128, 16, 16, 4, -1, -1), 0);
  for (int64_t nkv = 1; nkv <= ((int64_t)1 << 22); nkv *= 4)
    for (int group = 1; group <= 8; group *= 2) {
      const int hkv = 4, hq = hkv * group, batch = 3, dp = 128;
      int s = attn_cu_hp_section(nkv, dp, hq, hkv, batch, -1, 0);
      cr_assert(s >= 1 && s <= hq * batch, "nkv %lld: %d", (long long)nkv, s);
      if (s < hq * batch) {
        cr_assert_eq(s % group, 0, "a section splits a group");
        const int64_t kv = (int64_t)(s / group) * nkv * dp * 4;
        cr_assert(s == group || kv <= ATTN_CU_HP_L2_BUDGET, "nkv %lld: %lld bytes", (long long)nkv,
                  (long long)kv);
        cr_assert_gt(kv + nkv * dp * 4, ATTN_CU_HP_L2_BUDGET, "one more group would fit");
      }
    }
}

static bool visible(int64_t i, int64_t j, int64_t off, int64_t wl, int64_t wr) {
  return (wl < 0 || j >= i + off - wl) && (wr < 0 || j <= i + off + wr);
}

/* The kernel's geometry: 128-row units skip key tiles no row sees, and a
 * consumer masks only tiles that are not wholly visible to its 64 rows. */
Test(cuda_hopper, masks_skip_and_accept_whole_tiles) {
  uint64_t seed = 21;
  int skipped = 0, unmasked = 0;
  for (int it = 0; it < 600; it++) {
    int64_t nq = 1 + (int64_t)(trand(&seed) % 700), nkv = 1 + (int64_t)(trand(&seed) % 900);
    int64_t wl = (int64_t)(trand(&seed) % 300) - 1, wr = (int64_t)(trand(&seed) % 300) - 1;
    if (trand(&seed) % 2)
      wr = 0, wl = -1; /* causal */
    int bn = trand(&seed) % 2 ? 128 : 64;
    int64_t off = nkv - nq;
    for (int64_t i0 = 0; i0 < nq; i0 += ATTN_CU_HP_BM) {
      int64_t i1 = i0 + ATTN_CU_HP_BM < nq ? i0 + ATTN_CU_HP_BM : nq;
      int t0, t1;
      attn_cu_block_tiles(i0, i1, off, wl, wr, nkv, bn, 1, 0, &t0, &t1);
      skipped += (int)((nkv + bn - 1) / bn) - (t1 - t0);
      for (int64_t i = i0; i < i1; i++)
        for (int64_t j = 0; j < nkv; j++)
          if (visible(i, j, off, wl, wr))
            cr_assert(j / bn >= t0 && j / bn < t1, "visible (%lld,%lld) skipped", (long long)i,
                      (long long)j);
      for (int c = 0; c < 2; c++) {
        int64_t r0 = i0 + 64 * c, r1 = r0 + 64 < nq ? r0 + 64 : nq;
        if (r0 >= nq)
          continue;
        for (int t = t0; t < t1; t++) {
          if (!attn_cu_tile_full((int64_t)t * bn, bn, r0, r1, off, wl, wr, nkv))
            continue;
          unmasked++;
          for (int64_t i = r0; i < r1; i++)
            for (int64_t j = (int64_t)t * bn; j < (int64_t)(t + 1) * bn; j++)
              cr_assert(j < nkv && visible(i, j, off, wl, wr), "unmasked tile hides (%lld,%lld)",
                        (long long)i, (long long)j);
        }
      }
    }
  }
  cr_assert(skipped > 100 && unmasked > 100, "skipped %d, unmasked %d", skipped, unmasked);
}

/* The run of whole tiles a consumer takes unmasked is exactly the tiles
 * attn_cu_tile_full accepts, and they are contiguous. */
Test(cuda_hopper, full_range_is_the_whole_tiles) {
  uint64_t seed = 33;
  int whole = 0, partial = 0;
  for (int it = 0; it < 3000; it++) {
    int64_t nq = 1 + (int64_t)(trand(&seed) % 700), nkv = 1 + (int64_t)(trand(&seed) % 900);
    int64_t wl = (int64_t)(trand(&seed) % 300) - 1, wr = (int64_t)(trand(&seed) % 300) - 1;
    if (trand(&seed) % 3 == 0)
      wr = 0, wl = -1; /* causal */
    else if (trand(&seed) % 3 == 0)
      wr = wl = -1;
    const int bn = 32 << (trand(&seed) % 3);
    const int64_t off = trand(&seed) % 4 == 0 ? 0 : nkv - nq;
    const int64_t r0 = (int64_t)(trand(&seed) % (uint64_t)nq);
    const int64_t r1 = r0 + 64 < nq ? r0 + 64 : nq;
    int t0, t1, f0, f1;
    attn_cu_block_tiles(r0, r1, off, wl, wr, nkv, bn, 1, 0, &t0, &t1);
    attn_cu_hp_full_range(t0, t1, bn, r0, r1, off, wl, wr, nkv, &f0, &f1);
    cr_assert(t0 <= f0 && f0 <= f1 && f1 <= t1 && (f0 < f1 || f0 == t1));
    for (int t = t0; t < t1; t++) {
      bool full = attn_cu_tile_full((int64_t)t * bn, bn, r0, r1, off, wl, wr, nkv);
      cr_assert_eq(full, t >= f0 && t < f1, "tile %d of [%d, %d): whole %d, run [%d, %d)", t, t0,
                   t1, full, f0, f1);
      whole += full, partial += !full;
    }
  }
  cr_assert(whole > 1000 && partial > 1000, "whole %d, partial %d", whole, partial);
}

/* ---- the hook and the tensor maps ---------------------------------------------------- */

static attn_cu_params shape(attn_dtype dt, int b, int hq, int hkv, int nq, int nkv, int d) {
  attn_cu_params p;
  tcu_shape(&p, dt, b, hq, hkv, nq, nkv, d);
  return p;
}

Test(cuda_hopper, never_selected_by_default_and_hook_fits_the_card) {
  attn_cu_choice c;
  attn_status st;
  for (int d = 1; d <= 256; d += 7)
    for (int dt = 0; dt < ATTN_DTYPE_COUNT; dt++) {
      attn_cu_params p = shape((attn_dtype)dt, 2, 8, 2, 3000, 3000, d);
      cr_assert_eq(attn_cu_select(&p, 132, &c, &st), 0, "%s", st.message);
      cr_assert_lt(c.kernel, ATTN_CU_HOPPER_D64, "the default selection chose %s",
                   attn_cu_kernel_name(c.kernel));
      int took = attn_cu_select_hopper(&p, 132, &c);
      cr_assert_eq(took, dt != ATTN_F32, "d %d %s", d, attn_dtype_name((attn_dtype)dt));
      if (!took)
        continue;
      attn_cu_kernel want = p.dp <= 64    ? ATTN_CU_HOPPER_D64
                            : p.dp <= 96  ? ATTN_CU_HOPPER_D96
                            : p.dp <= 128 ? ATTN_CU_HOPPER_D128
                            : p.dp <= 192 ? ATTN_CU_HOPPER_D192
                                          : ATTN_CU_HOPPER_D256;
      cr_assert_eq(c.kernel, want);
      cr_assert_eq(attn_cu_hopper_of(p.dp), want);
      /* 227 KiB is what one block may opt into on sm_90. */
      cr_assert_leq(c.smem_bytes, 232448, "d %d: %zu bytes", d, c.smem_bytes);
      cr_assert(c.grid[0] == 132 && c.grid[1] == 1 && c.grid[2] == 1 && c.warps == 12);
    }
  /* A small problem gets one CTA per unit; a split decode and the backward
   * are not the Hopper instance's. */
  attn_cu_params p = shape(ATTN_BF16, 1, 2, 2, 200, 300, 128);
  cr_assert_eq(attn_cu_select(&p, 132, &c, &st), 0);
  c.nsplit = 1;
  cr_assert_eq(attn_cu_select_hopper(&p, 132, &c), 1);
  cr_assert_eq(c.grid[0], 4);
  p = shape(ATTN_BF16, 1, 32, 8, 1, 32768, 128);
  cr_assert_eq(attn_cu_select(&p, 132, &c, &st), 0);
  cr_assert_eq(attn_cu_select_hopper(&p, 132, &c), 0, "a split launch is not Hopper's");
  p = shape(ATTN_F16, 1, 2, 2, 200, 300, 64);
  p.pass = ATTN_BACKWARD;
  cr_assert_eq(attn_cu_select(&p, 132, &c, &st), 0);
  cr_assert_eq(attn_cu_select_hopper(&p, 132, &c), 0);
  cr_assert_str_eq(attn_cu_kernel_name(ATTN_CU_HOPPER_D96), "hopper_d96");
  cr_assert_str_eq(attn_cu_kernel_name(ATTN_CU_HOPPER_D128), "hopper_d128");
  cr_assert_str_eq(attn_cu_kernel_name(ATTN_CU_HOPPER_D192), "hopper_d192");
  /* The softmax folds the scale into the exponent, taking the raw scores'
   * max: a zero or negative scale is left to the mma.sync instances. */
  for (int sign = -1; sign <= 0; sign++) {
    p = shape(ATTN_BF16, 1, 2, 2, 200, 300, 128);
    p.scale_log2 *= (float)sign;
    cr_assert_eq(attn_cu_select(&p, 132, &c, &st), 0);
    cr_assert_eq(attn_cu_select_hopper(&p, 132, &c), 0, "scale sign %d", sign);
  }
}

Test(cuda_hopper, tensor_maps) {
  attn_cu_params p = shape(ATTN_BF16, 3, 8, 2, 1000, 700, 72);
  char q, k, v, o;
  p.q = &q, p.k = &k, p.v = &v, p.o = &o;
  attn_cu_choice c;
  attn_status st;
  cr_assert_eq(attn_cu_select(&p, 132, &c, &st), 0);
  cr_assert_eq(attn_cu_select_hopper(&p, 132, &c), 1);
  for (int w = ATTN_CU_TM_Q; w <= ATTN_CU_TM_O; w++) {
    attn_cu_tmap_spec s;
    attn_cu_hp_tmap_spec(&p, &c, (attn_cu_tmap_which)w, &s);
    bool kv = w == ATTN_CU_TM_K || w == ATTN_CU_TM_V;
    const void *want = w == ATTN_CU_TM_Q   ? &q
                       : w == ATTN_CU_TM_K ? &k
                       : w == ATTN_CU_TM_V ? &v
                                           : &o;
    cr_assert_eq(s.base, want);
    cr_assert_eq(s.dims[0], 72);
    cr_assert_eq(s.dims[1], kv ? 700 : 1000, "rows of one head: a box past them is zero-filled");
    cr_assert_eq(s.dims[2], kv ? 6 : 24);
    cr_assert_eq(s.strides[0], 144);
    cr_assert_eq(s.strides[1], 144 * s.dims[1]);
    cr_assert(s.strides[0] % 16 == 0 && s.strides[1] % 16 == 0, "TMA strides are 16-byte");
    /* The box is one swizzle panel wide (128 bytes) and at most 256 rows. */
    cr_assert_eq(s.box[0] * 2, 128);
    cr_assert_eq(s.box[1], w == ATTN_CU_TM_Q   ? ATTN_CU_HP_BM
                           : w == ATTN_CU_TM_O ? ATTN_CU_HP_WG_ROWS
                                               : (unsigned)c.block_n);
    cr_assert(s.box[1] <= 256 && s.box[2] == 1);
  }
}
