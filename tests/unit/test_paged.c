/*
 * test_paged.c — the forward pass over paged K and V (attn_request.k_pages,
 * a session's cache), on every CPU kernel this machine runs.
 *
 * Each case builds a dense problem, copies its K and V into pages scattered
 * in a shuffled order through one allocation (the rows past a sequence's
 * end poisoned with NaN, the table entries past its last page NULL, so a
 * read past either shows), and runs it both ways: the paged result must be
 * the dense result bit for bit where the kernel tiles the keys the same way
 * (no left window: every tile then starts on a multiple of the tile), and
 * within the dtype's tolerance of the float64 reference always. Then the
 * variable-length batch with one table per sequence, the values the kernel
 * still scans (Q) or takes on trust (kv_absmax), and the refusals.
 */
#include "helpers.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* amxemu: the amx kernel on the unit tests' emulation of its tiles (tests/lib/amx_emu.h). */
static const char *const isas[] = {"generic", "avx2", "avx512", "avx512bf16", "amx", "amxemu"};
enum { NISAS = sizeof isas / sizeof *isas };

/* Pages of K and V for nb batches (or sequences) of hkv heads: one
 * allocation, the pages in a shuffled order, tables [nb, hkv, pph]. */
typedef struct pages {
  char *pool;
  const void **kp, **vp;
  int64_t pt, pph, nb, hkv, d;
  size_t page_bytes;
} pages;

static void pages_init(pages *pg, int64_t nb, int64_t hkv, int64_t d, attn_dtype dt, int64_t pt,
                       int64_t pph, uint64_t seed) {
  memset(pg, 0, sizeof *pg);
  pg->pt = pt;
  pg->pph = pph;
  pg->nb = nb;
  pg->hkv = hkv;
  pg->d = d;
  pg->page_bytes = (size_t)(pt * d) * attn_dtype_size(dt);
  const int64_t n = nb * hkv * pph;
  pg->pool = malloc((size_t)(2 * n) * pg->page_bytes);
  memset(pg->pool, 0xff, (size_t)(2 * n) * pg->page_bytes); /* NaN in every dtype */
  pg->kp = calloc((size_t)n, sizeof *pg->kp);
  pg->vp = calloc((size_t)n, sizeof *pg->vp);
  int64_t *order = malloc((size_t)(2 * n) * sizeof *order);
  cr_assert(pg->pool && pg->kp && pg->vp && order);
  for (int64_t i = 0; i < 2 * n; i++)
    order[i] = i;
  for (int64_t i = 2 * n - 1; i > 0; i--) { /* Fisher-Yates */
    int64_t j = (int64_t)(trand(&seed) % (uint64_t)(i + 1)), t = order[i];
    order[i] = order[j];
    order[j] = t;
  }
  for (int64_t i = 0; i < n; i++) {
    pg->kp[i] = pg->pool + (size_t)order[2 * i] * pg->page_bytes;
    pg->vp[i] = pg->pool + (size_t)order[2 * i + 1] * pg->page_bytes;
  }
  free(order);
}

static void pages_free(pages *pg) {
  free(pg->pool);
  free(pg->kp);
  free(pg->vp);
}

/* Rows [0, n) of head hk of table t from a dense [n, D] run at k and v; the
 * entries past the last page they need become NULL. */
static void pages_fill(pages *pg, int64_t t, int64_t hk, const char *k, const char *v, int64_t n,
                       attn_dtype dt) {
  const size_t row = (size_t)pg->d * attn_dtype_size(dt);
  const int64_t base = (t * pg->hkv + hk) * pg->pph;
  for (int64_t j = 0; j < n; j++) {
    const size_t at = (size_t)(j % pg->pt) * row;
    memcpy((char *)(uintptr_t)pg->kp[base + j / pg->pt] + at, k + (size_t)j * row, row);
    memcpy((char *)(uintptr_t)pg->vp[base + j / pg->pt] + at, v + (size_t)j * row, row);
  }
  for (int64_t p = (n + pg->pt - 1) / pg->pt; p < pg->pph; p++)
    pg->kp[base + p] = pg->vp[base + p] = NULL;
}

/* The largest |x| of n elements. */
static float absmax(const void *x, attn_dtype dt, size_t n) {
  float m = 0;
  for (size_t i = 0; i < n; i++)
    m = fmaxf(m, fabsf((float)attn_load_elem(x, dt, i)));
  return m;
}

/* r reads K and V from pg instead of its tensors. */
static void use_pages(attn_request *r, const pages *pg, const void *k, const void *v, size_t nk) {
  r->k_pages = pg->kp;
  r->v_pages = pg->vp;
  r->page_tokens = pg->pt;
  r->pages_per_head = pg->pph;
  r->kv_absmax[0] = absmax(k, r->dtype, nk);
  r->kv_absmax[1] = absmax(v, r->dtype, nk);
  r->k = r->v = NULL;
}

/* Copies of a run's outputs, to compare another run with bit for bit. */
typedef struct outs {
  void *o;
  float *m, *l, *lse;
  size_t ob, sb;
} outs;

static void outs_save(outs *s, const tcase *c) {
  s->ob = (size_t)(c->p.b * c->p.hq * c->p.nq * c->p.d) * attn_dtype_size(c->p.dt);
  s->sb = (size_t)(c->p.b * c->p.hq * c->p.nq) * sizeof(float);
  s->o = malloc(s->ob);
  memcpy(s->o, c->o, s->ob);
  s->m = malloc(s->sb);
  s->l = malloc(s->sb);
  s->lse = malloc(s->sb);
  memcpy(s->m, c->m, s->sb);
  memcpy(s->l, c->l, s->sb);
  memcpy(s->lse, c->lse, s->sb);
}

static bool outs_same(const outs *s, const tcase *c) {
  return !memcmp(s->o, c->o, s->ob) && !memcmp(s->m, c->m, s->sb) && !memcmp(s->l, c->l, s->sb) &&
         !memcmp(s->lse, c->lse, s->sb);
}

static void outs_free(outs *s) {
  free(s->o);
  free(s->m);
  free(s->l);
  free(s->lse);
}

/* The engines of the kernels this CPU runs (NULL where it lacks one). */
static void open_all(attn_engine *e[NISAS]) {
  for (int k = 0; k < NISAS; k++)
    e[k] = topen_isa(isas[k], 2);
}

static void close_all(attn_engine *e[NISAS]) {
  for (int k = 0; k < NISAS; k++)
    if (e[k])
      attn_engine_close(e[k]);
}

/* One problem on one kernel with pages of pt tokens: dense, then paged;
 * returns the failures. */
static int run_one(attn_engine *e, const char *isa, tcase *c, const tref *ref, int64_t pt) {
  const tprob *p = &c->p;
  char desc[240], what[320];
  snprintf(what, sizeof what, "%s, pages of %lld: %s", isa, (long long)pt,
           tdesc(p, desc, sizeof desc));
  attn_request dense = c->req;
  attn_status st = {0};
  tcase_poison(c);
  int rc = trun(e, c, "cpu", &st);
  cr_expect_eq(rc, 0, "%s: dense run failed: %s", what, st.message);
  if (rc)
    return 1;
  outs d;
  outs_save(&d, c);
  /* one spare page per head: the table may be longer than the keys need */
  pages pg;
  pages_init(&pg, p->b, p->hkv, p->d, p->dt, pt, (p->nkv + pt - 1) / pt + 1, (uint64_t)pt);
  const size_t es = attn_dtype_size(p->dt), row = (size_t)p->d * es;
  const int64_t *ks = dense.k_stride;
  for (int64_t b = 0; b < p->b; b++)
    for (int64_t hk = 0; hk < p->hkv; hk++) {
      /* the dense rows of (b, hk) are k_stride[2] apart: gather them first */
      char *kr = malloc((size_t)p->nkv * row), *vr = malloc((size_t)p->nkv * row);
      for (int64_t j = 0; j < p->nkv; j++) {
        size_t at = (size_t)(b * ks[0] + hk * ks[1] + j * ks[2]) * es;
        if (!ks[0] && !ks[1] && !ks[2])
          at = (size_t)(((b * p->hkv + hk) * p->nkv + j) * p->d) * es;
        memcpy(kr + (size_t)j * row, (char *)c->k + at, row);
        memcpy(vr + (size_t)j * row, (char *)c->v + at, row);
      }
      pages_fill(&pg, b, hk, kr, vr, p->nkv, p->dt);
      free(kr);
      free(vr);
    }
  use_pages(&c->req, &pg, c->k, c->v, (size_t)(p->b * p->hkv * p->nkv * p->d));
  tcase_poison(c);
  rc = trun(e, c, "cpu", &st);
  c->req = dense;
  cr_expect_eq(rc, 0, "%s: paged run failed: %s", what, st.message);
  int fails = rc != 0;
  if (rc == 0) {
    terr err = tref_check(c, ref);
    bool ok = err.o <= ttol(p->dt) && err.masked_ok && err.stats <= 1e-5;
    cr_expect(ok, "%s: O error %.3g (tol %.0e), stats %.3g, masked rows %s", what, err.o,
              ttol(p->dt), err.stats, err.masked_ok ? "ok" : "WRONG");
    fails += !ok;
    /* tiles start on multiples of BK in both layouts unless a left window
     * moves the first one or a page holds fewer keys than a tile */
    if (p->wl < 0 && pt % ATTN_PAGE_ALIGN_TOKENS == 0) {
      bool same = outs_same(&d, c);
      cr_expect(same, "%s: paged result is not the dense result bit for bit", what);
      fails += !same;
    }
  }
  outs_free(&d);
  pages_free(&pg);
  return fails;
}

/* Every kernel, every dtype, pages of 64 and 128 tokens, on problem p. */
static int run_everywhere(attn_engine *e[NISAS], tprob p, uint64_t seed) {
  static const attn_dtype dts[] = {ATTN_F32, ATTN_F16, ATTN_BF16};
  int fails = 0;
  for (int di = 0; di < 3; di++) {
    p.dt = dts[di];
    p.stats = true;
    tcase c;
    tcase_init(&c, &p, seed + (uint64_t)di);
    tref ref;
    attn_status st;
    cr_assert_eq(tref_compute(&c, 2, &ref, &st), 0, "%s", st.message);
    for (int k = 0; k < NISAS; k++)
      for (int64_t pt = 64; e[k] && pt <= 128; pt *= 2)
        fails += run_one(e[k], isas[k], &c, &ref, pt);
    tref_free(&ref);
    tcase_free(&c);
  }
  return fails;
}

/* Head dims past 256 (pages keep v as wide as k, so up to Dv's 512): a
 * decode row with its keys split at D 512, and a causal prefill with GQA
 * at D 384. */
Test(paged, wide_heads, .timeout = 600) {
  attn_engine *e[NISAS];
  open_all(e);
  int fails = run_everywhere(e, tprob_make(1, 4, 1, 1, 1100, 512, ATTN_F32), 70);
  tprob pre = tprob_make(1, 4, 2, 70, 150, 384, ATTN_F32);
  pre.causal = true;
  fails += run_everywhere(e, pre, 80);
  close_all(e);
  cr_assert_eq(fails, 0, "%d paged wide-head checks failed", fails);
}

/* Pages of fewer keys than a tile (16 and 48: a store's pages for rows
 * over 1 KiB, D 576 in BF16), so that every tile ends at a page's end:
 * decoding with split keys, a causal prefill with GQA, a window that
 * starts tiles off the pages' boundaries, and D 512 (the widest v). */
Test(paged, pages_smaller_than_a_tile, .timeout = 600) {
  static const tprob probs[] = {
      {.b = 1, .hq = 4, .hkv = 1, .nq = 1, .nkv = 1100, .d = 512},
      {.b = 1, .hq = 4, .hkv = 2, .nq = 70, .nkv = 150, .d = 64, .causal = true},
      {.b = 1, .hq = 2, .hkv = 1, .nq = 3, .nkv = 500, .d = 128, .wl = 37, .wr = 0},
  };
  static const attn_dtype dts[] = {ATTN_F32, ATTN_BF16};
  attn_engine *e[NISAS];
  open_all(e);
  int fails = 0;
  for (size_t i = 0; i < sizeof probs / sizeof probs[0]; i++)
    for (int di = 0; di < 2; di++) {
      tprob p = tprob_make(probs[i].b, probs[i].hq, probs[i].hkv, probs[i].nq, probs[i].nkv,
                           probs[i].d, dts[di]);
      p.causal = probs[i].causal;
      if (probs[i].wl)
        p.wl = probs[i].wl, p.wr = probs[i].wr;
      p.stats = true;
      tcase c;
      tcase_init(&c, &p, 200 + 10 * i + (uint64_t)di);
      tref ref;
      attn_status st;
      cr_assert_eq(tref_compute(&c, 2, &ref, &st), 0, "%s", st.message);
      for (int k = 0; k < NISAS; k++)
        for (int64_t pt = 16; e[k] && pt <= 48; pt += 32)
          fails += run_one(e[k], isas[k], &c, &ref, pt);
      tref_free(&ref);
      tcase_free(&c);
    }
  close_all(e);
  cr_assert_eq(fails, 0, "%d checks with pages smaller than a tile failed", fails);
}

/* Decoding: one query over >= 1024 keys (the key split), seq_kv not a
 * multiple of any page; GQA and MQA; head_dim 128 and 64 (rows along
 * head_dim, in F32 and in BF16 pairs), 80 and 48. */
Test(paged, decode, .timeout = 600) {
  attn_engine *e[NISAS];
  open_all(e);
  int fails = 0;
  fails += run_everywhere(e, tprob_make(1, 8, 2, 1, 1100, 128, ATTN_F32), 10);
  tprob mqa = tprob_make(1, 4, 1, 1, 2000, 64, ATTN_F32);
  mqa.causal = true;
  fails += run_everywhere(e, mqa, 20);
  tprob batch = tprob_make(2, 4, 2, 2, 1030, 128, ATTN_F32); /* two tables per head */
  fails += run_everywhere(e, batch, 30);
  /* head_dim 80 and 48: a partial chunk of O columns; 3 and 1 rows */
  fails += run_everywhere(e, tprob_make(1, 3, 1, 1, 1030, 80, ATTN_F32), 33);
  fails += run_everywhere(e, tprob_make(1, 2, 2, 1, 300, 48, ATTN_F32), 36);
  close_all(e);
  cr_assert_eq(fails, 0, "%d paged decode checks failed", fails);
}

/* Prefill: many causal queries, several query blocks; an odd head_dim (F32
 * products for every dtype) and one not a multiple of 32 (BF16 pairs). */
Test(paged, prefill, .timeout = 600) {
  attn_engine *e[NISAS];
  open_all(e);
  int fails = 0;
  tprob p = tprob_make(1, 8, 2, 100, 300, 64, ATTN_F32);
  p.causal = true;
  fails += run_everywhere(e, p, 40);
  p = tprob_make(1, 2, 1, 130, 130, 37, ATTN_F32);
  p.causal = true;
  fails += run_everywhere(e, p, 50);
  p = tprob_make(1, 4, 4, 65, 200, 80, ATTN_F32);
  p.strided = true; /* k_stride is ignored with pages; q and o keep theirs */
  fails += run_everywhere(e, p, 60);
  close_all(e);
  cr_assert_eq(fails, 0, "%d paged prefill checks failed", fails);
}

/* Sliding windows (tiles that start off a page's boundary), softcap and
 * ALiBi, decoding and prefill. */
Test(paged, windows_and_variants, .timeout = 600) {
  attn_engine *e[NISAS];
  open_all(e);
  int fails = 0;
  tprob p = tprob_make(1, 8, 2, 1, 1500, 128, ATTN_F32);
  p.wl = 300;
  p.wr = 0;
  fails += run_everywhere(e, p, 70);
  p = tprob_make(1, 4, 2, 70, 333, 32, ATTN_F32);
  p.wl = 50;
  p.wr = 10;
  fails += run_everywhere(e, p, 80);
  p = tprob_make(1, 4, 2, 5, 700, 128, ATTN_F32);
  p.causal = true;
  p.softcap = 5.0;
  p.alibi = 1;
  fails += run_everywhere(e, p, 90);
  p = tprob_make(2, 4, 1, 1, 1200, 64, ATTN_F32);
  p.alibi = 2;
  fails += run_everywhere(e, p, 100);
  close_all(e);
  cr_assert_eq(fails, 0, "%d paged window and variant checks failed", fails);
}

/* Sinks: decoding (split keys, merged with the sink once) and prefill
 * with rows that see no key, each against the float64 reference and the
 * dense run bit for bit. */
Test(paged, sinks, .timeout = 600) {
  attn_engine *e[NISAS];
  open_all(e);
  int fails = 0;
  tprob p = tprob_make(2, 8, 2, 1, 1300, 128, ATTN_F32);
  p.sinks = true;
  fails += run_everywhere(e, p, 110);
  p = tprob_make(1, 5, 1, 90, 70, 64, ATTN_F32);
  p.causal = true;
  p.sinks = true;
  fails += run_everywhere(e, p, 120);
  close_all(e);
  cr_assert_eq(fails, 0, "%d paged checks with sinks failed", fails);
}

/* A variable-length batch of three sequences, each with its own tables
 * (sequence b's at k_pages + b·Hkv·pages_per_head, its keys from 0): the
 * paged run equals the dense packed run bit for bit, and each sequence the
 * float64 reference of that sequence alone. */
static int varlen_case(attn_engine *e, const char *isa, attn_dtype dt, int64_t pt) {
  enum { NS = 3 };
  const int64_t lq[NS] = {1, 40, 3}, lk[NS] = {1100, 150, 64}, hq = 4, hkv = 2, d = 64;
  int64_t cuq[NS + 1] = {0}, cuk[NS + 1] = {0};
  for (int b = 0; b < NS; b++) {
    cuq[b + 1] = cuq[b] + lq[b];
    cuk[b + 1] = cuk[b] + lk[b];
  }
  tprob p = tprob_make(1, hq, hkv, cuq[NS], cuk[NS], d, dt);
  p.causal = true;
  p.stats = true;
  tcase all;
  tcase_init(&all, &p, 7);
  attn_request *r = &all.req;
  r->batch = NS;
  r->cu_seqlens_q = cuq;
  r->cu_seqlens_kv = cuk;
  attn_status st = {0};
  int fails = 0;
  cr_assert_eq(trun(e, &all, "cpu", &st), 0, "%s: dense varlen: %s", isa, st.message);
  outs dense;
  outs_save(&dense, &all);
  const size_t es = attn_dtype_size(dt), row = (size_t)d * es;
  pages pg;
  pages_init(&pg, NS, hkv, d, dt, pt, (lk[0] + pt - 1) / pt, 99);
  tcase seq[NS];
  for (int b = 0; b < NS; b++) {
    tprob ps = p;
    ps.nq = lq[b];
    ps.nkv = lk[b];
    tcase_init(&seq[b], &ps, 8 + (uint64_t)b);
    trows_copy(all.q, seq[b].q, hq, p.nq, cuq[b], lq[b], row, true);
    trows_copy(all.k, seq[b].k, hkv, p.nkv, cuk[b], lk[b], row, true);
    trows_copy(all.v, seq[b].v, hkv, p.nkv, cuk[b], lk[b], row, true);
    for (int64_t hk = 0; hk < hkv; hk++)
      pages_fill(&pg, b, hk, (char *)seq[b].k + (size_t)(hk * lk[b]) * row,
                 (char *)seq[b].v + (size_t)(hk * lk[b]) * row, lk[b], dt);
  }
  attn_request keep = *r;
  use_pages(r, &pg, all.k, all.v, (size_t)(hkv * p.nkv * d));
  tcase_poison(&all);
  int rc = trun(e, &all, "cpu", &st);
  *r = keep;
  cr_expect_eq(rc, 0, "%s %s: paged varlen failed: %s", isa, attn_dtype_name(dt), st.message);
  fails += rc != 0;
  bool same = rc == 0 && outs_same(&dense, &all);
  cr_expect(same, "%s %s, pages of %lld: paged varlen is not the dense result bit for bit", isa,
            attn_dtype_name(dt), (long long)pt);
  fails += !same;
  for (int b = 0; rc == 0 && b < NS; b++) {
    trows_copy(all.o, seq[b].o, hq, p.nq, cuq[b], lq[b], row, true);
    trows_copy(all.m, seq[b].m, hq, p.nq, cuq[b], lq[b], 4, true);
    trows_copy(all.l, seq[b].l, hq, p.nq, cuq[b], lq[b], 4, true);
    trows_copy(all.lse, seq[b].lse, hq, p.nq, cuq[b], lq[b], 4, true);
    terr err = tcheck(&seq[b]);
    bool ok = err.o <= ttol(dt) && err.masked_ok && err.stats <= 1e-5;
    cr_expect(ok, "%s %s: sequence %d: O error %.3g (tol %.0e), stats %.3g", isa,
              attn_dtype_name(dt), b, err.o, ttol(dt), err.stats);
    fails += !ok;
  }
  for (int b = 0; b < NS; b++)
    tcase_free(&seq[b]);
  pages_free(&pg);
  outs_free(&dense);
  tcase_free(&all);
  return fails;
}

Test(paged, varlen, .timeout = 600) {
  static const attn_dtype dts[] = {ATTN_F32, ATTN_F16, ATTN_BF16};
  attn_engine *e[NISAS];
  open_all(e);
  int fails = 0;
  for (int k = 0; k < NISAS; k++)
    for (int di = 0; e[k] && di < 3; di++)
      for (int64_t pt = 64; pt <= 128; pt *= 2)
        fails += varlen_case(e[k], isas[k], dts[di], pt);
  close_all(e);
  cr_assert_eq(fails, 0, "%d paged varlen checks failed", fails);
}

/* A small paged request over tc's inputs, for the refusals. */
typedef struct small {
  tcase c;
  pages pg;
} small;

static void small_init(small *s, int64_t b) {
  tprob p = tprob_make(b, 2, 1, 2, 100, 16, ATTN_F32);
  tcase_init(&s->c, &p, 3);
  pages_init(&s->pg, b, 1, 16, ATTN_F32, 64, 2, 4);
  for (int64_t i = 0; i < b; i++)
    pages_fill(&s->pg, i, 0, (char *)s->c.k + (size_t)(i * 100 * 16 * 4),
               (char *)s->c.v + (size_t)(i * 100 * 16 * 4), 100, ATTN_F32);
  use_pages(&s->c.req, &s->pg, s->c.k, s->c.v, (size_t)(b * 100 * 16));
}

static void small_free(small *s) {
  pages_free(&s->pg);
  tcase_free(&s->c);
}

static void expect_refused(const attn_request *r, int code, const char *needle) {
  attn_status st = {0};
  int rc = attn_request_validate(r, &st);
  cr_expect_eq(rc, code, "expected %s, got %s: %s", attn_err_name(code), attn_err_name(rc),
               st.message);
  cr_expect(strstr(st.message, needle) != NULL, "message \"%s\" lacks \"%s\"", st.message, needle);
}

Test(paged, refusals) {
  small s;
  small_init(&s, 1);
  attn_request *r = &s.c.req;
  attn_status st;
  cr_assert_eq(attn_request_validate(r, &st), 0, "%s", st.message);
  attn_request ok = *r;
  r->page_tokens = 0;
  expect_refused(r, ATTN_EINVAL, "page_tokens must be a positive multiple of 16");
  r->page_tokens = 100;
  expect_refused(r, ATTN_EINVAL, "(got 100)");
  *r = ok;
  r->pages_per_head = 1; /* 100 keys need 2 pages of 64 */
  expect_refused(r, ATTN_ESHAPE, "pages_per_head = 1 does not fit 100 keys");
  *r = ok;
  r->k = s.c.k;
  expect_refused(r, ATTN_EINVAL, "must then be NULL");
  *r = ok;
  r->v_pages = NULL;
  expect_refused(r, ATTN_EINVAL, "v_pages is missing");
  *r = ok;
  r->kv_absmax[1] = NAN;
  expect_refused(r, ATTN_EINVAL, "kv_absmax[1]");
  *r = ok;
  r->pass = ATTN_BACKWARD;
  expect_refused(r, ATTN_EUNSUPPORTED, "backward pass does not read paged K/V");
  *r = ok;
  attn_engine *e = topen(2, NULL);
  /* the reference reads dense tensors only; "auto" takes the cpu backend */
  r->backend = "reference";
  cr_expect_eq(attn_engine_run(e, r, NULL, &st), ATTN_EUNSUPPORTED, "%s", st.message);
  cr_expect(strstr(st.message, "runs on the cpu backend"), "%s", st.message);
  r->backend = "auto";
  attn_result res;
  cr_expect_eq(attn_engine_run(e, r, &res, &st), 0, "%s", st.message);
  cr_expect_str_eq(res.backend, "cpu");
  attn_engine_close(e);
  small_free(&s);
}

/* A variable-length batch needs pages for its longest sequence. */
Test(paged, varlen_longest_sequence) {
  small s;
  small_init(&s, 2);
  attn_request *r = &s.c.req;
  int64_t cuq[3] = {0, 2, 4}, cuk[3] = {0, 60, 200};
  r->seq_q = 4;
  r->seq_kv = 200;
  r->batch = 2;
  r->cu_seqlens_q = cuq;
  r->cu_seqlens_kv = cuk;
  /* 140 keys in the second sequence need 3 pages; each head has 2 */
  expect_refused(r, ATTN_ESHAPE, "does not fit 140 keys");
  cuk[1] = 100;
  attn_status st;
  cr_expect_eq(attn_request_validate(r, &st), 0, "%s", st.message);
  small_free(&s);
}

/* Q is still scanned; K and V are not (they were checked when stored), and
 * their magnitudes are the request's kv_absmax. */
Test(paged, scan_and_magnitudes) {
  attn_engine *e = topen(2, NULL);
  small s;
  small_init(&s, 1);
  attn_request *r = &s.c.req;
  attn_status st;
  cr_assert_eq(trun(e, &s.c, "cpu", &st), 0, "%s", st.message);
  r->kv_absmax[1] = 1e38f;
  cr_expect_eq(trun(e, &s.c, "cpu", &st), ATTN_ERANGE, "%s", st.message);
  cr_expect(strstr(st.message, "scale v down"), "%s", st.message);
  r->kv_absmax[1] = 1;
  r->kv_absmax[0] = 1e38f;
  cr_expect_eq(trun(e, &s.c, "cpu", &st), ATTN_ERANGE, "%s", st.message);
  r->kv_absmax[0] = 2;
  ((float *)s.c.q)[17] = NAN; /* row 1, column 1 of head 0 */
  cr_expect_eq(trun(e, &s.c, "cpu", &st), ATTN_ENONFINITE, "%s", st.message);
  cr_expect(strstr(st.message, "tensor q holds a non-finite value at [0, 0, 1, 1]"), "%s",
            st.message);
  small_free(&s);
  attn_engine_close(e);
}
