/*
 * test_datapath.c — the cuda backend's data path on the mock runtime: the
 * pinned pool it lends (attn_engine_host_alloc) and the server's body
 * buffers drawn from it (server/bodybuf.c), contiguous tensors there
 * uploaded and downloaded in place with no host copy, other tensors packed
 * through two pinned chunks, a large job's groups ordered across the
 * upload, kernel and download streams, and the faults of that path (the
 * pool spent, a device lost mid-job) failing only their job. The mock's
 * log of copies and launches (mock.h) is what the checks read; results are
 * checked against the float64 reference as everywhere else.
 */
#include "bodybuf.h"
#include "cuda/kernels.h"
#include "helpers.h"
#include "mock.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void reset(void) { mock_defaults(); }

static attn_engine *open_pinned(uint64_t pinned) {
  attn_config cfg;
  attn_config_init(&cfg);
  cfg.threads = 2;
  cfg.cuda_streams = 2;
  cfg.cuda_pinned_bytes = pinned;
  attn_engine *e;
  attn_status st;
  cr_assert_eq(attn_engine_open(&cfg, &e, &st), 0, "%s", st.message);
  return e;
}

static size_t tensor_bytes(const tprob *p, bool kv) {
  return (size_t)(p->b * (kv ? p->hkv : p->hq) * (kv ? p->nkv : p->nq) * p->d) *
         attn_dtype_size(p->dt);
}

/* n bytes from the pool, which lends nothing under 256 KiB. */
static unsigned char *lend(attn_engine *e, size_t n) {
  return attn_engine_host_alloc(e, n < ((size_t)256 << 10) ? (size_t)256 << 10 : n);
}

/* A request's body and reply buffers in the pinned pool, as the server
 * lays them out: q, k, v back to back; o, then m, l, lse. */
typedef struct pinned_case {
  unsigned char *body, *out;
  size_t body_len, out_len, qb, kb, rows;
} pinned_case;

static void pin_inputs(attn_engine *e, tcase *c, pinned_case *pc) {
  pc->qb = tensor_bytes(&c->p, false), pc->kb = tensor_bytes(&c->p, true);
  pc->body_len = pc->qb + 2 * pc->kb;
  pc->body = lend(e, pc->body_len);
  cr_assert(pc->body, "the pool lends %zu bytes", pc->body_len);
  memcpy(pc->body, c->q, pc->qb);
  memcpy(pc->body + pc->qb, c->k, pc->kb);
  memcpy(pc->body + pc->qb + pc->kb, c->v, pc->kb);
  c->req.q = pc->body, c->req.k = pc->body + pc->qb, c->req.v = pc->body + pc->qb + pc->kb;
}

static void pin_outputs(attn_engine *e, tcase *c, pinned_case *pc) {
  pc->rows = (size_t)(c->p.b * c->p.hq * c->p.nq);
  pc->out_len = pc->qb + (c->p.stats ? 3 * pc->rows * sizeof(float) : 0);
  pc->out = lend(e, pc->out_len);
  cr_assert(pc->out, "the pool lends %zu bytes", pc->out_len);
  c->req.o = pc->out;
  if (c->p.stats) {
    c->req.m = (float *)(void *)(pc->out + pc->qb);
    c->req.l = c->req.m + pc->rows, c->req.lse = c->req.l + pc->rows;
  }
}

/* The reply's tensors back into the case's own buffers, for tcheck(). */
static void unpin(attn_engine *e, tcase *c, pinned_case *pc) {
  if (pc->out) {
    memcpy(c->o, pc->out, pc->qb);
    if (c->p.stats) {
      memcpy(c->m, c->req.m, pc->rows * sizeof(float));
      memcpy(c->l, c->req.l, pc->rows * sizeof(float));
      memcpy(c->lse, c->req.lse, pc->rows * sizeof(float));
    }
    cr_expect(attn_engine_host_free(e, pc->out));
  }
  if (pc->body)
    cr_expect(attn_engine_host_free(e, pc->body));
  c->req.q = c->q, c->req.k = c->k, c->req.v = c->v, c->req.o = c->o;
  c->req.m = c->m, c->req.l = c->l, c->req.lse = c->lse;
}

static bool within(const void *p, const void *base, size_t len) {
  const unsigned char *c = p, *b = base;
  return base && c >= b && c < b + len;
}

static void expect_correct(const tcase *c, const char *what) {
  terr err = tcheck(c);
  cr_expect(err.o <= ttol(c->p.dt) && (!c->p.stats || err.stats <= 1e-5),
            "%s: O error %.3g, stats %.3g", what, err.o, err.stats);
}

/* Bytes the log's copies of kind moved to or from [base, base + len), and
 * the largest copy of that kind outside it. */
static size_t logged_bytes(int kind, const void *base, size_t len, size_t *largest_other) {
  static mock_op log[MOCK_LOG_MAX];
  int n = mock_log(log, MOCK_LOG_MAX);
  size_t in = 0;
  *largest_other = 0;
  for (int i = 0; i < n; i++) {
    if (log[i].kind != kind)
      continue;
    const void *host = kind == MOCK_UPLOAD ? log[i].src : log[i].dst;
    if (within(host, base, len))
      in += log[i].bytes;
    else if (log[i].bytes > *largest_other)
      *largest_other = log[i].bytes;
  }
  return in;
}

Test(datapath, contiguous_pinned_request_is_copied_in_place, .init = reset) {
  attn_engine *e = open_pinned((size_t)64 << 20);
  const int64_t dims[2] = {64, 40}; /* 40: a padded head dim, moved by 2-D copies */
  for (int dt = 0; dt < ATTN_DTYPE_COUNT; dt++)
    for (int k = 0; k < 2; k++) {
      tprob p = tprob_make(2, 4, 2, 300, 310, dims[k], (attn_dtype)dt);
      p.stats = true;
      tcase c;
      tcase_init(&c, &p, 11);
      pinned_case pc = {0};
      pin_inputs(e, &c, &pc);
      pin_outputs(e, &c, &pc);
      mock_log_reset();
      attn_status st = {0};
      cr_expect_eq(trun(e, &c, "cuda", &st), 0, "%s", st.message);
      size_t up_other, down_other;
      size_t up = logged_bytes(MOCK_UPLOAD, pc.body, pc.body_len, &up_other);
      size_t down = logged_bytes(MOCK_DOWNLOAD, pc.out, pc.out_len, &down_other);
      /* every byte of q, k, v straight from the body and of o, m, l, lse
       * straight into the reply; the rest is the scan's few bytes */
      cr_expect_eq(up, pc.body_len, "%s D=%lld: %zu of %zu body bytes uploaded in place",
                   attn_dtype_name(p.dt), (long long)p.d, up, pc.body_len);
      cr_expect_eq(down, pc.out_len, "%s D=%lld: %zu of %zu reply bytes downloaded in place",
                   attn_dtype_name(p.dt), (long long)p.d, down, pc.out_len);
      cr_expect_leq(up_other, 4096, "an upload of %zu bytes came from elsewhere (a pack)",
                    up_other);
      cr_expect_leq(down_other, 4096, "a download of %zu bytes went elsewhere", down_other);
      unpin(e, &c, &pc);
      expect_correct(&c, attn_dtype_name(p.dt));
      tcase_free(&c);
    }
  attn_engine_close(e);
  cr_expect_eq(mock_pinned_buffers(), 0, "pinned buffers left");
  cr_expect_eq(mock_device_bytes(), 0, "device memory left");
}

Test(datapath, other_inputs_are_packed_through_two_pinned_chunks, .init = reset) {
  attn_engine *e = open_pinned((size_t)64 << 20);
  /* K and V of 8 MiB each, strided: two 4 MiB chunks per tensor */
  tprob p = tprob_make(1, 2, 1, 1, 32768, 64, ATTN_F32);
  p.strided = true;
  tcase c;
  tcase_init(&c, &p, 12);
  mock_log_reset();
  attn_status st = {0};
  cr_expect_eq(trun(e, &c, "cuda", &st), 0, "%s", st.message);
  static mock_op log[MOCK_LOG_MAX];
  int n = mock_log(log, MOCK_LOG_MAX);
  const void *src[2] = {NULL, NULL};
  size_t packed = 0;
  int big = 0;
  for (int i = 0; i < n; i++) {
    if (log[i].kind != MOCK_UPLOAD)
      continue;
    cr_expect(log[i].host_pinned, "an upload of %zu bytes from pageable memory", log[i].bytes);
    if (log[i].bytes < 4096)
      continue;
    big++;
    packed += log[i].bytes;
    /* the chunks alternate: never the same one twice in a row */
    cr_expect_neq(log[i].src, src[1], "upload %d reused the chunk of the one before", big);
    src[0] = src[1], src[1] = log[i].src;
  }
  size_t want = 2 * tensor_bytes(&p, true); /* q's 512 bytes are one small chunk */
  cr_expect_eq(packed, want, "%zu of %zu K and V bytes packed up", packed, want);
  cr_expect_geq(big, 4, "%d chunk uploads", big);
  expect_correct(&c, "strided F32");
  tcase_free(&c);
  attn_engine_close(e);
}

/* The log entry of the i-th op of kind on stream s (NULL: any stream). */
static const mock_op *nth(const mock_op *log, int n, int kind, int i) {
  for (int k = 0; k < n; k++)
    if (log[k].kind == kind && i-- == 0)
      return &log[k];
  return NULL;
}

Test(datapath, a_large_job_runs_in_groups_on_three_streams, .init = reset) {
  attn_engine *e = open_pinned((size_t)256 << 20);
  /* K and V of 32 MiB each: four groups of one batch entry */
  tprob p = tprob_make(4, 1, 1, 1, 32768, 64, ATTN_F32);
  p.stats = true;
  tcase c;
  tcase_init(&c, &p, 13);
  pinned_case pc = {0};
  pin_inputs(e, &c, &pc);
  pin_outputs(e, &c, &pc);
  mock_log_reset();
  attn_status st = {0};
  cr_expect_eq(trun(e, &c, "cuda", &st), 0, "%s", st.message);
  static mock_op log[MOCK_LOG_MAX];
  int n = mock_log(log, MOCK_LOG_MAX);
  const mock_op *k0 = nth(log, n, MOCK_KERNEL, 0);
  cr_assert(k0 && nth(log, n, MOCK_KERNEL, 3) && !nth(log, n, MOCK_KERNEL, 4),
            "four kernels, one per group");
  for (int g = 0; g < 4; g++) {
    const mock_op *k = nth(log, n, MOCK_KERNEL, g);
    cr_expect_eq(k->stream, k0->stream, "the kernels share a stream");
    /* group g's inputs: its q row and its K, V rows (the first upload
     * is the small inputs' and scan results' region) */
    for (int t = 0; t < 3; t++) {
      const mock_op *u = nth(log, n, MOCK_UPLOAD, 1 + 3 * g + t);
      cr_assert(u, "group %d's upload %d", g, t);
      cr_expect_neq(u->stream, k->stream, "uploads on their own stream");
      cr_expect_lt(u->end, k->start, "group %d's kernel started before its upload ended", g);
    }
    /* its downloads: o, m, l, lse */
    for (int t = 0; t < 4; t++) {
      const mock_op *d = nth(log, n, MOCK_DOWNLOAD, 4 * g + t);
      cr_assert(d, "group %d's download %d", g, t);
      cr_expect_neq(d->stream, k->stream, "downloads on their own stream");
      cr_expect_neq(d->stream, nth(log, n, MOCK_UPLOAD, 0)->stream, "not on the upload stream");
      cr_expect_gt(d->start, k->end, "group %d's download started before its kernel ended", g);
      cr_expect(within(d->dst, pc.out, pc.out_len), "group %d's download %d in place", g, t);
    }
  }
  unpin(e, &c, &pc);
  expect_correct(&c, "four groups");
  tcase_free(&c);
  attn_engine_close(e);
  cr_expect_eq(mock_device_bytes(), 0, "device memory left");
}

Test(datapath, a_nonfinite_value_in_a_later_group_names_its_element, .init = reset) {
  attn_engine *e = open_pinned((size_t)256 << 20);
  tprob p = tprob_make(4, 1, 1, 1, 32768, 64, ATTN_F32);
  tcase c;
  tcase_init(&c, &p, 14);
  ((float *)c.v)[(3 * 32768 + 20000) * 64 + 5] = NAN; /* batch 3, key 20000, dim 5 */
  pinned_case pc = {0};
  pin_inputs(e, &c, &pc);
  attn_status st = {0};
  int rc = trun(e, &c, "cuda", &st);
  cr_expect(rc == ATTN_ENONFINITE &&
                strstr(st.message, "tensor v holds a non-finite value at [3, 0, 20000, 5]"),
            "%s: %s", attn_err_name(rc), st.message);
  unpin(e, &c, &pc);
  tcase_free(&c);
  attn_engine_close(e);
}

Test(datapath, a_device_lost_mid_job_fails_that_job, .init = reset) {
  attn_engine *e = open_pinned((size_t)256 << 20);
  tprob p = tprob_make(4, 1, 1, 1, 32768, 64, ATTN_F32);
  tcase c;
  tcase_init(&c, &p, 15);
  pinned_case pc = {0};
  pin_inputs(e, &c, &pc);
  /* the self-check ran at open: the next kernel is the job's first group,
   * faulting while the later groups' uploads are queued */
  mock_knobs k = MOCK_KNOBS(1, 9, (size_t)8 << 30, 0, 0, 1);
  mock_set(&k);
  attn_status st = {0};
  int rc = trun(e, &c, "cuda", &st);
  cr_expect_eq(rc, ATTN_EDEVICE, "%s: %s", attn_err_name(rc), st.message);
  /* the device is gone; the next job says so and nothing hangs */
  rc = trun(e, &c, "cuda", &st);
  cr_expect(rc == ATTN_ENODEV || rc == ATTN_EDEVICE, "%s: %s", attn_err_name(rc), st.message);
  unpin(e, &c, &pc);
  tcase_free(&c);
  attn_engine_close(e);
  cr_expect_eq(mock_device_bytes(), 0, "device memory left");
  cr_expect_eq(mock_pinned_buffers(), 0, "pinned buffers left");
}

Test(datapath, the_pool_lends_within_its_cap_and_reuses_blocks, .init = reset) {
  attn_engine *e = open_pinned((size_t)8 << 20);
  attn_host_stats hs;
  cr_expect_null(attn_engine_host_alloc(e, 1000), "small buffers are not lent");
  void *a = attn_engine_host_alloc(e, (size_t)3 << 20);
  void *b = attn_engine_host_alloc(e, (size_t)3 << 20);
  cr_assert(a && b);
  attn_engine_host_stats(e, &hs);
  cr_expect_eq(hs.cap, (size_t)8 << 20);
  cr_expect_eq(hs.lent, (size_t)8 << 20, "two blocks of 4 MiB (2 MiB granules)");
  cr_expect_null(attn_engine_host_alloc(e, (size_t)3 << 20), "past the cap");
  attn_engine_host_stats(e, &hs);
  cr_expect_eq(hs.refused, 1);
  cr_expect(attn_engine_host_free(e, a));
  cr_expect_not(attn_engine_host_free(e, a), "given back twice");
  int pins = mock_pinned_buffers();
  void *c = attn_engine_host_alloc(e, (size_t)3 << 20);
  cr_expect_eq(c, a, "the idle block is lent again");
  cr_expect_eq(mock_pinned_buffers(), pins, "without pinning more");
  cr_expect(attn_engine_host_free(e, c) && attn_engine_host_free(e, b));
  /* a larger block evicts idle ones to fit under the cap */
  void *d = attn_engine_host_alloc(e, (size_t)7 << 20);
  cr_expect(d, "idle blocks give way");
  attn_engine_host_stats(e, &hs);
  cr_expect_leq(hs.pinned, hs.cap);
  cr_expect(attn_engine_host_free(e, d));
  char *mine = malloc(16);
  cr_expect_not(attn_engine_host_free(e, mine), "not the pool's");
  free(mine);
  attn_engine_close(e);
  cr_expect_eq(mock_pinned_buffers(), 0, "pinned buffers left");
  e = open_pinned(0);
  cr_expect_null(attn_engine_host_alloc(e, (size_t)3 << 20), "cap 0: none lent");
  attn_engine_close(e);
}

Test(datapath, a_refused_pin_leaves_requests_staged, .init = reset) {
  attn_engine *e = open_pinned((size_t)64 << 20);
  mock_knobs k = MOCK_KNOBS(1, 9, (size_t)8 << 30, 0, 0, 0);
  k.fail_pin = 1;
  mock_set(&k);
  cr_expect_null(attn_engine_host_alloc(e, (size_t)1 << 20), "the driver refused");
  attn_host_stats hs;
  attn_engine_host_stats(e, &hs);
  cr_expect_eq(hs.pinned, 0, "nothing counted for the refused block");
  /* body pinned, reply not: inputs in place, outputs unpacked */
  tprob p = tprob_make(2, 2, 2, 100, 120, 48, ATTN_BF16);
  p.stats = true;
  tcase c;
  tcase_init(&c, &p, 16);
  pinned_case pc = {0};
  pin_inputs(e, &c, &pc);
  attn_status st = {0};
  cr_expect_eq(trun(e, &c, "cuda", &st), 0, "%s", st.message);
  unpin(e, &c, &pc);
  expect_correct(&c, "pinned body, ordinary reply");
  tcase_free(&c);
  attn_engine_close(e);
}

Test(datapath, request_bodies_are_read_into_the_pool, .init = reset) {
  attn_engine *e = open_pinned((size_t)8 << 20);
  attnd_bodybufs c;
  attnd_bodybufs_init(&c, e);
  size_t n = (size_t)3 << 20;
  char *src = malloc(n);
  for (size_t i = 0; i < n; i++)
    src[i] = (char)(i * 131 % 251);
  char *p = attnd_bodybuf_get(&c, n);
  cr_assert(p);
  attn_host_stats hs;
  attn_engine_host_stats(e, &hs);
  cr_expect_geq(hs.lent, n, "the body is the pool's (%llu bytes lent)",
                (unsigned long long)hs.lent);
  attnd_bodybuf_fill(p, 0, src, n / 2);
  attnd_bodybuf_fill(p, n / 2, src + n / 2, n - n / 2);
  cr_expect(memcmp(p, src, n) == 0, "the bytes as they arrived");
  /* past the pool's cap: an ordinary mapping, the same to its user */
  char *big = attnd_bodybuf_get(&c, (size_t)16 << 20);
  cr_assert(big);
  attnd_bodybuf_fill(big, 0, src, n);
  cr_expect(memcmp(big, src, n) == 0);
  attn_engine_host_stats(e, &hs);
  cr_expect_lt(hs.lent, (size_t)8 << 20, "the large body is not the pool's");
  attnd_bodybuf_put(&c, p);
  attnd_bodybuf_put(&c, big);
  attn_engine_host_stats(e, &hs);
  cr_expect_eq(hs.lent, 0, "given back to the pool");
  attnd_bodybufs_close(&c);
  free(src);
  attn_engine_close(e);
  cr_expect_eq(mock_pinned_buffers(), 0, "pinned buffers left");
}
