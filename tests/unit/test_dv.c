/*
 * test_dv.c — values with a head dim of their own (head_dim_v: DeepSeek's
 * MLA prefill, q·k over D 192 and values of Dv 128).
 *
 * The float64 reference takes Dv by the definition; it is checked here by
 * an identity that does not go through its Dv code (O over Dv columns is
 * the first Dv columns of O over V padded with zeros to D). Then every CPU
 * kernel this machine runs, forward and backward, Dv below and above D,
 * GQA, masks, a variable-length batch, against that reference; then the
 * refusals.
 */
#include "dvcase.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* O over V of Dv columns is the first Dv columns of O over V padded with
 * zeros to D: the reference's Dv against its own plain path. */
Test(dv, reference_is_the_padded_problem) {
  const dvspec s = {2, 4, 2, 9, 13, 12, 5, true, -1, -1, false};
  dvcase c;
  dvcase_init(&c, &s, ATTN_F32, 1);
  double *o = malloc((size_t)c.no_el * sizeof *o);
  attn_status st;
  cr_assert_eq(attn_reference(&c.r, o, NULL, NULL, NULL, &st), 0, "%s", st.message);
  attn_request p = c.r;
  p.head_dim_v = 0;
  float *vp = calloc((size_t)c.nk_el, sizeof *vp);
  for (int64_t i = 0; i < c.nv_el; i++)
    vp[i / 5 * 12 + i % 5] = ((const float *)c.v)[i];
  float *op = calloc((size_t)(2 * 4 * 9 * 12), sizeof *op);
  double *ow = malloc((size_t)(2 * 4 * 9 * 12) * sizeof *ow);
  p.v = vp, p.o = op, p.lse = NULL;
  cr_assert_eq(attn_reference(&p, ow, NULL, NULL, NULL, &st), 0, "%s", st.message);
  for (int64_t i = 0; i < c.no_el; i++)
    cr_expect_float_eq(o[i], ow[i / 5 * 12 + i % 5], 1e-14, "element %lld", (long long)i);
  free(o), free(vp), free(op), free(ow);
  dvcase_free(&c);
}

static const dvspec specs[] = {
    {1, 4, 4, 100, 130, 192, 128, true, -1, -1, false}, /* DeepSeek's prefill widths */
    {2, 6, 2, 70, 70, 64, 96, false, -1, -1, false},    /* Dv above D, GQA */
    {1, 3, 1, 1, 1500, 128, 64, false, -1, -1, false},  /* decode: the keys split */
    {2, 2, 2, 33, 20, 37, 5, true, -1, -1, false},      /* odd widths; rows that see nothing */
    /* the products over v's columns rounded up to 32 (attn__flash_v_width),
     * forward and backward: 64 of 96, on AMX tiles for the whole blocks */
    {1, 2, 2, 64, 128, 96, 40, true, -1, -1, false},
};
enum { NSPECS = sizeof specs / sizeof *specs };

static void run_on(int isa, bool backward) { dvcase_run_isa(isa, backward, specs, NSPECS, 40); }

DVCASE_ISA_TESTS(dv, run_on)

/* A variable-length batch is padded as a whole, then cut by its offsets:
 * each sequence against its own reference. */
Test(dv, varlen) {
  attn_engine *e = topen(2, NULL);
  const int64_t cu_q[] = {0, 7, 7, 20}, cu_k[] = {0, 9, 15, 40};
  const dvspec one_seq = {1, 4, 2, 20, 40, 48, 24, true, -1, -1, false};
  dvcase c;
  dvcase_init(&c, &one_seq, ATTN_F32, 90);
  c.r.batch = 3, c.r.cu_seqlens_q = cu_q, c.r.cu_seqlens_kv = cu_k;
  attn_status st = {0};
  cr_assert_eq(attn_engine_run(e, &c.r, NULL, &st), 0, "%s", st.message);
  for (int64_t s = 0; s < 3; s++) {
    attn_request one;
    attn_request_sequence(&c.r, s, &one);
    if (one.seq_q == 0)
      continue;
    const int64_t n = one.heads_q * one.seq_q * 24;
    double *ref = malloc((size_t)n * sizeof *ref);
    cr_assert_eq(attn_reference(&one, ref, NULL, NULL, NULL, &st), 0, "%s", st.message);
    double num = 0, den = 0;
    for (int64_t h = 0; h < 4; h++)
      for (int64_t i = 0; i < one.seq_q; i++)
        for (int64_t d = 0; d < 24; d++) {
          const double x = ((const float *)c.o)[(h * 20 + cu_q[s] + i) * 24 + d];
          const double y = ref[(h * one.seq_q + i) * 24 + d];
          num += (x - y) * (x - y), den += y * y;
        }
    cr_expect(sqrt(num / den) <= 1e-5, "sequence %lld: O error %.3g", (long long)s,
              sqrt(num / den));
    free(ref);
  }
  dvcase_free(&c);
  attn_engine_close(e);
}

Test(dv, refusals) {
  const dvspec s = {1, 2, 2, 4, 4, 8, 4, false, -1, -1, false};
  dvcase c;
  dvcase_init(&c, &s, ATTN_F32, 3);
  attn_status st = {0};
  c.r.head_dim_v = ATTN_MAX_HEAD_DIM + 1;
  cr_expect_eq(attn_request_validate(&c.r, &st), ATTN_ESHAPE);
  cr_expect(strstr(st.message, "head_dim_v"), "%s", st.message);
  c.r.head_dim_v = 4;
  const void *pages[2] = {c.k, c.k};
  c.r.k = c.r.v = NULL;
  c.r.k_pages = c.r.v_pages = pages;
  c.r.page_tokens = ATTN_PAGE_MIN_TOKENS, c.r.pages_per_head = 1;
  /* pages are W = max(D, Dv) wide: a device's pitch below that is refused */
  c.r.page_pitch = 4;
  cr_expect_eq(attn_request_validate(&c.r, &st), ATTN_EINVAL);
  cr_expect(strstr(st.message, "page_pitch"), "%s", st.message);
  c.r.page_pitch = 8;
  cr_expect_eq(attn_request_validate(&c.r, &st), 0, "%s", st.message);
  /* rows a job writes are one width: not with two */
  const attn_page_rows rows = {c.k, (void *)(uintptr_t)c.k, 1};
  c.r.page_rows = &rows, c.r.npage_rows = 1;
  cr_expect_eq(attn_request_validate(&c.r, &st), ATTN_EINVAL);
  cr_expect(strstr(st.message, "page_rows"), "%s", st.message);
  dvcase_free(&c);
}
