/*
 * ptx.c — the PTX ISA's mma.m16n8k16 and ldmatrix figures, emulated (ptx.h).
 */
#include "ptx.h"

void tptx_a(int lane, int i, int *row, int *col) {
  int g = lane >> 2, t = lane % 4;
  *row = (i < 2 || (i >= 4 && i < 6)) ? g : g + 8;
  *col = t * 2 + (i & 1) + (i >= 4 ? 8 : 0);
}
void tptx_b(int lane, int i, int *row, int *col) {
  int g = lane >> 2, t = lane % 4;
  *row = t * 2 + (i & 1) + (i >= 2 ? 8 : 0);
  *col = g;
}
void tptx_c(int lane, int i, int *row, int *col) {
  int g = lane >> 2, t = lane % 4;
  *row = i < 2 ? g : g + 8;
  *col = t * 2 + (i & 1);
}

void tptx_ldsm(const float *const addr[32], bool trans, tptx_reg2 out[32][4]) {
  for (int l = 0; l < 32; l++)
    for (int j = 0; j < 4; j++)
      for (int h = 0; h < 2; h++)
        out[l][j][h] =
            trans ? addr[8 * j + 2 * (l % 4) + h][l / 4] : addr[8 * j + l / 4][2 * (l % 4) + h];
}

void tptx_mma(float c[32][4], tptx_reg2 a[32][4], tptx_reg2 lo[32], tptx_reg2 hi[32]) {
  double A[16][16], B[16][8], C[16][8];
  for (int l = 0; l < 32; l++) {
    for (int i = 0; i < 8; i++) {
      int r, k;
      tptx_a(l, i, &r, &k);
      A[r][k] = a[l][i / 2][i % 2];
    }
    for (int i = 0; i < 4; i++) {
      int k, n, r;
      tptx_b(l, i, &k, &n);
      B[k][n] = i < 2 ? lo[l][i % 2] : hi[l][i % 2];
      tptx_c(l, i, &r, &n);
      C[r][n] = c[l][i];
    }
  }
  for (int l = 0; l < 32; l++)
    for (int i = 0; i < 4; i++) {
      int r, n;
      tptx_c(l, i, &r, &n);
      double acc = C[r][n];
      for (int k = 0; k < 16; k++)
        acc += A[r][k] * B[k][n];
      c[l][i] = (float)acc;
    }
}
