/*
 * test_kv_move.c — a session moved between stores (attn_kv_export,
 * attn_kv_import): every kind of session (Dv = D, Dv != D, latent) in F32
 * and BF16, with layers of different lengths, exported from one store and
 * imported into another; the import's next calls equal the original's bit
 * for bit and the float64 reference, and its export equals the first byte
 * for byte. Then the imports refused: bad rows, bad lengths, the wrong
 * tensors, a name taken, no memory. The same rows across stores of 64, 16
 * and 32 KiB pages. And an export read out as it goes:
 * in pieces of any size, the session's own tokens, its rows held through
 * a delete and a truncate until it closes. And an import's copy, made
 * without the store's lock: calls on other sessions go on, a call on the
 * session being made waits for it.
 */
#include "helpers.h"
#include "check.h"
#include "kv/file.h"
#include "kvcalls.h"

#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MIB ((uint64_t)1 << 20)
#define LAYERS 3

typedef struct kind {
  int64_t d, dv;
  bool latent;
} kind;

static const kind kinds[] = {{64, 64, false}, {96, 64, false}, {64, 96, false}, {96, 64, true}};
enum { NKINDS = sizeof kinds / sizeof *kinds };

/* Layer l's length: one empty, one past a page of rows, one short. */
static const int64_t lengths_of[LAYERS] = {37, 0, 300};

/* An exported session: its info, lengths and rows. */
typedef struct moved {
  attn_kv_info info;
  int64_t len[ATTN_KV_MAX_LAYERS];
  void *k[LAYERS], *v[LAYERS];
} moved;

static void moved_free(moved *m) {
  for (int l = 0; l < LAYERS; l++) {
    free(m->k[l]);
    free(m->v[l]);
  }
}

static size_t tensor_bytes(const attn_kv_shape *sh, int64_t len, int t) {
  return (size_t)(sh->heads_kv * len * (t ? sh->head_dim_v : sh->head_dim)) *
         attn_dtype_size(sh->dtype);
}

/* The session id of s on a, its layers filled to lengths_of. */
static void fill(attn_kv_store *a, const char *id, const tkv_stream *s) {
  tkv_make(a, "", id, s, LAYERS, 512, 600, 0);
  for (int l = 0; l < LAYERS; l++) {
    tkv_opts op = tkv_plain;
    op.layer = l;
    tkv_reply y;
    attn_status st;
    if (lengths_of[l] == 0)
      continue;
    cr_assert_eq(tkv_call1(a, "", id, s, &op, 0, lengths_of[l], 0, lengths_of[l], &y, 0, &st), 0,
                 "%s", st.message);
    tkv_reply_free(&y);
  }
}

static void export_ok(attn_kv_store *kv, const char *tenant, const char *id, moved *m) {
  attn_status st;
  memset(m, 0, sizeof *m);
  cr_assert_eq(attn_kv_export(kv, tenant, id, 1, &m->info, m->len, m->k, m->v, &st), 0, "%s",
               st.message);
}

static int import(attn_kv_store *kv, const char *tenant, const char *id, const moved *m,
                  const void *const *v, attn_status *st) {
  return attn_kv_import(kv, tenant, id, &m->info.shape, m->info.ttl_s, 1, m->len,
                        (const void *const *)m->k, v, st);
}

static const void *const *vs_of(const moved *m) {
  return m->info.shape.v_from_k ? NULL : (const void *const *)m->v;
}

/* The next step of layer 2 on both stores: equal bit for bit, and right. */
static void next_steps_equal(attn_kv_store *a, attn_kv_store *b, const tkv_stream *s,
                             const char *id) {
  tkv_opts op = tkv_plain;
  op.layer = 2;
  tkv_reply ya, yb;
  attn_status st;
  const int64_t p = lengths_of[2];
  cr_assert_eq(tkv_call1(a, "", id, s, &op, p, 1, p, 1, &ya, 2, &st), 0, "%s", st.message);
  cr_assert_eq(tkv_call1(b, "t2", id, s, &op, p, 1, p, 1, &yb, 2, &st), 0, "%s", st.message);
  size_t ob = (size_t)(s->hq * s->dv) * attn_dtype_size(s->dt);
  cr_expect(!memcmp(ya.o, yb.o, ob), "%s: the imported session computes other bits", id);
  double err = tkv_ref_error(s, &op, p, 1, p + 1, &yb);
  cr_expect(err <= ttol(s->dt), "%s: error %g against float64", id, err);
  tkv_reply_free(&ya);
  tkv_reply_free(&yb);
}

/* Bytes the export of s at lengths_of reads out: layer by layer, k then v. */
static size_t export_size(const tkv_stream *s, const int64_t *len) {
  size_t n = 0;
  for (int l = 0; l < LAYERS; l++)
    n += (size_t)(s->hkv * len[l] * (s->d + (s->latent ? 0 : s->dv))) * attn_dtype_size(s->dt);
  return n;
}

/* The rows read out (all) are s's own tokens [0, len[l]) of each layer,
 * every head's packed, k then v (none for a latent session). */
static void rows_are_the_streams(const tkv_stream *s, const int64_t *len, const char *all,
                                 const char *what) {
  for (int l = 0; l < LAYERS; l++)
    for (int t = 0; t < (s->latent ? 1 : 2); t++) {
      const int64_t w = t ? s->dv : s->d;
      char *want = tkv_rows_of(t ? s->v : s->k, s->hkv, s->n, w, s->dt, 0, len[l]);
      const size_t n = (size_t)(s->hkv * len[l] * w) * attn_dtype_size(s->dt);
      cr_expect(!memcmp(all, want, n), "%s: layer %d's %c differs from the tokens sent", what, l,
                t ? 'v' : 'k');
      all += n;
      free(want);
    }
}

/* An export of session (tenant, id) on a opened, its lengths into len. */
static attn_kv_exporter *exporting(attn_kv_store *a, const char *tenant, const char *id,
                                   int64_t *len) {
  attn_kv_exporter *x;
  attn_kv_info info;
  attn_status st;
  cr_assert_eq(attn_kv_export_open(a, tenant, id, 1, &info, len, &x, &st), 0, "%s", st.message);
  return x;
}

/* x read out whole in pieces: s's tokens at len; closed. */
static void read_out(attn_kv_exporter *x, const tkv_stream *s, const int64_t *len,
                     const char *what) {
  char why[256];
  char *all = tkv_export_all(x, export_size(s, len), why, sizeof why);
  cr_assert(all, "%s: %s", what, why);
  rows_are_the_streams(s, len, all, what);
  attn_kv_export_close(x);
  free(all);
}

Test(kv_move, round_trip_every_kind, .timeout = 300) {
  attn_engine *e = topen(2, NULL);
  attn_kv_store *a = tkv_open_store(e, 64 * MIB, true, NULL),
                *b = tkv_open_store(e, 64 * MIB, true, NULL);
  const attn_dtype dts[] = {ATTN_F32, ATTN_BF16};
  for (int di = 0; di < 2; di++)
    for (int k = 0; k < NKINDS; k++) {
      char id[16];
      snprintf(id, sizeof id, "s%d-%d", di, k);
      tkv_stream s = tkv_stream_make_dv(4, 2, kinds[k].d, kinds[k].dv, kinds[k].latent, 301,
                                        dts[di], 90 + (uint64_t)k);
      fill(a, id, &s);
      moved m, m2;
      attn_status st;
      export_ok(a, "", id, &m);
      for (int l = 0; l < LAYERS; l++)
        cr_expect_eq(m.len[l], lengths_of[l]);
      cr_expect(kinds[k].latent ? !m.v[0] : m.v[0] != NULL);
      cr_assert_eq(import(b, "t2", id, &m, vs_of(&m), &st), 0, "%s", st.message);
      export_ok(b, "t2", id, &m2);
      cr_expect_eq(m2.info.reserved_bytes, m.info.reserved_bytes);
      cr_expect(!memcmp(&m2.info.shape, &m.info.shape, sizeof m.info.shape));
      for (int l = 0; l < LAYERS; l++) {
        cr_expect_eq(m2.len[l], m.len[l]);
        for (int t = 0; t < attn__kv_tensors(&m.info.shape); t++)
          cr_expect(!memcmp(t ? m2.v[l] : m2.k[l], t ? m.v[l] : m.k[l],
                            tensor_bytes(&m.info.shape, m.len[l], t)),
                    "%s: layer %d's %c exported again differs", id, l, t ? 'v' : 'k');
      }
      int64_t len[ATTN_KV_MAX_LAYERS]; /* the import read out as it goes, in pieces */
      attn_kv_exporter *x = exporting(b, "t2", id, len);
      for (int l = 0; l < LAYERS; l++)
        cr_expect_eq(len[l], lengths_of[l]);
      read_out(x, &s, len, id);
      next_steps_equal(a, b, &s, id);
      moved_free(&m);
      moved_free(&m2);
      tkv_stream_free(&s);
    }
  attn_kv_close(a);
  attn_kv_close(b);
  attn_engine_close(e);
}

/* An import refused with code, the store left without the session. */
static void refused(attn_kv_store *kv, const char *id, const moved *m, const void *const *v,
                    int code, const char *what) {
  attn_status st;
  attn_kv_info info;
  cr_expect_eq(import(kv, "t2", id, m, v, &st), code, "%s: %s", what, st.message);
  if (code != ATTN_ESESSION_EXISTS)
    cr_expect_neq(attn_kv_get(kv, "t2", id, 1, &info, NULL, 0, &st), 0, "%s: left a session", what);
}

Test(kv_move, imports_refused) {
  attn_engine *e = topen(2, NULL);
  attn_kv_store *a = tkv_open_store(e, 64 * MIB, true, NULL),
                *b = tkv_open_store(e, 64 * MIB, true, NULL),
                *tiny = tkv_open_store(e, 1 * MIB, true, NULL);
  tkv_stream s = tkv_stream_make_dv(4, 2, 64, 64, false, 301, ATTN_F32, 5);
  tkv_stream sl = tkv_stream_make_dv(4, 2, 96, 64, true, 301, ATTN_F32, 6);
  fill(a, "x", &s);
  fill(a, "lat", &sl);
  moved m, ml;
  attn_status st;
  export_ok(a, "", "x", &m);
  export_ok(a, "", "lat", &ml);
  const void *const *v = (const void *const *)m.v;

  ((float *)m.k[2])[7] = NAN;
  refused(b, "x", &m, v, ATTN_ENONFINITE, "a NaN in k");
  ((float *)m.k[2])[7] = 0;
  ((float *)m.v[0])[3] = INFINITY;
  refused(b, "x", &m, v, ATTN_ENONFINITE, "an Inf in v");
  ((float *)m.v[0])[3] = 0;
  m.len[0] = m.info.shape.max_tokens + 1;
  refused(b, "x", &m, v, ATTN_EINVAL, "a length past max_tokens");
  m.len[0] = lengths_of[0];
  refused(b, "x", &m, NULL, ATTN_EINVAL, "no v");
  refused(b, "lat", &ml, (const void *const *)m.v, ATTN_EINVAL, "v for a latent session");
  m.info.shape.head_dim = 0;
  refused(b, "x", &m, v, ATTN_EINVAL, "a head_dim of 0");
  m.info.shape.head_dim = 64;
  refused(tiny, "x", &m, v, ATTN_ESESSION_MEMORY, "too big for the store");
  cr_assert_eq(import(b, "t2", "x", &m, v, &st), 0, "%s", st.message);
  refused(b, "x", &m, v, ATTN_ESESSION_EXISTS, "taken");
  /* another tenant's is not found */
  moved none;
  cr_expect_eq(attn_kv_export(b, "", "x", 1, &none.info, none.len, none.k, none.v, &st),
               ATTN_ESESSION_NOT_FOUND);
  moved_free(&m);
  moved_free(&ml);
  tkv_stream_free(&s);
  tkv_stream_free(&sl);
  attn_kv_close(a);
  attn_kv_close(b);
  attn_kv_close(tiny);
  attn_engine_close(e);
}

/* A grow session moves as one: it takes the pages its tokens fill, not
 * max_tokens' (D 64 F32: 256 rows a page, so layers of 37, 0 and 300
 * tokens take 1, 0 and 2 pages per KV head and tensor), computes as the
 * original, exports the same file, and is refused by a pool that cannot
 * hold its tokens with nothing left behind. */
Test(kv_move, a_grow_session_takes_the_pages_of_its_tokens, .timeout = 300) {
  attn_engine *e = topen(2, NULL);
  attn_kv_store *a = tkv_open_store(e, 64 * MIB, true, NULL),
                *b = tkv_open_store(e, 64 * MIB, true, NULL),
                *small = tkv_open_store(e, 11 * ((uint64_t)64 << 10), true, NULL);
  tkv_stream s = tkv_stream_make_dv(4, 2, 64, 64, false, 301, ATTN_F32, 7);
  fill(a, "g", &s);
  moved m, m2;
  attn_status st;
  export_ok(a, "", "g", &m);
  m.info.shape.grow = true;
  cr_assert_eq(import(b, "t2", "g", &m, vs_of(&m), &st), 0, "%s", st.message);
  export_ok(b, "t2", "g", &m2);
  cr_expect(m2.info.shape.grow, "the import is not a grow session");
  cr_expect_eq(m2.info.reserved_bytes, (uint64_t)(1 + 0 + 2) * 2 * 2 * (64 << 10),
               "a grow import reserves %llu bytes", (unsigned long long)m2.info.reserved_bytes);
  for (int l = 0; l < LAYERS; l++)
    for (int t = 0; t < 2; t++)
      cr_expect(!memcmp(t ? m2.v[l] : m2.k[l], t ? m.v[l] : m.k[l],
                        tensor_bytes(&m.info.shape, m.len[l], t)),
                "layer %d's %c exported again differs", l, t ? 'v' : 'k');
  next_steps_equal(a, b, &s, "g");
  /* 12 pages of tokens, 11 in the pool */
  attn_kv_info info;
  cr_expect_eq(import(small, "t2", "g", &m, vs_of(&m), &st), ATTN_ESESSION_MEMORY, "%s",
               st.message);
  cr_expect(strstr(st.message, "reserve grow"), "%s", st.message);
  cr_expect_neq(attn_kv_get(small, "t2", "g", 1, &info, NULL, 0, &st), 0, "left a session");
  attn_kv_stats ks;
  attn_kv_stats_get(small, &ks);
  cr_expect_eq(ks.reserved_bytes, 0, "the refused import kept %llu bytes reserved",
               (unsigned long long)ks.reserved_bytes);
  moved_free(&m);
  moved_free(&m2);
  tkv_stream_free(&s);
  attn_kv_close(a);
  attn_kv_close(b);
  attn_kv_close(small);
  attn_engine_close(e);
}

/* While an export is open its session takes appends after its rows, and
 * a delete leaves it the rows: read out whole after both, the session's
 * pages given back at its close. */
Test(kv_move, an_export_holds_its_rows, .timeout = 300) {
  attn_engine *e = topen(2, NULL);
  attn_kv_store *a = tkv_open_store(e, 64 * MIB, true, NULL);
  tkv_stream s = tkv_stream_make_dv(4, 2, 64, 64, false, 301, ATTN_F32, 77);
  fill(a, "x", &s);
  int64_t len[ATTN_KV_MAX_LAYERS];
  attn_kv_exporter *x = exporting(a, "", "x", len);
  attn_kv_info info;
  attn_status st;
  tkv_opts op = tkv_plain;
  op.layer = 2;
  cr_expect_leq(tkv_step_error(a, "x", &s, &op, 300, 1, &st), ttol(s.dt), "%s", st.message);
  cr_assert_eq(attn_kv_delete(a, "", "x", 1, &st), 0, "%s", st.message);
  cr_expect_eq(attn_kv_get(a, "", "x", 1, &info, NULL, 0, &st), ATTN_ESESSION_NOT_FOUND);
  attn_kv_stats ks;
  attn_kv_stats_get(a, &ks);
  cr_expect_gt(ks.used_bytes, 0, "the pages went with the session, under its export");
  read_out(x, &s, len, "deleted under its export");
  attn_kv_stats_get(a, &ks);
  cr_expect_eq(ks.used_bytes, 0, "%llu bytes still used", (unsigned long long)ks.used_bytes);
  cr_expect_eq(ks.reserved_bytes, 0, "%llu bytes still reserved",
               (unsigned long long)ks.reserved_bytes);
  tkv_stream_free(&s);
  attn_kv_close(a);
  attn_engine_close(e);
}

/* A step on another thread (a call that has to wait): token pos of s
 * appended to layer of id, its error against float64. */
typedef struct later {
  attn_kv_store *kv;
  const tkv_stream *s;
  const char *id;
  int64_t layer, pos;
  double err;
  atomic_bool done;
  pthread_t th;
} later;

static void *later_run(void *arg) {
  later *o = arg;
  tkv_opts op = tkv_plain;
  op.layer = o->layer;
  attn_status st;
  o->err = tkv_step_error(o->kv, o->id, o->s, &op, o->pos, 1, &st);
  atomic_store(&o->done, true);
  return NULL;
}

/* o started, and held in the store (the test's timeout bounds the wait). */
static void later_start_waiting(later *o) {
  cr_assert_eq(pthread_create(&o->th, NULL, later_run, o), 0);
  attn_kv_stats ks = {0};
  while (ks.waiting == 0) {
    attn_kv_stats_get(o->kv, &ks);
    sched_yield();
  }
  cr_expect(!atomic_load(&o->done), "%s: the call did not wait", o->id);
}

/* A truncate under an open export cuts the session, and an append into
 * the rows cut waits for the export's close: the export reads out the
 * rows as they were, and the append then lands right. */
Test(kv_move, an_append_over_exported_rows_waits, .timeout = 300) {
  attn_engine *e = topen(2, NULL);
  attn_kv_store *a = tkv_open_store(e, 64 * MIB, true, NULL);
  tkv_stream s = tkv_stream_make_dv(4, 2, 64, 64, false, 301, ATTN_BF16, 78);
  fill(a, "y", &s);
  int64_t len[ATTN_KV_MAX_LAYERS];
  attn_kv_exporter *x = exporting(a, "", "y", len);
  attn_status st;
  cr_assert_eq(attn_kv_truncate(a, "", "y", 10, 1, &st), 0, "%s", st.message);
  later o = {.kv = a, .s = &s, .id = "y", .layer = 2, .pos = 10};
  later_start_waiting(&o);
  read_out(x, &s, len, "truncated under its export");
  pthread_join(o.th, NULL);
  cr_expect_leq(o.err, ttol(s.dt), "the append after the export: error %g", o.err);
  tkv_stream_free(&s);
  attn_kv_close(a);
  attn_engine_close(e);
}

/* The same rows whatever the stores' page sizes: exported from 64 KiB
 * pages, imported into 16 KiB pages (64 and more pages a layer's tokens
 * span differently), exported again byte for byte and imported back into
 * 32 KiB pages; each import's next step against float64. A shape too wide
 * for the smaller pages is refused, naming the page size that takes it. */
Test(kv_move, across_page_sizes, .timeout = 120) {
  attn_engine *e = topen(2, NULL);
  attn_kv_store *st3[3] = {tkv_open_store(e, 64 * MIB, true, "cpu"),
                           tkv_open_paged(e, 64 * MIB, 16 << 10),
                           tkv_open_paged(e, 64 * MIB, 32 << 10)};
  for (int k = 0; k < NKINDS; k++) {
    char id[16];
    snprintf(id, sizeof id, "p%d", k);
    tkv_stream s = tkv_stream_make_dv(4, 2, kinds[k].d, kinds[k].dv, kinds[k].latent, 301,
                                      ATTN_BF16, 60 + (uint64_t)k);
    fill(st3[0], id, &s);
    moved m[3];
    attn_status st;
    export_ok(st3[0], "", id, &m[0]);
    for (int i = 1; i < 3; i++) {
      cr_assert_eq(import(st3[i], "t2", id, &m[i - 1], vs_of(&m[i - 1]), &st), 0, "%s", st.message);
      export_ok(st3[i], "t2", id, &m[i]);
      for (int l = 0; l < LAYERS; l++)
        for (int t = 0; t < attn__kv_tensors(&m[0].info.shape); t++)
          cr_expect(!memcmp(t ? m[i].v[l] : m[i].k[l], t ? m[0].v[l] : m[0].k[l],
                            tensor_bytes(&m[0].info.shape, m[0].len[l], t)),
                    "%s: layer %d's %c differs at the %dth store", id, l, t ? 'v' : 'k', i);
      tkv_opts op = tkv_plain;
      op.layer = 2;
      tkv_reply y;
      const int64_t p = lengths_of[2];
      cr_assert_eq(tkv_call1(st3[i], "t2", id, &s, &op, p, 1, p, 1, &y, 2, &st), 0, "%s",
                   st.message);
      cr_expect_leq(tkv_ref_error(&s, &op, p, 1, p + 1, &y), ttol(s.dt), "%s at store %d", id, i);
      tkv_reply_free(&y);
    }
    for (int i = 0; i < 3; i++)
      moved_free(&m[i]);
    tkv_stream_free(&s);
  }
  /* D 576 BF16: 1152-byte rows, 14 to a 16 KiB page */
  tkv_stream w = tkv_stream_make_dv(4, 1, 576, 512, true, 40, ATTN_BF16, 9);
  tkv_make(st3[0], "", "mla", &w, 1, 64, 600, 0);
  tkv_reply y;
  attn_status st;
  cr_assert_eq(tkv_call1(st3[0], "", "mla", &w, &tkv_plain, 0, 20, 0, 20, &y, 0, &st), 0, "%s",
               st.message);
  tkv_reply_free(&y);
  moved m;
  memset(&m, 0, sizeof m);
  cr_assert_eq(attn_kv_export(st3[0], "", "mla", 1, &m.info, m.len, m.k, m.v, &st), 0, "%s",
               st.message);
  cr_expect_eq(attn_kv_import(st3[1], "", "mla", &m.info.shape, 600, 1, m.len,
                              (const void *const *)m.k, NULL, &st),
               ATTN_EUNSUPPORTED);
  cr_expect(strstr(st.message, "1152 bytes") && strstr(st.message, "--session-page-bytes 32K"),
            "%s", st.message);
  cr_expect_eq(attn_kv_import(st3[2], "", "mla", &m.info.shape, 600, 1, m.len,
                              (const void *const *)m.k, NULL, &st),
               0, "%s", st.message);
  free(m.k[0]);
  tkv_stream_free(&w);
  for (int i = 0; i < 3; i++)
    attn_kv_close(st3[i]);
  attn_engine_close(e);
}

/* ---- an import's rows copied without the store's lock ------------------- */

#define IMPORTED 100 /* tokens of the session the fill below makes */

typedef struct slow_fill {
  const tkv_stream *s, *other;
  later waiter;
} slow_fill;

/* Fills the session with s's first IMPORTED tokens, once it has seen the
 * store take calls meanwhile: a look at its stats (the lock is free), a
 * step on another session, and a step on this one, which waits. */
static int fill_slowly(attn_kv_store *kv, kv_session *ks, void *arg, attn_status *st) {
  slow_fill *f = arg;
  attn_kv_stats stats;
  attn_kv_stats_get(kv, &stats);
  cr_expect_eq(stats.sessions, 2);
  tkv_opts op = tkv_plain;
  cr_expect_leq(tkv_step_error(kv, "o", f->other, &op, 0, 1, st), ttol(f->other->dt),
                "a call on another session during the import");
  later_start_waiting(&f->waiter);
  const tkv_stream *s = f->s;
  for (int t = 0; t < 2; t++)
    for (int64_t h = 0; h < s->hkv; h++)
      for (int64_t j = 0, n; j < IMPORTED; j += n) {
        n = attn__kv_span(ks, j, IMPORTED);
        const char *rows = (const char *)(t ? s->v : s->k) + (size_t)((h * s->n + j) * s->d) * 4;
        if (attn__kv_rows_put(kv, ks, &ks->layers[0], t, h, j, n, rows, st))
          return -1;
      }
  return 0;
}

/* While an import copies its rows, the store takes calls on its other
 * sessions, and a call on the one being made waits for it, then runs
 * over its whole history. */
Test(kv_move, an_import_copies_without_the_lock, .timeout = 300) {
  attn_engine *e = topen(2, NULL);
  attn_kv_store *a = tkv_open_store(e, 64 * MIB, true, NULL);
  tkv_stream s = tkv_stream_make_dv(4, 2, 64, 64, false, 301, ATTN_F32, 79),
             other = tkv_stream_make_dv(4, 2, 64, 64, false, 301, ATTN_F32, 80);
  tkv_make(a, "", "o", &other, 1, 512, 600, 0);
  kvf_header *h = calloc(1, sizeof *h);
  snprintf(h->id, sizeof h->id, "n");
  h->shape = (attn_kv_shape){
      .heads_kv = 2, .head_dim = 64, .dtype = ATTN_F32, .layers = 1, .max_tokens = 512};
  h->ttl_s = h->left_s = 600;
  h->length[0] = IMPORTED;
  h->absmax[0][0] = attn__absmax(s.k, ATTN_F32, (size_t)(2 * s.n * 64));
  h->absmax[0][1] = attn__absmax(s.v, ATTN_F32, (size_t)(2 * s.n * 64));
  slow_fill f = {&s, &other, {.kv = a, .s = &s, .id = "n", .layer = 0, .pos = IMPORTED}};
  attn_status st;
  cr_assert_eq(attn__kvf_install(a, h, 600, 1, true, fill_slowly, &f, &st), 0, "%s", st.message);
  pthread_join(f.waiter.th, NULL);
  cr_expect_leq(f.waiter.err, ttol(s.dt), "the call that waited for the import: error %g",
                f.waiter.err);
  attn_kv_info info;
  int64_t len;
  cr_assert_eq(attn_kv_get(a, "", "n", 1, &info, &len, 1, &st), 0, "%s", st.message);
  cr_expect_eq(len, IMPORTED + 1);
  free(h);
  tkv_stream_free(&s);
  tkv_stream_free(&other);
  attn_kv_close(a);
  attn_engine_close(e);
}
