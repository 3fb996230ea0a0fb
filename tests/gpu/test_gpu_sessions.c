/*
 * test_gpu_sessions.c — group "sessions": a session store on the device
 * (its pages in GPU memory, read by the paged kernels) through the engine
 * as the server drives it: prefill then token-by-token decode in each
 * dtype and head dim class (one padded), a batch call of three sessions of
 * different lengths, and a decode step over 32K cached tokens (split-KV on
 * pages), each step against the float64 reference over exactly the keys
 * the session holds. The store must be on the device: a paged view the
 * self-check turned off fails the group, saying why.
 */
#include "gpu_test.h"

#ifdef ATTN_HAVE_CUDA
#include "kvcalls.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Whether the float64 reference of nq queries over nk keys is cheap
 * enough to check (a 32K-token prefill is not: 10^13 operations). */
static bool checkable(const tkv_stream *s, int64_t nq, int64_t nk) {
  return (double)s->hq * (double)nq * (double)nk * (double)s->d < 4e9;
}

/* Prefill pre in calls of at most 4096 tokens, then decode to s->n; false
 * at the first step off the reference (why written). */
static bool decode_ok(attn_kv_store *kv, const char *id, const tkv_stream *s, int64_t pre,
                      int64_t every, char *why, size_t cap) {
  for (int64_t pos = 0; pos < s->n;) {
    int64_t left = pre - pos, n = pos < pre ? (left < 4096 ? left : 4096) : 1;
    tkv_reply y;
    attn_status st = {0};
    int rc = tkv_call1(kv, "", id, s, &tkv_plain, pos, n, pos, n, &y, 0, &st);
    bool checked =
        checkable(s, n, pos + n) && (pos < pre || (pos - pre) % every == 0 || pos + n == s->n);
    double err = rc == 0 && checked ? tkv_ref_error(s, &tkv_plain, pos, n, pos + n, &y) : 0;
    bool gpu = rc == 0 && y.backend && !strcmp(y.backend, "cuda");
    tkv_reply_free(&y);
    if (rc || !gpu || !(err <= g_tol_o(s->dt))) {
      snprintf(why, cap, "pos %lld: %.150s", (long long)pos,
               rc     ? st.message
               : !gpu ? "ran on the CPU"
                      : "error past the tolerance");
      return false;
    }
    pos += n;
  }
  return true;
}

static void decode_cases(tgroup *g, attn_kv_store *kv) {
  static const struct {
    attn_dtype dt;
    int64_t hq, hkv, d, pre, n;
  } cs[] = {{ATTN_BF16, 8, 2, 128, 1000, 1016},
            {ATTN_F16, 8, 2, 64, 700, 716},
            {ATTN_F32, 4, 4, 37, 300, 310},
            {ATTN_BF16, 32, 8, 128, 32768, 32770},
            {ATTN_F16, 16, 2, 256, 513, 520}};
  for (size_t i = 0; i < sizeof cs / sizeof *cs && !g_dead; i++) {
    char id[16], why[200] = "";
    snprintf(id, sizeof id, "g%zu", i);
    tkv_stream s =
        tkv_stream_make(cs[i].hq, cs[i].hkv, cs[i].d, cs[i].n, cs[i].dt, g_seed(0, (int)i, 0));
    tkv_make(kv, "", id, &s, 1, cs[i].n, 600, 0);
    g_set_current("sessions %s Hq%lld Hkv%lld D%lld N%lld", attn_dtype_name(cs[i].dt),
                  (long long)cs[i].hq, (long long)cs[i].hkv, (long long)cs[i].d,
                  (long long)cs[i].n);
    bool ok = decode_ok(kv, id, &s, cs[i].pre, 4, why, sizeof why);
    tg_case(g, ok, "sessions %s Hq%lld Hkv%lld D%lld prefill %lld, decode to %lld%s%s",
            attn_dtype_name(cs[i].dt), (long long)cs[i].hq, (long long)cs[i].hkv,
            (long long)cs[i].d, (long long)cs[i].pre, (long long)cs[i].n, ok ? "" : ": ", why);
    tkv_stream_free(&s);
    attn_status st;
    attn_kv_delete(kv, "", id, 0, &st);
  }
}

void group_sessions(tgroup *g, int grp, attn_engine *e) {
  (void)grp;
  attn_kv_store *kv = tkv_open_store(e, (uint64_t)1 << 30, false, NULL);
  attn_kv_stats ks;
  attn_kv_stats_get(kv, &ks);
  if (strcmp(ks.where, "cuda")) {
    tg_case(g, false,
            "sessions: the store's pages are in %s memory, not on the GPU (see the "
            "log: the paged kernels' self-check)",
            ks.where);
  } else {
    decode_cases(g, kv);
  }
  attn_kv_close(kv);
}
#endif
