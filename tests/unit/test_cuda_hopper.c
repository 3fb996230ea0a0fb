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
 * tile of bn keys, dpad the instance. */
static void wg_tile(int dpad, int dp, int bn, int c, uint64_t seed) {
  const int bm = ATTN_CU_HP_BM, stages = 2, slot = 1;
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
  /* S = Q Kᵀ as hp_issue_qk issues it. */
  float(*s)[128] = calloc(128, sizeof *s), (*o)[128] = calloc(128, sizeof *o);
  for (int kk = 0; kk < dpad / 16; kk++) {
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
  /* The epilogue: stmatrix into Q's space, as hp_epilogue addresses it,
   * then a TMA store of the 64-row box of each panel reads it back. */
  for (int w = 0; w < 4; w++)
    for (int kk = 0; kk < dpad / 16; kk++) {
      uint32_t addr[32];
      float r[32][4][2];
      for (int l = 0; l < 32; l++) {
        int lr, lc, x = 32 * w + l;
        attn_cu_ldsm_q(l, &lr, &lc);
        addr[l] = attn_cu_hp_off(ATTN_CU_HP_WG_ROWS * c + 16 * w + lr, 16 * kk + lc, bm);
        for (int j = 0; j < 4; j++) {
          int i = attn_cu_hp_acc_pair(kk, j);
          r[l][j][0] = o[x][i], r[l][j][1] = o[x][i + 1];
        }
      }
      emu_stsm(&m, addr, r);
    }
  for (int pn = 0; pn < dpad / 64; pn++) {
    uint32_t box = (uint32_t)(pn * bm * 128 + ATTN_CU_HP_WG_ROWS * c * 128);
    cr_assert_eq(box % 1024, 0);
    for (int r = 0; r < ATTN_CU_HP_WG_ROWS; r++)
      for (int d = 0; d < 64; d++) {
        float got = *at(&m, swz(box + (uint32_t)r * 128 + (uint32_t)d * 2));
        double ref = O[r][64 * pn + d];
        cr_assert(fabs(got - ref) <= 1e-3 * (1 + fabs(ref)), "stored O[%d][%d]: %g, expected %g", r,
                  64 * pn + d, got, ref);
      }
  }
  free(m.v), free(Q), free(K), free(V), free(s), free(o);
}

Test(cuda_hopper, warpgroup_emulation_d64) {
  wg_tile(64, 64, ATTN_CU_HP_BN_D64, 0, 1);
  wg_tile(64, 40, ATTN_CU_HP_BN_D64, 1, 2);
}
Test(cuda_hopper, warpgroup_emulation_d128) {
  wg_tile(128, 128, ATTN_CU_HP_BN_D128, 1, 3);
  wg_tile(128, 72, ATTN_CU_HP_BN_D128, 0, 4);
}
Test(cuda_hopper, warpgroup_emulation_d256) {
  wg_tile(256, 256, ATTN_CU_HP_BN_D256, 0, 5);
  wg_tile(256, 136, ATTN_CU_HP_BN_D256, 1, 6);
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

Test(cuda_hopper, ring_phases_keep_producer_and_consumers_in_step) {
  uint64_t seed = 9;
  for (int stages = 1; stages <= 4; stages++)
    for (int trial = 0; trial < 50; trial++) {
      enum { TILES = 40 };
      mbar full[4], empty[4];
      int data[4], filled = 0;
      for (int s = 0; s < stages; s++)
        mb_init(&full[s], 1), mb_init(&empty[s], 8), data[s] = -1; /* 4 warps x 2 */
      int64_t next[2] = {0, 0}; /* the consumers' tile counters */
      /* Random interleaving: the producer or a consumer tries one step. */
      for (int guard = 0; guard < 100000 && (next[0] < TILES || next[1] < TILES); guard++) {
        int who = (int)(trand(&seed) % 3);
        int slot, parity;
        if (who == 2 && filled < TILES) {
          attn_cu_hp_ring(filled, stages, &slot, &parity);
          if (!mb_ready(&empty[slot], attn_cu_hp_empty_parity(filled, stages)))
            continue;
          for (int c = 0; c < 2; c++) /* nobody may still be reading it */
            cr_assert(next[c] > filled - stages, "slot %d overwritten under consumer %d", slot, c);
          data[slot] = filled++;
          mb_arrive(&full[slot]);
        } else if (who < 2 && next[who] < TILES) {
          attn_cu_hp_ring(next[who], stages, &slot, &parity);
          if (!mb_ready(&full[slot], parity))
            continue;
          cr_assert_eq(data[slot], next[who], "consumer %d read tile %d for %lld", who, data[slot],
                       (long long)next[who]);
          next[who]++;
          for (int w = 0; w < 4; w++)
            mb_arrive(&empty[slot]);
        }
      }
      cr_assert(next[0] == TILES && next[1] == TILES, "stalled: stages %d", stages);
    }
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

Test(cuda_hopper, schedule_covers_every_unit_longest_first) {
  const int qtiles = 13, heads = 5, batch = 3, bn = 128;
  const int64_t nq = (int64_t)qtiles * ATTN_CU_HP_BM - 37, nkv = nq;
  char seen[13][5][3] = {{{0}}};
  int prev = 1 << 30;
  for (int64_t u = 0; u < (int64_t)qtiles * heads * batch; u++) {
    int qt, h, b;
    attn_cu_hp_unit(u, qtiles, heads, batch, &qt, &h, &b);
    cr_assert(qt >= 0 && qt < qtiles && h >= 0 && h < heads && b >= 0 && b < batch);
    cr_assert_eq(seen[qt][h][b]++, 0, "unit (%d,%d,%d) twice", qt, h, b);
    /* Causal (wr = 0): key tiles per unit never grow along the order. */
    int t0, t1;
    int64_t i0 = (int64_t)qt * ATTN_CU_HP_BM,
            i1 = i0 + ATTN_CU_HP_BM < nq ? i0 + ATTN_CU_HP_BM : nq;
    attn_cu_block_tiles(i0, i1, nkv - nq, -1, 0, nkv, bn, 1, 0, &t0, &t1);
    cr_assert_leq(t1 - t0, prev, "unit %lld has more tiles than the one before", (long long)u);
    prev = t1 - t0;
  }
  /* A persistent CTA c of g takes units c, c + g, ...: the first wave is
   * the last query tiles. */
  int qt, h, b;
  attn_cu_hp_unit(0, qtiles, heads, batch, &qt, &h, &b);
  cr_assert_eq(qt, qtiles - 1);
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

/* ---- the hook and the tensor maps ---------------------------------------------------- */

static attn_cu_params shape(attn_dtype dt, int b, int hq, int hkv, int nq, int nkv, int d) {
  attn_cu_params p;
  memset(&p, 0, sizeof p);
  p.dtype = dt;
  p.batch = b, p.heads_q = hq, p.heads_kv = hkv, p.seq_q = nq, p.seq_kv = nkv;
  p.head_dim = d;
  p.dp = attn_cu_dp(d);
  p.window_left = p.window_right = -1;
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
                            : p.dp <= 128 ? ATTN_CU_HOPPER_D128
                                          : ATTN_CU_HOPPER_D256;
      cr_assert_eq(c.kernel, want);
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
  cr_assert_str_eq(attn_cu_kernel_name(ATTN_CU_HOPPER_D128), "hopper_d128");
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
