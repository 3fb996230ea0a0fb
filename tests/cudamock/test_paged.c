/*
 * test_paged.c — the paged K/V view of kernels.h on the mock runtime:
 * attn_cu_select and attn_cu_launch called directly on a packed K/V and on
 * a paged copy of it (pages in shuffled order, tests/lib's tpaged), in
 * F16, BF16 and F32, head dims 64 to 256 and padded ones, GQA packing,
 * causal and windowed masks, split-KV decodes. The paged outputs must be
 * the packed ones bit for bit (the mock's float64 forward reads pages by
 * the header's rule, apart from the kernels' code) and match the float64
 * reference; a paged launch that breaks the contract is refused, and a
 * paged request never takes the Hopper instances nor the backward. With
 * per-entry key lengths (seqused_k), each entry of a batched launch must
 * be its launch alone (batch 1, seq_kv its length) bit for bit and match
 * the reference; an entry of no key gives O 0 and empty statistics.
 */
#include "cuda/kernels.h"
#include "helpers.h"
#include "mock.h"

#include <criterion/criterion.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void reset(void) { mock_defaults(); }

/* A problem, its pages, and what the selector should do with it on sms
 * multiprocessors. */
typedef struct pcase {
  tprob p;
  int page_tokens;
  size_t page_bytes;
  int sms;
  bool split, pack; /* expected: nsplit > 1, GQA packing */
} pcase;

/* "Device" memory of the mock: host memory, 64-byte aligned. */
static void *dmem(size_t n) { return aligned_alloc(64, (n + 63) / 64 * 64 + 64); }

/* Contiguous [rows, d] -> [rows, dp] with zero padding, or back. */
static void *pad(const void *x, size_t rows, int64_t d, int dp, size_t es) {
  unsigned char *y = dmem(rows * (size_t)dp * es);
  memset(y, 0, rows * (size_t)dp * es);
  for (size_t r = 0; r < rows; r++)
    memcpy(y + r * (size_t)dp * es, (const unsigned char *)x + r * (size_t)d * es, (size_t)d * es);
  return y;
}
static void unpad(void *y, const unsigned char *x, size_t rows, int64_t d, int dp, size_t es) {
  for (size_t r = 0; r < rows; r++)
    memcpy((unsigned char *)y + r * (size_t)d * es, x + r * (size_t)dp * es, (size_t)d * es);
}

/* One launch's outputs: O [B, Hq, Nq, dp] and the statistics. */
typedef struct outs {
  void *o;
  float *m, *l, *lse;
} outs;

static void outs_alloc(outs *x, size_t rows, size_t obytes) {
  x->o = dmem(obytes);
  x->m = dmem(rows * 4);
  x->l = dmem(rows * 4);
  x->lse = dmem(rows * 4);
  memset(x->o, 0xff, obytes); /* NaN: a row the launch misses shows */
}
static void outs_free(outs *x) {
  free(x->o);
  free(x->m);
  free(x->l);
  free(x->lse);
}

/* Launches prm (outputs into x) and waits for it; the launch's code. */
static int launch(attn_cu_params prm, const attn_cu_choice *ch, outs *x, void *ws) {
  prm.o = x->o, prm.m = x->m, prm.l = x->l, prm.lse = x->lse, prm.split_ws = ws;
  cudaStream_t s;
  cr_assert_eq(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  int rc = attn_cu_launch(&prm, ch, s);
  cr_assert_eq(cudaStreamSynchronize(s), cudaSuccess);
  cudaStreamDestroy(s);
  return rc;
}

/* prm made paged over pg (page numbers and pool in host "device" memory). */
static void make_paged(attn_cu_params *prm, const tpaged *pg, int page_tokens, size_t page_bytes) {
  prm->k = prm->v = NULL; /* a paged launch never reads them */
  prm->k_table = pg->k_table;
  prm->v_table = pg->v_table;
  prm->page_base = pg->pool;
  prm->page_bytes = page_bytes;
  prm->page_tokens = page_tokens;
  prm->pages_per_head = pg->per_head;
}

/* The packed run's O (unpadded) and statistics against float64. */
static void check_reference(tcase *c, const outs *x, size_t rows, int dp, const char *desc) {
  const tprob *p = &c->p;
  unpad(c->o, x->o, rows, p->d, dp, attn_dtype_size(p->dt));
  memcpy(c->m, x->m, rows * 4);
  memcpy(c->l, x->l, rows * 4);
  memcpy(c->lse, x->lse, rows * 4);
  terr err = tcheck(c);
  cr_expect(err.o <= ttol(p->dt) && err.masked_ok && err.stats <= 1e-5,
            "%s: O error %.3g, stats %.3g, masked rows %s", desc, err.o, err.stats,
            err.masked_ok ? "ok" : "WRONG");
}

/* The choices of the packed and the paged request: the same launch, but
 * the 192 instance for the 160 one's head dims when paged (kernels.h). */
static void select_both(const pcase *pc, const attn_cu_params *packed, const attn_cu_params *paged,
                        attn_cu_choice *ch, attn_cu_choice *pch, const char *desc) {
  attn_status st = {0};
  cr_assert_eq(attn_cu_select(packed, pc->sms, ch, &st), 0, "%s: %s", desc, st.message);
  cr_assert_eq(attn_cu_select(paged, pc->sms, pch, &st), 0, "%s: %s", desc, st.message);
  const attn_cu_kernel want = ch->kernel == ATTN_CU_MMA_D160 ? ATTN_CU_MMA_D192 : ch->kernel;
  cr_expect(pch->kernel == want &&
                (want != ch->kernel || (ch->nsplit == pch->nsplit && ch->pack == pch->pack)),
            "%s: the paged request chose %s/%d pack %d", desc, attn_cu_kernel_name(pch->kernel),
            pch->nsplit, pch->pack);
  cr_expect_eq(pch->nsplit > 1, pc->split, "%s: nsplit %d", desc, pch->nsplit);
  cr_expect_eq(pch->pack > 1, pc->pack, "%s: pack %d", desc, pch->pack);
}

static void paged_case(const pcase *pc, uint64_t seed) {
  const tprob *p = &pc->p;
  char desc[240], pd[200];
  snprintf(desc, sizeof desc, "%s, pages of %d", tdesc(p, pd, sizeof pd), pc->page_tokens);
  tcase c;
  tcase_init(&c, p, seed);
  attn_cu_params prm, pprm;
  tcu_params(p, &prm);
  const size_t es = attn_dtype_size(p->dt), rows = (size_t)(p->b * p->hq * p->nq);
  const size_t kvrows = (size_t)(p->b * p->hkv * p->nkv), obytes = rows * (size_t)prm.dp * es;
  void *q = pad(c.q, rows, p->d, prm.dp, es), *k = pad(c.k, kvrows, p->d, prm.dp, es),
       *v = pad(c.v, kvrows, p->d, prm.dp, es);
  prm.q = q, prm.k = k, prm.v = v;
  tpaged pg;
  cr_assert_eq(tpaged_make(&pg, k, v, p->b * p->hkv, p->nkv, (size_t)prm.dp * es, pc->page_tokens,
                           pc->page_bytes, seed ^ 0x5eed),
               0);
  pprm = prm;
  make_paged(&pprm, &pg, pc->page_tokens, pc->page_bytes);
  attn_cu_choice ch, pch;
  select_both(pc, &prm, &pprm, &ch, &pch, desc);
  size_t wsb = attn_cu_split_bytes(&prm, &ch), pwsb = attn_cu_split_bytes(&pprm, &pch);
  void *ws = wsb ? dmem(wsb) : NULL, *pws = pwsb ? dmem(pwsb) : NULL;
  outs a, b;
  outs_alloc(&a, rows, obytes);
  outs_alloc(&b, rows, obytes);
  cr_expect_eq(launch(prm, &ch, &a, ws), 0, "%s: the packed launch", desc);
  cr_expect_eq(launch(pprm, &pch, &b, pws), 0, "%s: the paged launch", desc);
  cr_expect(!memcmp(a.o, b.o, obytes) && !memcmp(a.m, b.m, rows * 4) &&
                !memcmp(a.l, b.l, rows * 4) && !memcmp(a.lse, b.lse, rows * 4),
            "%s: paged outputs differ from the packed ones", desc);
  check_reference(&c, &a, rows, prm.dp, desc);
  outs_free(&a);
  outs_free(&b);
  free(ws);
  free(pws);
  tpaged_free(&pg);
  free(q);
  free(k);
  free(v);
  tcase_free(&c);
}

/* The cases: each dtype, head dims 64 to 256 and padded ones (37, 90),
 * GQA packing, masks, split-KV decodes on an H200's 132 SMs, and pages of
 * 64, 128, 192, 256 and 512 tokens. */
static int paged_list(pcase *cs) {
  int n = 0;
  pcase c = {.sms = 132};
  c.p = tprob_make(1, 8, 2, 1, 3000, 64, ATTN_F16); /* decode: split and packed */
  c.page_tokens = 512, c.page_bytes = 65536, c.split = c.pack = true;
  cs[n++] = c;
  c.p = tprob_make(2, 4, 2, 77, 300, 128, ATTN_BF16);
  c.p.causal = true;
  c.sms = 0; /* no split asked */
  c.page_tokens = 256, c.page_bytes = 65536, c.split = c.pack = false;
  cs[n++] = c;
  c.sms = 132;
  c.p = tprob_make(1, 2, 1, 1, 1000, 96, ATTN_F32); /* F32 decode: split, never packed */
  c.page_tokens = 128, c.page_bytes = 65536, c.split = true;
  cs[n++] = c;
  c.p = tprob_make(1, 4, 4, 5, 700, 90, ATTN_F16); /* dp 96 */
  c.p.causal = true;
  c.page_tokens = 64, c.page_bytes = 64 * 96 * 2, c.split = true;
  cs[n++] = c;
  c.p = tprob_make(1, 2, 1, 50, 200, 37, ATTN_F32); /* dp 40, a window */
  c.p.wl = 16, c.p.wr = 3;
  c.page_tokens = 64, c.page_bytes = 64 * 40 * 4, c.split = false;
  cs[n++] = c;
  c.p = tprob_make(1, 8, 1, 1, 2000, 256, ATTN_BF16); /* MQA decode */
  c.page_tokens = 128, c.page_bytes = 65536, c.split = c.pack = true;
  cs[n++] = c;
  c.p = tprob_make(2, 6, 2, 3, 513, 160, ATTN_F16); /* the 192 instance; a key alone on its page */
  c.p.causal = true;
  c.page_tokens = 192, c.page_bytes = 192 * 160 * 2, c.split = c.pack = true;
  cs[n++] = c;
  c.p = tprob_make(1, 2, 2, 40, 130, 192, ATTN_BF16);
  c.sms = 0; /* no split asked */
  c.page_tokens = 64, c.page_bytes = 64 * 192 * 2 + 256, c.split = c.pack = false;
  cs[n++] = c;
  return n;
}

Test(cuda_paged, paged_equals_packed_and_the_reference, .init = reset) {
  pcase cs[16];
  int n = paged_list(cs);
  for (int i = 0; i < n; i++) {
    cs[i].p.stats = true;
    paged_case(&cs[i], 0xbade + (uint64_t)i);
  }
}

/* A small valid paged launch for the contract's cases: *pg holds the pages,
 * bufs what else the launch needs. */
static void contract_setup(attn_cu_params *prm, attn_cu_choice *ch, tpaged *pg, void **bufs) {
  tprob p = tprob_make(1, 2, 1, 4, 100, 64, ATTN_F16);
  tcu_params(&p, prm);
  const size_t bytes = 2 * 100 * 64 * 2;
  bufs[0] = dmem(bytes); /* Q and O */
  bufs[1] = dmem(bytes); /* the packed K and V the pages come from */
  memset(bufs[1], 0, bytes);
  prm->q = bufs[0];
  cr_assert_eq(tpaged_make(pg, bufs[1], bufs[1], 1, 100, 64 * 2, 64, 64 * 64 * 2, 3), 0);
  make_paged(prm, pg, 64, 64 * 64 * 2);
  attn_status st = {0};
  cr_assert_eq(attn_cu_select(prm, 0, ch, &st), 0, "%s", st.message);
}

Test(cuda_paged, contract_breaks_are_refused, .init = reset) {
  attn_cu_params ok, x;
  attn_cu_choice ch, hc;
  tpaged pg;
  void *bufs[2];
  contract_setup(&ok, &ch, &pg, bufs);
  outs a;
  outs_alloc(&a, 8, 2 * 4 * 64 * 2);
  cr_expect_eq(launch(ok, &ch, &a, NULL), 0, "the valid paged launch");
#define REFUSED(change, what)                                                      \
  do {                                                                             \
    x = ok;                                                                        \
    change;                                                                        \
    cr_expect_eq(launch(x, &ch, &a, NULL), cudaErrorInvalidValue, "%s", what);     \
    cr_expect(!attn_cu_launch_ok(&x, &ch), "attn_cu_launch_ok accepts: %s", what); \
  } while (0)
  REFUSED(x.v_table = NULL, "a K table without a V table");
  REFUSED(x.k_table = NULL, "a V table without a K table");
  REFUSED(x.page_base = NULL, "no page pool");
  REFUSED(x.page_base = pg.pool + 8, "a pool 8-byte aligned");
  REFUSED(x.k_table = (const int32_t *)((const char *)pg.k_table + 2), "a misaligned table");
  REFUSED(x.page_tokens = 96, "96 tokens a page");
  REFUSED(x.page_tokens = 0, "no tokens a page");
  REFUSED(x.page_bytes = 64 * 64 * 2 - 256, "pages smaller than their rows");
  REFUSED(x.page_bytes = 64 * 64 * 2 + 16, "page_bytes not a multiple of 256");
  REFUSED(x.pages_per_head = 1, "a table shorter than the keys");
  int32_t *used = dmem(8);
  used[0] = 37;
  x = ok;
  x.seqused_k = used;
  cr_expect_eq(launch(x, &ch, &a, NULL), 0, "a valid paged launch with seqused_k");
  x.k_table = x.v_table = NULL, x.k = x.v = bufs[1];
  cr_expect_eq(launch(x, &ch, &a, NULL), cudaErrorInvalidValue, "seqused_k with no table");
  cr_expect(!attn_cu_launch_ok(&x, &ch), "attn_cu_launch_ok accepts seqused_k with no table");
  x.seqused_k = NULL;
  cr_expect_eq(launch(x, &ch, &a, NULL), 0, "the same launch packed, without seqused_k");
  REFUSED(x.seqused_k = (const int32_t *)((const char *)used + 2), "a misaligned seqused_k");
  hc = ch;
  hc.kernel = ATTN_CU_HOPPER_D64; /* TMA reads packed tensors */
  cr_expect(!attn_cu_launch_ok(&ok, &hc), "a paged launch on the Hopper instance");
  hc.kernel = ATTN_CU_MMA_D160; /* no paged variant */
  cr_expect(!attn_cu_launch_ok(&ok, &hc), "a paged launch on the 160 instance");
  x = ok;
  x.pass = ATTN_BACKWARD;
  cr_expect(!attn_cu_launch_ok(&x, &ch), "a paged backward launch");
#undef REFUSED
  free(used);
  outs_free(&a);
  tpaged_free(&pg);
  free(bufs[0]);
  free(bufs[1]);
}

Test(cuda_paged, never_hopper_nor_backward, .init = reset) {
  tprob p = tprob_make(4, 16, 16, 1024, 1024, 128, ATTN_BF16); /* 512 blocks: no split */
  attn_cu_params prm;
  tcu_params(&p, &prm);
  attn_cu_choice ch;
  attn_status st = {0};
  /* off 0: the Hopper instances allowed, as after a passed self-check */
  cr_assert_eq(attn_cu_select_masked(&prm, 132, 0, &ch, &st), 0, "%s", st.message);
  cr_expect_eq(ch.kernel, ATTN_CU_HOPPER_D128, "the packed request takes the Hopper instance");
  int32_t table[16] = {0};
  prm.k_table = prm.v_table = table;
  cr_assert_eq(attn_cu_select_masked(&prm, 132, 0, &ch, &st), 0, "%s", st.message);
  cr_expect_eq(ch.kernel, ATTN_CU_MMA_D128, "the paged one keeps the tensor-core instance");
  cr_expect(!attn_cu_select_hopper(&prm, 132, &ch), "attn_cu_select_hopper took a paged request");
  prm.pass = ATTN_BACKWARD;
  cr_expect_eq(attn_cu_select(&prm, 132, &ch, &st), ATTN_EUNSUPPORTED, "a paged backward: %s",
               st.message);
}

/* ---- per-entry key lengths (seqused_k) ---------------------------------- */

/* A batch of sessions: entry b has lens[b] keys, in one paged launch. */
typedef struct bcase {
  tprob p; /* the shape of one entry (b 1; nkv ignored) */
  int n, lens[5];
  int page_tokens;
  size_t page_bytes;
  int sms;
  bool split; /* expected of the batched choice */
} bcase;

/* Entry b's share of a launch's outputs: rows from r0. */
static outs outs_at(const outs *x, size_t r0, size_t orow_bytes) {
  outs e = {(unsigned char *)x->o + r0 * orow_bytes, x->m + r0, x->l + r0, x->lse + r0};
  return e;
}

/* An entry with no key: O exactly 0, m = lse = -inf, l = 0. */
static void check_empty(const outs *x, size_t rows, size_t orow_bytes, const char *desc) {
  const unsigned char *o = x->o;
  bool zero = true, stats = true;
  for (size_t i = 0; i < rows * orow_bytes; i++)
    zero = zero && o[i] == 0;
  for (size_t r = 0; r < rows; r++)
    stats = stats && x->m[r] == -INFINITY && x->lse[r] == -INFINITY && x->l[r] == 0.0f;
  cr_expect(zero && stats, "%s: the entry with no key gives O %s, stats %s", desc,
            zero ? "0" : "NOT 0", stats ? "ok" : "WRONG");
}

/* Entry b launched alone, as a session would be: batch 1, seq_kv its
 * length, its rows of Q and its tables; its choice the selector's. */
static void entry_alone(const bcase *bc, const tbatch *t, tcase *c, int b, const outs *batched,
                        const char *desc) {
  attn_cu_params prm;
  tcu_params(&c->p, &prm);
  const size_t es = attn_dtype_size(c->p.dt), rows = (size_t)(c->p.hq * c->p.nq);
  const size_t orow = (size_t)prm.dp * es;
  prm.q = t->q + (size_t)b * rows * orow;
  make_paged(&prm, &t->pg, bc->page_tokens, bc->page_bytes);
  prm.k_table += (size_t)b * (size_t)(c->p.hkv * t->pg.per_head);
  prm.v_table += (size_t)b * (size_t)(c->p.hkv * t->pg.per_head);
  attn_cu_choice ch;
  attn_status st = {0};
  cr_assert_eq(attn_cu_select(&prm, bc->sms, &ch, &st), 0, "%s: %s", desc, st.message);
  size_t wsb = attn_cu_split_bytes(&prm, &ch);
  void *ws = wsb ? dmem(wsb) : NULL;
  outs a;
  outs_alloc(&a, rows, rows * orow);
  cr_expect_eq(launch(prm, &ch, &a, ws), 0, "%s: the launch alone", desc);
  const outs e = outs_at(batched, (size_t)b * rows, orow);
  cr_expect(!memcmp(a.o, e.o, rows * orow) && !memcmp(a.m, e.m, rows * 4) &&
                !memcmp(a.l, e.l, rows * 4) && !memcmp(a.lse, e.lse, rows * 4),
            "%s: the batched entry differs from its launch alone", desc);
  check_reference(c, &e, rows, prm.dp, desc);
  outs_free(&a);
  free(ws);
}

static void batched_case(const bcase *bc, uint64_t seed) {
  char desc[300], pd[200];
  tcase cs[5];
  for (int b = 0; b < bc->n; b++) {
    tprob e = bc->p;
    e.b = 1, e.nkv = bc->lens[b] > 0 ? bc->lens[b] : 1, e.stats = true;
    tcase_init(&cs[b], &e, seed + (uint64_t)b);
  }
  attn_cu_params prm;
  tcu_params(&cs[0].p, &prm);
  tbatch t;
  cr_assert_eq(tbatch_make(&t, cs, bc->lens, bc->n, prm.dp, bc->page_tokens, bc->page_bytes, seed),
               0);
  int32_t *used = dmem((size_t)bc->n * 4);
  memcpy(used, t.lens, (size_t)bc->n * 4);
  tprob bp = bc->p;
  bp.b = bc->n, bp.nkv = t.maxk;
  tcu_params(&bp, &prm);
  prm.q = t.q;
  make_paged(&prm, &t.pg, bc->page_tokens, bc->page_bytes);
  prm.seqused_k = used;
  attn_cu_choice ch;
  attn_status st = {0};
  cr_assert_eq(attn_cu_select(&prm, bc->sms, &ch, &st), 0, "%s", st.message);
  snprintf(desc, sizeof desc, "%s, %d entries [%s/%d pack %d]", tdesc(&bp, pd, sizeof pd), bc->n,
           attn_cu_kernel_name(ch.kernel), ch.nsplit, ch.pack);
  cr_expect_eq(ch.nsplit > 1, bc->split, "%s: nsplit %d", desc, ch.nsplit);
  const size_t es = attn_dtype_size(bp.dt), rows = (size_t)(bp.hq * bp.nq);
  const size_t orow = (size_t)prm.dp * es, wsb = attn_cu_split_bytes(&prm, &ch);
  void *ws = wsb ? dmem(wsb) : NULL;
  outs x;
  outs_alloc(&x, (size_t)bc->n * rows, (size_t)bc->n * rows * orow);
  cr_expect_eq(launch(prm, &ch, &x, ws), 0, "%s: the batched launch", desc);
  for (int b = 0; b < bc->n; b++) {
    char ed[360];
    snprintf(ed, sizeof ed, "%s, entry %d of %d keys", desc, b, bc->lens[b]);
    if (bc->lens[b] > 0)
      entry_alone(bc, &t, &cs[b], b, &x, ed);
    else {
      const outs e = outs_at(&x, (size_t)b * rows, orow);
      check_empty(&e, rows, orow, ed);
    }
    tcase_free(&cs[b]);
  }
  outs_free(&x);
  free(ws);
  free(used);
  tbatch_free(&t);
}

/* Decodes (Nq 1) and short queries (Nq 4), causal and not, GQA packed and
 * not, every dtype, split-KV on 132 SMs and not split; entries of 0, 1,
 * 64, 300, 1000 keys (one shorter than its queries, with rows that see
 * nothing), pages of 64 to 192 tokens. */
static int batched_list(bcase *cs) {
  int n = 0;
  bcase c = {.sms = 132, .split = true};
  c.p = tprob_make(1, 8, 2, 1, 1, 64, ATTN_F16); /* decode: split and packed */
  c.n = 5, c.lens[0] = 1, c.lens[1] = 300, c.lens[2] = 1000, c.lens[3] = 64, c.lens[4] = 0;
  c.page_tokens = 64, c.page_bytes = 64 * 64 * 2;
  cs[n++] = c;
  c.p = tprob_make(1, 4, 4, 4, 1, 128, ATTN_BF16); /* Nq 4, causal, an entry of 3 keys */
  c.p.causal = true;
  c.n = 3, c.lens[0] = 3, c.lens[1] = 1000, c.lens[2] = 300;
  c.page_tokens = 128, c.page_bytes = 65536;
  cs[n++] = c;
  c.p = tprob_make(1, 2, 1, 1, 1, 96, ATTN_F32); /* F32 decode: split, never packed */
  c.p.causal = true;
  c.n = 4, c.lens[0] = 1000, c.lens[1] = 0, c.lens[2] = 257, c.lens[3] = 64;
  c.page_tokens = 128, c.page_bytes = 65536;
  cs[n++] = c;
  c.p = tprob_make(1, 6, 2, 4, 1, 160, ATTN_F16); /* the 192 instance, packed, causal */
  c.p.causal = true;
  c.n = 4, c.lens[0] = 513, c.lens[1] = 1, c.lens[2] = 64, c.lens[3] = 700;
  c.page_tokens = 192, c.page_bytes = 192 * 160 * 2;
  cs[n++] = c;
  c.p = tprob_make(1, 8, 1, 4, 1, 256, ATTN_BF16); /* MQA, a window, no split asked */
  c.p.wl = 100, c.p.wr = 0;
  c.sms = 0, c.split = false;
  c.n = 3, c.lens[0] = 0, c.lens[1] = 1000, c.lens[2] = 5;
  c.page_tokens = 64, c.page_bytes = 64 * 256 * 2;
  cs[n++] = c;
  return n;
}

Test(cuda_paged, seqused_k_entries_equal_their_launches_alone, .init = reset) {
  bcase cs[8];
  int n = batched_list(cs);
  for (int i = 0; i < n; i++)
    batched_case(&cs[i], 0x5e55 + 16 * (uint64_t)i);
}
