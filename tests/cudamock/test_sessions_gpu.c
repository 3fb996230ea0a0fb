/*
 * test_sessions_gpu.c — sessions whose pages live on the device, on the
 * mock runtime: a store on an engine with a GPU puts its pages in device
 * memory (rows padded to the kernels' dp, the padding zero), a call's job
 * uploads only q, its page tables and its new rows (which a kernel puts
 * into their pages) and the paged kernel reads K and V in place; prefill and decode match
 * the float64 reference in every dtype, a batch call matches its entries
 * alone (one launch over their page tables), a store saved from the device loads back (on the
 * device or in host memory), a session exported from the device imports into either, a device
 * lost fails the calls and not the process, and a store the
 * device cannot hold stays in host memory. A decode step (alone or a batch of sessions) is one
 * upload and one download, and the steps after it read the rows its job put; a call on a layer
 * waits for the job that puts its keys (without batching too, and behind a waiting call that
 * appends to it), a replay's check waits for it, and a job that fails or that the engine splits
 * still leaves its rows stored. A session of reserve grow takes device pages as its tokens
 * arrive, refused past what is free with nothing appended. A fork shares its source's device
 * pages, the first divergent write copies the page on the device and each side reads its own
 * history; a source whose job is still putting its rows is not forked (a conflict, then a fork
 * once the job has ended), and a page copy that fails refuses the append, nothing written.
 */
#include "cuda/kernels.h"
#include "helpers.h"
#include "kv/kv_int.h"
#include "kvcalls.h"
#include "kvstep.h"
#include "mock.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MIB ((uint64_t)1 << 20)

static void reset(void) { mock_defaults(); }

static const char *where(attn_kv_store *kv) {
  attn_kv_stats s;
  attn_kv_stats_get(kv, &s);
  return s.where;
}

/* Prefill pre tokens, then decode one at a time to s->n, every step on
 * the GPU and checked; failures counted. */
static int decode(attn_kv_store *kv, const char *id, const tkv_stream *s, int64_t pre,
                  const char *what) {
  const tkv_plan pl = {.pre = pre, .backend = "cuda"};
  char why[200] = "";
  int fails = tkv_decode(kv, id, s, &tkv_plain, &pl, why, sizeof why);
  if (fails)
    cr_log_error("%s: %d steps failed, the first at %s", what, fails, why);
  return fails;
}

/* Bytes of the padding columns of every page of ks's layer 0 that are
 * not zero (device memory is host memory on the mock): past each row's
 * own width (head_dim for K, head_dim_v for V). */
static long nonzero_padding(attn_kv_store *kv, const char *id) {
  pthread_mutex_lock(&kv->mu);
  kv_session *ks = attn__kv_find(kv, "", id, 0);
  cr_assert(ks);
  const size_t es = attn_dtype_size(ks->shape.dtype);
  long bad = 0;
  const kv_layer *L = &ks->layers[0];
  for (int64_t i = 0; i < ks->shape.heads_kv * ks->pages_per_head; i++)
    for (int t = 0; t < attn__kv_tensors(&ks->shape) && (t ? L->vp : L->kp)[i]; t++) {
      const unsigned char *page = (t ? L->vp : L->kp)[i];
      for (int64_t r = 0; r < ks->page_tokens; r++)
        for (size_t b = (size_t)attn__kv_cols(&ks->shape, t) * es; b < (size_t)ks->pitch * es; b++)
          bad += page[(size_t)r * (size_t)ks->pitch * es + b] != 0;
    }
  pthread_mutex_unlock(&kv->mu);
  return bad;
}

Test(sessions_gpu, prefill_and_decode_on_the_device_match_float64, .init = reset) {
  attn_engine *e = topen_streams(2, 2);
  attn_kv_store *kv = tkv_open_store(e, 64 * MIB, false, NULL);
  cr_assert_str_eq(where(kv), "cuda", "the pages live on the GPU");
  const attn_dtype dts[3] = {ATTN_F32, ATTN_F16, ATTN_BF16};
  const int64_t dims[2] = {64, 37}; /* 37: rows padded to 40 on the device */
  int fails = 0;
  for (int i = 0; i < 3; i++)
    for (int k = 0; k < 2; k++) {
      char id[32], what[64];
      snprintf(id, sizeof id, "s%d-%d", i, k);
      snprintf(what, sizeof what, "%s D=%lld", attn_dtype_name(dts[i]), (long long)dims[k]);
      tkv_stream s = tkv_stream_make(4, 2, dims[k], 150, dts[i], 40 + (uint64_t)(3 * i + k));
      tkv_make(kv, "", id, &s, 1, 200, 60, 0);
      fails += decode(kv, id, &s, 100, what);
      cr_expect_eq(nonzero_padding(kv, id), 0, "%s: the rows' padding stays zero", what);
      tkv_stream_free(&s);
    }
  cr_expect_eq(fails, 0, "%d steps off the reference", fails);
  attn_kv_close(kv);
  attn_engine_close(e);
  cr_expect_eq(mock_device_bytes(), 0, "device memory left");
}

static long copies_within(void) {
  static mock_op log[MOCK_LOG_MAX];
  long n = 0;
  for (int i = 0, m = mock_log(log, MOCK_LOG_MAX); i < m; i++)
    n += log[i].kind == MOCK_WITHIN;
  return n;
}

/* A fork shares the device pages of its source's tokens; the first
 * divergent append copies the partial page it writes into (on the device,
 * one copy per KV head, K and V; the other side then holds its page alone
 * and writes in place), and each side reads exactly its own history; a
 * branch at a page's end copies nothing. */
Test(sessions_gpu, a_fork_shares_device_pages_and_each_side_reads_its_own, .init = reset) {
  attn_engine *e = topen_streams(2, 2);
  attn_kv_store *kv = tkv_open_store(e, 64 * MIB, false, NULL);
  cr_assert_str_eq(where(kv), "cuda", "the pages live on the GPU");
  /* D 64, 64 KiB pages: 256 F32 tokens a page, 512 BF16 ones */
  const int64_t ats[3] = {100, 256, 300};
  for (int a = 0; a < 3; a++) {
    const attn_dtype dt = a == 2 ? ATTN_BF16 : ATTN_F32;
    tkv_stream src = tkv_stream_make(4, 2, 64, 400, dt, 80 + (uint64_t)a);
    tkv_stream other = tkv_stream_make(4, 2, 64, 400, dt, 90 + (uint64_t)a);
    tkv_stream mine = tkv_stream_splice(&src, &other, ats[a]);
    tkv_make(kv, "", "s", &src, 1, 400, 60, 0);
    tkv_step_ok(kv, "s", &src, 0, ats[a]);
    attn_status st;
    cr_assert_eq(attn_kv_fork(kv, "", "s", "f", -1, 0, 0, &st), 0, "%s", st.message);
    attn_kv_info info;
    cr_assert_eq(attn_kv_get(kv, "", "f", 0, &info, NULL, 0, &st), 0, "%s", st.message);
    cr_expect(info.tokens == ats[a] && info.shared_bytes > 0, "the fork holds the source's pages");
    mock_log_reset();
    for (int64_t pos = ats[a]; pos < ats[a] + 3; pos++) { /* interleaved decodes */
      tkv_step_ok(kv, "f", &mine, pos, 1);
      tkv_step_ok(kv, "s", &src, pos, 1);
    }
    const long nc = copies_within(), want = a == 1 ? 0 : 2 * 2; /* Hkv 2, K and V */
    cr_expect_eq(nc, want, "branch at %lld: %ld page copies", (long long)ats[a], nc);
    cr_assert_eq(attn_kv_delete(kv, "", "s", 0, &st), 0);
    tkv_step_ok(kv, "f", &mine, ats[a] + 3, 40); /* the fork outlives its source */
    cr_assert_eq(attn_kv_delete(kv, "", "f", 0, &st), 0);
    tkv_stream_free(&src);
    tkv_stream_free(&other);
    tkv_stream_free(&mine);
  }
  attn_kv_stats t;
  attn_kv_stats_get(kv, &t);
  cr_expect(t.reserved_bytes == 0 && t.shared_bytes == 0, "every page given back");
  attn_kv_close(kv);
  attn_engine_close(e);
  cr_expect_eq(mock_device_bytes(), 0, "device memory left");
}

Test(sessions_gpu, a_decode_step_moves_q_and_page_numbers_not_the_cache, .init = reset) {
  attn_engine *e = topen_streams(2, 2);
  attn_kv_store *kv = tkv_open_store(e, 64 * MIB, false, NULL);
  tkv_stream s = tkv_stream_make(8, 2, 64, 2001, ATTN_BF16, 5);
  tkv_make(kv, "", "d", &s, 1, 4096, 60, 0);
  tkv_reply y;
  attn_status st;
  cr_assert_eq(tkv_call1(kv, "", "d", &s, &tkv_plain, 0, 2000, 0, 2000, &y, 0, &st), 0, "%s",
               st.message);
  tkv_reply_free(&y);
  mock_log_reset();
  cr_assert_eq(tkv_call1(kv, "", "d", &s, &tkv_plain, 2000, 1, 2000, 1, &y, 0, &st), 0, "%s",
               st.message);
  cr_expect_leq(tkv_ref_error(&s, &tkv_plain, 2000, 1, 2001, &y), ttol(ATTN_BF16));
  tkv_reply_free(&y);
  static mock_op log[MOCK_LOG_MAX];
  int n = mock_log(log, MOCK_LOG_MAX);
  size_t up = 0, put = 0;
  int kernels = 0, sync = 0;
  for (int i = 0; i < n; i++) {
    sync += log[i].kind == MOCK_UPLOAD && !log[i].stream; /* a synchronous copy */
    if (log[i].kind == MOCK_UPLOAD)
      up += log[i].bytes;
    if (log[i].kind == MOCK_OTHER && log[i].dst == kv->pages.base) /* attn_cu_put_rows */
      put += log[i].bytes;
    kernels += log[i].kind == MOCK_KERNEL;
  }
  const size_t cache = 2 * 2 * 2001 * 64 * 2; /* K and V of 2001 tokens */
  cr_expect_eq(sync, 0, "the new rows travel in the job's upload");
  cr_expect_eq(put, 2 * 2 * 64 * 2, "one new row of K and of V per KV head");
  cr_expect_lt(up, cache / 50, "the job uploaded %zu bytes; the cache is %zu", up, cache);
  cr_expect_eq(kernels, 1, "one launch");
  tkv_stream_free(&s);
  attn_kv_close(kv);
  attn_engine_close(e);
}

/* A decode step of three sessions as one call: q [Hq, 3, D], one row each. */
static int batch_step(attn_kv_store *kv, const tkv_stream *s, const int64_t *pos, void *o,
                      attn_status *st) {
  const int64_t hq = s[0].hq, hkv = s[0].hkv, d = s[0].d;
  const size_t es = attn_dtype_size(s[0].dt), w = (size_t)d * es;
  char *q = malloc((size_t)(hq * 3) * w), *k = malloc((size_t)(hkv * 3) * w),
       *v = malloc((size_t)(hkv * 3) * w);
  static const char *const ids[3] = {"b0", "b1", "b2"};
  attn_kv_entry en[3];
  for (int i = 0; i < 3; i++) {
    en[i] = (attn_kv_entry){.id = ids[i], .pos = pos[i], .n_new = 1, .kv_off = i};
    for (int64_t h = 0; h < hq; h++)
      memcpy(q + (size_t)(h * 3 + i) * w, (const char *)s[i].q + (size_t)(h * s[i].n + pos[i]) * w,
             w);
    for (int64_t h = 0; h < hkv; h++) {
      memcpy(k + (size_t)(h * 3 + i) * w, (const char *)s[i].k + (size_t)(h * s[i].n + pos[i]) * w,
             w);
      memcpy(v + (size_t)(h * 3 + i) * w, (const char *)s[i].v + (size_t)(h * s[i].n + pos[i]) * w,
             w);
    }
  }
  int64_t cu[4] = {0, 1, 2, 3};
  attn_kv_call c = {.tenant = "", .layer = 0, .nentries = 3, .entries = en};
  attn_request_init(&c.req);
  c.req.heads_q = hq, c.req.heads_kv = hkv, c.req.head_dim = d, c.req.seq_q = 3;
  c.req.dtype = s[0].dt, c.req.causal = true, c.req.cu_seqlens_q = cu;
  c.req.q = q, c.req.o = o;
  c.k_new = k, c.v_new = v, c.total_new = 3;
  int rc = tkv_run(kv, &c, 0, st);
  free(q);
  free(k);
  free(v);
  return rc;
}

Test(sessions_gpu, a_batch_call_matches_its_entries, .init = reset) {
  attn_engine *e = topen_streams(2, 2);
  attn_kv_store *kv = tkv_open_store(e, 64 * MIB, false, NULL);
  const int64_t pre[3] = {1, 300, 129}; /* different lengths: one page, several, a boundary */
  tkv_stream s[3];
  static const char *const ids[3] = {"b0", "b1", "b2"};
  for (int i = 0; i < 3; i++) {
    s[i] = tkv_stream_make(4, 2, 64, pre[i] + 1, ATTN_F16, 70 + (uint64_t)i);
    tkv_make(kv, "", ids[i], &s[i], 1, 512, 60, 0);
    tkv_reply y;
    attn_status st;
    cr_assert_eq(tkv_call1(kv, "", ids[i], &s[i], &tkv_plain, 0, pre[i], 0, pre[i], &y, 0, &st), 0,
                 "%s", st.message);
    tkv_reply_free(&y);
  }
  void *o = calloc(4 * 3 * 64, 2);
  attn_status st;
  mock_log_reset();
  cr_assert_eq(batch_step(kv, s, pre, o, &st), 0, "%s", st.message);
  static mock_op log[MOCK_LOG_MAX];
  int n = mock_log(log, MOCK_LOG_MAX), kernels = 0;
  for (int i = 0; i < n; i++)
    kernels += log[i].kind == MOCK_KERNEL;
  cr_expect_eq(kernels, 1, "one launch over the three sessions' page tables");
  for (int i = 0; i < 3; i++) {
    tkv_reply y = {.o = tkv_rows_of(o, 4, 3, 64, ATTN_F16, i, 1)};
    double err = tkv_ref_error(&s[i], &tkv_plain, pre[i], 1, pre[i] + 1, &y);
    cr_expect_leq(err, ttol(ATTN_F16), "entry %d (%lld keys): error %.3g", i, (long long)pre[i] + 1,
                  err);
    free(y.o);
    tkv_stream_free(&s[i]);
  }
  free(o);
  attn_kv_close(kv);
  attn_engine_close(e);
}

Test(sessions_gpu, a_store_saved_from_the_device_loads_back_anywhere, .init = reset) {
  char dir[] = "/tmp/attn-gpu-kv-XXXXXX";
  cr_assert(mkdtemp(dir));
  attn_engine *e = topen_streams(2, 2);
  tkv_stream s = tkv_stream_make(4, 2, 37, 301, ATTN_BF16, 9);
  attn_status st;
  for (int round = 0; round < 2; round++) {
    attn_kv_store *kv = tkv_open_store(e, 64 * MIB, false, NULL);
    tkv_make(kv, "", "p", &s, 1, 400, 600, 0);
    tkv_reply y;
    cr_assert_eq(tkv_call1(kv, "", "p", &s, &tkv_plain, 0, 300, 0, 300, &y, 0, &st), 0, "%s",
                 st.message);
    tkv_reply_free(&y);
    cr_assert_eq(attn_kv_save(kv, dir, 0, &st), 1, "%s", st.message);
    attn_kv_close(kv);
    /* back on the device, then (round 1) into host memory: the file holds rows, not pages */
    kv = tkv_open_store(e, 64 * MIB, false, round ? "cpu" : NULL);
    cr_assert_str_eq(where(kv), round ? "host" : "cuda");
    cr_assert_eq(attn_kv_load(kv, dir, 0, 1e9, NULL, NULL, &st), 1, "%s", st.message);
    cr_assert_eq(tkv_call1(kv, "", "p", &s, &tkv_plain, 300, 1, 300, 1, &y, 0, &st), 0, "%s",
                 st.message);
    cr_expect_leq(tkv_ref_error(&s, &tkv_plain, 300, 1, 301, &y), ttol(ATTN_BF16),
                  "round %d: the loaded cache attends as the saved one", round);
    cr_expect_str_eq(y.backend, round ? "cpu" : "cuda");
    tkv_reply_free(&y);
    attn_kv_close(kv);
  }
  tkv_stream_free(&s);
  attn_engine_close(e);
  rmdir(dir);
}

/* A session exported from device pages (rows read back without their
 * padding) imports into a device store and a host one alike: both export
 * the same rows, and attend as the first. */
Test(sessions_gpu, a_session_exported_from_the_device_imports_anywhere, .init = reset) {
  attn_engine *e = topen_streams(2, 2);
  tkv_stream s = tkv_stream_make(4, 2, 37, 301, ATTN_BF16, 10);
  attn_kv_store *a = tkv_open_store(e, 64 * MIB, false, NULL);
  cr_assert_str_eq(where(a), "cuda");
  tkv_make(a, "", "p", &s, 1, 400, 600, 0);
  tkv_reply y;
  attn_status st;
  cr_assert_eq(tkv_call1(a, "", "p", &s, &tkv_plain, 0, 300, 0, 300, &y, 0, &st), 0, "%s",
               st.message);
  tkv_reply_free(&y);
  attn_kv_info info;
  int64_t len[1];
  void *k[1], *v[1];
  cr_assert_eq(attn_kv_export(a, "", "p", 0, &info, len, k, v, &st), 0, "%s", st.message);
  cr_assert_eq(len[0], 300);
  attn_kv_close(a); /* an engine lends its device to one store at a time */
  const size_t bytes = (size_t)(2 * 300 * 37) * 2;
  for (int round = 0; round < 2; round++) {
    attn_kv_store *b = tkv_open_store(e, 64 * MIB, false, round ? "cpu" : NULL);
    cr_assert_str_eq(where(b), round ? "host" : "cuda");
    cr_assert_eq(attn_kv_import(b, "", "p", &info.shape, info.ttl_s, 0, len, (const void *const *)k,
                                (const void *const *)v, &st),
                 0, "%s", st.message);
    attn_kv_info i2;
    int64_t l2[1];
    void *k2[1], *v2[1];
    cr_assert_eq(attn_kv_export(b, "", "p", 0, &i2, l2, k2, v2, &st), 0, "%s", st.message);
    cr_expect(!memcmp(k[0], k2[0], bytes) && !memcmp(v[0], v2[0], bytes),
              "round %d: the imported session exports other rows", round);
    free(k2[0]), free(v2[0]);
    cr_assert_eq(tkv_call1(b, "", "p", &s, &tkv_plain, 300, 1, 300, 1, &y, 0, &st), 0, "%s",
                 st.message);
    cr_expect_leq(tkv_ref_error(&s, &tkv_plain, 300, 1, 301, &y), ttol(ATTN_BF16),
                  "round %d: the imported cache attends as the exported one", round);
    cr_expect_str_eq(y.backend, round ? "cpu" : "cuda");
    tkv_reply_free(&y);
    attn_kv_close(b);
  }
  free(k[0]), free(v[0]);
  tkv_stream_free(&s);
  attn_engine_close(e);
}

Test(sessions_gpu, a_lost_device_fails_the_calls, .init = reset) {
  attn_engine *e = topen_streams(2, 2);
  attn_kv_store *kv = tkv_open_store(e, 64 * MIB, false, NULL);
  tkv_stream s = tkv_stream_make(4, 2, 64, 40, ATTN_F32, 3);
  tkv_make(kv, "", "x", &s, 1, 64, 60, 0);
  tkv_reply y;
  attn_status st;
  cr_assert_eq(tkv_call1(kv, "", "x", &s, &tkv_plain, 0, 30, 0, 30, &y, 0, &st), 0, "%s",
               st.message);
  tkv_reply_free(&y);
  mock_knobs k = MOCK_KNOBS(1, 9, (size_t)8 << 30, 0, 0, 1); /* the next kernel faults */
  mock_set(&k);
  int rc = tkv_call1(kv, "", "x", &s, &tkv_plain, 30, 1, 30, 1, &y, 0, &st);
  cr_expect_eq(rc, ATTN_EDEVICE, "%s: %s", attn_err_name(rc), st.message);
  tkv_reply_free(&y);
  rc = tkv_call1(kv, "", "x", &s, &tkv_plain, 31, 1, 31, 1, &y, 0, &st);
  cr_expect(rc == ATTN_EDEVICE || rc == ATTN_ENODEV, "after: %s: %s", attn_err_name(rc),
            st.message);
  tkv_reply_free(&y);
  tkv_stream_free(&s);
  attn_kv_close(kv);
  attn_engine_close(e);
  cr_expect_eq(mock_device_bytes(), 0, "device memory left");
}

/* A session "h" of up to max_tokens prefilled with all of s in one call on
 * a store whose pages stay in host memory: the CPU computes it, within
 * tolerance of float64. Frees s. */
static void expect_host_prefill(attn_kv_store *kv, tkv_stream *s, int64_t max_tokens) {
  tkv_make(kv, "", "h", s, 1, max_tokens, 60, 0);
  tkv_reply y;
  attn_status st;
  const int64_t n = s->n;
  cr_assert_eq(tkv_call1(kv, "", "h", s, &tkv_plain, 0, n, 0, n, &y, 0, &st), 0, "%s", st.message);
  cr_expect_str_eq(y.backend, "cpu");
  cr_expect_leq(tkv_ref_error(s, &tkv_plain, 0, n, n, &y), ttol(s->dt));
  tkv_reply_free(&y);
  tkv_stream_free(s);
}

Test(sessions_gpu, a_store_the_device_cannot_hold_stays_in_host_memory, .init = reset) {
  mock_knobs k = MOCK_KNOBS(1, 9, 32 * MIB, 0, 0, 0);
  mock_set(&k);
  attn_engine *e = topen_streams(2, 2);
  attn_kv_store *kv = tkv_open_store(e, 256 * MIB, false, NULL);
  cr_expect_str_eq(where(kv), "host");
  tkv_stream s = tkv_stream_make(4, 2, 64, 20, ATTN_F16, 4);
  expect_host_prefill(kv, &s, 64);
  attn_kv_close(kv);
  attn_engine_close(e);
}

/* The paged_kv entry of the cuda backend's disabled list, or NULL. */
static const attn_disabled *paged_off(attn_engine *e, attn_backend_info *info) {
  int n = attn_engine_backends(e, info, 4);
  for (int i = 0; i < n; i++)
    for (int k = 0; !strcmp(info[i].name, "cuda") && k < info[i].ndisabled; k++)
      if (!strcmp(info[i].disabled[k].kernel, "paged_kv"))
        return &info[i].disabled[k];
  return NULL;
}

Test(sessions_gpu, paged_kernels_that_fail_their_self_check_keep_pages_on_the_host, .init = reset) {
  mock_knobs k = MOCK_KNOBS(1, 9, (size_t)8 << 30, 0, 0, 0);
  k.wrong_paged = true;
  mock_set(&k);
  attn_engine *e = topen_streams(2, 2);
  attn_backend_info info[4];
  const attn_disabled *d = paged_off(e, info);
  cr_assert(d, "the paged view is listed off");
  cr_expect(strstr(d->why, "error"), "why: %s", d->why);
  attn_kv_store *kv = tkv_open_store(e, 16 * MIB, false, NULL);
  cr_expect_str_eq(where(kv), "host");
  tkv_stream s = tkv_stream_make(2, 1, 64, 10, ATTN_BF16, 8);
  expect_host_prefill(kv, &s, 16);
  attn_kv_close(kv);
  attn_engine_close(e);
  /* with the self-check off the paged view is never tried */
  mock_defaults();
  attn_config cfg;
  attn_config_init(&cfg);
  cfg.cuda_self_check_off = true;
  e = topen_config(&cfg);
  d = paged_off(e, info);
  cr_expect(d && strstr(d->why, "self-check"), "%s", d ? d->why : "not listed");
  kv = tkv_open_store(e, 16 * MIB, false, NULL);
  cr_expect_str_eq(where(kv), "host");
  attn_kv_close(kv);
  attn_engine_close(e);
}

/* ---- a decode step's one round trip --------------------------------------- */

/* What a stretch of the mock's log holds: every host-device copy it logs
 * (cudaMemcpy* of any shape, on a stream or synchronous), memsets, kernel
 * launches, and attn_cu_put_rows' writes into the page pool at base. */
typedef struct trips {
  int up, down, sync, memsets, kernels, puts;
} trips;

static trips count_trips(const void *base) {
  static mock_op log[MOCK_LOG_MAX];
  int n = mock_log(log, MOCK_LOG_MAX);
  trips t = {0};
  for (int i = 0; i < n; i++) {
    t.up += log[i].kind == MOCK_UPLOAD;
    t.down += log[i].kind == MOCK_DOWNLOAD;
    t.sync += (log[i].kind == MOCK_UPLOAD || log[i].kind == MOCK_DOWNLOAD) && !log[i].stream;
    t.memsets += log[i].kind == MOCK_MEMSET;
    t.kernels += log[i].kind == MOCK_KERNEL;
    t.puts += log[i].kind == MOCK_OTHER && log[i].dst == base;
  }
  return t;
}

static void expect_one_trip(const trips *t, const char *what) {
  cr_expect_eq(t->up, 1, "%s: %d uploads", what, t->up);
  cr_expect_eq(t->down, 1, "%s: %d downloads", what, t->down);
  cr_expect_eq(t->sync, 0, "%s: %d synchronous copies", what, t->sync);
  cr_expect_eq(t->memsets, 0, "%s: %d memsets", what, t->memsets);
  cr_expect_eq(t->kernels, 1, "%s: %d attention launches", what, t->kernels);
  cr_expect_eq(t->puts, 1, "%s: the new rows put by %d launches", what, t->puts);
}

Test(sessions_gpu, a_decode_step_is_one_upload_and_one_download, .init = reset) {
  attn_engine *e = topen_streams(2, 2);
  attn_kv_store *kv = tkv_open_store(e, 64 * MIB, false, NULL);
  tkv_stream s = tkv_stream_make(8, 2, 64, 302, ATTN_BF16, 15);
  tkv_make(kv, "", "d", &s, 1, 512, 60, 0);
  tkv_reply y;
  attn_status st;
  cr_assert_eq(tkv_call1(kv, "", "d", &s, &tkv_plain, 0, 300, 0, 300, &y, 0, &st), 0, "%s",
               st.message);
  tkv_reply_free(&y);
  for (int64_t p = 300; p < 302; p++) {
    mock_log_reset();
    cr_assert_eq(tkv_call1(kv, "", "d", &s, &tkv_plain, p, 1, p, 1, &y, 0, &st), 0, "%s",
                 st.message);
    trips t = count_trips(kv->pages.base);
    expect_one_trip(&t, "a step");
    cr_expect_leq(tkv_ref_error(&s, &tkv_plain, p, 1, p + 1, &y), ttol(ATTN_BF16));
    tkv_reply_free(&y);
  }
  tkv_stream_free(&s);
  attn_kv_close(kv);
  attn_engine_close(e);
  cr_expect_eq(mock_device_bytes(), 0, "device memory left");
}

/* Tokens a page of session id holds. */
static int64_t page_tokens_of(attn_kv_store *kv, const char *id) {
  pthread_mutex_lock(&kv->mu);
  kv_session *ks = attn__kv_find(kv, "", id, 0);
  cr_assert(ks);
  int64_t pt = ks->page_tokens;
  pthread_mutex_unlock(&kv->mu);
  return pt;
}

Test(sessions_gpu, steps_read_the_rows_earlier_steps_put_across_a_page_boundary, .init = reset) {
  attn_engine *e = topen_streams(2, 2);
  attn_kv_store *kv = tkv_open_store(e, 64 * MIB, false, NULL);
  tkv_stream probe = tkv_stream_make(8, 2, 37, 1, ATTN_F16, 1);
  tkv_make(kv, "", "probe", &probe, 1, 16, 60, 0);
  const int64_t pt = page_tokens_of(kv, "probe");
  tkv_stream_free(&probe);
  /* GQA 4:1, D 37 (rows padded to 40): the prefill ends 3 short of a page */
  tkv_stream s = tkv_stream_make(8, 2, 37, pt + 6, ATTN_F16, 16);
  tkv_make(kv, "", "g", &s, 1, 2 * pt, 60, 0);
  cr_expect_eq(decode(kv, "g", &s, pt - 3, "GQA over a page boundary"), 0);
  cr_expect_eq(nonzero_padding(kv, "g"), 0, "the rows' padding stays zero");
  tkv_stream_free(&s);
  attn_kv_close(kv);
  attn_engine_close(e);
}

Test(sessions_gpu, batch_steps_of_three_sessions_read_each_others_put_rows, .init = reset) {
  attn_engine *e = topen_streams(2, 2);
  attn_kv_store *kv = tkv_open_store(e, 64 * MIB, false, NULL);
  static const char *const ids[3] = {"b0", "b1", "b2"};
  tkv_stream s[3];
  int64_t pos[3] = {0, 5, 0}, pt = 0;
  for (int i = 0; i < 3; i++) {
    s[i] = tkv_stream_make(4, 2, 64, 1, ATTN_F16, 1);
    tkv_make(kv, "", ids[i], &s[i], 1, 1024, 60, 0);
    tkv_stream_free(&s[i]);
    pt = page_tokens_of(kv, ids[i]);
  }
  pos[0] = pt - 2, pos[2] = pt - 1; /* two cross a page boundary on the way */
  for (int i = 0; i < 3; i++) {
    s[i] = tkv_stream_make(4, 2, 64, pos[i] + 4, ATTN_F16, 80 + (uint64_t)i);
    tkv_reply y;
    attn_status st;
    cr_assert_eq(tkv_call1(kv, "", ids[i], &s[i], &tkv_plain, 0, pos[i], 0, pos[i], &y, 0, &st), 0,
                 "%s", st.message);
    tkv_reply_free(&y);
  }
  void *o = calloc(4 * 3 * 64, 2);
  for (int step = 0; step < 4; step++) {
    attn_status st;
    mock_log_reset();
    cr_assert_eq(batch_step(kv, s, pos, o, &st), 0, "step %d: %s", step, st.message);
    trips t = count_trips(kv->pages.base);
    expect_one_trip(&t, "a batch step");
    for (int i = 0; i < 3; i++) {
      tkv_reply y = {.o = tkv_rows_of(o, 4, 3, 64, ATTN_F16, i, 1)};
      double err = tkv_ref_error(&s[i], &tkv_plain, pos[i], 1, pos[i] + 1, &y);
      cr_expect_leq(err, ttol(ATTN_F16), "step %d, entry %d: error %.3g", step, i, err);
      free(y.o);
      pos[i]++;
    }
  }
  for (int i = 0; i < 3; i++)
    tkv_stream_free(&s[i]);
  free(o);
  attn_kv_close(kv);
  attn_engine_close(e);
}

/* ---- calls that wait for a step's job ----------------------------------------- */

/* A one-token step of n sessions in one call (query and token pos[i] of
 * s[i] for session ids[i]) submitted, and its end. */
#define ASTEP_MAX 3
typedef struct astep {
  int n;
  attn_kv_entry en[ASTEP_MAX];
  int64_t cu[ASTEP_MAX + 1];
  attn_kv_call c;
  void *q, *k, *v, *o;
  attn_result res;
  bool done;
  pthread_mutex_t mu;
  pthread_cond_t cv;
} astep;

static void astep_done(const attn_result *res, void *arg) {
  astep *a = arg;
  pthread_mutex_lock(&a->mu);
  a->res = *res;
  a->done = true;
  pthread_cond_broadcast(&a->cv);
  pthread_mutex_unlock(&a->mu);
}

/* Row pos of every head of s's tensor t (q, k or v) into column i of a
 * [heads, n, D] buffer. */
static void put_col(char *dst, const tkv_stream *s, const void *t, int64_t heads, int64_t pos,
                    int i, int n) {
  const size_t w = (size_t)s->d * attn_dtype_size(s->dt);
  for (int64_t h = 0; h < heads; h++)
    memcpy(dst + (size_t)(h * n + i) * w, (const char *)t + (size_t)(h * s->n + pos) * w, w);
}

static void astep_submit_n(attn_kv_store *kv, astep *a, int n, const char *const *ids,
                           const tkv_stream *s, const int64_t *pos, float *lse) {
  memset(a, 0, sizeof *a);
  pthread_mutex_init(&a->mu, NULL);
  pthread_cond_init(&a->cv, NULL);
  const size_t w = (size_t)s[0].d * attn_dtype_size(s[0].dt);
  a->n = n;
  a->q = malloc((size_t)(s[0].hq * n) * w);
  a->k = malloc((size_t)(s[0].hkv * n) * w);
  a->v = malloc((size_t)(s[0].hkv * n) * w);
  a->o = calloc((size_t)(s[0].hq * n), w);
  for (int i = 0; i < n; i++) {
    a->en[i] = (attn_kv_entry){.id = ids[i], .pos = pos[i], .n_new = 1, .kv_off = i};
    a->cu[i + 1] = i + 1;
    put_col(a->q, &s[i], s[i].q, s[i].hq, pos[i], i, n);
    put_col(a->k, &s[i], s[i].k, s[i].hkv, pos[i], i, n);
    put_col(a->v, &s[i], s[i].v, s[i].hkv, pos[i], i, n);
  }
  a->c = (attn_kv_call){.tenant = "", .nentries = n, .entries = a->en};
  attn_request_init(&a->c.req);
  a->c.req.heads_q = s[0].hq, a->c.req.heads_kv = s[0].hkv, a->c.req.head_dim = s[0].d;
  a->c.req.seq_q = n, a->c.req.dtype = s[0].dt, a->c.req.causal = true;
  a->c.req.cu_seqlens_q = n > 1 ? a->cu : NULL;
  a->c.req.q = a->q, a->c.req.o = a->o, a->c.req.lse = lse;
  a->c.k_new = a->k, a->c.v_new = a->v, a->c.total_new = n;
  attn_status st;
  cr_assert_eq(attn_kv_submit(kv, &a->c, 0, astep_done, a, &st), 0, "%s", st.message);
}

static void astep_submit(attn_kv_store *kv, astep *a, const char *id, const tkv_stream *s,
                         int64_t pos) {
  astep_submit_n(kv, a, 1, &id, s, &pos, NULL);
}

/* Waits for a's end; the largest error of its entries against the
 * reference, entry i over pos[i] + 1 keys of s[i]. */
static double astep_end_n(astep *a, const tkv_stream *s) {
  pthread_mutex_lock(&a->mu);
  while (!a->done)
    pthread_cond_wait(&a->cv, &a->mu);
  pthread_mutex_unlock(&a->mu);
  cr_expect_eq(a->res.status.code, 0, "%s", a->res.status.message);
  double worst = 0;
  for (int i = 0; i < a->n; i++) {
    tkv_reply y = {.o = tkv_rows_of(a->o, s[i].hq, a->n, s[i].d, s[i].dt, i, 1)};
    double err = tkv_ref_error(&s[i], &tkv_plain, a->en[i].pos, 1, a->en[i].pos + 1, &y);
    worst = err > worst ? err : worst;
    free(y.o);
  }
  free(a->q);
  free(a->k);
  free(a->v);
  free(a->o);
  pthread_cond_destroy(&a->cv);
  pthread_mutex_destroy(&a->mu);
  return worst;
}

static double astep_end(astep *a, const tkv_stream *s) { return astep_end_n(a, s); }

static int64_t waiting(attn_kv_store *kv) {
  attn_kv_stats s;
  attn_kv_stats_get(kv, &s);
  return s.waiting;
}

/* A store of one session "w" prefilled with n - 3 tokens of s, and the
 * kernels held from here on. */
static attn_kv_store *held_store(attn_engine *e, const tkv_stream *s) {
  attn_kv_store *kv = tkv_open_store(e, 64 * MIB, false, NULL); /* no batching */
  tkv_make(kv, "", "w", s, 1, 256, 60, 0);
  tkv_reply y;
  attn_status st;
  cr_assert_eq(tkv_call1(kv, "", "w", s, &tkv_plain, 0, s->n - 3, 0, s->n - 3, &y, 0, &st), 0, "%s",
               st.message);
  tkv_reply_free(&y);
  mock_knobs k = MOCK_KNOBS(1, 9, (size_t)8 << 30, 0, 0, 0);
  k.hold_kernels = true;
  mock_set(&k);
  return kv;
}

Test(sessions_gpu, without_batching_a_step_waits_for_the_job_that_puts_its_keys, .init = reset,
     .timeout = 60) {
  attn_engine *e = topen_streams(2, 2);
  tkv_stream s = tkv_stream_make(4, 2, 64, 103, ATTN_BF16, 21);
  attn_kv_store *kv = held_store(e, &s);
  astep a, b;
  astep_submit(kv, &a, "w", &s, 100); /* its job holds at the gate, row 100 not yet put */
  astep_submit(kv, &b, "w", &s, 101); /* reads row 100: waits for a's job */
  cr_expect_eq(waiting(kv), 1, "the second step waits in the store");
  mock_open_gate();
  cr_expect_leq(astep_end(&a, &s), ttol(ATTN_BF16), "the first step");
  cr_expect_leq(astep_end(&b, &s), ttol(ATTN_BF16), "the second step reads the first's row");
  cr_expect_eq(waiting(kv), 0);
  attn_kv_close(kv);
  attn_engine_close(e);
  tkv_stream_free(&s);
  cr_expect_eq(mock_device_bytes(), 0, "device memory left");
}

Test(sessions_gpu, a_replay_of_a_step_whose_job_runs_waits_and_is_a_replay, .init = reset,
     .timeout = 60) {
  attn_engine *e = topen_streams(2, 2);
  tkv_stream s = tkv_stream_make(4, 2, 64, 103, ATTN_F16, 22);
  attn_kv_store *kv = held_store(e, &s);
  astep a, r;
  astep_submit(kv, &a, "w", &s, 100);
  astep_submit(kv, &r, "w", &s, 100); /* the same step again, its rows not yet put */
  cr_expect_eq(waiting(kv), 1, "the replay's check waits for the step's job");
  mock_open_gate();
  cr_expect_leq(astep_end(&a, &s), ttol(ATTN_F16));
  cr_expect_leq(astep_end(&r, &s), ttol(ATTN_F16));
  cr_expect(r.en[0].replay, "recognized as a replay");
  cr_expect_eq(r.en[0].length, 101);
  /* and after the job ended: a replay, then a different token at 100 a conflict */
  tkv_reply y;
  attn_status st;
  int rc = tkv_call1(kv, "", "w", &s, &tkv_plain, 100, 1, 100, 1, &y, 0, &st);
  cr_expect_eq(rc, 0, "%s: %s", attn_err_name(rc), st.message);
  cr_expect(y.replay && y.length == 101);
  tkv_reply_free(&y);
  rc = tkv_call1(kv, "", "w", &s, &tkv_plain, 101, 1, 101, 1, &y, 0, &st);
  cr_expect_eq(rc, 0, "%s: %s", attn_err_name(rc), st.message);
  tkv_reply_free(&y);
  tkv_stream other = tkv_stream_make(4, 2, 64, 103, ATTN_F16, 99); /* another token at 100 */
  rc = tkv_call1(kv, "", "w", &other, &tkv_plain, 100, 1, 100, 1, &y, 0, &st);
  cr_expect_eq(rc, ATTN_ESESSION_CONFLICT, "%s: %s", attn_err_name(rc), st.message);
  tkv_reply_free(&y);
  tkv_stream_free(&other);
  attn_kv_close(kv);
  attn_engine_close(e);
  tkv_stream_free(&s);
}

/* A source whose step's job still holds its rows is not forked (its last
 * row is not on the device yet): a conflict, nothing made; once the job
 * has ended the fork is made and reads that row. */
Test(sessions_gpu, a_source_with_a_job_running_is_forked_once_it_ends, .init = reset,
     .timeout = 60) {
  attn_engine *e = topen_streams(2, 2);
  tkv_stream s = tkv_stream_make(4, 2, 64, 103, ATTN_BF16, 23);
  attn_kv_store *kv = held_store(e, &s);
  astep a;
  astep_submit(kv, &a, "w", &s, 100); /* its job holds at the gate, row 100 not yet put */
  attn_status st;
  cr_expect_eq(attn_kv_fork(kv, "", "w", "f", -1, 0, 0, &st), ATTN_ESESSION_CONFLICT, "%s",
               st.message);
  cr_expect(strstr(st.message, "fork it once they have ended"), "%s", st.message);
  attn_kv_info info;
  cr_expect_eq(attn_kv_get(kv, "", "f", 0, &info, NULL, 0, &st), ATTN_ESESSION_NOT_FOUND);
  mock_open_gate();
  cr_expect_leq(astep_end(&a, &s), ttol(ATTN_BF16));
  mock_defaults();
  cr_assert_eq(attn_kv_fork(kv, "", "w", "f", -1, 0, 0, &st), 0, "%s", st.message);
  tkv_step_ok(kv, "f", &s, 101, 1); /* over rows [0, 102), row 100 the held job's */
  tkv_step_ok(kv, "w", &s, 101, 1);
  attn_kv_close(kv);
  attn_engine_close(e);
  tkv_stream_free(&s);
  cr_expect_eq(mock_device_bytes(), 0, "device memory left");
}

/* A page copy that fails part way (the third of a slot's four) refuses the
 * append that needed it, nothing written and the slot still shared; the
 * next append copies it whole, and neither side reads the other's rows. */
Test(sessions_gpu, a_failed_page_copy_refuses_the_append, .init = reset) {
  attn_engine *e = topen_streams(2, 2);
  attn_kv_store *kv = tkv_open_store(e, 64 * MIB, false, NULL);
  tkv_stream src = tkv_stream_make(4, 2, 64, 200, ATTN_F32, 31);
  tkv_stream other = tkv_stream_make(4, 2, 64, 200, ATTN_F32, 32);
  tkv_stream mine = tkv_stream_splice(&src, &other, 100);
  tkv_make(kv, "", "s", &src, 1, 200, 60, 0);
  tkv_step_ok(kv, "s", &src, 0, 100);
  attn_status st;
  cr_assert_eq(attn_kv_fork(kv, "", "s", "f", -1, 0, 0, &st), 0, "%s", st.message);
  mock_knobs k = MOCK_KNOBS(1, 9, (size_t)8 << 30, 0, 0, 0);
  k.fail_within = 3;
  mock_set(&k);
  tkv_reply y;
  int rc = tkv_call1(kv, "", "f", &mine, &tkv_plain, 100, 1, 100, 1, &y, 0, &st);
  cr_expect_eq(rc, ATTN_EDEVICE, "%s: %s", attn_err_name(rc), st.message);
  tkv_reply_free(&y);
  attn_kv_info info;
  cr_assert_eq(attn_kv_get(kv, "", "f", 0, &info, NULL, 0, &st), 0, "%s", st.message);
  cr_expect(info.tokens == 100 && info.shared_bytes > 0, "nothing appended, still shared");
  tkv_step_ok(kv, "f", &mine, 100, 2);
  tkv_step_ok(kv, "s", &src, 100, 2);
  tkv_step_ok(kv, "f", &mine, 102, 1);
  attn_kv_close(kv);
  attn_engine_close(e);
  tkv_stream_free(&src);
  tkv_stream_free(&other);
  tkv_stream_free(&mine);
  cr_expect_eq(mock_device_bytes(), 0, "device memory left");
}

Test(sessions_gpu, a_step_whose_job_fails_before_it_runs_still_stores_its_rows, .init = reset) {
  attn_engine *e = topen_streams(2, 2);
  attn_kv_store *kv = tkv_open_store(e, 64 * MIB, false, NULL);
  tkv_stream s = tkv_stream_make(4, 2, 64, 42, ATTN_F16, 23);
  tkv_make(kv, "", "f", &s, 1, 64, 60, 0);
  tkv_reply y;
  attn_status st;
  cr_assert_eq(tkv_call1(kv, "", "f", &s, &tkv_plain, 0, 40, 0, 40, &y, 0, &st), 0, "%s",
               st.message);
  tkv_reply_free(&y);
  mock_knobs k = MOCK_KNOBS(1, 9, (size_t)8 << 30, 1, 0, 0); /* the job's memory: refused */
  mock_set(&k);
  int rc = tkv_call1(kv, "", "f", &s, &tkv_plain, 40, 1, 40, 1, &y, 0, &st);
  cr_expect_eq(rc, ATTN_ENOMEM, "%s: %s", attn_err_name(rc), st.message);
  tkv_reply_free(&y);
  /* token 40 was published: the store wrote it the synchronous way */
  cr_assert_eq(tkv_call1(kv, "", "f", &s, &tkv_plain, 41, 1, 41, 1, &y, 0, &st), 0, "%s",
               st.message);
  cr_expect_leq(tkv_ref_error(&s, &tkv_plain, 41, 1, 42, &y), ttol(ATTN_F16));
  tkv_reply_free(&y);
  tkv_stream_free(&s);
  attn_kv_close(kv);
  attn_engine_close(e);
  cr_expect_eq(mock_device_bytes(), 0, "device memory left");
}

Test(sessions_gpu, a_step_waits_behind_a_waiting_call_that_appends_to_its_layer, .init = reset,
     .timeout = 60) {
  /* a (on x) holds; b (x and y) waits for a's job on x; c (on y alone)
   * reads the row b appends to y, which only b's job puts: c waits too */
  attn_engine *e = topen_streams(2, 2);
  tkv_stream s[2] = {tkv_stream_make(4, 2, 64, 103, ATTN_F16, 31),
                     tkv_stream_make(4, 2, 64, 103, ATTN_F16, 32)};
  attn_kv_store *kv = tkv_open_store(e, 64 * MIB, false, NULL);
  static const char *const ids[2] = {"x", "y"};
  for (int i = 0; i < 2; i++) {
    tkv_make(kv, "", ids[i], &s[i], 1, 256, 60, 0);
    tkv_reply y;
    attn_status st;
    cr_assert_eq(tkv_call1(kv, "", ids[i], &s[i], &tkv_plain, 0, 100, 0, 100, &y, 0, &st), 0, "%s",
                 st.message);
    tkv_reply_free(&y);
  }
  mock_knobs k = MOCK_KNOBS(1, 9, (size_t)8 << 30, 0, 0, 0);
  k.hold_kernels = true;
  mock_set(&k);
  astep a, b, c;
  const int64_t pa = 100, pb[2] = {101, 100}, pc = 101;
  astep_submit(kv, &a, "x", &s[0], pa);
  astep_submit_n(kv, &b, 2, ids, s, pb, NULL);
  astep_submit(kv, &c, "y", &s[1], pc);
  cr_expect_eq(waiting(kv), 2, "b waits for a, c for b");
  mock_open_gate();
  cr_expect_leq(astep_end(&a, &s[0]), ttol(ATTN_F16), "a");
  cr_expect_leq(astep_end_n(&b, s), ttol(ATTN_F16), "b");
  cr_expect_leq(astep_end(&c, &s[1]), ttol(ATTN_F16), "c reads the row b put");
  attn_kv_close(kv);
  attn_engine_close(e);
  for (int i = 0; i < 2; i++)
    tkv_stream_free(&s[i]);
}

Test(sessions_gpu, a_batch_the_engine_splits_stores_its_rows_before_it_runs, .init = reset) {
  /* statistics asked: the batch is a variable-length one, one job per
   * session, which carries no rows: the store writes them first */
  attn_engine *e = topen_streams(2, 2);
  attn_kv_store *kv = tkv_open_store(e, 64 * MIB, true, NULL);
  static const char *const ids[2] = {"u", "v"};
  tkv_stream s[2] = {tkv_stream_make(4, 2, 64, 60, ATTN_BF16, 33),
                     tkv_stream_make(4, 2, 64, 60, ATTN_BF16, 34)};
  for (int i = 0; i < 2; i++) {
    tkv_make(kv, "", ids[i], &s[i], 1, 64, 60, 0);
    tkv_reply y;
    attn_status st;
    cr_assert_eq(tkv_call1(kv, "", ids[i], &s[i], &tkv_plain, 0, 50, 0, 50, &y, 0, &st), 0, "%s",
                 st.message);
    tkv_reply_free(&y);
  }
  for (int64_t p = 50; p < 53; p++) {
    astep a;
    const int64_t pos[2] = {p, p};
    float lse[4 * 2];
    mock_log_reset();
    astep_submit_n(kv, &a, 2, ids, s, pos, lse);
    cr_expect_leq(astep_end_n(&a, s), ttol(ATTN_BF16), "step at %lld", (long long)p);
    trips t = count_trips(kv->pages.base);
    cr_expect_eq(t.sync, 2 * 2 * 2, "K and V of each KV head of each session, copied");
    cr_expect_eq(t.puts, 0, "no rows carried");
    cr_expect_eq(t.kernels, 2, "one job per session");
  }
  attn_kv_close(kv);
  attn_engine_close(e);
  for (int i = 0; i < 2; i++)
    tkv_stream_free(&s[i]);
}

/* Values of a head dim of their own, and latent sessions (k alone, v its
 * first Dv columns), on the device: their pages' rows max(D, Dv) wide and
 * padded with zeros past each tensor's width, their rows written before
 * their job (page_rows take one width), prefill and decode against
 * float64, a batch call of sessions against it, saved and loaded back
 * into host memory; a shape whose head dim the kernels cannot take is
 * refused at create, never at its first call. */
Test(sessions_gpu, value_head_dims_and_latent_sessions, .init = reset) {
  static const struct {
    int64_t d, dv;
    bool latent;
  } kinds[] = {{96, 64, true}, {37, 21, true}, {64, 96, false}, {37, 21, false}};
  attn_engine *e = topen_streams(2, 2);
  attn_kv_store *kv = tkv_open_store(e, 64 * MIB, true, NULL);
  cr_assert_str_eq(where(kv), "cuda");
  int fails = 0;
  for (int k = 0; k < 4; k++)
    for (int t = 0; t < 2; t++) {
      const attn_dtype dt = t ? ATTN_BF16 : ATTN_F16;
      char id[32], what[80];
      snprintf(id, sizeof id, "s%d-%d", k, t);
      snprintf(what, sizeof what, "D %lld Dv %lld%s %s", (long long)kinds[k].d,
               (long long)kinds[k].dv, kinds[k].latent ? " latent" : "", attn_dtype_name(dt));
      tkv_stream s = tkv_stream_make_dv(4, 2, kinds[k].d, kinds[k].dv, kinds[k].latent, 150, dt,
                                        90 + (uint64_t)(2 * k + t));
      tkv_make(kv, "", id, &s, 1, 200, 60, 0);
      fails += decode(kv, id, &s, 100, what);
      cr_expect_eq(nonzero_padding(kv, id), 0, "%s: the rows' padding stays zero", what);
      tkv_stream_free(&s);
    }
  cr_expect_eq(fails, 0, "%d steps off the reference", fails);
  attn_status st;
  bool created;
  const attn_kv_shape wide = {.heads_kv = 1,
                              .head_dim = 64,
                              .head_dim_v = 320, /* past the kernels' 256 */
                              .dtype = ATTN_F16,
                              .layers = 1,
                              .max_tokens = 64};
  cr_expect_eq(attn_kv_create(kv, "", "wide", &wide, 60, 0, &created, &st), ATTN_EUNSUPPORTED);
  cr_expect(strstr(st.message, "cuda"), "%s", st.message);
  attn_kv_close(kv);
  attn_engine_close(e);
}

Test(sessions_gpu, a_batch_of_latent_sessions_and_its_file, .init = reset) {
  char dir[] = "/tmp/attn-gpu-kvdv-XXXXXX";
  cr_assert(mkdtemp(dir));
  attn_engine *e = topen_streams(2, 2);
  attn_kv_store *kv = tkv_open_store(e, 64 * MIB, false, NULL);
  const int64_t pre[3] = {1, 300, 129};
  tkv_stream s[3];
  tkv_batch bt = {.ids = {"l0", "l1", "l2"}};
  attn_status st;
  tkv_reply y;
  for (int i = 0; i < 3; i++) {
    s[i] = tkv_stream_make_dv(4, 2, 96, 64, true, pre[i] + 2, ATTN_BF16, 30 + (uint64_t)i);
    tkv_make(kv, "", bt.ids[i], &s[i], 1, 512, 600, 0);
    cr_assert_eq(tkv_call1(kv, "", bt.ids[i], &s[i], &tkv_plain, 0, pre[i], 0, pre[i], &y, 0, &st),
                 0, "%s", st.message);
    tkv_reply_free(&y);
    bt.s[i] = &s[i];
    bt.pos[i] = pre[i];
    bt.nq[i] = bt.nn[i] = 1;
  }
  void *o;
  cr_assert_eq(tkv_call_batch(kv, &bt, 3, &o, 0, &st), 0, "%s", st.message);
  for (int i = 0; i < 3; i++) {
    tkv_reply r = {.o = tkv_rows_of(o, 4, 3, 64, ATTN_BF16, i, 1)};
    double err = tkv_ref_error(&s[i], &tkv_plain, pre[i], 1, pre[i] + 1, &r);
    cr_expect_leq(err, ttol(ATTN_BF16), "entry %d: error %.3g", i, err);
    free(r.o);
  }
  free(o);
  cr_assert_eq(attn_kv_save(kv, dir, 0, &st), 3, "%s", st.message);
  attn_kv_close(kv);
  kv = tkv_open_store(e, 64 * MIB, false, "cpu");
  cr_assert_eq(attn_kv_load(kv, dir, 0, 1e9, NULL, NULL, &st), 3, "%s", st.message);
  for (int i = 0; i < 3; i++) {
    const int64_t p = pre[i] + 1;
    cr_assert_eq(tkv_call1(kv, "", bt.ids[i], &s[i], &tkv_plain, p, 1, p, 1, &y, 0, &st), 0, "%s",
                 st.message);
    cr_expect_leq(tkv_ref_error(&s[i], &tkv_plain, p, 1, p + 1, &y), ttol(ATTN_BF16),
                  "entry %d: the loaded cache attends as the saved one", i);
    tkv_reply_free(&y);
    tkv_stream_free(&s[i]);
  }
  attn_kv_close(kv);
  attn_engine_close(e);
  rmdir(dir);
}

/* A grow session on device pages takes them as its tokens arrive, as on
 * the host: past what a whole session left it is refused with nothing
 * appended, and goes on once that session is deleted; every step computed
 * on the GPU and checked against float64. */
Test(sessions_gpu, a_grow_session_takes_device_pages_as_tokens_arrive, .init = reset) {
  attn_engine *e = topen_streams(2, 2);
  tkv_stream probe = tkv_stream_make(2, 1, 64, 1, ATTN_F32, 1);
  attn_kv_store *kv = tkv_open_store(e, 8 * ATTN_KV_PAGE_BYTES, false, NULL);
  cr_assert_str_eq(where(kv), "cuda");
  tkv_make(kv, "", "probe", &probe, 1, 1, 60, 0);
  const int64_t pt = page_tokens_of(kv, "probe");
  attn_status st;
  cr_assert_eq(attn_kv_delete(kv, "", "probe", 0, &st), 0);
  tkv_stream g = tkv_stream_make(2, 1, 64, 3 * pt + 1, ATTN_F32, 21);
  attn_kv_shape sh = {.heads_kv = 1,
                      .head_dim = 64,
                      .dtype = ATTN_F32,
                      .layers = 1,
                      .max_tokens = 8 * pt,
                      .grow = true};
  bool created;
  cr_assert_eq(attn_kv_create(kv, "", "g", &sh, 60, 0, &created, &st), 0, "%s", st.message);
  tkv_make(kv, "", "w", &probe, 1, pt, 60, 0); /* 2 of the 8 pages */
  cr_expect_lt(tkv_step_error(kv, "g", &g, &tkv_plain, 0, pt + 3, &st), ttol(ATTN_F32));
  cr_expect_lt(tkv_step_error(kv, "g", &g, &tkv_plain, pt + 3, 2 * pt - 3, &st), ttol(ATTN_F32));
  tkv_reply y;
  cr_expect_eq(tkv_call1(kv, "", "g", &g, &tkv_plain, 3 * pt, 1, 3 * pt, 1, &y, 0, &st),
               ATTN_ESESSION_MEMORY);
  tkv_reply_free(&y);
  attn_kv_info info;
  cr_assert_eq(attn_kv_get(kv, "", "g", 0, &info, NULL, 0, &st), 0);
  cr_expect_eq(info.tokens, 3 * pt, "the refused append stored tokens");
  cr_assert_eq(attn_kv_delete(kv, "", "w", 0, &st), 0);
  cr_expect_lt(tkv_step_error(kv, "g", &g, &tkv_plain, 3 * pt, 1, &st), ttol(ATTN_F32), "%s",
               st.message);
  tkv_stream_free(&g);
  tkv_stream_free(&probe);
  attn_kv_close(kv);
  attn_engine_close(e);
}
