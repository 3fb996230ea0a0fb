/*
 * bench_sessions.c — bench-gpu --sessions (bench_sessions.h): an engine on
 * the device with a session store whose pages live there, one session
 * prefilled to SES_TOKENS tokens in calls of 4096, then decode steps timed
 * by the wall clock from submission to completion, as a server's call
 * costs them: one upload (q, the page tables and the new token's rows), the
 * kernel that puts the rows into their pages, the paged kernel and one
 * download (O). Then the rows alone the way the store wrote them before
 * (two synchronous copies per KV head), for the ratio.
 */
#include "bench_sessions.h"

#include "engine.h"
#include "kv/kv_int.h"
#include "kvcalls.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* The store, on the device; NULL (said on stderr) when it is not. */
static attn_kv_store *device_store(attn_engine *e) {
  attn_kv_store *kv;
  attn_status st;
  if (attn_kv_open(e, (uint64_t)1 << 30, false, NULL, &kv, &st)) {
    fprintf(stderr, "bench-gpu: --sessions: %s\n", st.message);
    return NULL;
  }
  attn_kv_stats ks;
  attn_kv_stats_get(kv, &ks);
  if (strcmp(ks.where, "cuda")) {
    fprintf(stderr, "bench-gpu: --sessions: the store's pages are in %s memory (see the log)\n",
            ks.where);
    attn_kv_close(kv);
    return NULL;
  }
  return kv;
}

/* Calls from pos to end, n tokens each (the last step's time in *ms). */
static int steps(attn_kv_store *kv, const tkv_stream *s, int64_t pos, int64_t end, int64_t n,
                 double *ms) {
  for (; pos < end; pos += n) {
    tkv_reply y;
    attn_status st = {0};
    int64_t k = end - pos < n ? end - pos : n;
    double t0 = attn_now();
    int rc = tkv_call1(kv, "", "bench", s, &tkv_plain, pos, k, pos, k, &y, 0, &st);
    *ms = (attn_now() - t0) * 1e3;
    tkv_reply_free(&y);
    if (rc) {
      fprintf(stderr, "bench-gpu: --sessions: the call at %lld failed: %s\n", (long long)pos,
              st.message);
      return -1;
    }
  }
  return 0;
}

static double median(double *t, int n) {
  qsort(t, (size_t)n, sizeof *t, cmp);
  return n % 2 ? t[n / 2] : (t[n / 2 - 1] + t[n / 2]) / 2;
}

/* The last step's rows (token `at`) written again, each KV head's K and V
 * by a synchronous copy, as a step's append cost before: ms, or -1. No job
 * runs meanwhile, and the rows are the ones already there. */
static double rows_the_old_way(attn_kv_store *kv, const tkv_stream *s, int64_t at) {
  pthread_mutex_lock(&kv->mu);
  kv_session *ks = attn__kv_find(kv, "", "bench", 0);
  pthread_mutex_unlock(&kv->mu);
  const size_t row = (size_t)s->d * attn_dtype_size(s->dt);
  attn_status st;
  double t0 = attn_now();
  for (int t = 0; ks && t < 2; t++)
    for (int64_t h = 0; h < s->hkv; h++)
      if (attn__kv_rows_put(kv, ks, &ks->layers[0], t, h, at, 1,
                            (const char *)(t ? s->v : s->k) + (size_t)(h * s->n + at) * row, &st))
        return -1;
  return ks ? (attn_now() - t0) * 1e3 : -1;
}

int bench_sessions(int reps, double *best_ms, double *med_ms, double *rows_ms) {
  attn_engine *e;
  attn_status st;
  if (attn_engine_open(NULL, &e, &st)) {
    fprintf(stderr, "bench-gpu: --sessions: %s\n", st.message);
    return -1;
  }
  attn_kv_store *kv = device_store(e);
  tkv_stream s = tkv_stream_make(SES_HQ, SES_HKV, SES_D, SES_TOKENS + 2 + reps, ATTN_BF16, 17);
  double *t = malloc((size_t)reps * sizeof *t), ms = 0;
  int rc = kv && t ? 0 : -1;
  if (rc == 0) {
    tkv_make(kv, "", "bench", &s, 1, s.n, 600, 0);
    rc = steps(kv, &s, 0, SES_TOKENS, 4096, &ms);
    rc = rc ? rc : steps(kv, &s, SES_TOKENS, SES_TOKENS + 2, 1, &ms); /* warm-up */
  }
  for (int i = 0; i < reps && rc == 0; i++)
    rc = steps(kv, &s, SES_TOKENS + 2 + i, SES_TOKENS + 3 + i, 1, &t[i]);
  if (rc == 0) {
    *med_ms = median(t, reps);
    *best_ms = t[0];
  }
  for (int i = 0; i < reps && rc == 0; i++)
    if ((t[i] = rows_the_old_way(kv, &s, SES_TOKENS + 1 + reps)) < 0) {
      fprintf(stderr, "bench-gpu: --sessions: the synchronous row copies failed\n");
      rc = -1;
    }
  if (rc == 0)
    *rows_ms = median(t, reps);
  free(t);
  tkv_stream_free(&s);
  attn_kv_close(kv);
  attn_engine_close(e);
  return rc;
}
