/*
 * ptx.h — the PTX ISA's mma.m16n8k16 and ldmatrix.m8n8.x4 as the tests
 * emulate a warp on the CPU: the fragment figures of "Matrix Fragments for
 * mma.m16n8k16 with floating point type" written here independently of
 * the kernels' headers (engine/cuda/layout.h, decode_layout.h), which the
 * unit tests check against them.
 */
#ifndef ATTN_TESTS_PTX_H
#define ATTN_TESTS_PTX_H

#include <stdbool.h>

/* One 32-bit register of a fragment: two 16-bit elements, held as floats. */
typedef float tptx_reg2[2];

/* Element i of lane's A (16 x 16, a0..a7), B (16 x 8 as k x n, b0..b3) and
 * C/D (16 x 8, F32, c0..c3) fragments. */
void tptx_a(int lane, int i, int *row, int *col);
void tptx_b(int lane, int i, int *row, int *col);
void tptx_c(int lane, int i, int *row, int *col);

/* ldmatrix.m8n8.x4 (.trans): lane l addresses row l % 8 of matrix l / 8; in
 * register j it receives row l / 4, elements 2 (l % 4) and +1, of matrix j
 * (transposed: column l / 4, rows 2 (l % 4) and +1). */
void tptx_ldsm(const float *const addr[32], bool trans, tptx_reg2 out[32][4]);

/* mma.m16n8k16: D = A B + C in float64, B's registers b0 b1 from lo and b2
 * b3 from hi, every fragment placed by the figures. */
void tptx_mma(float c[32][4], tptx_reg2 a[32][4], tptx_reg2 lo[32], tptx_reg2 hi[32]);

#endif
