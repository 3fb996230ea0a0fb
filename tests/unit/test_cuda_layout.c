/*
 * test_cuda_layout.c — the CUDA kernels' index arithmetic, on the CPU.
 *
 * The fragment layouts are checked against the PTX ISA's tables, written
 * here as the document states them ("Matrix Fragments for mma.m16n8k16 with
 * floating point type", "ldmatrix"), independently of layout.h. A warp is
 * then emulated lane by lane: ldmatrix and mma.sync act as the PTX ISA
 * describes, fed with the addresses layout.h gives, in the order the kernel
 * (fwd_mma.cuh) issues them, and S = Q Kᵀ and O = P V must come out right.
 * Masks, key-tile ranges, split-KV ranges, the lse merge and the kernel
 * selection are checked against brute force and float64.
 */
#include "cuda/kernels.h"
#include "cuda/layout.h"
#include "helpers.h"
#include "ptx.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

/* ---- the PTX ISA's tables (tests/lib/ptx.h) ------------------------------ */

Test(cuda_layout, fragments_match_ptx_tables) {
  int seen_a[16][16] = {{0}}, seen_b[16][8] = {{0}}, seen_c[16][8] = {{0}};
  for (int lane = 0; lane < 32; lane++) {
    for (int i = 0; i < 8; i++) {
      int r, c, pr, pc;
      attn_cu_frag_a(lane, i, &r, &c);
      tptx_a(lane, i, &pr, &pc);
      cr_assert(r == pr && c == pc, "A lane %d a%d: (%d,%d), PTX (%d,%d)", lane, i, r, c, pr, pc);
      seen_a[r][c]++;
    }
    for (int i = 0; i < 4; i++) {
      int r, c, pr, pc;
      attn_cu_frag_b(lane, i, &r, &c);
      tptx_b(lane, i, &pr, &pc);
      cr_assert(r == pr && c == pc, "B lane %d b%d", lane, i);
      seen_b[r][c]++;
      attn_cu_frag_c(lane, i, &r, &c);
      tptx_c(lane, i, &pr, &pc);
      cr_assert(r == pr && c == pc, "C lane %d c%d", lane, i);
      seen_c[r][c]++;
    }
  }
  for (int r = 0; r < 16; r++)
    for (int c = 0; c < 16; c++) {
      cr_assert_eq(seen_a[r][c], 1, "A (%d,%d) held %d times", r, c, seen_a[r][c]);
      if (c < 8) {
        cr_assert_eq(seen_b[r][c], 1);
        cr_assert_eq(seen_c[r][c], 1);
      }
    }
}

/* ---- a warp, emulated ---------------------------------------------------- */

/* The four registers of an x4 load, each as its own per-lane array. */
static void split_regs(tptx_reg2 r[32][4], tptx_reg2 b0[32], tptx_reg2 b1[32], tptx_reg2 b2[32],
                       tptx_reg2 b3[32]) {
  for (int l = 0; l < 32; l++) {
    memcpy(b0[l], r[l][0], sizeof(tptx_reg2));
    memcpy(b1[l], r[l][1], sizeof(tptx_reg2));
    memcpy(b2[l], r[l][2], sizeof(tptx_reg2));
    memcpy(b3[l], r[l][3], sizeof(tptx_reg2));
  }
}

/* A warp's mt row tiles of S = Q Kᵀ for a BN-key tile, issued as
 * fwd_mma.cuh's qk_tile issues them: each K fragment feeds every row tile
 * (s[t][n]: row tile t, key block n). */
static void emu_qk(float (*s)[8][32][4], const float *sQ, const float *sK, int str, int kd, int nb,
                   int mt) {
  const float *addr[32];
  tptx_reg2 q[2][32][4], bk[32][4];
  for (int kk = 0; kk < kd; kk++) {
    for (int t = 0; t < mt; t++) {
      for (int l = 0; l < 32; l++) {
        int r, c;
        attn_cu_ldsm_q(l, &r, &c);
        addr[l] = sQ + (t * 16 + r) * str + kk * 16 + c;
      }
      tptx_ldsm(addr, false, q[t]);
    }
    for (int n2 = 0; n2 < nb / 2; n2++) {
      for (int l = 0; l < 32; l++) {
        int r, c;
        attn_cu_ldsm_k(l, &r, &c);
        cr_assert(n2 * 16 + r < 8 * nb && kk * 16 + c + 8 <= 16 * kd);
        addr[l] = sK + (n2 * 16 + r) * str + kk * 16 + c;
      }
      tptx_ldsm(addr, false, bk);
      tptx_reg2 b0[32], b1[32], b2[32], b3[32];
      split_regs(bk, b0, b1, b2, b3);
      for (int t = 0; t < mt; t++) {
        tptx_mma(s[t][2 * n2], q[t], b0, b1);
        tptx_mma(s[t][2 * n2 + 1], q[t], b2, b3);
      }
    }
  }
}

/* O += P V as pv_tile issues it: S's accumulators of key blocks 2k and
 * 2k+1 are P's A fragment for keys 16k..16k+15 (P = S here, kept in
 * registers), and each V fragment feeds every row tile. */
static void emu_pv(float (*o)[32][32][4], float (*s)[8][32][4], const float *sV, int str, int bn,
                   int db, int mt) {
  const float *addr[32];
  tptx_reg2 a[2][32][4], bv[32][4];
  for (int k = 0; k < bn / 16; k++) {
    for (int t = 0; t < mt; t++)
      for (int l = 0; l < 32; l++) {
        a[t][l][0][0] = s[t][2 * k][l][0], a[t][l][0][1] = s[t][2 * k][l][1];
        a[t][l][1][0] = s[t][2 * k][l][2], a[t][l][1][1] = s[t][2 * k][l][3];
        a[t][l][2][0] = s[t][2 * k + 1][l][0], a[t][l][2][1] = s[t][2 * k + 1][l][1];
        a[t][l][3][0] = s[t][2 * k + 1][l][2], a[t][l][3][1] = s[t][2 * k + 1][l][3];
      }
    for (int d2 = 0; d2 < db / 2; d2++) {
      for (int l = 0; l < 32; l++) {
        int r, c;
        attn_cu_ldsm_v(l, &r, &c);
        cr_assert(k * 16 + r < bn && d2 * 16 + c + 8 <= 8 * db);
        addr[l] = sV + (k * 16 + r) * str + d2 * 16 + c;
      }
      tptx_ldsm(addr, true, bv);
      tptx_reg2 b0[32], b1[32], b2[32], b3[32];
      split_regs(bv, b0, b1, b2, b3);
      for (int t = 0; t < mt; t++) {
        tptx_mma(o[t][2 * d2], a[t], b0, b1);
        tptx_mma(o[t][2 * d2 + 1], a[t], b2, b3);
      }
    }
  }
}

/* The epilogue's store_o: the warp's O fragments into its rows of shared
 * memory (sW, poisoned beforehand), then read back 16 bytes per lane in
 * attn_cu_ostage_at's order; every chunk below dp must be read once and
 * hold the reference O[row][col] (ref, rows 16 mt x dp). */
static void emu_store_o(float (*o)[32][32][4], int str, int dp, int db, int mt, const double *ref) {
  float *sW = malloc((size_t)16 * mt * str * sizeof *sW);
  for (int i = 0; i < 16 * mt * str; i++)
    sW[i] = NAN;
  for (int t = 0; t < mt; t++)
    for (int d = 0; d < db; d++)
      for (int l = 0; l < 32; l++)
        for (int e = 0; e < 4; e++) {
          int r, c;
          attn_cu_frag_c(l, e, &r, &c);
          sW[(t * 16 + r) * str + d * 8 + c] = o[t][d][l][e];
        }
  int seen[32][32] = {{0}};
  for (int it = 0; it < 16 * mt * db / 32; it++)
    for (int l = 0; l < 32; l++) {
      int r, c;
      attn_cu_ostage_at(l, it, db, &r, &c);
      cr_assert(r < 16 * mt && c < db, "lane %d step %d: row %d chunk %d", l, it, r, c);
      seen[r][c]++;
      for (int e = 0; e < 8 && c * 8 < dp; e++) {
        double want = ref[r * dp + c * 8 + e], got = sW[r * str + c * 8 + e];
        cr_assert(fabs(got - want) <= 1e-3 * (1 + fabs(want)),
                  "stored O[%d][%d]: %g, expected %g (mt %d, dp %d)", r, c * 8 + e, got, want, mt,
                  dp);
      }
    }
  for (int r = 0; r < 16 * mt; r++)
    for (int c = 0; c < db; c++)
      cr_assert_eq(seen[r][c], 1, "chunk (%d, %d) stored %d times", r, c, seen[r][c]);
  free(sW);
}

/* A padded shared-memory tile of rows x dpad: columns below dp random,
 * the rest of dpad zero (cp.async's zero-fill), the 8 pad elements of each
 * row NaN, which must never be read. */
static float *smem_tile(int rows, int str, int dp, int dpad, uint64_t *seed) {
  float *t = malloc((size_t)rows * str * sizeof *t);
  for (int r = 0; r < rows; r++)
    for (int c = 0; c < str; c++)
      t[r * str + c] = c < dp ? (float)tuniform(seed) : c < dpad ? 0.0f : NAN;
  return t;
}

/* One warp of an instance for a BN-key tile: its mt row tiles of S = Q Kᵀ
 * and O = S V, and O's staged store, against float64. */
static void warp_tile(int dpad, int dp, int bm, int bn, uint64_t seed) {
  const int mt = bm / (16 * ATTN_CU_MMA_WARPS), rows = 16 * mt;
  const int str = attn_cu_smem_stride(dpad), kd = dpad / 16, nb = bn / 8, db = dpad / 8;
  cr_assert(mt >= 1 && mt <= 2 && nb <= 8 && db <= 32);
  float *sQ = smem_tile(rows, str, dp, dpad, &seed), *sK = smem_tile(bn, str, dp, dpad, &seed);
  float *sV = smem_tile(bn, str, dp, dpad, &seed);
  float(*s)[8][32][4] = calloc((size_t)mt, sizeof *s);
  float(*o)[32][32][4] = calloc((size_t)mt, sizeof *o);
  emu_qk(s, sQ, sK, str, kd, nb, mt);
  double *S = malloc((size_t)rows * bn * sizeof *S), *O = calloc((size_t)rows * dp, sizeof *O);
  for (int r = 0; r < rows; r++)
    for (int j = 0; j < bn; j++) {
      double acc = 0;
      for (int d = 0; d < dp; d++)
        acc += (double)sQ[r * str + d] * sK[j * str + d];
      S[r * bn + j] = acc;
      for (int d = 0; d < dp; d++)
        O[r * dp + d] += acc * sV[j * str + d];
    }
  for (int t = 0; t < mt; t++)
    for (int n = 0; n < nb; n++)
      for (int l = 0; l < 32; l++)
        for (int e = 0; e < 4; e++) {
          int r, c;
          attn_cu_frag_c(l, e, &r, &c);
          double want = S[(t * 16 + r) * bn + n * 8 + c];
          cr_assert(fabs(s[t][n][l][e] - want) <= 1e-4 * (1 + fabs(want)),
                    "S[%d][%d]: %g, expected %g (dpad %d, dp %d)", t * 16 + r, n * 8 + c,
                    s[t][n][l][e], want, dpad, dp);
        }
  emu_pv(o, s, sV, str, bn, db, mt);
  emu_store_o(o, str, dp, db, mt, O);
  free(sQ), free(sK), free(sV), free(s), free(o), free(S), free(O);
}

/* The forward tensor-core instances as kernels.h documents them, in
 * head-dim order: the padded head dims each holds and its tiles. */
static const struct fwd_inst {
  attn_cu_kernel k;
  int dpad, bm, bn;
} fwd_insts[] = {
    {ATTN_CU_MMA_D64, 64, ATTN_CU_BM_D64, ATTN_CU_BN_D64},
    {ATTN_CU_MMA_D96, 96, ATTN_CU_BM_D96, ATTN_CU_BN_D96},
    {ATTN_CU_MMA_D128, 128, ATTN_CU_BM_D128, ATTN_CU_BN_D128},
    {ATTN_CU_MMA_D160, 160, ATTN_CU_BM_D160, ATTN_CU_BN_D160},
    {ATTN_CU_MMA_D192, 192, ATTN_CU_BM_D192, ATTN_CU_BN_D192},
    {ATTN_CU_MMA_D256, 256, ATTN_CU_BM_D256, ATTN_CU_BN_D256},
};
enum { NFWD_INSTS = sizeof fwd_insts / sizeof *fwd_insts };

Test(cuda_layout, warp_emulation_every_instance) {
  for (int i = 0; i < NFWD_INSTS; i++) {
    const struct fwd_inst *in = &fwd_insts[i];
    warp_tile(in->dpad, in->dpad, in->bm, in->bn, 1 + (uint64_t)i);
    warp_tile(in->dpad, in->dpad - 24, in->bm, in->bn, 100 + (uint64_t)i); /* a padded dp */
  }
}

/* Every instance's unrolled copies (attn_cu_copy_at) cover each 16-byte
 * chunk of a Q tile (BM rows) and of a K or V tile (BN rows) exactly
 * once, with passes that split the rows evenly over the block's threads
 * (the kernel's static_assert), and the block's shared memory fits
 * sm_89's 99 KB. */
Test(cuda_layout, tile_copies_cover_each_chunk_once) {
  const int nt = 32 * ATTN_CU_MMA_WARPS;
  for (int i = 0; i < NFWD_INSTS; i++) {
    const int dpad = fwd_insts[i].dpad, ch = dpad / 8, tpr = attn_cu_copy_tpr(ch);
    cr_assert(ch % tpr == 0 && nt % tpr == 0, "dpad %d: %d threads per row", dpad, tpr);
    for (int w = 1; w <= 2; w++) {
      const int rows = w == 1 ? fwd_insts[i].bm : fwd_insts[i].bn, rpp = nt / tpr;
      cr_assert_eq(rows % rpp, 0, "dpad %d: %d rows in passes of %d", dpad, rows, rpp);
      int *seen = calloc((size_t)rows * ch, sizeof *seen);
      for (int tid = 0; tid < nt; tid++)
        for (int pass = 0; pass < rows / rpp; pass++)
          for (int panel = 0; panel < ch / tpr; panel++) {
            int r, c;
            attn_cu_copy_at(tid, nt, ch, pass, panel, &r, &c);
            cr_assert(r >= 0 && r < rows && c >= 0 && c < ch);
            /* the kernel adds thread 0's (pass, panel) to its own (0, 0) */
            int r0, c0, dr, dc;
            attn_cu_copy_at(tid, nt, ch, 0, 0, &r0, &c0);
            attn_cu_copy_at(0, nt, ch, pass, panel, &dr, &dc);
            cr_assert(r == r0 + dr && c == c0 + dc,
                      "dpad %d: thread %d's chunk is not its base "
                      "plus a constant",
                      dpad, tid);
            seen[r * ch + c]++;
          }
      for (int k = 0; k < rows * ch; k++)
        cr_assert_eq(seen[k], 1, "dpad %d: chunk %d copied %d times", dpad, k, seen[k]);
      free(seen);
    }
    const int bytes = (fwd_insts[i].bm + 4 * fwd_insts[i].bn) * attn_cu_smem_stride(dpad) * 2;
    cr_expect_leq(bytes, 99 * 1024, "dpad %d: %d bytes of shared memory", dpad, bytes);
  }
}

Test(cuda_layout, smem_rows_hit_distinct_bank_quads) {
  /* The 8 rows one ldmatrix phase reads, 16 bytes each, must cover all 32
   * banks once: row starts (stride x 2 bytes) land in distinct 16-byte
   * quads modulo 128 bytes. */
  for (int i = 0; i < NFWD_INSTS; i++) {
    int dpad = fwd_insts[i].dpad, str = attn_cu_smem_stride(dpad), seen = 0;
    for (int r = 0; r < 8; r++)
      seen |= 1 << ((r * str * 2) % 128 / 16);
    cr_assert_eq(seen, 0xff, "dpad %d: rows share bank quads", dpad);
  }
}

/* ---- masks and key ranges ------------------------------------------------- */

static bool visible(int64_t i, int64_t j, int64_t off, int64_t wl, int64_t wr) {
  return (wl < 0 || j >= i + off - wl) && (wr < 0 || j <= i + off + wr);
}

Test(cuda_layout, row_bounds_match_the_rule) {
  uint64_t seed = 7;
  for (int it = 0; it < 3000; it++) {
    int64_t nq = 1 + (int64_t)(trand(&seed) % 40), nkv = 1 + (int64_t)(trand(&seed) % 40);
    int64_t wl = (int64_t)(trand(&seed) % 12) - 1, wr = (int64_t)(trand(&seed) % 12) - 1;
    int64_t off = nkv - nq;
    for (int64_t i = 0; i < nq; i++) {
      int lo, hi;
      attn_cu_row_bounds(i, off, wl, wr, nkv, &lo, &hi);
      for (int64_t j = 0; j < nkv; j++)
        cr_assert_eq(j >= lo && j <= hi, visible(i, j, off, wl, wr),
                     "nq %lld nkv %lld wl %lld wr %lld i %lld j %lld: [%d, %d]", (long long)nq,
                     (long long)nkv, (long long)wl, (long long)wr, (long long)i, (long long)j, lo,
                     hi);
    }
  }
}

Test(cuda_layout, huge_windows_are_unbounded) {
  int lo, hi;
  attn_cu_row_bounds(5, -3, INT64_MAX, INT64_MAX, 100, &lo, &hi);
  cr_assert(lo == 0 && hi == 99, "[%d, %d]", lo, hi);
  attn_cu_row_bounds(5, -3, (int64_t)1 << 35, 0, 100, &lo, &hi);
  cr_assert(lo == 0 && hi == 2, "[%d, %d]", lo, hi);
}

Test(cuda_layout, block_tiles_cover_every_visible_key_once) {
  uint64_t seed = 11;
  int full_seen = 0;
  for (int it = 0; it < 2000; it++) {
    int64_t nq = 1 + (int64_t)(trand(&seed) % 200), nkv = 1 + (int64_t)(trand(&seed) % 300);
    int64_t wl = (int64_t)(trand(&seed) % 80) - 1, wr = (int64_t)(trand(&seed) % 80) - 1;
    if (trand(&seed) % 3 == 0)
      wl = wr = -1;
    int bm = trand(&seed) % 2 ? 64 : 32, bn = trand(&seed) % 2 ? 64 : 32;
    int nsplit = 1 + (int)(trand(&seed) % 5);
    int64_t off = nkv - nq, ntiles = (nkv + bn - 1) / bn;
    for (int64_t i0 = 0; i0 < nq; i0 += bm) {
      int64_t i1 = i0 + bm < nq ? i0 + bm : nq;
      char owner[1024];
      memset(owner, 0, sizeof owner);
      for (int s = 0; s < nsplit; s++) {
        int t0, t1;
        attn_cu_block_tiles(i0, i1, off, wl, wr, nkv, bn, nsplit, s, &t0, &t1);
        cr_assert(t0 <= t1 && t0 >= 0 && t1 <= ntiles);
        for (int t = t0; t < t1; t++) {
          cr_assert_eq(owner[t], 0, "tile %d in two splits", t);
          owner[t] = 1;
          int full = attn_cu_tile_full((int64_t)t * bn, bn, i0, i1, off, wl, wr, nkv);
          full_seen += full;
          for (int64_t i = i0; full && i < i1; i++)
            for (int64_t j = (int64_t)t * bn; j < (int64_t)(t + 1) * bn; j++)
              cr_assert(j < nkv && visible(i, j, off, wl, wr),
                        "tile %d called full but (%lld, %lld) is masked", t, (long long)i,
                        (long long)j);
        }
      }
      for (int64_t i = i0; i < i1; i++)
        for (int64_t j = 0; j < nkv; j++)
          if (visible(i, j, off, wl, wr))
            cr_assert(owner[j / bn], "visible (%lld, %lld) in no tile", (long long)i, (long long)j);
    }
  }
  cr_assert_gt(full_seen, 1000, "interior tiles should need no mask");
}

/* ---- issue 17's variants on the kernels' scores ------------------------------ */

/* attn_cu_variant against the float64 definition in natural units (the
 * reference's order: softcap, then ALiBi), including both signs, scores
 * far past the cap and no cap at all. */
Test(cuda_layout, variant_matches_float64) {
  uint64_t seed = 17;
  for (int it = 0; it < 20000; it++) {
    double cap = it % 5 == 0 ? 0 : 0.05 + 60 * (tuniform(&seed) + 1) / 2;
    double s = 200 * tuniform(&seed) * (it % 3 ? 0.05 : 1), slope = tuniform(&seed);
    double dist = (double)(trand(&seed) % 5000), cap2 = cap * M_LOG2E;
    float g,
        x = attn_cu_variant((float)(s * M_LOG2E), (float)cap2, cap > 0 ? (float)(1 / cap2) : 0.0f,
                            (float)(-slope * M_LOG2E), (float)dist, &g);
    double t = cap > 0 ? tanh(s / cap) : 0, want = (cap > 0 ? cap * t : s) - slope * dist;
    double gwant = cap > 0 ? 1 - t * t : 1;
    cr_assert(fabs(x * M_LN2 - want) <= 2e-6 * (cap + fabs(s) + fabs(slope) * dist + 1),
              "cap %g s %g slope %g dist %g: %g, expected %g", cap, s, slope, dist, x * M_LN2,
              want);
    cr_assert(fabs(g - gwant) <= 1e-6, "cap %g s %g: 1 - tanh^2 %g, expected %g", cap, s, g, gwant);
  }
}

/* The distance each accumulator element gets, in both layouts the kernels
 * use, is |i + off − j| of the query and key that element holds. */
Test(cuda_layout, variant_distances_follow_the_fragments) {
  const int64_t offs[] = {0, 7, -5, 1000, -300};
  for (int o = 0; o < 5; o++)
    for (int lane = 0; lane < 32; lane++)
      for (int n = 0; n < 8; n++)
        for (int e = 0; e < 4; e++) {
          const int64_t off = offs[o], i0 = 64, j0 = 128;
          int row, col;
          attn_cu_frag_c(lane, e, &row, &col);
          /* S: rows queries i0 + row, columns keys j0 + n·8 + col */
          float d = attn_cu_frag_dist(attn_cu_dist0(i0 + lane / 4, off, j0), 1, row, n * 8 + col);
          cr_assert_eq(d, (float)llabs(i0 + row + off - (j0 + n * 8 + col)));
          /* Sᵀ: rows keys j0 + row, columns queries i0 + n·8 + col */
          d = attn_cu_frag_dist(attn_cu_dist0(i0, off, j0 + lane / 4), -1, row, n * 8 + col);
          cr_assert_eq(d, (float)llabs(i0 + n * 8 + col + off - (j0 + row)));
        }
}

/* ---- the split-KV merge ---------------------------------------------------- */

Test(cuda_layout, lse_merge_matches_float64_softmax) {
  uint64_t seed = 5;
  enum { N = 300, DV = 3 };
  for (int it = 0; it < 400; it++) {
    double x[N], v[N][DV];
    int n = 1 + (int)(trand(&seed) % N);
    bool none = it % 10 == 0;
    for (int j = 0; j < n; j++) {
      x[j] = none || trand(&seed) % 4 == 0 ? -INFINITY : 20 * tuniform(&seed);
      for (int d = 0; d < DV; d++)
        v[j][d] = tuniform(&seed);
    }
    /* float64 truth, in log2 units */
    double m = -INFINITY, l = 0, o[DV] = {0};
    for (int j = 0; j < n; j++)
      m = fmax(m, x[j]);
    for (int j = 0; j < n && m > -INFINITY; j++) {
      double w = exp2(x[j] - m);
      l += w;
      for (int d = 0; d < DV; d++)
        o[d] += w * v[j][d];
    }
    /* the splits: contiguous ranges, each normalized by its own sum */
    int ns = 1 + (int)(trand(&seed) % 9);
    float ml[2 * 16], os[16][DV];
    for (int s = 0; s < ns; s++) {
      int a = n * s / ns, b = n * (s + 1) / ns;
      double ms = -INFINITY, ls = 0, acc[DV] = {0};
      for (int j = a; j < b; j++)
        ms = fmax(ms, x[j]);
      for (int j = a; j < b && ms > -INFINITY; j++) {
        double w = exp2(x[j] - ms);
        ls += w;
        for (int d = 0; d < DV; d++)
          acc[d] += w * v[j][d];
      }
      ml[2 * s] = (float)ms;
      ml[2 * s + 1] = (float)ls;
      for (int d = 0; d < DV; d++)
        os[s][d] = ls > 0 ? (float)(acc[d] / ls) : 0.0f;
    }
    float m2, l2;
    attn_cu_merge(ml, 1, ns, &m2, &l2);
    float fm, flse;
    attn_cu_stats(m2, l2, &fm, &flse);
    if (l == 0) {
      cr_assert(m2 == -INFINITY && l2 == 0 && fm == -INFINITY && flse == -INFINITY);
      for (int s = 0; s < ns; s++)
        cr_assert_eq(attn_cu_merge_weight(ml[2 * s], ml[2 * s + 1], m2, l2), 0.0f);
      continue;
    }
    cr_assert(fabs(m2 - m) <= 1e-6 * fmax(1, fabs(m)), "m %g vs %g", m2, m);
    cr_assert(fabs(l2 / l - 1) <= 1e-5, "l %g vs %g", l2, l);
    cr_assert(fabs(fm - m * M_LN2) <= 1e-5 * fmax(1, fabs(m)));
    cr_assert(fabs(flse - (m + log2(l)) * M_LN2) <= 1e-5 * fmax(1, fabs(m)));
    for (int d = 0; d < DV; d++) {
      double acc = 0;
      for (int s = 0; s < ns; s++)
        acc += attn_cu_merge_weight(ml[2 * s], ml[2 * s + 1], m2, l2) * os[s][d];
      cr_assert(fabs(acc - o[d] / l) <= 1e-5, "O[%d] %g vs %g", d, acc, o[d] / l);
    }
  }
}

Test(cuda_layout, seqused_k_splits_of_an_entry) {
  /* A batch entry's block divides its own visible tiles over the launch's
   * splits (kernels.h's seqused_k): the splits cover them once, in order,
   * and those past them (all, for an entry of no key) are empty, which the
   * merge weighs 0: m -inf, l 0, O 0. */
  static const int lens[] = {0, 1, 63, 64, 65, 300, 1000};
  for (int li = 0; li < 7; li++)
    for (int nsplit = 1; nsplit <= 16; nsplit *= 2) {
      const int n = lens[li], nq = 4;
      int next = 0, busy = 0;
      for (int s = 0; s < nsplit; s++) {
        int t0, t1;
        attn_cu_block_tiles(0, nq, (int64_t)n - nq, -1, 0, n, 64, nsplit, s, &t0, &t1);
        if (t0 == t1)
          continue;
        cr_expect(t0 == next && t1 > t0, "len %d split %d: tiles [%d, %d)", n, s, t0, t1);
        next = t1, busy++;
      }
      cr_expect_eq(next, (n + 63) / 64, "len %d, %d splits: tiles up to %d", n, nsplit, next);
      cr_expect(busy <= nsplit && (n == 0) == (busy == 0));
    }
  /* Partials of a row: two empty splits (their O poisoned, never read)
   * around two that saw keys; then every one empty. */
  float ml[8] = {-INFINITY, 0, 3.0f, 2.0f, -INFINITY, 0, 4.0f, 1.0f}, m2, l;
  attn_cu_merge(ml, 1, 4, &m2, &l);
  cr_expect(m2 == 4.0f && fabsf(l - 2.0f) < 1e-6f, "m2 %g l %g", m2, l);
  cr_expect(attn_cu_merge_weight(ml[0], ml[1], m2, l) == 0.0f &&
            attn_cu_merge_weight(ml[4], ml[5], m2, l) == 0.0f);
  cr_expect(fabsf(attn_cu_merge_weight(ml[2], ml[3], m2, l) +
                  attn_cu_merge_weight(ml[6], ml[7], m2, l) - 1.0f) < 1e-6f);
  float none[6] = {-INFINITY, 0, -INFINITY, 0, -INFINITY, 0}, m, lse;
  attn_cu_merge(none, 1, 3, &m2, &l);
  attn_cu_stats(m2, l, &m, &lse);
  cr_expect(m2 == -INFINITY && l == 0.0f && m == -INFINITY && lse == -INFINITY);
  cr_expect_eq(attn_cu_merge_weight(none[0], none[1], m2, l), 0.0f);
}

Test(cuda_layout, max_for_exp_never_makes_nan) {
  float m = -INFINITY, use = attn_cu_max_for_exp(m);
  cr_assert_eq(exp2f(-INFINITY - use), 0.0f);
  cr_assert_eq(exp2f(m - use), 0.0f);
  cr_assert_eq(attn_cu_max_for_exp(3.5f), 3.5f);
}

/* ---- kernel selection ---------------------------------------------------- */

static attn_cu_params shape(attn_dtype dt, int b, int hq, int hkv, int nq, int nkv, int d) {
  attn_cu_params p;
  tcu_shape(&p, dt, b, hq, hkv, nq, nkv, d);
  return p;
}

/* The decode kernel off (test_cuda_decode.c tests it): these tests are of
 * the tiled forward's choices for decode shapes, its splits and packing. */
#define DEC_OFF ATTN_CU_DECODE_KERNELS
static int select_tiled(const attn_cu_params *p, int sms, attn_cu_choice *c, attn_status *st) {
  return attn_cu_select_masked(p, sms, ATTN_CU_HOPPER_OFF | DEC_OFF, c, st);
}

/* Index into fwd_insts of the smallest instance holding dp. */
static int fwd_inst_for(int dp) {
  int i = 0;
  while (fwd_insts[i].dpad < dp)
    i++;
  return i;
}

/* Whether a forward choice has instance i's tiles: its query rows (whole
 * m16 tiles for each of the 4 warps: 16 or 32 rows a warp), keys and
 * shared memory, Q then K and V double-buffered, rows padded by 8. */
static void expect_inst_tiles(const attn_cu_choice *c, int i, int d) {
  const struct fwd_inst *w = &fwd_insts[i];
  cr_assert_eq(c->kernel, w->k, "d %d: %s, not %s", d, attn_cu_kernel_name(c->kernel),
               attn_cu_kernel_name(w->k));
  cr_assert(c->block_m == w->bm && c->block_n == w->bn && c->warps == ATTN_CU_MMA_WARPS,
            "d %d %s: tiles %d x %d, %d warps", d, attn_cu_kernel_name(c->kernel), c->block_m,
            c->block_n, c->warps);
  cr_assert(w->bm == 64 || w->bm == 128, "%s: %d rows", attn_cu_kernel_name(w->k), w->bm);
  cr_assert_eq(c->smem_bytes, (size_t)(w->bm + 4 * w->bn) * (size_t)(w->dpad + 8) * 2, "d %d", d);
}

Test(cuda_layout, selection) {
  cr_assert_eq(attn_cu_dp(1), 8);
  cr_assert_eq(attn_cu_dp(37), 40);
  cr_assert_eq(attn_cu_dp(256), 256);
  for (int i = 0; i < NFWD_INSTS; i++) {
    char name[16];
    snprintf(name, sizeof name, "mma_d%d", fwd_insts[i].dpad);
    cr_assert_str_eq(attn_cu_kernel_name(fwd_insts[i].k), name);
  }
  attn_cu_choice c;
  attn_status st;
  for (int d = 1; d <= 256; d++)
    for (int dt = 0; dt < ATTN_DTYPE_COUNT; dt++) {
      attn_cu_params p = shape((attn_dtype)dt, 2, 8, 2, 300, 500, d);
      cr_assert_eq(attn_cu_select(&p, 132, &c, &st), 0, "%s", st.message);
      /* dp 8..64, 72..96, 104..128, 136..160, 168..192, 200..256 */
      attn_cu_kernel want = dt == ATTN_F32 ? ATTN_CU_SIMT_F32
                            : p.dp <= 64   ? ATTN_CU_MMA_D64
                            : p.dp <= 96   ? ATTN_CU_MMA_D96
                            : p.dp <= 128  ? ATTN_CU_MMA_D128
                            : p.dp <= 160  ? ATTN_CU_MMA_D160
                            : p.dp <= 192  ? ATTN_CU_MMA_D192
                                           : ATTN_CU_MMA_D256;
      cr_assert_eq(c.kernel, want, "d %d %s: %s", d, attn_dtype_name((attn_dtype)dt),
                   attn_cu_kernel_name(c.kernel));
      if (dt != ATTN_F32)
        expect_inst_tiles(&c, fwd_inst_for(p.dp), d);
      /* 99 KiB is what a block may opt into on sm_86 and sm_89, the
       * smallest of the targets. */
      cr_assert_leq(c.smem_bytes, 101376, "d %d: %zu bytes of shared memory", d, c.smem_bytes);
      cr_assert_eq(c.grid[0], (unsigned)((300 + c.block_m - 1) / c.block_m));
    }
  /* A big prefill fills the machine without splitting. */
  attn_cu_params p = shape(ATTN_BF16, 4, 16, 16, 4096, 4096, 128);
  cr_assert_eq(attn_cu_select(&p, 132, &c, &st), 0);
  cr_assert(c.nsplit == 1 && c.grid[0] == 32 && c.grid[1] == 16 && c.grid[2] == 4,
            "%u %u %u, %d splits", c.grid[0], c.grid[1], c.grid[2], c.nsplit);
  cr_assert_eq(attn_cu_split_bytes(&p, &c), 0);
  /* Decoding splits the keys, within bounds. */
  p = shape(ATTN_BF16, 1, 32, 8, 1, 32768, 128);
  cr_assert_eq(select_tiled(&p, 132, &c, &st), 0);
  cr_assert(c.nsplit > 1 && c.nsplit <= ATTN_CU_MAX_SPLITS, "nsplit %d", c.nsplit);
  cr_assert(c.grid[0] * c.grid[1] * c.grid[2] >= 132, "decode leaves SMs idle");
  cr_assert_eq(c.grid[2], (unsigned)c.nsplit);
  cr_assert_eq(attn_cu_split_bytes(&p, &c), (size_t)c.nsplit * 32 * (128 + 2) * 4);
  /* Too few keys to split. */
  p = shape(ATTN_F16, 1, 1, 1, 1, 100, 64);
  cr_assert_eq(attn_cu_select(&p, 132, &c, &st), 0);
  cr_assert_eq(c.nsplit, 1);
  /* Limits come back as EUNSUPPORTED, so auto can fall back. */
  p = shape(ATTN_F16, 1, 1, 1, 1, 100, 64);
  p.seq_kv = (int)ATTN_CU_MAX_SEQ + 1;
  cr_assert_eq(attn_cu_select(&p, 132, &c, &st), ATTN_EUNSUPPORTED);
  cr_assert(strstr(st.message, "sequences"), "%s", st.message);
  p = shape(ATTN_F16, 1, 70000, 1, 1, 100, 64);
  cr_assert_eq(attn_cu_select(&p, 132, &c, &st), ATTN_EUNSUPPORTED);
}

/* ---- the backward pass ------------------------------------------------------ */

/* A tile of rows x str floats: columns < dp random, dp..dpad zero (as
 * cp.async's zero-fill leaves them), the row padding NaN (never read). */
/* bwd_mma.cuh's mma_abt: acc (16 x 8nb) += A Bᵀ, A the 16 rows at a, B the
 * nb·8 rows at b (both row-major, width 16kd), plain ldmatrix with the
 * addresses attn_cu_ldsm_q and attn_cu_ldsm_k give, as the kernel issues
 * them. rows_b bounds b's rows. */
static void emu_abt(float (*acc)[32][4], const float *a, const float *b, int str, int kd, int nb,
                    int rows_b) {
  const float *addr[32];
  tptx_reg2 af[32][4], bf[32][4];
  for (int kk = 0; kk < kd; kk++) {
    for (int l = 0; l < 32; l++) {
      int r, c;
      attn_cu_ldsm_q(l, &r, &c);
      cr_assert(r < 16 && kk * 16 + c + 8 <= 16 * kd);
      addr[l] = a + r * str + kk * 16 + c;
    }
    tptx_ldsm(addr, false, af);
    for (int n2 = 0; n2 < nb / 2; n2++) {
      for (int l = 0; l < 32; l++) {
        int r, c;
        attn_cu_ldsm_k(l, &r, &c);
        cr_assert(n2 * 16 + r < rows_b && kk * 16 + c + 8 <= 16 * kd);
        addr[l] = b + (n2 * 16 + r) * str + kk * 16 + c;
      }
      tptx_ldsm(addr, false, bf);
      tptx_reg2 b0[32], b1[32], b2[32], b3[32];
      split_regs(bf, b0, b1, b2, b3);
      tptx_mma(acc[2 * n2], af, b0, b1);
      tptx_mma(acc[2 * n2 + 1], af, b2, b3);
    }
  }
}

/* bwd_mma.cuh's mma_xb: acc (16 x 8db) += X B, X (16 x 16ks) held in C
 * layout as x[2ks], B the 16ks rows at b read by ldmatrix.trans at the
 * addresses of attn_cu_ldsm_v; cols bounds the columns read from b on. */
static void emu_xb(float (*acc)[32][4], float (*x)[32][4], const float *b, int str, int ks, int db,
                   int cols) {
  const float *addr[32];
  tptx_reg2 a[32][4], bv[32][4];
  for (int k = 0; k < ks; k++) {
    for (int l = 0; l < 32; l++) {
      a[l][0][0] = x[2 * k][l][0], a[l][0][1] = x[2 * k][l][1];
      a[l][1][0] = x[2 * k][l][2], a[l][1][1] = x[2 * k][l][3];
      a[l][2][0] = x[2 * k + 1][l][0], a[l][2][1] = x[2 * k + 1][l][1];
      a[l][3][0] = x[2 * k + 1][l][2], a[l][3][1] = x[2 * k + 1][l][3];
    }
    for (int d2 = 0; d2 < db / 2; d2++) {
      for (int l = 0; l < 32; l++) {
        int r, c;
        attn_cu_ldsm_v(l, &r, &c);
        cr_assert(d2 * 16 + c + 8 <= cols && r < 16);
        addr[l] = b + (k * 16 + r) * str + d2 * 16 + c;
      }
      tptx_ldsm(addr, true, bv);
      tptx_reg2 b0[32], b1[32], b2[32], b3[32];
      split_regs(bv, b0, b1, b2, b3);
      tptx_mma(acc[2 * d2], a, b0, b1);
      tptx_mma(acc[2 * d2 + 1], a, b2, b3);
    }
  }
}

/* acc (C layout, n blocks of 8 columns) against want(row, col). */
static void expect_tile(float (*acc)[32][4], int n, double (*want)(int, int, void *), void *ctx,
                        const char *what) {
  for (int b = 0; b < n; b++)
    for (int l = 0; l < 32; l++)
      for (int e = 0; e < 4; e++) {
        int r, c;
        attn_cu_frag_c(l, e, &r, &c);
        double w = want(r, b * 8 + c, ctx);
        cr_assert(fabs(acc[b][l][e] - w) <= 1e-3 * (1 + fabs(w)), "%s[%d][%d]: %g, expected %g",
                  what, r, b * 8 + c, acc[b][l][e], w);
      }
}

/* float64 products of row-major tiles: Σ_k A[ra + r][ka + k] B[rb + c][kb + k]
 * (transposed B) or Σ_k X[r][k] B[k][cb + c]. */
typedef struct prod_ctx {
  const float *a, *b;
  int str, ra, rb, cb, n;
  float (*x)[32][4];
} prod_ctx;
static double dot_abt(int r, int c, void *v) {
  prod_ctx *p = v;
  double s = 0;
  for (int k = 0; k < p->n; k++)
    s += (double)p->a[(p->ra + r) * p->str + k] * p->b[(p->rb + c) * p->str + k];
  return s;
}
/* Element (r, k) of an accumulator tile in C layout. */
static double c_elem(float (*x)[32][4], int r, int k) {
  for (int l = 0; l < 32; l++)
    for (int e = 0; e < 4; e++) {
      int rr, cc;
      attn_cu_frag_c(l, e, &rr, &cc);
      if (rr == r && cc == k % 8)
        return x[k / 8][l][e];
    }
  return NAN;
}
static double dot_xb(int r, int c, void *v) {
  prod_ctx *p = v;
  double s = 0;
  for (int k = 0; k < p->n; k++)
    s += c_elem(p->x, r, k) * p->b[k * p->str + p->cb + c];
  return s;
}

/* One warp of the dK/dV kernel (bwd_dkdv) on one query step: Sᵀ = K Qᵀ,
 * dV += Pᵀ dO (P taken as Sᵀ: the products are linear in it), dPᵀ = V dOᵀ,
 * dK += dSᵀ Q (dS as dPᵀ), with the kernel's warp slice and addresses. */
static void warp_dkdv(int dpad, int dp, int bn, int dsplit, int warp, uint64_t seed) {
  const int bm = ATTN_CU_BWD_BM, str = attn_cu_smem_stride(dpad), kd = dpad / 16, nb = bm / 8;
  const int db = dpad / dsplit / 8;
  float *sK = smem_tile(bn, str, dp, dpad, &seed), *sV = smem_tile(bn, str, dp, dpad, &seed);
  float *sQ = smem_tile(bm, str, dp, dpad, &seed), *sO = smem_tile(bm, str, dp, dpad, &seed);
  int key0, dim0;
  attn_cu_bwd_warp(warp, dsplit, dpad, &key0, &dim0);
  cr_assert(key0 + 16 <= bn && dim0 + 8 * db <= dpad, "warp %d: keys %d, dims %d", warp, key0,
            dim0);
  float(*st)[32][4] = calloc((size_t)nb, sizeof *st),
  (*dpt)[32][4] = calloc((size_t)nb, sizeof *dpt);
  float(*dk)[32][4] = calloc((size_t)db, sizeof *dk), (*dv)[32][4] = calloc((size_t)db, sizeof *dv);
  emu_abt(st, sK + key0 * str, sQ, str, kd, nb, bm);
  prod_ctx c = {sK, sQ, str, key0, 0, 0, dp, NULL};
  expect_tile(st, nb, dot_abt, &c, "S^T");
  emu_xb(dv, st, sO + dim0, str, bm / 16, db, dpad - dim0);
  c = (prod_ctx){NULL, sO, str, 0, 0, dim0, bm, st};
  expect_tile(dv, db, dot_xb, &c, "dV");
  emu_abt(dpt, sV + key0 * str, sO, str, kd, nb, bm);
  c = (prod_ctx){sV, sO, str, key0, 0, 0, dp, NULL};
  expect_tile(dpt, nb, dot_abt, &c, "dP^T");
  emu_xb(dk, dpt, sQ + dim0, str, bm / 16, db, dpad - dim0);
  c = (prod_ctx){NULL, sQ, str, 0, 0, dim0, bm, dpt};
  expect_tile(dk, db, dot_xb, &c, "dK");
  free(sK), free(sV), free(sQ), free(sO), free(st), free(dpt), free(dk), free(dv);
}

/* One warp of the dQ kernel (bwd_dq) on one key step: S = Q Kᵀ, dP = dO Vᵀ,
 * dQ += dS K (dS taken as dP). */
static void warp_dq(int dpad, int dp, int bn, int warp, uint64_t seed) {
  const int bm = ATTN_CU_BWDQ_BM, str = attn_cu_smem_stride(dpad), kd = dpad / 16, nb = bn / 8;
  const int db = dpad / 8;
  float *sQ = smem_tile(bm, str, dp, dpad, &seed), *sO = smem_tile(bm, str, dp, dpad, &seed);
  float *sK = smem_tile(bn, str, dp, dpad, &seed), *sV = smem_tile(bn, str, dp, dpad, &seed);
  float(*s)[32][4] = calloc((size_t)nb, sizeof *s), (*dpv)[32][4] = calloc((size_t)nb, sizeof *dpv);
  float(*dq)[32][4] = calloc((size_t)db, sizeof *dq);
  emu_abt(s, sQ + warp * 16 * str, sK, str, kd, nb, bn);
  prod_ctx c = {sQ, sK, str, warp * 16, 0, 0, dp, NULL};
  expect_tile(s, nb, dot_abt, &c, "S");
  emu_abt(dpv, sO + warp * 16 * str, sV, str, kd, nb, bn);
  c = (prod_ctx){sO, sV, str, warp * 16, 0, 0, dp, NULL};
  expect_tile(dpv, nb, dot_abt, &c, "dP");
  emu_xb(dq, dpv, sK, str, bn / 16, db, dpad);
  c = (prod_ctx){NULL, sK, str, 0, 0, 0, bn, dpv};
  expect_tile(dq, db, dot_xb, &c, "dQ");
  free(sQ), free(sO), free(sK), free(sV), free(s), free(dpv), free(dq);
}

Test(cuda_layout, backward_warp_emulation_d64) {
  for (int w = 0; w < ATTN_CU_MMA_WARPS; w++) {
    warp_dkdv(64, w % 2 ? 64 : 40, ATTN_CU_BWD_BN_D64, 1, w, 100 + (uint64_t)w);
    warp_dq(64, w % 2 ? 64 : 24, ATTN_CU_BWDQ_BN_D64, w, 110 + (uint64_t)w);
  }
}
Test(cuda_layout, backward_warp_emulation_d128) {
  for (int w = 0; w < ATTN_CU_MMA_WARPS; w++) {
    warp_dkdv(128, w % 2 ? 128 : 72, ATTN_CU_BWD_BN_D128, 1, w, 120 + (uint64_t)w);
    warp_dq(128, w % 2 ? 128 : 96, ATTN_CU_BWDQ_BN_D128, w, 130 + (uint64_t)w);
  }
}
Test(cuda_layout, backward_warp_emulation_d256) {
  for (int w = 0; w < ATTN_CU_MMA_WARPS; w++) {
    warp_dkdv(256, w % 2 ? 256 : 136, ATTN_CU_BWD_BN_D256, 2, w, 140 + (uint64_t)w);
    warp_dq(256, w % 2 ? 256 : 200, ATTN_CU_BWDQ_BN_D256, w, 150 + (uint64_t)w);
  }
}

Test(cuda_layout, backward_warps_cover_every_key_and_dim_once) {
  const int dsplit[3] = {1, 1, 2}, dpad[3] = {64, 128, 256};
  const int bn[3] = {ATTN_CU_BWD_BN_D64, ATTN_CU_BWD_BN_D128, ATTN_CU_BWD_BN_D256};
  for (int i = 0; i < 3; i++) {
    static int seen[64][256];
    memset(seen, 0, sizeof seen);
    for (int w = 0; w < ATTN_CU_MMA_WARPS; w++) {
      int k0, d0;
      attn_cu_bwd_warp(w, dsplit[i], dpad[i], &k0, &d0);
      for (int k = k0; k < k0 + 16; k++)
        for (int d = d0; d < d0 + dpad[i] / dsplit[i]; d++)
          seen[k][d]++;
    }
    for (int k = 0; k < bn[i]; k++)
      for (int d = 0; d < dpad[i]; d++)
        cr_assert_eq(seen[k][d], 1, "dpad %d: dK[%d][%d] owned %d times", dpad[i], k, d,
                     seen[k][d]);
  }
}

/* The atomic dQ path of the dK/dV kernel on one query step
 * (bwd_mma.cuh's store_ds and dq_rows): each warp's dSᵀ fragment (16 keys x
 * BM queries, C layout; those of the warps with dim0 0) stored into the dS
 * tile as the kernel stores it, then each warp's dS K for its head dims
 * through ldmatrix (A: dS rows, plain; B: K, .trans) and mma, against
 * float64. The tile's padding columns are NaN: read, they would show. */
static void warp_dq_atomic(int dpad, int dp, int bn, int dsplit, uint64_t seed) {
  const int bm = ATTN_CU_BWD_BM, nb = bm / 8, str = attn_cu_smem_stride(dpad);
  const int lds = attn_cu_smem_stride(bn), dq = dpad / ATTN_CU_MMA_WARPS / 8;
  float *sK = smem_tile(bn, str, dp, dpad, &seed);
  double *ds = malloc((size_t)bm * bn * sizeof *ds); /* dS[q][key] */
  float *sdS = malloc((size_t)bm * lds * sizeof *sdS);
  int *seen = calloc((size_t)bm * lds, sizeof *seen);
  for (int i = 0; i < bm * bn; i++)
    ds[i] = (float)tuniform(&seed);
  for (int i = 0; i < bm * lds; i++)
    sdS[i] = NAN;
  for (int w = 0; w < ATTN_CU_MMA_WARPS; w++) {
    int key0, dim0;
    attn_cu_bwd_warp(w, dsplit, dpad, &key0, &dim0);
    if (dim0 != 0)
      continue;
    for (int n = 0; n < nb; n++) /* the fragment element (row, col): dSᵀ[key0 + row][n 8 + col] */
      for (int l = 0; l < 32; l++)
        for (int e = 0; e < 4; e++) {
          int row, col;
          attn_cu_frag_c(l, e, &row, &col);
          int at = attn_cu_bwd_ds_at(n, row, col, key0, lds);
          sdS[at] = (float)ds[(n * 8 + col) * bn + key0 + row];
          seen[at]++;
        }
  }
  for (int q = 0; q < bm; q++)
    for (int k = 0; k < lds; k++)
      cr_assert_eq(seen[q * lds + k], k < bn, "dS[%d][%d] stored %d times", q, k,
                   seen[q * lds + k]);
  float(*acc)[32][4] = calloc((size_t)dq, sizeof *acc);
  for (int w = 0; w < ATTN_CU_MMA_WARPS; w++) {
    const int col0 = attn_cu_bwd_dq_col0(w, dpad);
    for (int m = 0; m < bm / 16; m++) {
      memset(acc, 0, (size_t)dq * sizeof *acc);
      for (int k = 0; k < bn / 16; k++) {
        const float *addr[32];
        tptx_reg2 a[32][4], bv[32][4];
        for (int l = 0; l < 32; l++) {
          int r, c;
          attn_cu_ldsm_q(l, &r, &c);
          addr[l] = sdS + (m * 16 + r) * lds + k * 16 + c;
        }
        tptx_ldsm(addr, false, a);
        for (int d2 = 0; d2 < dq / 2; d2++) {
          for (int l = 0; l < 32; l++) {
            int r, c;
            attn_cu_ldsm_v(l, &r, &c);
            addr[l] = sK + (k * 16 + r) * str + col0 + d2 * 16 + c;
          }
          tptx_ldsm(addr, true, bv);
          tptx_reg2 b0[32], b1[32], b2[32], b3[32];
          split_regs(bv, b0, b1, b2, b3);
          tptx_mma(acc[2 * d2], a, b0, b1);
          tptx_mma(acc[2 * d2 + 1], a, b2, b3);
        }
      }
      for (int d = 0; d < dq; d++)
        for (int l = 0; l < 32; l++)
          for (int e = 0; e < 4; e++) {
            int r, c;
            attn_cu_frag_c(l, e, &r, &c);
            const int q = m * 16 + r, col = col0 + d * 8 + c;
            double want = 0;
            for (int j = 0; j < bn; j++)
              want += ds[q * bn + j] * sK[j * str + col];
            cr_assert(fabs(acc[d][l][e] - want) <= 1e-3 * (1 + fabs(want)),
                      "dpad %d warp %d: dQ[%d][%d] %g, expected %g", dpad, w, q, col, acc[d][l][e],
                      want);
          }
    }
  }
  free(sK), free(ds), free(sdS), free(seen), free(acc);
}

Test(cuda_layout, backward_atomic_dq_emulation) {
  warp_dq_atomic(64, 40, ATTN_CU_BWD_BN_D64, 1, 300);
  warp_dq_atomic(128, 128, ATTN_CU_BWD_BN_D128, 1, 301);
  warp_dq_atomic(128, 72, ATTN_CU_BWD_BN_D128, 1, 302);
  warp_dq_atomic(256, 200, ATTN_CU_BWD_BN_D256, 2, 303);
}

/* The atomic path's warps split dQ's head dims once between them, and its
 * accumulator starts past D and lse on 16 bytes. */
Test(cuda_layout, backward_atomic_dq_partition_and_offset) {
  for (int dpad = 64; dpad <= 256; dpad *= 2) {
    int seen[256] = {0};
    for (int w = 0; w < ATTN_CU_MMA_WARPS; w++)
      for (int d = 0; d < dpad / ATTN_CU_MMA_WARPS; d++)
        seen[attn_cu_bwd_dq_col0(w, dpad) + d]++;
    for (int d = 0; d < dpad; d++)
      cr_assert_eq(seen[d], 1, "dpad %d: dim %d owned %d times", dpad, d, seen[d]);
  }
  for (uint64_t rows = 1; rows < 2000; rows++) {
    uint64_t at = attn_cu_bwd_dq_at(rows);
    cr_assert(at >= 2 * rows && at < 2 * rows + 4 && at % 4 == 0, "rows %llu: %llu",
              (unsigned long long)rows, (unsigned long long)at);
  }
}

Test(cuda_layout, key_bounds_match_the_rule) {
  uint64_t seed = 17;
  for (int it = 0; it < 3000; it++) {
    int64_t nq = 1 + (int64_t)(trand(&seed) % 40), nkv = 1 + (int64_t)(trand(&seed) % 40);
    int64_t wl = (int64_t)(trand(&seed) % 12) - 1, wr = (int64_t)(trand(&seed) % 12) - 1;
    int64_t off = nkv - nq;
    for (int64_t j = 0; j < nkv + 3; j++) {
      int lo, hi;
      attn_cu_key_bounds(j, off, wl, wr, nq, nkv, &lo, &hi);
      for (int64_t i = 0; i < nq; i++)
        cr_assert_eq(i >= lo && i <= hi, j < nkv && visible(i, j, off, wl, wr),
                     "nq %lld nkv %lld wl %lld wr %lld j %lld i %lld: [%d, %d]", (long long)nq,
                     (long long)nkv, (long long)wl, (long long)wr, (long long)j, (long long)i, lo,
                     hi);
    }
  }
  int lo, hi;
  attn_cu_key_bounds(5, 3, INT64_MAX, (int64_t)1 << 41, 100, 100, &lo, &hi);
  cr_assert(lo == 0 && hi == 99, "huge windows are unbounded: [%d, %d]", lo, hi);
}

/* The dK/dV kernel's walk: for each key block, the query tiles of
 * attn_cu_key_block_qtiles hold every row that sees one of its keys, the
 * first and last hold one, and a step it calls full (the kernel's test)
 * has every pair visible. */
Test(cuda_layout, key_block_query_tiles_cover_every_visible_pair) {
  uint64_t seed = 19;
  int full_seen = 0;
  for (int it = 0; it < 1500; it++) {
    int64_t nq = 1 + (int64_t)(trand(&seed) % 200), nkv = 1 + (int64_t)(trand(&seed) % 200);
    int64_t wl = (int64_t)(trand(&seed) % 80) - 1, wr = (int64_t)(trand(&seed) % 80) - 1;
    if (trand(&seed) % 3 == 0)
      wl = wr = -1;
    int bn = trand(&seed) % 2 ? 64 : 32, bm = trand(&seed) % 2 ? 32 : 16;
    int64_t off = nkv - nq;
    for (int64_t j0 = 0; j0 < nkv; j0 += bn) {
      int64_t j1 = j0 + bn < nkv ? j0 + bn : nkv;
      int t0, t1;
      attn_cu_key_block_qtiles(j0, j1, off, wl, wr, nq, nkv, bm, &t0, &t1);
      cr_assert(t0 >= 0 && t0 <= t1 && t1 <= (nq + bm - 1) / bm);
      bool first = false, last = false;
      for (int64_t i = 0; i < nq; i++)
        for (int64_t j = j0; j < j1; j++)
          if (visible(i, j, off, wl, wr)) {
            cr_assert(i / bm >= t0 && i / bm < t1, "(%lld, %lld) outside tiles [%d, %d)",
                      (long long)i, (long long)j, t0, t1);
            first |= i / bm == t0;
            last |= i / bm == t1 - 1;
          }
      cr_assert(t0 == t1 || (first && last), "tiles [%d, %d) wider than needed", t0, t1);
      for (int t = t0; t < t1; t++) {
        int64_t i0 = (int64_t)t * bm;
        int full = i0 + bm <= nq && j0 + bn <= nkv &&
                   attn_cu_tile_full(j0, bn, i0, i0 + bm, off, wl, wr, nkv);
        full_seen += full;
        for (int64_t i = i0; full && i < i0 + bm; i++)
          for (int64_t j = j0; j < j0 + bn; j++)
            cr_assert(visible(i, j, off, wl, wr), "step (%lld, %lld) called full", (long long)i0,
                      (long long)j0);
      }
    }
  }
  cr_assert_gt(full_seen, 1000, "interior steps should need no mask");
}

Test(cuda_layout, backward_selection) {
  attn_cu_choice c;
  attn_status st;
  for (int d = 1; d <= 256; d++)
    for (int dt = 0; dt < ATTN_DTYPE_COUNT; dt++) {
      attn_cu_params p = shape((attn_dtype)dt, 2, 8, 2, 300, 500, d);
      p.pass = ATTN_BACKWARD;
      cr_assert_eq(attn_cu_select(&p, 132, &c, &st), 0, "%s", st.message);
      attn_cu_kernel want = dt == ATTN_F32 ? ATTN_CU_BWD_SIMT_F32
                            : p.dp <= 64   ? ATTN_CU_BWD_MMA_D64
                            : p.dp <= 128  ? ATTN_CU_BWD_MMA_D128
                                           : ATTN_CU_BWD_MMA_D256;
      cr_assert_eq(c.kernel, want, "d %d %s: %s", d, attn_dtype_name((attn_dtype)dt),
                   attn_cu_kernel_name(c.kernel));
      cr_assert(c.smem_bytes <= 101376 && c.dq_smem_bytes <= 101376, "d %d: %zu, %zu bytes", d,
                c.smem_bytes, c.dq_smem_bytes);
      cr_assert_eq(c.nsplit, 1);
      cr_assert(c.grid[0] == (unsigned)((500 + c.block_n - 1) / c.block_n) && c.grid[1] == 2 &&
                c.grid[2] == 2);
      cr_assert(c.dq_grid[0] == (unsigned)((300 + c.dq_block_m - 1) / c.dq_block_m) &&
                c.dq_grid[1] == 8 && c.dq_grid[2] == 2);
      cr_assert_eq(attn_cu_split_bytes(&p, &c), 0);
      cr_assert_eq(attn_cu_bwd_bytes(&p), 2 * 2 * 8 * 300 * sizeof(float));
    }
  /* A forward never takes a backward kernel, and has no backward scratch. */
  attn_cu_params p = shape(ATTN_BF16, 1, 32, 8, 1, 32768, 128);
  cr_assert_eq(select_tiled(&p, 132, &c, &st), 0);
  cr_assert(c.kernel == ATTN_CU_MMA_D128 && attn_cu_bwd_bytes(&p) == 0);
  /* Decoding shapes do not split in the backward. */
  p.pass = ATTN_BACKWARD;
  cr_assert_eq(attn_cu_select(&p, 132, &c, &st), 0);
  cr_assert(c.kernel == ATTN_CU_BWD_MMA_D128 && c.nsplit == 1);
  p.seq_q = (int)ATTN_CU_MAX_SEQ + 1;
  cr_assert_eq(attn_cu_select(&p, 132, &c, &st), ATTN_EUNSUPPORTED);
  cr_assert_str_eq(attn_cu_kernel_name(ATTN_CU_BWD_SIMT_F32), "bwd_simt_f32");
}

/* The atomic path: asked for (bwd_atomic_dq), every backward instance
 * takes it with the deterministic choice's kernel and dK/dV grid, no dQ
 * kernel (dq_grid zero: how the launch tells), the dS tile's shared memory
 * on top, and scratch for the F32 accumulator [B, Hq, Nq, dp] past D and
 * lse; ATTN_CU_ATOMIC_DQ_BIT off gives back the two-kernel choice, and a
 * forward pass ignores the field. */
Test(cuda_layout, backward_atomic_selection_and_scratch) {
  attn_cu_choice c, det;
  attn_status st;
  for (int d = 1; d <= 256; d++)
    for (int dt = 0; dt < ATTN_DTYPE_COUNT; dt++) {
      attn_cu_params p = shape((attn_dtype)dt, 2, 8, 2, 300, 500, d);
      p.pass = ATTN_BACKWARD;
      cr_assert_eq(attn_cu_select(&p, 132, &det, &st), 0, "%s", st.message);
      const size_t rows = 2 * 8 * 300, two = 2 * rows * sizeof(float);
      cr_assert_eq(attn_cu_bwd_bytes(&p), two);
      p.bwd_atomic_dq = 1;
      cr_assert_eq(attn_cu_select(&p, 132, &c, &st), 0, "%s", st.message);
      cr_assert_eq(c.kernel, det.kernel, "d %d: %s", d, attn_cu_kernel_name(c.kernel));
      cr_assert(c.grid[0] == det.grid[0] && c.grid[1] == det.grid[1] && c.grid[2] == det.grid[2]);
      cr_assert(c.dq_grid[0] == 0 && c.dq_grid[1] == 0 && c.dq_grid[2] == 0 && c.dq_smem_bytes == 0,
                "d %d: a dQ kernel on the atomic path", d);
      size_t tile = dt == ATTN_F32 ? 16 * 33 * sizeof(float) : (size_t)32 * (c.block_n + 8) * 2;
      cr_assert_eq(c.smem_bytes, det.smem_bytes + tile, "d %d", d);
      cr_assert(c.smem_bytes <= 101376, "d %d: %zu bytes", d, c.smem_bytes);
      size_t at = (2 * rows + 3) / 4 * 4 * sizeof(float);
      cr_assert_eq(attn_cu_bwd_bytes(&p), at + rows * (size_t)p.dp * sizeof(float), "d %d", d);
      cr_assert(at >= two && at % 16 == 0);
      cr_assert_eq(
          attn_cu_select_masked(&p, 132, ATTN_CU_HOPPER_OFF | ATTN_CU_ATOMIC_DQ_BIT, &c, &st), 0);
      cr_assert(memcmp(&c, &det, sizeof c) == 0, "d %d: the bit off gives the two-kernel choice",
                d);
    }
  attn_cu_params p = shape(ATTN_BF16, 1, 4, 2, 64, 64, 128);
  p.bwd_atomic_dq = 1;
  cr_assert_eq(attn_cu_select(&p, 132, &c, &st), 0);
  cr_assert(c.kernel == ATTN_CU_MMA_D128 && attn_cu_bwd_bytes(&p) == 0);
}

Test(cuda_layout, launch_contract) {
  /* 16-byte aligned tensors and dp = head_dim padded to 8, or no launch. */
  static _Alignas(16) unsigned char buf[4096];
  attn_cu_params p;
  memset(&p, 0, sizeof p);
  p.dtype = ATTN_F16, p.batch = 1, p.heads_q = 2, p.heads_kv = 1, p.seq_q = 5, p.seq_kv = 9;
  p.head_dim = 61, p.dp = 64, p.window_left = p.window_right = -1;
  attn_cu_choice c;
  attn_status st;
  cr_assert_eq(attn_cu_select(&p, 0, &c, &st), 0, "%s", st.message);
  p.q = buf, p.k = buf + 1024, p.v = buf + 2048, p.o = buf + 3072;
  cr_expect(attn_cu_launch_ok(&p, &c));
  attn_cu_params x = p;
  x.k = buf + 1032; /* 8-byte aligned */
  cr_expect(!attn_cu_launch_ok(&x, &c), "a misaligned K");
  x = p;
  x.o = NULL;
  cr_expect(!attn_cu_launch_ok(&x, &c), "no O");
  x = p;
  x.dp = 62;
  cr_expect(!attn_cu_launch_ok(&x, &c), "dp not a multiple of 8");
  x = p;
  x.dp = 72;
  cr_expect(!attn_cu_launch_ok(&x, &c), "dp not head_dim's padding");
  x = p;
  x.lse = (float *)(void *)(buf + 2);
  cr_expect(!attn_cu_launch_ok(&x, &c), "a misaligned lse");
  attn_cu_choice cs = c;
  cs.nsplit = 2;
  cr_expect(!attn_cu_launch_ok(&p, &cs), "split without scratch");
  x = p;
  x.split_ws = buf + 8;
  cr_expect(!attn_cu_launch_ok(&x, &cs), "misaligned split scratch");
  x.split_ws = buf;
  cr_expect(attn_cu_launch_ok(&x, &cs));
  x = p;
  x.pass = ATTN_BACKWARD;
  x.dout = buf, x.dq = buf, x.dk = buf, x.dv = buf, x.lse = (float *)(void *)buf;
  x.bwd_ws = (float *)(void *)buf;
  attn_cu_choice cb;
  cr_assert_eq(attn_cu_select(&x, 132, &cb, &st), 0);
  cr_expect(attn_cu_launch_ok(&x, &cb));
  x.dv = buf + 4;
  cr_expect(!attn_cu_launch_ok(&x, &cb), "a misaligned dV");
  x.dv = buf;
  /* The atomic choice writes an accumulator only params that ask for it
   * size bwd_ws for (attn_cu_bwd_bytes). */
  x.bwd_atomic_dq = 1;
  cr_assert_eq(attn_cu_select(&x, 132, &cb, &st), 0);
  cr_assert_eq(cb.dq_grid[0], 0);
  cr_expect(attn_cu_launch_ok(&x, &cb));
  x.bwd_atomic_dq = 0;
  cr_expect(!attn_cu_launch_ok(&x, &cb), "an atomic choice on scratch sized without it");
}

Test(cuda_layout, paged_launch_contract) {
  /* The paged view (kernels.h): both tables, a 16-byte aligned pool, pages
   * of a multiple of 64 rows that fit in page_bytes (a multiple of 256),
   * tables covering seq_kv, a forward instance with a paged variant. K and
   * V themselves are not read. */
  static _Alignas(256) unsigned char buf[4096];
  static int32_t table[4];
  attn_cu_params p = shape(ATTN_F16, 1, 2, 1, 5, 200, 64);
  attn_cu_choice c;
  attn_status st;
  p.k_table = p.v_table = table;
  cr_assert_eq(attn_cu_select(&p, 0, &c, &st), 0, "%s", st.message);
  p.q = buf, p.o = buf + 1024, p.page_base = buf;
  p.page_tokens = 64, p.page_bytes = 64 * 64 * 2, p.pages_per_head = 4;
  cr_expect(attn_cu_launch_ok(&p, &c));
  attn_cu_params x = p;
#define BAD(change, what)                                       \
  do {                                                          \
    x = p;                                                      \
    change;                                                     \
    cr_expect(!attn_cu_launch_ok(&x, &c), "accepted %s", what); \
  } while (0)
  BAD(x.v_table = NULL, "a K table alone");
  BAD(x.k_table = NULL, "a V table alone");
  BAD(x.page_base = buf + 8, "a misaligned pool");
  BAD(x.page_tokens = 32, "32-row pages");
  BAD(x.page_bytes = 64 * 64 * 2 - 256, "pages too small");
  BAD(x.page_bytes = 64 * 64 * 2 + 128, "page_bytes not a multiple of 256");
  BAD(x.pages_per_head = 3, "a table short of seq_kv");
  BAD((x.batch = 4, x.pages_per_head = 1 << 30), "tables past 32-bit indices");
  BAD(x.pass = ATTN_BACKWARD, "a paged backward");
  /* Per-entry key lengths: 4-byte aligned, and only with a paged view. */
  static int32_t used[4];
  x = p;
  x.seqused_k = used;
  cr_expect(attn_cu_launch_ok(&x, &c), "seqused_k with a paged view");
  BAD(x.seqused_k = (const int32_t *)((const char *)used + 2), "a misaligned seqused_k");
  BAD((x.k = x.v = buf, x.k_table = x.v_table = NULL, x.seqused_k = used),
      "seqused_k on a packed launch");
#undef BAD
  /* 129..160 takes the 192 instance when paged; the backward refuses. */
  attn_cu_params d = shape(ATTN_BF16, 1, 8, 1, 1, 4096, 160);
  cr_assert_eq(select_tiled(&d, 132, &c, &st), 0);
  cr_expect_eq(c.kernel, ATTN_CU_MMA_D160);
  d.k_table = d.v_table = table;
  cr_assert_eq(select_tiled(&d, 132, &c, &st), 0);
  cr_expect(c.kernel == ATTN_CU_MMA_D192 && c.nsplit > 1 && c.pack == 8);
  d.pass = ATTN_BACKWARD;
  cr_expect_eq(attn_cu_select(&d, 132, &c, &st), ATTN_EUNSUPPORTED);
}

Test(cuda_layout, split_kv_counts_only_visible_tiles) {
  /* A decode row over 8192 keys with a 256-key window sees 5 tiles of 64
   * (the window straddles a tile edge): at most one split of >= 4 tiles,
   * not the 32 that all 128 tiles would give. */
  attn_cu_params p;
  memset(&p, 0, sizeof p);
  p.dtype = ATTN_BF16, p.batch = 1, p.heads_q = 2, p.heads_kv = 1, p.seq_q = 1, p.seq_kv = 8192;
  p.head_dim = 64, p.dp = 64, p.window_left = 256, p.window_right = 0;
  attn_cu_choice c;
  attn_status st;
  cr_assert_eq(attn_cu_select(&p, 132, &c, &st), 0, "%s", st.message);
  cr_expect_eq(c.nsplit, 1, "windowed decode split %d ways", c.nsplit);
  p.window_left = 4096; /* 65 tiles: 16 splits of >= 4 */
  cr_assert_eq(attn_cu_select(&p, 132, &c, &st), 0);
  cr_expect_eq(c.nsplit, 16);
  p.window_left = -1;
  cr_assert_eq(attn_cu_select(&p, 132, &c, &st), 0);
  cr_expect_eq(c.nsplit, 32);
}

Test(cuda_layout, disabled_instances_fall_back) {
  /* MHA: a GQA decode would pack its heads, which the Hopper instance
   * never takes (gqa_packing_selection) */
  attn_cu_params p = shape(ATTN_F16, 1, 2, 2, 1, 4096, 64);
  attn_cu_choice c;
  attn_status st;
  /* with the first i instances off, instance i takes it, with its tiles */
  for (int i = 1; i < NFWD_INSTS; i++) {
    unsigned off = ((1u << i) - 1) << ATTN_CU_MMA_D64 | ATTN_CU_HOPPER_OFF | DEC_OFF;
    cr_assert_eq(attn_cu_select_masked(&p, 132, off, &c, &st), 0);
    expect_inst_tiles(&c, i, 64);
    cr_expect_gt(c.nsplit, 1);
  }
  /* an instance off sends its head dims to the next larger one only */
  for (int i = 0; i + 1 < NFWD_INSTS; i++) {
    attn_cu_params q = p;
    const unsigned off = 1u << fwd_insts[i].k | ATTN_CU_HOPPER_OFF | DEC_OFF;
    q.head_dim = fwd_insts[i].dpad - 6 - 2 * i; /* 58, 88, 118, 148, 178 */
    q.dp = attn_cu_dp(q.head_dim);
    cr_assert_eq(attn_cu_select_masked(&q, 132, off, &c, &st), 0);
    expect_inst_tiles(&c, i + 1, q.head_dim);
    q.head_dim = q.dp = fwd_insts[i + 1].dpad;
    cr_assert_eq(attn_cu_select_masked(&q, 132, off, &c, &st), 0);
    expect_inst_tiles(&c, i + 1, q.head_dim);
  }
  cr_assert_eq(
      attn_cu_select_masked(&p, 132, ATTN_CU_SPLIT_BIT | ATTN_CU_HOPPER_OFF | DEC_OFF, &c, &st), 0);
  cr_expect(c.kernel == ATTN_CU_MMA_D64 && c.nsplit == 1);
  /* a clear Hopper bit (the self-check passed it) lets that instance take
   * the unsplit F16 forward */
  cr_assert_eq(attn_cu_select_masked(&p, 132, ATTN_CU_SPLIT_BIT | DEC_OFF, &c, &st), 0);
  cr_expect(c.kernel == ATTN_CU_HOPPER_D64 && c.nsplit == 1);
  const unsigned all_mma = ((1u << NFWD_INSTS) - 1) << ATTN_CU_MMA_D64;
  cr_expect_eq(attn_cu_select_masked(&p, 132, all_mma, &c, &st), ATTN_EUNSUPPORTED);
  cr_expect(strstr(st.message, "self-check"), "%s", st.message);
  p.head_dim = p.dp = 256;
  cr_expect_eq(attn_cu_select_masked(&p, 132, 1u << ATTN_CU_MMA_D256, &c, &st), ATTN_EUNSUPPORTED,
               "a dp of 256 has nowhere to go");
  p.head_dim = p.dp = 64;
  p.dtype = ATTN_F32;
  cr_assert_eq(attn_cu_select_masked(&p, 132, all_mma, &c, &st), 0);
  cr_expect_eq(c.kernel, ATTN_CU_SIMT_F32, "the tensor-core bits leave F32 alone");
  p.dtype = ATTN_F16;
  p.pass = ATTN_BACKWARD;
  cr_assert_eq(attn_cu_select_masked(&p, 132, 1u << ATTN_CU_MMA_D64, &c, &st), 0);
  cr_expect_eq(c.kernel, ATTN_CU_BWD_MMA_D64, "a forward bit leaves the backward alone");
  cr_assert_eq(attn_cu_select_masked(&p, 132, 1u << ATTN_CU_BWD_MMA_D64, &c, &st), 0);
  cr_expect_eq(c.kernel, ATTN_CU_BWD_MMA_D128);
  p.dtype = ATTN_F32;
  cr_expect_eq(attn_cu_select_masked(&p, 132, 1u << ATTN_CU_BWD_SIMT_F32, &c, &st),
               ATTN_EUNSUPPORTED);
}

/* ---- GQA packing ------------------------------------------------------------- */

Test(cuda_layout, gqa_packing_selection) {
  attn_cu_choice c;
  attn_status st;
  /* a 32:8 decode: 8 blocks of the 4 heads of a group, split to fill the
   * machine (264 blocks wanted of 8, 512 tiles) */
  attn_cu_params p = shape(ATTN_BF16, 1, 32, 8, 1, 32768, 128);
  cr_assert_eq(select_tiled(&p, 132, &c, &st), 0, "%s", st.message);
  cr_expect(c.kernel == ATTN_CU_MMA_D128 && c.pack == 4, "%s pack %d",
            attn_cu_kernel_name(c.kernel), c.pack);
  cr_expect(c.grid[0] == 1 && c.grid[1] == 8 && c.grid[2] == 33, "grid %u %u %u", c.grid[0],
            c.grid[1], c.grid[2]);
  cr_expect_eq(c.nsplit, 33);
  cr_expect_eq(attn_cu_split_bytes(&p, &c), (size_t)33 * 32 * (128 + 2) * 4, "every head's rows");
  /* MQA: 32 heads x 4 queries fill the 128 rows; 5 queries do not fit */
  p = shape(ATTN_F16, 2, 32, 1, 4, 100, 64);
  cr_assert_eq(attn_cu_select(&p, 132, &c, &st), 0);
  cr_expect(c.pack == 32 && c.grid[0] == 1 && c.grid[1] == 1 &&
            c.grid[2] == 2u * (unsigned)c.nsplit);
  p.seq_q = 5;
  cr_assert_eq(attn_cu_select(&p, 132, &c, &st), 0);
  cr_expect(c.pack == 1 && c.grid[1] == 32);
  /* each instance: groups of 16 queries that exactly fill its block (8 of
   * them in 128 rows, 4 in 64) pack, 17 queries do not */
  for (int i = 0; i < NFWD_INSTS; i++) {
    const int g = fwd_insts[i].bm / 16, d = fwd_insts[i].dpad - 3;
    p = shape(ATTN_BF16, 1, 2 * g, 2, 16, 300, d);
    cr_assert_eq(attn_cu_select(&p, 132, &c, &st), 0);
    expect_inst_tiles(&c, i, d);
    cr_expect(c.pack == g && c.grid[0] == 1 && c.grid[1] == 2, "d %d: pack %d, grid %u %u", d,
              c.pack, c.grid[0], c.grid[1]);
    p.seq_q = 17;
    cr_assert_eq(attn_cu_select(&p, 132, &c, &st), 0);
    cr_expect(c.pack == 1 && c.grid[0] == 1 && c.grid[1] == 2u * (unsigned)g, "d %d: pack %d", d,
              c.pack);
  }
  /* never: MHA, F32 (its own kernel), the backward, the bit off */
  p = shape(ATTN_F16, 1, 8, 8, 1, 300, 64);
  cr_assert_eq(attn_cu_select(&p, 132, &c, &st), 0);
  cr_expect_eq(c.pack, 1);
  p = shape(ATTN_F32, 1, 8, 2, 1, 300, 64);
  cr_assert_eq(attn_cu_select(&p, 132, &c, &st), 0);
  cr_expect(c.kernel == ATTN_CU_SIMT_F32 && c.pack == 1 && c.grid[1] == 8);
  p = shape(ATTN_F16, 1, 8, 2, 1, 300, 64);
  p.pass = ATTN_BACKWARD;
  cr_assert_eq(attn_cu_select(&p, 132, &c, &st), 0);
  cr_expect_eq(c.pack, 1);
  p.pass = ATTN_FORWARD;
  cr_assert_eq(attn_cu_select_masked(&p, 132, ATTN_CU_PACK_BIT | ATTN_CU_HOPPER_OFF, &c, &st), 0);
  cr_expect(c.pack == 1 && c.grid[1] == 8, "the packing bit turns it off");
  /* the Hopper instance, allowed, leaves a packed decode alone and takes
   * it unpacked */
  p.seq_kv = 100; /* too few tiles to split */
  cr_assert_eq(attn_cu_select_masked(&p, 132, 0, &c, &st), 0);
  cr_expect(c.kernel == ATTN_CU_MMA_D64 && c.pack == 4, "%s", attn_cu_kernel_name(c.kernel));
  cr_assert_eq(attn_cu_select_masked(&p, 132, ATTN_CU_PACK_BIT, &c, &st), 0);
  cr_expect(c.kernel == ATTN_CU_HOPPER_D64 && c.pack == 1);
}

/* The block row mapping against the layout: rows r < pack·nq of the block
 * of group g are query r % nq of head g·pack + r / nq, and flat row
 * (b·Hq + h0)·Nq + r is that head's row in Q and O. */
Test(cuda_layout, block_rows_map_to_their_heads) {
  for (int nq = 1; nq <= 32; nq++) /* up to the 128-row blocks */
    for (int pack = 1; pack * nq <= 128; pack *= 2) {
      int seen[128] = {0};
      for (int r = 0; r < 128; r++) {
        int dh, i;
        attn_cu_block_row(r, nq, pack, &dh, &i);
        if (pack == 1) {
          cr_assert(dh == 0 && i == r);
          continue;
        }
        cr_assert(dh >= 0 && dh < pack && i >= 0 && i < nq, "r %d: head +%d query %d", r, dh, i);
        if (r < pack * nq) {
          cr_assert_eq(dh * nq + i, r, "row %d is not its head's row in the layout", r);
          seen[r]++;
        }
      }
      for (int r = 0; r < pack * nq && pack > 1; r++)
        cr_assert_eq(seen[r], 1);
    }
}

/* What one lane of fwd_mma computes for its two rows, with the kernel's
 * arithmetic: every visited key (split tiles, masked unless the tile is
 * full) of every stored row is counted in vis[row][key]. */
typedef struct emu_launch {
  const attn_cu_params *p;
  const attn_cu_choice *c;
  int64_t off;
  unsigned char *vis; /* [B·Hq·Nq][Nkv] */
  int *stored;        /* [B·Hq·Nq] */
  int *slope_head;    /* [B·Hq·Nq]: the head whose ALiBi slope the row used */
} emu_launch;

static void emu_lane(const emu_launch *e, int qt, int gy, int b, int split, int warp, int lane) {
  const attn_cu_params *p = e->p;
  const int pack = e->c->pack, bm = e->c->block_m, bn = e->c->block_n;
  const int h0 = gy * pack, rows = pack * p->seq_q;
  int i0, i1, q0, q1;
  attn_cu_block_span(qt, bm, p->seq_q, pack, &i0, &i1, &q0, &q1);
  const size_t qrow0 = ((size_t)b * p->heads_q + h0) * p->seq_q;
  int t0, t1;
  attn_cu_block_tiles(q0, q1, e->off, p->window_left, p->window_right, p->seq_kv, bn, e->c->nsplit,
                      split, &t0, &t1);
  const int mt = bm / (16 * e->c->warps);
  if (i0 + attn_cu_lane_row(warp, mt, 0, 0, 0) >= i1)
    return; /* an idle warp: only loads */
  for (int rh = 0; rh < 2 * mt; rh++) {
    const int r = i0 + attn_cu_lane_row(warp, mt, rh / 2, lane, rh % 2);
    int dh, i, lo, hi;
    attn_cu_block_row(r, p->seq_q, pack, &dh, &i);
    attn_cu_row_bounds(i, e->off, p->window_left, p->window_right, p->seq_kv, &lo, &hi);
    if (r >= rows)
      continue;
    const size_t row = qrow0 + (size_t)r;
    if (lane % 4 == 0 && split == 0)
      e->stored[row]++;
    e->slope_head[row] = (int)(((size_t)b * p->heads_q + h0 + dh) % p->heads_q);
    for (int t = t0; t < t1; t++) {
      int full = attn_cu_tile_full((int64_t)t * bn, bn, q0, q1, e->off, p->window_left,
                                   p->window_right, p->seq_kv);
      for (int c = 2 * (lane % 4); c < bn; c += 8) /* the lane's columns, 2 per 8 */
        for (int k = c; k < c + 2; k++) {
          int j = t * bn + k;
          if ((full || (j >= lo && j <= hi)) && j < p->seq_kv)
            e->vis[row * (size_t)p->seq_kv + (size_t)j]++;
          else
            cr_assert(full || j >= p->seq_kv || j < lo || j > hi);
        }
    }
  }
}

static void emu_packed_launch(attn_cu_params *p, int64_t wl, int64_t wr, int sms) {
  p->window_left = wl, p->window_right = wr, p->off = (int64_t)p->seq_kv - p->seq_q;
  attn_cu_choice c;
  attn_status st;
  cr_assert_eq(attn_cu_select(p, sms, &c, &st), 0, "%s", st.message);
  const size_t nrows = (size_t)p->batch * p->heads_q * p->seq_q;
  emu_launch e = {p,
                  &c,
                  p->off,
                  calloc(nrows * (size_t)p->seq_kv, 1),
                  calloc(nrows, sizeof(int)),
                  calloc(nrows, sizeof(int))};
  for (unsigned z = 0; z < c.grid[2]; z++)
    for (unsigned y = 0; y < c.grid[1]; y++)
      for (unsigned x = 0; x < c.grid[0]; x++)
        for (int w = 0; w < c.warps; w++)
          for (int l = 0; l < 32; l++)
            emu_lane(&e, (int)x, (int)y, (int)z / c.nsplit, (int)z % c.nsplit, w, l);
  for (size_t row = 0; row < nrows; row++) {
    const int64_t i = (int64_t)(row % (size_t)p->seq_q);
    const int h = (int)(row / (size_t)p->seq_q % (size_t)p->heads_q);
    cr_assert_eq(e.stored[row], 1, "row %zu stored %d times (pack %d)", row, e.stored[row], c.pack);
    cr_assert_eq(e.slope_head[row], h, "row %zu used head %d's slope", row, e.slope_head[row]);
    for (int64_t j = 0; j < p->seq_kv; j++)
      cr_assert_eq(e.vis[row * (size_t)p->seq_kv + (size_t)j], visible(i, j, p->off, wl, wr),
                   "row %zu (head %d, query %lld), key %lld: counted %d (pack %d, %d splits)", row,
                   h, (long long)i, (long long)j, e.vis[row * (size_t)p->seq_kv + (size_t)j],
                   c.pack, c.nsplit);
  }
  free(e.vis), free(e.stored), free(e.slope_head);
}

/* Packed blocks, emulated lane by lane: every row of every head is stored
 * once and sees exactly its own query's visible keys, across splits,
 * windows, GQA and MQA groups whose heads change inside a warp's rows. */
Test(cuda_layout, packed_blocks_see_each_rows_own_keys) {
  uint64_t seed = 23;
  int packed = 0, split = 0;
  for (int it = 0; it < 60; it++) {
    static const int groups[][2] = {{32, 8}, {32, 1}, {8, 2}, {12, 4}, {6, 3}, {4, 4}};
    const int *g = groups[it % 6];
    int group = g[0] / g[1], nq = 1 + (int)(trand(&seed) % (64 / group < 20 ? 64 / group : 20));
    attn_cu_params p = shape(it % 2 ? ATTN_F16 : ATTN_BF16, 1 + it % 2, g[0], g[1], nq,
                             1 + (int)(trand(&seed) % 900), it % 3 ? 64 : 160);
    int64_t wl = it % 3 ? (int64_t)(trand(&seed) % 300) - 1 : -1;
    int64_t wr = (int64_t)(trand(&seed) % 4) - 1;
    const int sms = it % 4 ? 132 : 4;
    emu_packed_launch(&p, wl, wr, sms);
    attn_cu_choice c;
    attn_status st;
    attn_cu_select(&p, sms, &c, &st);
    packed += c.pack > 1;
    split += c.pack > 1 && c.nsplit > 1;
  }
  cr_expect_geq(packed, 30, "only %d packed launches", packed);
  cr_expect_geq(split, 10, "only %d packed and split", split);
}

/* ---- the scale folded into the exponent ---------------------------------------- */

/* One row's online softmax as fwd_mma.cuh runs it over tiles of 8 raw
 * scores q·k (masked ones -inf): scaled first unless attn_cu_exp_factor
 * folds the scale into the exponent's FFMA; returns sum_j w_j v_j / l. */
static double emu_row_softmax(const float *raw, const float *v, int n, float scale_log2, bool var) {
  const float k = attn_cu_exp_factor(scale_log2, var);
  float m = -INFINITY, l = 0, acc = 0;
  for (int j0 = 0; j0 < n; j0 += 8) {
    float s[8], mx = -INFINITY;
    for (int j = 0; j < 8; j++) {
      s[j] = j0 + j < n ? raw[j0 + j] : -INFINITY;
      if (k == 1.0f && s[j] != -INFINITY) /* the kernel masks after scaling */
        s[j] *= scale_log2;
      mx = fmaxf(mx, s[j]);
    }
    mx = fmaxf(m, mx * k);
    const float use = attn_cu_max_for_exp(mx), al = exp2f(m - use);
    m = mx;
    l *= al, acc *= al;
    for (int j = 0; j < 8; j++) {
      float w = exp2f(fmaf(s[j], k, -use));
      l += w;
      acc += w * (j0 + j < n ? v[j0 + j] : 0);
    }
  }
  return l > 0 ? acc / l : 0;
}

Test(cuda_layout, folded_scale_matches_float64_for_every_sign) {
  cr_expect_eq(attn_cu_exp_factor(0.18f, false), 0.18f);
  cr_expect_eq(attn_cu_exp_factor(0.18f, true), 1.0f, "variants need the scaled score");
  cr_expect_eq(attn_cu_exp_factor(-0.18f, false), 1.0f);
  cr_expect_eq(attn_cu_exp_factor(0.0f, false), 1.0f);
  uint64_t seed = 29;
  static const float scales[] = {0.125f, 2.5f, -0.125f, -3.0f, 0.0f, 1.0f};
  for (int it = 0; it < 600; it++) {
    const int n = 1 + (int)(trand(&seed) % 70);
    const float sl2 = scales[it % 6] * 1.4426950408889634f;
    float raw[70], v[70];
    int visible = 0;
    for (int j = 0; j < n; j++) {
      raw[j] = (float)(8 * tuniform(&seed));
      v[j] = (float)tuniform(&seed);
      if (trand(&seed) % 4 == 0 || it % 50 == 0) /* masked; some rows wholly */
        raw[j] = -INFINITY;
      visible += raw[j] != -INFINITY;
    }
    double m = -INFINITY, l = 0, acc = 0;
    for (int j = 0; j < n; j++)
      if (raw[j] != -INFINITY && (double)raw[j] * sl2 > m)
        m = (double)raw[j] * sl2;
    for (int j = 0; j < n; j++)
      if (raw[j] != -INFINITY) {
        double w = exp2((double)raw[j] * sl2 - m);
        l += w, acc += w * v[j];
      }
    const double want = visible ? acc / l : 0;
    const double got = emu_row_softmax(raw, v, n, sl2, it % 7 == 0);
    cr_assert(fabs(got - want) <= 1e-5, "scale %g, %d keys (%d visible): %.8g, float64 %.8g",
              scales[it % 6], n, visible, got, want);
  }
}
