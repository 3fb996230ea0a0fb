/*
 * test_cuda_decode.c — the decode kernel's index arithmetic
 * (decode_layout.h) and its selection (select.c), on the CPU.
 *
 * The PTX ISA's mma.m16n8k16 fragment figures (A, B, C of F16/BF16 inputs
 * with F32 accumulators) and ldmatrix.m8n8 (plain and .trans) are written
 * here independently of the headers. A warp is then emulated lane by lane
 * as decode.cuh issues its operations for one 16-key tile: Q's B
 * fragments, Sᵀ = K Qᵀ, P staged through the per-warp tile and read back
 * as Pᵀ's B fragments, Oᵀ += Vᵀ Pᵀ; both products must match float64. A
 * whole decode is then emulated the same way, lane by lane and tile by
 * tile as decode.cuh runs it (each warp's tiles, scores, variants and
 * masks per fragment element, the online softmax over a column's lanes,
 * the warps' combine, the splits' merge): O, m and lse must be float64's.
 * The warps' and the splits' key ranges, the two-level merge (warps, then
 * splits), the split counters' place in split_ws and the selection are
 * checked against brute force and float64.
 */
#include "cuda/decode_layout.h"
#include "cuda/kernels.h"
#include "engine.h"
#include "helpers.h"
#include "ptx.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- the PTX ISA's figures (tests/lib/ptx.h) ------------------------------- */

/* D = A B + D, B's registers b0 b1 from register rb and b2 b3 from rb + 1 of
 * each lane's four. */
static void mma(float d[32][4], tptx_reg2 a[32][4], tptx_reg2 b[32][4], int rb) {
  tptx_reg2 lo[32], hi[32];
  for (int l = 0; l < 32; l++)
    for (int h = 0; h < 2; h++)
      lo[l][h] = b[l][rb][h], hi[l][h] = b[l][rb + 1][h];
  tptx_mma(d, a, lo, hi);
}

static double urand(unsigned *x) {
  *x = *x * 1664525u + 1013904223u;
  return (double)(*x >> 8) / (double)(1u << 24) * 2.0 - 1.0;
}

Test(cuda_decode, fragments_match_ptx_figures) {
  for (int l = 0; l < 32; l++)
    for (int i = 0; i < 4; i++) {
      int r, c, r2, c2;
      attn_cu_frag_c(l, i, &r, &c);
      tptx_c(l, i, &r2, &c2);
      cr_assert(r == r2 && c == c2, "C lane %d element %d", l, i);
    }
}

/* ---- one tile of a warp, emulated -------------------------------------------- */

enum { EMU_DMAX = 128, EMU_STR = EMU_DMAX + 8 };

/* One 16-key tile of dims dpad and nb n8 column tiles, issued as
 * decode.cuh does (dec_qk, dec_pv); Sᵀ and Oᵀ checked against float64. */
static void emulate_tile(int dpad, int nb, unsigned seed) {
  static float K[16][EMU_STR], V[16][EMU_STR], Q[16][EMU_STR], P[16][ATTN_CU_DEC_PSTR];
  const int md = dpad / 16;
  for (int r = 0; r < 16; r++)
    for (int c = 0; c < EMU_STR; c++) {
      K[r][c] = (float)urand(&seed), V[r][c] = (float)urand(&seed);
      Q[r][c] = (float)urand(&seed);
    }
  memset(P, 0, sizeof P);
  static tptx_reg2 qf[EMU_DMAX / 16][32][4], a[32][4], pb[32][4];
  float s[2][32][4] = {{{0}}}, o[EMU_DMAX / 16][2][32][4];
  memset(o, 0, sizeof o);
  const float *rows[32];
  for (int kk = 0; kk < md; kk++) { /* Q as B, once per block */
    for (int l = 0; l < 32; l++) {
      int qc, qd;
      attn_cu_dec_addr_q(l, &qc, &qd);
      rows[l] = &Q[qc][kk * 16 + qd];
    }
    tptx_ldsm(rows, 0, qf[kk]);
  }
  for (int kk = 0; kk < md; kk++) { /* Sᵀ = K Qᵀ */
    for (int l = 0; l < 32; l++) {
      int kr, kc;
      attn_cu_dec_addr_k(l, &kr, &kc);
      rows[l] = &K[kr][kk * 16 + kc];
    }
    tptx_ldsm(rows, 0, a);
    for (int n = 0; n < nb; n++)
      mma(s[n], a, qf[kk], 2 * n);
  }
  for (int n = 0; n < nb; n++)
    for (int l = 0; l < 32; l++)
      for (int i = 0; i < 4; i++) {
        int key, col;
        tptx_c(l, i, &key, &col);
        double want = 0;
        for (int d = 0; d < dpad; d++)
          want += (double)K[key][d] * Q[n * 8 + col][d];
        cr_assert_float_eq(s[n][l][i], want, 1e-4, "Sᵀ d %d key %d col %d", dpad, key, n * 8 + col);
      }
  /* P staged as dec_pv stores it: C element 2h (and 2h + 1) of each tile */
  for (int n = 0; n < nb; n++)
    for (int l = 0; l < 32; l++)
      for (int h = 0; h < 2; h++) {
        int key, col;
        attn_cu_frag_c(l, 2 * h, &key, &col);
        P[key][n * 8 + col] = s[n][l][2 * h];
        P[key][n * 8 + col + 1] = s[n][l][2 * h + 1];
      }
  for (int l = 0; l < 32; l++) { /* x4.trans (x2: lanes 0-15, registers 0, 1) */
    int pk, pc;
    attn_cu_dec_addr_p(l, &pk, &pc);
    rows[l] = &P[pk][pc];
  }
  tptx_ldsm(rows, 1, pb);
  for (int dm = 0; dm < md; dm++) { /* Oᵀ += Vᵀ Pᵀ */
    for (int l = 0; l < 32; l++) {
      int vk, vd;
      attn_cu_dec_addr_v(l, &vk, &vd);
      rows[l] = &V[vk][dm * 16 + vd];
    }
    tptx_ldsm(rows, 1, a);
    for (int n = 0; n < nb; n++)
      mma(o[dm][n], a, pb, 2 * n);
  }
  for (int dm = 0; dm < md; dm++)
    for (int n = 0; n < nb; n++)
      for (int l = 0; l < 32; l++)
        for (int i = 0; i < 4; i++) {
          int dim, col;
          attn_cu_frag_c(l, i, &dim, &col); /* what dec_warp_out stores */
          double want = 0;
          for (int key = 0; key < 16; key++) {
            double sk = 0;
            for (int d = 0; d < dpad; d++)
              sk += (double)K[key][d] * Q[n * 8 + col][d];
            want += (double)V[key][dm * 16 + dim] * sk;
          }
          cr_assert_float_eq(o[dm][n][l][i], want, 1e-3, "Oᵀ d %d dim %d col %d", dpad,
                             dm * 16 + dim, n * 8 + col);
        }
}

Test(cuda_decode, warp_emulation_d64_8_columns) { emulate_tile(64, 1, 1u); }
Test(cuda_decode, warp_emulation_d64_16_columns) { emulate_tile(64, 2, 2u); }
Test(cuda_decode, warp_emulation_d128_8_columns) { emulate_tile(128, 1, 3u); }
Test(cuda_decode, warp_emulation_d128_16_columns) { emulate_tile(128, 2, 4u); }

/* ---- a whole decode, emulated ------------------------------------------------ */

/* A decode problem for the emulation: one (batch, KV head) of `group`
 * query heads × nq queries over nkv keys, dims d (<= 128). */
typedef struct dprob {
  int nq, group, nkv, d, nsplit, nw;
  int64_t wl, wr;
  double scale, cap; /* cap: softcap, 0 off */
  bool alibi;
} dprob;

enum { EMU_NKV = 1024 };
static float eQ[16][EMU_STR], eK[EMU_NKV][EMU_STR], eV[EMU_NKV][EMU_STR], eSlope[16];

/* One warp's state, as decode.cuh's registers hold it: Oᵀ per (dim tile,
 * n8 tile, lane, element), and m, l per (lane, n8 tile, column 2t + c). */
typedef struct ewarp {
  float o[EMU_DMAX / 16][2][32][4], m[32][2][2], l[32][2][2];
} ewarp;

/* Sᵀ = K Qᵀ of the tile at K row j0 (rows past nkv zero, as cp.async
 * fills them), as dec_qk issues it. */
static void e_qk(const dprob *pr, int j0, int nb, float s[2][32][4]) {
  static float Kt[16][EMU_STR];
  static tptx_reg2 qf[32][4], a[32][4];
  memset(Kt, 0, sizeof Kt);
  for (int r = 0; r < 16 && j0 + r < pr->nkv; r++)
    memcpy(Kt[r], eK[j0 + r], sizeof Kt[r]);
  memset(s, 0, 2 * 32 * 4 * sizeof(float));
  const float *rows[32];
  for (int kk = 0; kk < (pr->d + 15) / 16; kk++) {
    for (int l = 0; l < 32; l++) {
      int qc, qd;
      attn_cu_dec_addr_q(l, &qc, &qd);
      rows[l] = &eQ[qc][kk * 16 + qd];
    }
    tptx_ldsm(rows, 0, qf);
    for (int l = 0; l < 32; l++) {
      int kr, kc;
      attn_cu_dec_addr_k(l, &kr, &kc);
      rows[l] = &Kt[kr][kk * 16 + kc];
    }
    tptx_ldsm(rows, 0, a);
    for (int n = 0; n < nb; n++)
      mma(s[n], a, qf, 2 * n);
  }
}

/* dec_scores: log2 units, the variants, the mask, element by element at
 * the (key, column) attn_cu_frag_c and attn_cu_block_row give it. */
static void e_scores(const dprob *pr, int j0, int nb, float k, float s[2][32][4]) {
  const int64_t off = pr->nkv - pr->nq;
  const float sl2 = (float)(pr->scale * M_LOG2E), cap2 = (float)(pr->cap * M_LOG2E);
  const bool full = attn_cu_tile_full(j0, 16, 0, pr->nq, off, pr->wl, pr->wr, pr->nkv);
  for (int n = 0; n < nb; n++)
    for (int l = 0; l < 32; l++)
      for (int e = 0; e < 4; e++) {
        int key, col, dh, i, lo, hi;
        attn_cu_frag_c(l, e, &key, &col);
        attn_cu_block_row(n * 8 + col, pr->nq, pr->group, &dh, &i);
        float x = s[n][l][e], g;
        if (k == 1.0f) {
          x *= sl2;
          if (pr->cap > 0 || pr->alibi)
            x = attn_cu_variant(x, cap2, cap2 > 0 ? 1.0f / cap2 : 0.0f,
                                pr->alibi ? (float)(-eSlope[dh] * M_LOG2E) : 0.0f,
                                attn_cu_dist(attn_cu_dist0(i, off, j0), key), &g);
        }
        attn_cu_row_bounds(i, off, pr->wl, pr->wr, pr->nkv, &lo, &hi);
        s[n][l][e] = full || (j0 + key >= lo && j0 + key <= hi) ? x : -INFINITY;
      }
}

/* dec_softmax: a column's tile max over the 8 lanes of one t, then each
 * lane's weights, sums and rescaled Oᵀ. */
static void e_softmax(ewarp *w, int nb, int md, float k, float s[2][32][4]) {
  for (int n = 0; n < nb; n++)
    for (int c = 0; c < 2; c++)
      for (int t = 0; t < 4; t++) {
        float mx = -INFINITY;
        for (int l = t; l < 32; l += 4)
          mx = fmaxf(mx, fmaxf(s[n][l][c], s[n][l][c + 2]));
        for (int l = t; l < 32; l += 4) {
          const float nm = fmaxf(w->m[l][n][c], mx * k), use = attn_cu_max_for_exp(nm);
          const float al = exp2f(w->m[l][n][c] - use);
          w->m[l][n][c] = nm;
          s[n][l][c] = exp2f(fmaf(s[n][l][c], k, -use));
          s[n][l][c + 2] = exp2f(fmaf(s[n][l][c + 2], k, -use));
          w->l[l][n][c] = w->l[l][n][c] * al + s[n][l][c] + s[n][l][c + 2];
          for (int d = 0; d < md; d++)
            w->o[d][n][l][c] *= al, w->o[d][n][l][c + 2] *= al;
        }
      }
}

/* dec_pv: P through the staging tile, Oᵀ += Vᵀ Pᵀ. */
static void e_pv(const dprob *pr, ewarp *w, int j0, int nb, float s[2][32][4]) {
  static float Vt[16][EMU_STR], P[16][ATTN_CU_DEC_PSTR];
  static tptx_reg2 pb[32][4], a[32][4];
  memset(Vt, 0, sizeof Vt);
  for (int r = 0; r < 16 && j0 + r < pr->nkv; r++)
    memcpy(Vt[r], eV[j0 + r], sizeof Vt[r]);
  for (int n = 0; n < nb; n++)
    for (int l = 0; l < 32; l++)
      for (int h = 0; h < 2; h++) {
        int key, col;
        attn_cu_frag_c(l, 2 * h, &key, &col);
        P[key][n * 8 + col] = s[n][l][2 * h], P[key][n * 8 + col + 1] = s[n][l][2 * h + 1];
      }
  const float *rows[32];
  for (int l = 0; l < 32; l++) {
    int pk, pc;
    attn_cu_dec_addr_p(l, &pk, &pc);
    rows[l] = &P[pk][pc];
  }
  tptx_ldsm(rows, 1, pb);
  for (int dm = 0; dm < (pr->d + 15) / 16; dm++) {
    for (int l = 0; l < 32; l++) {
      int vk, vd;
      attn_cu_dec_addr_v(l, &vk, &vd);
      rows[l] = &Vt[vk][dm * 16 + vd];
    }
    tptx_ldsm(rows, 1, a);
    for (int n = 0; n < nb; n++)
      mma(w->o[dm][n], a, pb, 2 * n);
  }
}

/* The block of split sp: its warps' passes, then dec_warp_out and
 * dec_combine into the split's partial (o normalized, m2, l) per column. */
static void e_block(const dprob *pr, int sp, int nb, float (*po)[EMU_DMAX], float *pml) {
  static ewarp ws[4];
  static float sML[2 * 4 * 16];
  const int64_t off = pr->nkv - pr->nq;
  const int md = (pr->d + 15) / 16, rows = pr->group * pr->nq;
  const bool var = pr->cap > 0 || pr->alibi;
  const float k = attn_cu_exp_factor((float)(pr->scale * M_LOG2E), var);
  int t0, t1;
  attn_cu_block_tiles(0, pr->nq, off, pr->wl, pr->wr, pr->nkv, 16, pr->nsplit, sp, &t0, &t1);
  for (int wp = 0; wp < pr->nw; wp++) {
    ewarp *w = &ws[wp];
    memset(w, 0, sizeof *w);
    for (int l = 0; l < 32; l++)
      for (int i = 0; i < 4; i++)
        w->m[l][i / 2][i % 2] = -INFINITY;
    for (int i = 0; i < attn_cu_dec_warp_count(t0, t1, wp, pr->nw); i++) {
      const int j0 = attn_cu_dec_warp_tile(t0, wp, pr->nw, i) * 16;
      float s[2][32][4];
      e_qk(pr, j0, nb, s);
      e_scores(pr, j0, nb, k, s);
      e_softmax(w, nb, md, k, s);
      e_pv(pr, w, j0, nb, s);
    }
    for (int l = 0; l < 4; l++) /* lanes g = 0 after the sum over g */
      for (int n = 0; n < nb; n++)
        for (int c = 0; c < 2; c++) {
          float sum = 0;
          for (int g = 0; g < 8; g++)
            sum += w->l[4 * g + l][n][c];
          sML[2 * (wp * 16 + n * 8 + 2 * l + c)] = w->m[l][n][c];
          sML[2 * (wp * 16 + n * 8 + 2 * l + c) + 1] = sum;
        }
  }
  for (int col = 0; col < rows; col++) {
    float m2, l;
    attn_cu_merge(sML + 2 * col, 16, pr->nw, &m2, &l);
    pml[2 * col] = m2, pml[2 * col + 1] = l;
    for (int dim = 0; dim < pr->d; dim++) {
      float acc = 0;
      for (int wp = 0; wp < pr->nw; wp++)
        for (int lane = 0; lane < 32; lane++)
          for (int e = 0; e < 4; e++) {
            int r, c;
            attn_cu_frag_c(lane, e, &r, &c);
            if ((col / 8) < nb && c == col % 8 && (dim / 16) * 16 + r == dim)
              acc += attn_cu_dec_warp_weight(sML[2 * (wp * 16 + col)], sML[2 * (wp * 16 + col) + 1],
                                             m2, l) *
                     ws[wp].o[dim / 16][col / 8][lane][e];
          }
      po[col][dim] = acc;
    }
  }
}

/* The P staging tile: the 8 rows of each ldmatrix phase start in distinct
 * bank quads, and a warp's 32-bit stores of one (n, h) hit 32 banks. */
Test(cuda_decode, p_staging_is_conflict_free) {
  for (int ph = 0; ph < 4; ph++) {
    int seen = 0;
    for (int l = 8 * ph; l < 8 * ph + 8; l++) {
      int pk, pc;
      attn_cu_dec_addr_p(l, &pk, &pc);
      int quad = ((pk * ATTN_CU_DEC_PSTR + pc) * 2 / 16) % 8;
      cr_assert(!(seen & 1 << quad), "phase %d: bank quad %d twice", ph, quad);
      seen |= 1 << quad;
    }
  }
  for (int n = 0; n < 2; n++)
    for (int h = 0; h < 2; h++) {
      uint64_t banks = 0;
      for (int l = 0; l < 32; l++) {
        int key, col;
        attn_cu_frag_c(l, 2 * h, &key, &col);
        int bank = ((key * ATTN_CU_DEC_PSTR + n * 8 + col) * 2 / 4) % 32;
        cr_assert(!(banks >> bank & 1), "n %d h %d: bank %d twice", n, h, bank);
        banks |= 1ull << bank;
      }
    }
}

/* float64 attention of column col (head dh, query i) over every key. */
static void e_reference(const dprob *pr, int col, double *o, double *m, double *lse) {
  int dh, i;
  attn_cu_block_row(col, pr->nq, pr->group, &dh, &i);
  const int64_t off = pr->nkv - pr->nq;
  static double sc[EMU_NKV];
  double mx = -INFINITY, sum = 0;
  for (int j = 0; j < pr->nkv; j++) {
    bool vis = (pr->wl < 0 || j >= i + off - pr->wl) && (pr->wr < 0 || j <= i + off + pr->wr);
    double x = 0;
    for (int d = 0; d < pr->d; d++)
      x += (double)eQ[col][d] * eK[j][d];
    x *= pr->scale;
    if (pr->cap > 0)
      x = pr->cap * tanh(x / pr->cap);
    if (pr->alibi)
      x -= eSlope[dh] * fabs((double)(i + off - j));
    sc[j] = vis ? x : -INFINITY;
    mx = sc[j] > mx ? sc[j] : mx;
  }
  for (int d = 0; d < pr->d; d++)
    o[d] = 0;
  for (int j = 0; j < pr->nkv && mx > -INFINITY; j++) {
    double p = exp(sc[j] - mx);
    sum += p;
    for (int d = 0; d < pr->d; d++)
      o[d] += p * eV[j][d];
  }
  for (int d = 0; d < pr->d; d++)
    o[d] = sum > 0 ? o[d] / sum : 0;
  *m = sum > 0 ? mx : -INFINITY;
  *lse = sum > 0 ? mx + log(sum) : -INFINITY;
}

/* Every split's block, then dec_merge's (m2, l) and weights over the
 * splits; O, m and lse of every column against float64. */
static void emulate_decode(const dprob *pr, unsigned seed) {
  const int rows = pr->group * pr->nq, nb = rows <= 8 ? 1 : 2;
  memset(eQ, 0, sizeof eQ), memset(eK, 0, sizeof eK), memset(eV, 0, sizeof eV);
  for (int r = 0; r < rows; r++)
    for (int d = 0; d < pr->d; d++)
      eQ[r][d] = (float)urand(&seed);
  for (int j = 0; j < pr->nkv; j++)
    for (int d = 0; d < pr->d; d++)
      eK[j][d] = (float)urand(&seed), eV[j][d] = (float)urand(&seed);
  for (int h = 0; h < pr->group; h++)
    eSlope[h] = (float)exp2(-8.0 * (h + 1) / pr->group);
  static float po[64][16][EMU_DMAX], pml[64][2 * 16];
  for (int sp = 0; sp < pr->nsplit; sp++)
    e_block(pr, sp, nb, po[sp], pml[sp]);
  for (int col = 0; col < rows; col++) {
    float m2, l, m, lse;
    attn_cu_merge(&pml[0][2 * col], 16, pr->nsplit, &m2, &l);
    attn_cu_stats(m2, l, &m, &lse);
    double ro[EMU_DMAX], rm, rlse;
    e_reference(pr, col, ro, &rm, &rlse);
    cr_assert(rm == -INFINITY ? m == -INFINITY && lse == -INFINITY && l == 0
                              : fabs(lse - rlse) < 1e-3 && fabs(m - rm) < 1e-3,
              "column %d: m %g lse %g, want %g %g", col, m, lse, rm, rlse);
    for (int d = 0; d < pr->d; d++) {
      double acc = 0;
      for (int sp = 0; sp < pr->nsplit; sp++)
        acc += attn_cu_merge_weight(pml[sp][2 * col], pml[sp][2 * col + 1], m2, l) * po[sp][col][d];
      cr_assert(fabs(acc - ro[d]) < 2e-4, "column %d dim %d: %g, want %g (nkv %d, %d splits)", col,
                d, acc, ro[d], pr->nkv, pr->nsplit);
    }
  }
}

/* The cases of the self-check's decode section, and the awkward ones:
 * one column, 16 columns over two n8 tiles, windows, a top-left-like
 * window that leaves splits empty, softcap and ALiBi, negative scales. */
Test(cuda_decode, whole_decode_emulation_matches_float64) {
  const dprob cases[] = {
      {1, 1, 200, 64, 2, 2, -1, -1, 0.125, 0, false},
      {1, 4, 300, 128, 3, 2, -1, -1, 0.088, 0, false},
      {2, 8, 260, 125, 2, 2, 100, 0, 0.09, 0, false},
      {3, 4, 150, 61, 1, 2, -1, 0, 0.13, 0, false},
      {1, 4, 333, 64, 4, 1, 20, 0, 0.125, 1.5, true},
      {2, 2, 100, 40, 4, 2, 0, 0, -0.1, 0, false},
      {1, 6, 257, 96, 2, 3, -1, -1, -0.08, 2.0, true},
      {4, 4, 64, 64, 2, 2, -1, -1, 0.2, 0, true},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
    emulate_decode(&cases[i], (unsigned)(11 * i + 3));
}

/* ---- key ranges -------------------------------------------------------------- */

/* Every visible tile of a (batch, KV head) is computed by exactly one warp
 * of exactly one split, and none outside the rows' windows. */
Test(cuda_decode, splits_and_warps_cover_every_visible_tile_once) {
  static int seen[4096];
  const int nkvs[] = {1, 15, 16, 17, 700, 4096, 40000};
  const int64_t wls[] = {-1, 0, 100}, wrs[] = {-1, 0};
  for (size_t a = 0; a < sizeof nkvs / sizeof *nkvs; a++)
    for (size_t w = 0; w < 3; w++)
      for (size_t r = 0; r < 2; r++)
        for (int nq = 1; nq <= 3; nq++)
          for (int nsplit = 1; nsplit <= 64; nsplit = nsplit * 3 + 1)
            for (int nw = 1; nw <= 4; nw++) {
              const int nkv = nkvs[a], tiles = (nkv + 15) / 16;
              const int64_t off = nkv - nq;
              if (tiles > 4096)
                continue;
              memset(seen, 0, sizeof seen);
              for (int s = 0; s < nsplit; s++) {
                int t0, t1;
                attn_cu_block_tiles(0, nq, off, wls[w], wrs[r], nkv, ATTN_CU_DEC_KT, nsplit, s, &t0,
                                    &t1);
                for (int wp = 0; wp < nw; wp++)
                  for (int i = 0; i < attn_cu_dec_warp_count(t0, t1, wp, nw); i++) {
                    int t = attn_cu_dec_warp_tile(t0, wp, nw, i);
                    cr_assert(t >= t0 && t < t1, "tile %d outside [%d, %d)", t, t0, t1);
                    seen[t]++;
                  }
              }
              for (int t = 0; t < tiles; t++) {
                int vis = 0; /* does any row see a key of tile t? */
                for (int i = 0; i < nq && !vis; i++)
                  for (int j = 16 * t; j < 16 * t + 16 && j < nkv && !vis; j++)
                    vis = (wls[w] < 0 || j >= i + off - wls[w]) &&
                          (wrs[r] < 0 || j <= i + off + wrs[r]);
                /* a tile between two visible ones is visited too: ranges are contiguous */
                cr_assert(seen[t] <= 1, "nkv %d: tile %d twice", nkv, t);
                if (vis)
                  cr_assert_eq(seen[t], 1, "nkv %d wl %lld nq %d nsplit %d nw %d: tile %d missed",
                               nkv, (long long)wls[w], nq, nsplit, nw, t);
              }
            }
}

/* ---- the two-level merge ------------------------------------------------------ */

/* Scores of one column over nkv keys (some masked: −inf) and a value per
 * key, split over nsplit splits and nw warps as the kernel splits them;
 * each warp's (m2, l, unnormalized o) in float as the kernel's online
 * softmax leaves them, then the warps' combine (attn_cu_merge,
 * attn_cu_dec_warp_weight) and the splits' merge (attn_cu_merge,
 * attn_cu_merge_weight): o and lse must be float64's. */
static void merge_case(int nkv, int nsplit, int nw, int masked_from, unsigned seed) {
  double s[2048], v[2048];
  for (int j = 0; j < nkv; j++) {
    s[j] = j >= masked_from ? -INFINITY : 6 * urand(&seed);
    v[j] = urand(&seed);
  }
  float part_ml[2 * 64], part_o[64];
  for (int sp = 0; sp < nsplit; sp++) {
    int t0, t1;
    attn_cu_block_tiles(0, 1, nkv - 1, -1, -1, nkv, ATTN_CU_DEC_KT, nsplit, sp, &t0, &t1);
    float wml[2 * 16 * 8] = {0}, wo[8];
    for (int w = 0; w < nw; w++) {
      float m = -INFINITY, l = 0, o = 0;
      for (int i = 0; i < attn_cu_dec_warp_count(t0, t1, w, nw); i++)
        for (int j = 16 * attn_cu_dec_warp_tile(t0, w, nw, i), e = j + 16; j < e && j < nkv; j++) {
          float x = (float)(s[j] * 1.4426950408889634), mx = fmaxf(m, x);
          float use = attn_cu_max_for_exp(mx), al = exp2f(m - use), p = exp2f(x - use);
          m = mx, l = l * al + p, o = o * al + p * (float)v[j];
        }
      wml[2 * (w * 16)] = m, wml[2 * (w * 16) + 1] = l, wo[w] = o;
    }
    float m2, l;
    attn_cu_merge(wml, 16, nw, &m2, &l);
    float acc = 0;
    for (int w = 0; w < nw; w++)
      acc += attn_cu_dec_warp_weight(wml[2 * w * 16], wml[2 * w * 16 + 1], m2, l) * wo[w];
    cr_assert(!isnan(acc) && !isnan(m2) && !isnan(l));
    part_ml[2 * sp] = m2, part_ml[2 * sp + 1] = l, part_o[sp] = acc;
  }
  float m2, l;
  attn_cu_merge(part_ml, 1, nsplit, &m2, &l);
  double acc = 0;
  for (int sp = 0; sp < nsplit; sp++)
    acc += attn_cu_merge_weight(part_ml[2 * sp], part_ml[2 * sp + 1], m2, l) * part_o[sp];
  double mx = -INFINITY, sum = 0, want = 0;
  for (int j = 0; j < nkv; j++)
    mx = s[j] > mx ? s[j] : mx;
  for (int j = 0; j < nkv && mx > -INFINITY; j++)
    sum += exp(s[j] - mx), want += exp(s[j] - mx) * v[j];
  float m, lse;
  attn_cu_stats(m2, l, &m, &lse);
  if (sum == 0) {
    cr_assert(acc == 0 && l == 0 && m == -INFINITY && lse == -INFINITY, "an empty row");
    return;
  }
  cr_assert_float_eq(acc, want / sum, 1e-5, "nkv %d nsplit %d nw %d", nkv, nsplit, nw);
  cr_assert_float_eq(lse, mx + log(sum), 1e-4, "lse nkv %d nsplit %d nw %d", nkv, nsplit, nw);
}

Test(cuda_decode, warp_then_split_merge_matches_float64) {
  const int nkvs[] = {1, 16, 33, 700, 2048};
  for (int a = 0; a < 5; a++)
    for (int nsplit = 1; nsplit <= 64; nsplit *= 4)
      for (int nw = 1; nw <= 4; nw++) {
        merge_case(nkvs[a], nsplit, nw, nkvs[a], (unsigned)(a * 100 + nsplit * 7 + nw));
        /* keys past 20 masked: whole warps and splits see nothing */
        merge_case(nkvs[a], nsplit, nw, 20, (unsigned)(a * 100 + nsplit * 7 + nw + 1));
        merge_case(nkvs[a], nsplit, nw, 0, 5u); /* no key at all */
      }
}

/* ---- selection ------------------------------------------------------------------ */

static attn_cu_params shape(attn_dtype dt, int b, int hq, int hkv, int nq, int nkv, int d) {
  attn_cu_params p;
  tcu_shape(&p, dt, b, hq, hkv, nq, nkv, d);
  return p;
}

Test(cuda_decode, names_and_bits_fit) {
  cr_assert_str_eq(attn_cu_kernel_name(ATTN_CU_DECODE_D64), "decode_d64");
  cr_assert_str_eq(attn_cu_kernel_name(ATTN_CU_DECODE_D128), "decode_d128");
  cr_assert_str_eq(attn_cu_kernel_name(ATTN_CU_DECODE_D256), "decode_d256");
  cr_assert_lt(ATTN_CU_KERNEL_COUNT + 1, 32, "the split and pack bits fit an unsigned");
  /* every kernel, the merge, the packing and the paged view */
  cr_assert_geq(ATTN_MAX_DISABLED, ATTN_CU_KERNEL_COUNT + 3);
  cr_assert(ATTN_CU_PAGED_KERNELS >> ATTN_CU_DECODE_D64 & 1);
  cr_assert(ATTN_CU_PAGED_KERNELS >> ATTN_CU_DECODE_D128 & 1);
  cr_assert(ATTN_CU_PAGED_KERNELS >> ATTN_CU_DECODE_D256 & 1);
}

/* The benchmark's decode (B 1, 32:8 heads, 32K keys): the decode kernel,
 * one block per KV head and split, enough splits for two blocks per
 * multiprocessor, shared memory under sm_89's 99 KB. */
Test(cuda_decode, selection_of_the_long_decode) {
  attn_cu_choice c;
  attn_status st;
  for (int d = 1; d <= 256; d++)
    for (int dt = ATTN_F16; dt <= ATTN_BF16; dt++) {
      attn_cu_params p = shape((attn_dtype)dt, 1, 32, 8, 1, 32768, d);
      if (p.dtype == ATTN_F32)
        continue;
      cr_assert_eq(attn_cu_select(&p, 132, &c, &st), 0, "%s", st.message);
      const int dpad = p.dp <= 64 ? 64 : p.dp <= 128 ? 128 : 256;
      const attn_cu_kernel want = dpad == 64    ? ATTN_CU_DECODE_D64
                                  : dpad == 128 ? ATTN_CU_DECODE_D128
                                                : ATTN_CU_DECODE_D256;
      cr_assert_eq(c.kernel, want, "d %d: %s", d, attn_cu_kernel_name(c.kernel));
      cr_assert(c.pack == 4 && c.grid[0] == 1 && c.grid[1] == 8, "d %d", d);
      cr_assert_eq(c.grid[2], (unsigned)c.nsplit);
      cr_assert_geq((int64_t)c.grid[1] * c.grid[2], 2 * 132, "d %d: %u blocks", d,
                    c.grid[1] * c.grid[2]);
      cr_assert_leq(c.nsplit, ATTN_CU_MAX_SPLITS);
      cr_assert_eq(c.block_n, ATTN_CU_DEC_KT);
      cr_assert_eq(c.warps, ATTN_CU_DEC_WARPS);
      cr_assert_leq(c.smem_bytes, 101376, "d %d: %zu bytes", d, c.smem_bytes);
      const int st_ = dpad == 64    ? ATTN_CU_DEC_STAGES_D64
                      : dpad == 128 ? ATTN_CU_DEC_STAGES_D128
                                    : ATTN_CU_DEC_STAGES_D256;
      const size_t ring = (size_t)ATTN_CU_DEC_WARPS * st_ * 2 * 16 * (dpad + 8) * 2;
      cr_assert_gt(c.smem_bytes, ring, "the rings are in the shared memory");
      /* the combine's F32 O [warps][16][dpad + 4] fits in the rings */
      cr_assert_leq((size_t)ATTN_CU_DEC_WARPS * 16 * (dpad + 4) * 4, ring);
      /* each split has its share of tiles, at least the minimum */
      cr_assert_geq(2048 / c.nsplit, ATTN_CU_DEC_MIN_TILES);
    }
}

Test(cuda_decode, split_counters_sit_after_the_partials) {
  attn_cu_choice c;
  attn_status st;
  attn_cu_params p = shape(ATTN_BF16, 3, 32, 8, 2, 9000, 128);
  cr_assert_eq(attn_cu_select(&p, 132, &c, &st), 0, "%s", st.message);
  cr_assert(attn_cu_is_decode(c.kernel) && c.nsplit > 1, "%s, %d splits",
            attn_cu_kernel_name(c.kernel), c.nsplit);
  const size_t nrows = 3 * 32 * 2;
  size_t first = attn_cu_dec_counter_at(c.nsplit, nrows, p.dp, 0);
  size_t last = attn_cu_dec_counter_at(c.nsplit, nrows, p.dp, 3 * 8 - 1);
  /* past every partial O and (m2, l) pair ... */
  cr_assert_eq(first * 4, (size_t)c.nsplit * nrows * (size_t)(p.dp + 2) * 4);
  /* ... and inside the scratch the launch gets, which stays 16-byte sized */
  cr_assert_leq((last + 1) * 4, attn_cu_split_bytes(&p, &c));
  cr_assert_eq(attn_cu_split_bytes(&p, &c) % 16, 0);
  /* one split: no scratch */
  attn_cu_params q = shape(ATTN_BF16, 64, 32, 8, 1, 9000, 128);
  cr_assert_eq(attn_cu_select(&q, 132, &c, &st), 0);
  cr_assert(attn_cu_is_decode(c.kernel) && c.nsplit == 1, "%d splits for 512 blocks", c.nsplit);
  cr_assert_eq(attn_cu_split_bytes(&q, &c), 0);
}

/* What the decode kernel does not take, and the bits that turn it off. */
Test(cuda_decode, selection_limits_and_disable_bits) {
  attn_cu_choice c;
  attn_status st;
  struct {
    attn_cu_params p;
    const char *why;
  } no[] = {
      {shape(ATTN_F32, 1, 32, 8, 1, 32768, 128), "F32"},
      {shape(ATTN_BF16, 1, 32, 8, 5, 32768, 128), "20 rows a group"},
      {shape(ATTN_BF16, 1, 32, 8, 1, 496, 128), "496 keys"},
      {shape(ATTN_BF16, 1, 32, 32, 17, 32768, 64), "17 queries"},
  };
  attn_cu_params bwd = shape(ATTN_BF16, 1, 32, 8, 1, 32768, 128);
  bwd.pass = ATTN_BACKWARD;
  attn_cu_params win = shape(ATTN_BF16, 1, 32, 8, 1, 32768, 128);
  win.window_left = 100; /* 101 visible keys */
  for (size_t i = 0; i < sizeof no / sizeof *no; i++) {
    cr_assert_eq(attn_cu_select(&no[i].p, 132, &c, &st), 0, "%s", st.message);
    cr_assert(!attn_cu_is_decode(c.kernel), "%s took %s", no[i].why, attn_cu_kernel_name(c.kernel));
  }
  cr_assert_eq(attn_cu_select(&bwd, 132, &c, &st), 0);
  cr_assert(!attn_cu_is_decode(c.kernel), "a backward");
  cr_assert_eq(attn_cu_select(&win, 132, &c, &st), 0);
  cr_assert(!attn_cu_is_decode(c.kernel), "101 visible keys");
  /* MHA and 16 rows (8 heads x 2 queries) take it too */
  attn_cu_params mha = shape(ATTN_F16, 2, 4, 4, 16, 4096, 64);
  cr_assert_eq(attn_cu_select(&mha, 132, &c, &st), 0);
  cr_assert(c.kernel == ATTN_CU_DECODE_D64 && c.pack == 1 && c.grid[1] == 4, "MHA");
  attn_cu_params g16 = shape(ATTN_F16, 1, 8, 1, 2, 4096, 128);
  cr_assert_eq(attn_cu_select(&g16, 132, &c, &st), 0);
  cr_assert(c.kernel == ATTN_CU_DECODE_D128 && c.pack == 8 && c.grid[1] == 1, "8 x 2 rows");
  /* the bits: 64 falls back to 128, both off to the tiled forward, split off to one range */
  attn_cu_params p = shape(ATTN_BF16, 1, 32, 8, 1, 32768, 64);
  unsigned off = ATTN_CU_HOPPER_OFF | 1u << ATTN_CU_DECODE_D64;
  cr_assert_eq(attn_cu_select_masked(&p, 132, off, &c, &st), 0);
  cr_assert_eq(c.kernel, ATTN_CU_DECODE_D128);
  off |= 1u << ATTN_CU_DECODE_D128;
  cr_assert_eq(attn_cu_select_masked(&p, 132, off, &c, &st), 0);
  cr_assert_eq(c.kernel, ATTN_CU_DECODE_D256);
  off |= 1u << ATTN_CU_DECODE_D256;
  cr_assert_eq(attn_cu_select_masked(&p, 132, off, &c, &st), 0);
  cr_assert_eq(c.kernel, ATTN_CU_MMA_D64);
  cr_assert_eq(attn_cu_select_masked(&p, 132, ATTN_CU_HOPPER_OFF | ATTN_CU_SPLIT_BIT, &c, &st), 0);
  cr_assert(c.kernel == ATTN_CU_DECODE_D64 && c.nsplit == 1 && c.grid[2] == 1);
  /* no multiprocessor count: no split */
  cr_assert_eq(attn_cu_select(&p, 0, &c, &st), 0);
  cr_assert(c.kernel == ATTN_CU_DECODE_D64 && c.nsplit == 1);
}

/* A paged decode (a session's step) takes it, with its contract. */
Test(cuda_decode, paged_decode_takes_it) {
  static _Alignas(256) unsigned char buf[8192];
  static int32_t table[64], used[2];
  attn_cu_params p = shape(ATTN_F16, 2, 8, 2, 1, 4000, 128);
  p.k_table = p.v_table = table;
  p.seqused_k = used;
  attn_cu_choice c;
  attn_status st;
  cr_assert_eq(attn_cu_select(&p, 132, &c, &st), 0, "%s", st.message);
  cr_assert(c.kernel == ATTN_CU_DECODE_D128 && c.nsplit > 1, "%s", attn_cu_kernel_name(c.kernel));
  p.q = buf, p.o = buf + 1024, p.page_base = buf, p.split_ws = buf + 2048;
  p.page_tokens = 64, p.page_bytes = 64 * 128 * 2, p.pages_per_head = 63;
  cr_assert(attn_cu_launch_ok(&p, &c));
  p.page_tokens = 32; /* below the contract's 64 */
  cr_assert(!attn_cu_launch_ok(&p, &c));
}

/* The split count: fills per_sm blocks on each multiprocessor, keeps
 * min_tiles tiles a split, stays within most, and 1 rather than a lone
 * split. */
Test(cuda_decode, split_count_rule) {
  for (long long blocks = 1; blocks <= 600; blocks += 7)
    for (long long tiles = 0; tiles <= 5000; tiles += 333) {
      int n = attn_cu_dec_splits(blocks, 132, 2, tiles, 16, 64);
      cr_assert(n >= 1 && n <= 64);
      if (n > 1) {
        cr_assert_geq(tiles / n, 16, "%lld tiles over %d splits", tiles, n);
        cr_assert_lt((n - 1) * blocks, 264, "more splits than the slots need");
      } else {
        cr_assert(blocks >= 264 || tiles < 32, "%lld blocks, %lld tiles: unsplit", blocks, tiles);
      }
      if (blocks * 64 < 264 && tiles >= 64 * 16)
        cr_assert_eq(n, 64);
    }
  cr_assert_eq(attn_cu_dec_splits(8, 0, 2, 2048, 16, 64), 1);
}
