/*
 * test_gpu_sessions.c — group "sessions": a session store on the device
 * (its pages in GPU memory, read by the paged kernels) through the engine
 * as the server drives it: prefill then token-by-token decode in each
 * dtype and head dim class (one padded; values of a head dim of their
 * own, and a latent session whose v is its k's first columns), a batch
 * call of three sessions of different lengths, and a decode step over 32K
 * cached tokens (split-KV on pages), and a fork mid-page whose two sides decode in turns, each
 * step against the float64 reference over exactly the keys the session holds. The store must be on
 * the device: a paged view the self-check turned off fails the group, saying why.
 */
#include "gpu_test.h"

#ifdef ATTN_HAVE_CUDA
#include "kvcalls.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void decode_cases(tgroup *g, attn_kv_store *kv) {
  static const struct {
    attn_dtype dt;
    int64_t hq, hkv, d, pre, n;
    int64_t dv; /* 0: d */
    bool latent;
  } cs[] = {{ATTN_BF16, 8, 2, 128, 1000, 1016, 0, false},
            {ATTN_F16, 8, 2, 64, 700, 716, 0, false},
            {ATTN_F32, 4, 4, 37, 300, 310, 0, false},
            {ATTN_BF16, 32, 8, 128, 32768, 32770, 0, false},
            {ATTN_F16, 16, 2, 256, 513, 520, 0, false},
            {ATTN_BF16, 16, 1, 96, 600, 610, 64, true}, /* MLA's absorbed decode, scaled down */
            {ATTN_F16, 8, 2, 192, 500, 510, 128, false},
            {ATTN_BF16, 8, 2, 64, 400, 408, 128, false}};
  for (size_t i = 0; i < sizeof cs / sizeof *cs && !g_dead; i++) {
    char id[16], why[200] = "";
    snprintf(id, sizeof id, "g%zu", i);
    const int64_t dv = cs[i].dv ? cs[i].dv : cs[i].d;
    tkv_stream s = tkv_stream_make_dv(cs[i].hq, cs[i].hkv, cs[i].d, dv, cs[i].latent, cs[i].n,
                                      cs[i].dt, g_seed(0, (int)i, 0));
    tkv_make(kv, "", id, &s, 1, cs[i].n, 600, 0);
    g_set_current("sessions %s Hq%lld Hkv%lld D%lld Dv%lld%s N%lld", attn_dtype_name(cs[i].dt),
                  (long long)cs[i].hq, (long long)cs[i].hkv, (long long)cs[i].d, (long long)dv,
                  cs[i].latent ? " latent" : "", (long long)cs[i].n);
    /* a 32K-token prefill's reference would be 10^13 operations: its decode steps are checked */
    const tkv_plan pl = {.pre = cs[i].pre,
                         .chunk = 4096,
                         .every = 4,
                         .max_ops = 4e9,
                         .backend = "cuda",
                         .tol = g_tol_o(cs[i].dt)};
    bool ok = tkv_decode(kv, id, &s, &tkv_plain, &pl, why, sizeof why) == 0;
    tg_case(g, ok, "sessions %s Hq%lld Hkv%lld D%lld Dv%lld%s prefill %lld, decode to %lld%s%s",
            attn_dtype_name(cs[i].dt), (long long)cs[i].hq, (long long)cs[i].hkv,
            (long long)cs[i].d, (long long)dv, cs[i].latent ? " latent" : "", (long long)cs[i].pre,
            (long long)cs[i].n, ok ? "" : ": ", why);
    tkv_stream_free(&s);
    attn_status st;
    attn_kv_delete(kv, "", id, 0, &st);
  }
}

/* A fork mid-page: both sides then decode their own tokens in turns, the
 * first divergent step copying the shared page on the device; each step
 * against float64 over exactly its side's history. */
static void fork_case(tgroup *g, attn_kv_store *kv) {
  const int64_t at = 700, n = 716; /* BF16 D 128: 256 tokens a page */
  tkv_stream src = tkv_stream_make(8, 2, 128, n, ATTN_BF16, g_seed(0, 90, 0));
  tkv_stream other = tkv_stream_make(8, 2, 128, n, ATTN_BF16, g_seed(0, 91, 0));
  tkv_stream mine = tkv_stream_splice(&src, &other, at);
  g_set_current("sessions fork BF16 Hq8 Hkv2 D128 at %lld", (long long)at);
  tkv_make(kv, "", "src", &src, 1, n, 600, 0);
  attn_status st = {0};
  double worst = tkv_step_error(kv, "src", &src, &tkv_plain, 0, at, &st);
  if (worst != INFINITY && attn_kv_fork(kv, "", "src", "fork", -1, 0, 0, &st))
    worst = INFINITY;
  for (int64_t pos = at; pos < n && worst != INFINITY && !g_dead; pos++) {
    const double a = tkv_step_error(kv, "fork", &mine, &tkv_plain, pos, 1, &st);
    const double b = a == INFINITY ? a : tkv_step_error(kv, "src", &src, &tkv_plain, pos, 1, &st);
    worst = fmax(worst, fmax(a, b));
  }
  const bool ok = worst <= g_tol_o(ATTN_BF16);
  tg_case(g, ok, "sessions fork BF16 Hq8 Hkv2 D128 at %lld, both sides to %lld: error %.2g%s%s",
          (long long)at, (long long)n, worst, worst == INFINITY ? ": " : "",
          worst == INFINITY ? st.message : "");
  attn_kv_delete(kv, "", "src", 0, &st);
  attn_kv_delete(kv, "", "fork", 0, &st);
  tkv_stream_free(&src);
  tkv_stream_free(&other);
  tkv_stream_free(&mine);
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
    fork_case(g, kv);
  }
  attn_kv_close(kv);
}
#endif
