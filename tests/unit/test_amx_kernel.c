/*
 * test_amx_kernel.c — the amx kernel's logic on any CPU with AVX512-BF16: flash.c's amxemu
 * instance (its tile instructions emulated and checked by tests/lib/amx_emu.c) run through
 * the whole cpu backend (cpu_isa "amxemu": items, GQA packing, key splits and their merge,
 * the start-up self-check) on BF16 problems against the float64 reference, at the BF16
 * tolerance.
 *
 * Awkward sizes (1, 15, 16, 17, 63, 64, 65, 130, 200) at every head_dim the tile path
 * takes (32 .. 256) and one it must not (40), square and over more keys; GQA and MQA, causal
 * and windowed masks, rows that see nothing, softcap and ALiBi, strided layouts, decode
 * splits, paged K and V, variable-length batches, statistics m, l, lse. Each case counts the
 * emulated TDPBF16PS: where the tile path must run (amx_expected, and F16 prefill split in
 * two BF16 parts) the count must grow, at head_dim 40 and for F16 under a left window it
 * must not. A CPU without AVX512-BF16 reports "skipped".
 */
#include "amx_emu.h"
#include "helpers.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The engine on the emulated amx kernel, or NULL (having printed
 * "skipped: ...") where this CPU or build lacks it. The self-check ran on
 * the emulation as the engine opened; it must have kept the kernel. */
static attn_engine *emu_open(void) {
  attn_engine *e = topen_isa("amxemu", 2);
  if (!e)
    return NULL;
  attn_backend_info info[8];
  int n = attn_engine_backends(e, info, 8);
  for (int i = 0; i < n; i++)
    if (!strcmp(info[i].name, "cpu")) {
      cr_assert(!strncmp(info[i].detail, "amx kernel", 10), "cpu backend: %s", info[i].detail);
      cr_assert_eq(info[i].ndisabled, 0, "the self-check failed on the emulation: %s",
                   info[i].disabled[0].why);
    }
  return e;
}

/*
 * Whether the tile path must run for p: BF16, head_dim a multiple of 32,
 * and either blocks of at most 4 query rows (the few rows path, every tile
 * of it; short query sequences pack a GQA group's heads into one block) or
 * a whole 64-key tile somewhere (at least 128 keys, no window narrower).
 * Conservative: other shapes may take tiles too, and are not asserted
 * either way.
 */
static bool amx_expected(const tprob *p) {
  const int64_t group = p->hq / p->hkv;
  const int64_t rows = p->nq <= 32 ? p->nq * group : p->nq;
  const bool whole =
      p->nkv >= 128 && (p->wl < 0 || p->wl >= 128) && (p->wr < 0 || p->wr >= 128 || p->causal);
  return p->dt == ATTN_BF16 && p->d % 32 == 0 && (rows <= 4 || whole) &&
         p->diag == ATTN_DIAG_AUTO && p->nq <= p->nkv;
}

/* What a case asks of the tile path. */
typedef enum { TILES_ANY, TILES_USED, TILES_UNUSED } tiles;

/* c's outputs (already run, or rc its failure) against the float64
 * reference and dp, the TDPBF16PS it executed, against want; returns the
 * failures (0 or 1). */
static int judge(const tcase *c, int rc, const attn_status *st, int64_t dp, tiles want,
                 const char *what) {
  char desc[240];
  tdesc(&c->p, desc, sizeof desc);
  cr_expect_eq(rc, 0, "%s %s: the run failed: %s", what, desc, st->message);
  if (rc)
    return 1;
  terr err = tcheck(c);
  bool ok = err.o <= ttol(c->p.dt) && err.stats <= 1e-5 && err.masked_ok;
  cr_expect(ok, "%s %s: O error %.3g (tol %.0e), stats %.3g, masked rows %s", what, desc, err.o,
            ttol(c->p.dt), err.stats, err.masked_ok ? "ok" : "WRONG");
  bool tiles_ok = want == TILES_ANY || (want == TILES_USED) == (dp > 0);
  cr_expect(tiles_ok, "%s %s: %lld emulated TDPBF16PS, expected %s", what, desc, (long long)dp,
            want == TILES_USED ? "some" : "none");
  return !ok || !tiles_ok;
}

static tiles want_of(const tprob *p) { return amx_expected(p) ? TILES_USED : TILES_ANY; }

/* One dense problem; returns the failures. */
static int run_case(attn_engine *e, const tprob *p, uint64_t seed, tiles want) {
  tcase c;
  tcase_init(&c, p, seed);
  attn_status st = {0};
  const int64_t before = tamx_dpbf16ps_count();
  int rc = trun(e, &c, "cpu", &st);
  int fails = judge(&c, rc, &st, tamx_dpbf16ps_count() - before, want, "amxemu");
  tcase_free(&c);
  return fails;
}

static const int64_t sizes[] = {1, 15, 16, 17, 63, 64, 65, 130, 200};
static const int64_t dims[] = {32, 64, 96, 128, 160, 256};
enum { NSIZES = sizeof sizes / sizeof *sizes, NDIMS = sizeof dims / sizeof *dims };

/* Every awkward size at every tile head_dim, GQA 2:1, over 130 more keys
 * (so every shape has whole tiles), causal every other case. */
Test(amx_kernel, sizes_and_head_dims, .timeout = 600) {
  attn_engine *e = emu_open();
  if (!e)
    return;
  int fails = 0, n = 0;
  for (int i = 0; i < NSIZES; i++)
    for (int j = 0; j < NDIMS; j++, n++) {
      tprob p = tprob_make(1, 2, 1, sizes[i], sizes[i] + 130, dims[j], ATTN_BF16);
      p.causal = n % 2;
      p.stats = true;
      fails += run_case(e, &p, 1000 + (uint64_t)n, want_of(&p));
    }
  attn_engine_close(e);
  cr_assert_eq(fails, 0, "%d of %d cases failed", fails, n);
}

/* Square problems: the causal diagonal crosses the tiles, and the smallest
 * sizes have no whole tile at all (the VDPBF16PS path alone). */
Test(amx_kernel, square_causal) {
  attn_engine *e = emu_open();
  if (!e)
    return;
  int fails = 0;
  for (int i = 0; i < NSIZES; i++) {
    tprob p = tprob_make(2, 4, 2, sizes[i], sizes[i], i % 2 ? 128 : 64, ATTN_BF16);
    p.causal = true;
    p.stats = true;
    fails += run_case(e, &p, 2000 + (uint64_t)i, want_of(&p));
  }
  attn_engine_close(e);
  cr_assert_eq(fails, 0, "%d cases failed", fails);
}

/* head_dim 40 (not a multiple of 32), and F16 under a left window (its K
 * and V are not packed for the split), never take the tiles, yet compute
 * right. */
Test(amx_kernel, other_shapes_fall_back) {
  attn_engine *e = emu_open();
  if (!e)
    return;
  int fails = 0;
  static const int64_t odd[] = {40, 48, 80};
  for (int i = 0; i < 3; i++) {
    tprob p = tprob_make(1, 4, 2, 130, 200, odd[i], ATTN_BF16);
    p.causal = i == 1;
    p.stats = true;
    fails += run_case(e, &p, 3000 + (uint64_t)i, TILES_UNUSED);
  }
  tprob f16 = tprob_make(1, 2, 2, 130, 200, 128, ATTN_F16);
  f16.stats = true;
  f16.wl = 100;
  fails += run_case(e, &f16, 3010, TILES_UNUSED);
  attn_engine_close(e);
  cr_assert_eq(fails, 0, "%d cases failed", fails);
}

/* F16 prefill on the tiles, split into BF16 hi and lo parts: every tile
 * head_dim, key counts that leave a padded last tile, GQA, causal and
 * not, softcap and ALiBi (the padding keys stay masked after them), at
 * F16's tolerance and the statistics' 1e-5. */
Test(amx_kernel, f16_split) {
  attn_engine *e = emu_open();
  if (!e)
    return;
  int fails = 0, n = 0;
  static const int64_t nkv[] = {64, 100, 130, 257};
  for (int j = 0; j < NDIMS; j++)
    for (int k = 0; k < 4; k++, n++) {
      tprob p = tprob_make(1, 4, 2, 70 + 30 * k, nkv[k] + 70, dims[j], ATTN_F16);
      p.causal = n % 2;
      p.softcap = n % 3 == 1 ? 2.0 : 0.0;
      p.alibi = n % 5 == 2;
      p.stats = true;
      fails += run_case(e, &p, 3100 + (uint64_t)n, TILES_USED);
    }
  attn_engine_close(e);
  cr_assert_eq(fails, 0, "%d of %d cases failed", fails, n);
}

/* GQA and MQA, masks and windows both ways, rows that see nothing, a
 * top-left diagonal, batches, strided [B, N, H, D] layouts, explicit
 * scales. */
Test(amx_kernel, masks_groups_layouts) {
  attn_engine *e = emu_open();
  if (!e)
    return;
  /* b, hq, hkv, nq, nkv, d, causal, wl, wr, strided, diag, scale */
  static const struct {
    int64_t b, hq, hkv, nq, nkv, d;
    bool causal;
    int64_t wl, wr;
    bool strided;
    int64_t diag;
    double scale;
  } v[] = {
      {2, 8, 2, 65, 200, 64, false, -1, -1, false, ATTN_DIAG_AUTO, NAN},   /* GQA 4:1 */
      {1, 4, 1, 130, 130, 128, true, -1, -1, true, ATTN_DIAG_AUTO, NAN},   /* MQA, strided */
      {1, 2, 2, 200, 200, 96, false, 16, 0, false, ATTN_DIAG_AUTO, NAN},   /* sliding window */
      {1, 2, 1, 100, 300, 64, false, 100, 70, false, ATTN_DIAG_AUTO, NAN}, /* both sides */
      {1, 2, 2, 130, 200, 128, false, -1, 7, true, ATTN_DIAG_AUTO, 0.05},  /* right only */
      {1, 2, 1, 200, 130, 64, true, -1, -1, false, ATTN_DIAG_AUTO, NAN},   /* rows see nothing */
      {1, 4, 2, 80, 200, 160, true, -1, -1, false, 0, NAN},                /* top-left diagonal */
      {3, 6, 3, 17, 150, 256, true, 40, -1, false, ATTN_DIAG_AUTO, NAN},   /* causal window */
      {1, 2, 2, 64, 128, 32, false, -1, -1, false, ATTN_DIAG_AUTO, -0.2},  /* negative scale */
  };
  int fails = 0;
  for (int i = 0; i < (int)(sizeof v / sizeof *v); i++) {
    tprob p = tprob_make(v[i].b, v[i].hq, v[i].hkv, v[i].nq, v[i].nkv, v[i].d, ATTN_BF16);
    p.causal = v[i].causal;
    p.wl = v[i].wl;
    p.wr = v[i].wr;
    p.strided = v[i].strided;
    p.diag = v[i].diag;
    p.scale = v[i].scale;
    p.stats = true;
    fails += run_case(e, &p, 4000 + (uint64_t)i, want_of(&p));
  }
  attn_engine_close(e);
  cr_assert_eq(fails, 0, "%d cases failed", fails);
}

/* softcap and ALiBi ([Hq] and [B, Hq]) on the tile path, alone and together. */
Test(amx_kernel, softcap_and_alibi) {
  attn_engine *e = emu_open();
  if (!e)
    return;
  int fails = 0;
  for (int i = 0; i < 4; i++) {
    tprob p = tprob_make(2, 4, 2, 130, 200, i % 2 ? 128 : 64, ATTN_BF16);
    p.causal = i >= 2;
    p.softcap = i == 1 ? 0 : 1.5 + i;
    p.alibi = i == 0 ? 0 : 1 + i % 2;
    p.stats = true;
    fails += run_case(e, &p, 5000 + (uint64_t)i, want_of(&p));
  }
  attn_engine_close(e);
  cr_assert_eq(fails, 0, "%d cases failed", fails);
}

/* Keys that grow along the sequence, so that most lanes' maxima pass their
 * reference by more than the slack on tiles past the first: the softmax's
 * one pass is redone from a max pass there, and the statistics are still
 * the eager form's. Causal and not, both tile widths of P·V. */
Test(amx_kernel, rising_maxima) {
  attn_engine *e = emu_open();
  if (!e)
    return;
  int fails = 0;
  for (int i = 0; i < 4; i++) {
    tprob p = tprob_make(1, 2, 1, 130, 400, i % 2 ? 128 : 64, ATTN_BF16);
    p.causal = i >= 2;
    p.stats = true;
    tcase c;
    tcase_init(&c, &p, 9100 + (uint64_t)i);
    for (int64_t j = 0; j < p.nkv; j++) /* up to 26x: scores up to ~30 past the first tile's */
      for (int64_t d = 0; d < p.d; d++) {
        const size_t at = (size_t)(j * p.d + d);
        attn_store_elem(c.k, p.dt, at, (float)(attn_load_elem(c.k, p.dt, at) * (1 + j / 16.0)));
      }
    attn_status st = {0};
    const int64_t before = tamx_dpbf16ps_count();
    int rc = trun(e, &c, "cpu", &st);
    fails += judge(&c, rc, &st, tamx_dpbf16ps_count() - before, TILES_USED, "amxemu");
    tcase_free(&c);
  }
  attn_engine_close(e);
  cr_assert_eq(fails, 0, "%d cases failed", fails);
}

/* A value planted in K or V of a prefill whose keys the job packs (the
 * packing scans the tiles it reads, the blocks the rest): the job is
 * refused naming the first bad element, in a packed tile, in BF16's
 * unpacked last part tile, in F16's K (which it splits) and padded last
 * tile, and a magnitude the sum of V could overflow with. On the emulated
 * and, where the CPU has it, the real tile unit. */
typedef struct {
  attn_dtype dt;
  int tensor;        /* 1 K, 2 V */
  int64_t key, key2; /* where the value goes; key2 >= 0: a second one, later */
  float val;
  const char *want; /* in the error message */
} planted;

static void plant(tcase *c, const planted *pl, int64_t key) {
  const tprob *p = &c->p;
  const size_t at = (size_t)(((1 * p->nkv) + key) * p->d + 5); /* KV head 1, element 5 */
  attn_store_elem(pl->tensor == 1 ? c->k : c->v, p->dt, at, pl->val);
}

Test(amx_kernel, nonfinite_in_packed_keys) {
  static const planted cases[] = {
      {ATTN_BF16, 2, 70, -1, NAN, "tensor v holds a non-finite value at [0, 1, 70, 5]"},
      {ATTN_BF16, 2, 150, 70, INFINITY, "tensor v holds a non-finite value at [0, 1, 70, 5]"},
      {ATTN_BF16, 2, 195, -1, NAN, "tensor v holds a non-finite value at [0, 1, 195, 5]"},
      {ATTN_BF16, 1, 130, -1, -INFINITY, "tensor k holds a non-finite value at [0, 1, 130, 5]"},
      {ATTN_F16, 1, 130, -1, NAN, "tensor k holds a non-finite value at [0, 1, 130, 5]"},
      {ATTN_F16, 2, 199, 3, INFINITY, "tensor v holds a non-finite value at [0, 1, 3, 5]"},
      {ATTN_BF16, 2, 100, -1, 1e37f, "values could overflow float32"},
  };
  static const char *const isas[] = {"amxemu", "amx"};
  for (int k = 0; k < 2; k++) {
    attn_engine *e = topen_isa(isas[k], 2);
    if (!e)
      continue;
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
      const planted *pl = &cases[i];
      tprob p = tprob_make(1, 4, 2, 200, 200, 64, pl->dt);
      tcase c;
      tcase_init(&c, &p, 9300 + (uint64_t)i);
      plant(&c, pl, pl->key);
      if (pl->key2 >= 0)
        plant(&c, pl, pl->key2);
      attn_status st = {0};
      const int rc = trun(e, &c, "cpu", &st);
      cr_expect(rc != 0 && strstr(st.message, pl->want), "%s case %zu: rc %d, \"%s\"", isas[k], i,
                rc, st.message);
      tcase_free(&c);
    }
    attn_engine_close(e);
  }
}

/* Decoding: a GQA group's rows in one block, the keys split across items
 * and merged by their log-sum-exp. */
Test(amx_kernel, decode_splits) {
  attn_engine *e = emu_open();
  if (!e)
    return;
  int fails = 0;
  for (int64_t nq = 1; nq <= 4; nq++) {
    tprob p = tprob_make(1, 8, 2, nq, 1500 + 300 * nq, nq % 2 ? 128 : 64, ATTN_BF16);
    p.causal = nq > 2;
    p.wl = nq == 4 ? 700 : -1;
    p.softcap = nq == 3 ? 2.0 : 0;
    p.stats = true;
    fails += run_case(e, &p, 6000 + (uint64_t)nq, want_of(&p));
  }
  attn_engine_close(e);
  cr_assert_eq(fails, 0, "%d cases failed", fails);
}

/* Decoding blocks of one to four rows on the tiles (flash_amx_rows.h):
 * every row count, head_dims of odd and even tile counts, key counts that
 * leave a partial last tile, key splits, windows, softcap, ALiBi and a
 * negative scale. */
Test(amx_kernel, decode_rows) {
  attn_engine *e = emu_open();
  if (!e)
    return;
  static const int64_t d[] = {32, 96, 128, 256};
  int fails = 0, n = 0;
  for (int64_t rows = 1; rows <= 4; rows++)
    for (int j = 0; j < 4; j++, n++) {
      tprob p = tprob_make(1, 2 * rows, 2, 1, 1100 + 37 * n, d[j], ATTN_BF16);
      p.causal = n % 2;
      p.wl = n % 5 == 3 ? 300 : -1;
      p.softcap = n % 3 == 1 ? 2.0 : 0;
      p.alibi = n % 7 == 2;
      p.scale = n % 11 == 5 ? -0.1 : NAN;
      p.stats = true;
      fails += run_case(e, &p, 6100 + (uint64_t)n, TILES_USED);
    }
  attn_engine_close(e);
  cr_assert_eq(fails, 0, "%d of %d cases failed", fails, n);
}

/* ---- paged K and V ----------------------------------------------------------- */

/* K and V of c copied into pages of pt tokens, one allocation each (so a
 * read past a page is a read past an allocation), rows past the keys NaN,
 * the table entries past the last page NULL; c's request reads them. */
typedef struct paged {
  void **pages;
  const void **kp, **vp;
  int64_t n;
} paged;

static void paged_make(paged *pg, tcase *c, int64_t pt) {
  const tprob *p = &c->p;
  const int64_t pph = (p->nkv + pt - 1) / pt + 1, heads = p->b * p->hkv;
  const size_t row = (size_t)p->d * 2;
  pg->n = heads * pph;
  pg->pages = calloc((size_t)(2 * pg->n), sizeof *pg->pages);
  pg->kp = calloc((size_t)pg->n, sizeof *pg->kp);
  pg->vp = calloc((size_t)pg->n, sizeof *pg->vp);
  cr_assert(pg->pages && pg->kp && pg->vp);
  for (int64_t h = 0; h < heads; h++)
    for (int64_t g = 0; g * pt < p->nkv; g++) {
      const int64_t t = h * pph + g, rows = p->nkv - g * pt < pt ? p->nkv - g * pt : pt;
      const size_t at = (size_t)(h * p->nkv + g * pt) * row; /* contiguous [B, Hkv, N, D] */
      pg->pages[2 * t] = malloc((size_t)pt * row);
      pg->pages[2 * t + 1] = malloc((size_t)pt * row);
      cr_assert(pg->pages[2 * t] && pg->pages[2 * t + 1]);
      memset(pg->pages[2 * t], 0xff, (size_t)pt * row); /* NaN past the keys */
      memset(pg->pages[2 * t + 1], 0xff, (size_t)pt * row);
      memcpy(pg->pages[2 * t], (char *)c->k + at, (size_t)rows * row);
      memcpy(pg->pages[2 * t + 1], (char *)c->v + at, (size_t)rows * row);
      pg->kp[t] = pg->pages[2 * t];
      pg->vp[t] = pg->pages[2 * t + 1];
    }
  attn_request *r = &c->req;
  r->k_pages = pg->kp;
  r->v_pages = pg->vp;
  r->page_tokens = pt;
  r->pages_per_head = pph;
  r->k = r->v = NULL;
  const size_t nk = (size_t)(heads * p->nkv * p->d);
  for (size_t i = 0; i < nk; i++) {
    r->kv_absmax[0] = fmaxf(r->kv_absmax[0], fabsf((float)attn_load_elem(c->k, p->dt, i)));
    r->kv_absmax[1] = fmaxf(r->kv_absmax[1], fabsf((float)attn_load_elem(c->v, p->dt, i)));
  }
}

static void paged_free(paged *pg) {
  for (int64_t i = 0; i < 2 * pg->n; i++)
    free(pg->pages[i]);
  free(pg->pages);
  free(pg->kp);
  free(pg->vp);
}

/* Paged K and V (a session's cache), pages of 64 and 128 tokens, a left
 * window that starts tiles between page boundaries, GQA decode rows. */
Test(amx_kernel, paged_kv) {
  attn_engine *e = emu_open();
  if (!e)
    return;
  static const struct {
    int64_t hq, hkv, nq, nkv, d, pt, wl;
    bool causal;
    attn_dtype dt;
    tiles want; /* TILES_ANY: want_of */
  } v[] = {
      {4, 2, 130, 300, 128, 64, -1, true, ATTN_BF16, TILES_ANY},
      {2, 1, 80, 200, 64, 128, 50, false, ATTN_BF16, TILES_ANY},
      {8, 2, 3, 1100, 128, 64, -1, true, ATTN_BF16, TILES_ANY},
      {4, 4, 65, 257, 256, 128, -1, false, ATTN_BF16, TILES_ANY},
      /* few rows: a window's partial tiles */
      {8, 2, 1, 1100, 128, 64, 300, true, ATTN_BF16, TILES_ANY},
      {2, 2, 1, 700, 96, 128, -1, false, ATTN_BF16, TILES_ANY},
      /* pages off the 64-key tiles' grid (a multiple of 16 keys, as a
       * session's pages at D192 are): tiles that cross a page; the job packs
       * nothing (its packing read past the page), so every whole tile's Vᵀ
       * is transposed per step, at most two waiting at D192 */
      {4, 2, 200, 700, 192, 224, -1, true, ATTN_BF16, TILES_ANY},
      /* F16 on pages: split on the tiles where the pages keep to the grid,
       * else on F32 (its split tiles need every tile packed: off the grid
       * a block crashed on the first tile past a page) */
      {4, 2, 200, 300, 128, 64, -1, true, ATTN_F16, TILES_USED},
      {4, 2, 200, 700, 96, 336, -1, true, ATTN_F16, TILES_UNUSED},
  };
  int fails = 0;
  for (int i = 0; i < (int)(sizeof v / sizeof *v); i++) {
    tprob p = tprob_make(1 + i % 2, v[i].hq, v[i].hkv, v[i].nq, v[i].nkv, v[i].d, v[i].dt);
    p.causal = v[i].causal;
    p.wl = v[i].wl;
    p.stats = true;
    tcase c;
    tcase_init(&c, &p, 7000 + (uint64_t)i);
    const attn_request dense = c.req;
    paged pg;
    paged_make(&pg, &c, v[i].pt);
    attn_status st = {0};
    const int64_t before = tamx_dpbf16ps_count();
    int rc = trun(e, &c, "cpu", &st);
    c.req = dense; /* the reference reads the dense K and V */
    fails += judge(&c, rc, &st, tamx_dpbf16ps_count() - before, v[i].want ? v[i].want : want_of(&p),
                   "amxemu paged");
    paged_free(&pg);
    tcase_free(&c);
  }
  attn_engine_close(e);
  cr_assert_eq(fails, 0, "%d cases failed", fails);
}

/* ---- variable-length batches ---------------------------------------------- */

enum { NSEQ = 4 };

/* A batch of NSEQ sequences packed along N ([1, H, total, D]), each
 * checked against the reference as a problem of its own. */
Test(amx_kernel, varlen) {
  attn_engine *e = emu_open();
  if (!e)
    return;
  static const int64_t lq[NSEQ] = {130, 17, 1, 70}, lk[NSEQ] = {200, 150, 300, 70};
  const int64_t hq = 4, hkv = 2, d = 128;
  int64_t cuq[NSEQ + 1] = {0}, cuk[NSEQ + 1] = {0};
  for (int b = 0; b < NSEQ; b++) {
    cuq[b + 1] = cuq[b] + lq[b];
    cuk[b + 1] = cuk[b] + lk[b];
  }
  tprob pa = tprob_make(1, hq, hkv, cuq[NSEQ], cuk[NSEQ], d, ATTN_BF16);
  pa.causal = true;
  pa.stats = true;
  tcase all, seq[NSEQ];
  tcase_init(&all, &pa, 8000);
  all.req.batch = NSEQ;
  all.req.cu_seqlens_q = cuq;
  all.req.cu_seqlens_kv = cuk;
  const size_t row = (size_t)d * 2;
  for (int b = 0; b < NSEQ; b++) {
    tprob p = pa;
    p.nq = lq[b];
    p.nkv = lk[b];
    tcase_init(&seq[b], &p, 8001 + (uint64_t)b);
    trows_copy(all.q, seq[b].q, hq, cuq[NSEQ], cuq[b], lq[b], row, true);
    trows_copy(all.k, seq[b].k, hkv, cuk[NSEQ], cuk[b], lk[b], row, true);
    trows_copy(all.v, seq[b].v, hkv, cuk[NSEQ], cuk[b], lk[b], row, true);
  }
  attn_status st = {0};
  const int64_t before = tamx_dpbf16ps_count();
  int rc = trun(e, &all, "cpu", &st);
  const int64_t dp = tamx_dpbf16ps_count() - before;
  int fails = 0;
  for (int b = 0; b < NSEQ; b++) {
    trows_copy(all.o, seq[b].o, hq, cuq[NSEQ], cuq[b], lq[b], row, true);
    trows_copy(all.m, seq[b].m, hq, cuq[NSEQ], cuq[b], lq[b], 4, true);
    trows_copy(all.l, seq[b].l, hq, cuq[NSEQ], cuq[b], lq[b], 4, true);
    trows_copy(all.lse, seq[b].lse, hq, cuq[NSEQ], cuq[b], lq[b], 4, true);
    /* the first sequence (130 queries, 200 keys) takes whole tiles */
    fails += judge(&seq[b], rc, &st, dp, b == 0 ? TILES_USED : TILES_ANY, "amxemu varlen");
    tcase_free(&seq[b]);
  }
  tcase_free(&all);
  attn_engine_close(e);
  cr_assert_eq(fails, 0, "%d sequences failed", fails);
}
