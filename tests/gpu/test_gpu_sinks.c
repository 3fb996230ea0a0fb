/*
 * test_gpu_sinks.c — group "sinks", the part beyond the forward list that
 * test_gpu.c runs first (list_sinks: prefill and decode problems with
 * sinks through the engine, every head-dim instance, split-KV and the
 * Hopper instance where the device has it): the backward pass with sinks
 * (dq, dk, dv against the float64 backward, dsinks against
 * attn_reference_dsinks, with the forward's lse given and recomputed, each
 * run twice: all four must repeat bit for bit), and a session whose pages
 * live on the device calling with sinks (prefill, then decode steps
 * through the paged kernels), against the float64 reference.
 */
#include "gpu_test.h"

#ifdef ATTN_HAVE_CUDA
#include "kvcalls.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* dq, dk, dv and dsinks of c, concatenated (to compare two runs). */
static unsigned char *grads_copy(const tcase *c, size_t *n) {
  const tprob *p = &c->p;
  const size_t es = attn_dtype_size(p->dt), q = (size_t)(p->b * p->hq * p->nq * p->d) * es,
               kv = (size_t)(p->b * p->hkv * p->nkv * p->d) * es, s = (size_t)p->hq * 4;
  unsigned char *x = malloc(q + 2 * kv + s);
  if (!x)
    return NULL;
  memcpy(x, c->dq, q);
  memcpy(x + q, c->dk, kv);
  memcpy(x + q + kv, c->dv, kv);
  memcpy(x + q + 2 * kv, c->dsinks, s);
  *n = q + 2 * kv + s;
  return x;
}

/* One run: the engine's result judged against the references; why when
 * not within the dtype's tolerance. */
static bool backward_run(tgroup *g, attn_engine *e, const char *backend, tcase *c,
                         const tref_bwd *ref, const double *dref, char *why, size_t cap) {
  attn_status st = {0};
  tcase_poison_grads(c);
  int rc = trun(e, c, backend, &st);
  if (rc != 0) {
    snprintf(why, cap, "%s: %s", attn_err_name(rc), st.message);
    return false;
  }
  const terr_bwd err = tref_bwd_check(c, ref);
  const double ds = tdsinks_err(c, dref), tol = g_tol_o(c->p.dt);
  terr te = {.o = fmax(fmax(err.dq, ds), fmax(err.dk, err.dv)), .masked_ok = true};
  tg_errors(g, c->p.dt, &te, false);
  if (terr_bwd_within(&err, tol) && ds <= tol)
    return true;
  snprintf(why, cap, "dq %.3g dk %.3g dv %.3g dsinks %.3g (tol %.0e)", err.dq, err.dk, err.dv, ds,
           tol);
  return false;
}

static void backward_problem(tgroup *g, attn_engine *e, const char *backend, const tprob *p,
                             uint64_t seed) {
  char desc[200];
  tdesc(p, desc, sizeof desc);
  for (int with_lse = 0; with_lse < 2 && !g_dead; with_lse++) {
    tcase c;
    tref_bwd ref = {0};
    attn_status st = {0};
    double dref[64];
    tcase_init(&c, p, seed);
    if (tcase_backward(&c, with_lse, ~seed, &st) < 0 || tref_bwd_compute(&c, &ref, &st) < 0 ||
        attn_reference_dsinks(&c.req, dref, &st) < 0) {
      tg_case(g, false, "%s: the reference failed: %s", desc, st.message);
      tref_bwd_free(&ref);
      tcase_free(&c);
      continue;
    }
    g_set_current("sinks backward: %s lse %d", desc, with_lse);
    char why[300] = "";
    unsigned char *first = NULL;
    size_t n = 0;
    bool ok = true;
    for (int run = 0; run < 2 && ok; run++) {
      ok = backward_run(g, e, backend, &c, &ref, dref, why, sizeof why);
      if (ok && run == 0)
        first = grads_copy(&c, &n);
      unsigned char *again = ok && run == 1 && first ? grads_copy(&c, &n) : NULL;
      if (again && memcmp(first, again, n) != 0) {
        snprintf(why, sizeof why, "run 2's dq, dk, dv or dsinks differ from run 1's in bits");
        ok = false;
      }
      free(again);
    }
    free(first);
    tg_case(g, ok, "sinks backward %s lse %d seed %#" PRIx64 "%s%s", desc, with_lse, seed,
            ok ? "" : ": ", why);
    tref_bwd_free(&ref);
    tcase_free(&c);
  }
}

/* Every backward instance (head dims 16 to 256, padded ones), every dtype,
 * GQA, causal with rows that see no key, a window, strides. */
static void backward_cases(tgroup *g, int grp, attn_engine *e, const char *backend) {
  static const int64_t ds[] = {16, 37, 64, 128, 200, 256};
  for (int i = 0; i < 6; i++)
    for (int t = 0; t < ATTN_DTYPE_COUNT && (!g_opt.small || i < 2); t++) {
      const int k = 3 * i + t;
      tprob p = tprob_make(1 + k % 2, 4, 1 + k % 2, 60 + 37 * (k % 3), 90 - 20 * (k % 4), ds[i],
                           (attn_dtype)t);
      p.causal = k % 3 != 1; /* 100 queries over 70 keys: rows with none */
      p.wl = k % 3 == 1 ? 30 : -1, p.wr = k % 3 == 1 ? 5 : -1;
      p.strided = k % 4 == 1;
      p.sinks = true;
      backward_problem(g, e, backend, &p, g_seed(grp, 100 + k, 0));
    }
}

/* Prefill 300 tokens, then a few decode steps, each step checked. */
static void session_cases(tgroup *g, attn_engine *e) {
  static const struct {
    attn_dtype dt;
    int64_t hq, hkv, d;
  } cs[] = {{ATTN_BF16, 8, 2, 128}, {ATTN_F16, 4, 4, 64}, {ATTN_F32, 4, 1, 37}};
  attn_kv_store *kv = tkv_open_store(e, (uint64_t)256 << 20, false, NULL);
  attn_kv_stats ks;
  attn_kv_stats_get(kv, &ks);
  if (strcmp(ks.where, "cuda")) {
    tg_case(g, false, "sinks sessions: the store's pages are in %s memory, not on the GPU",
            ks.where);
    attn_kv_close(kv);
    return;
  }
  const float sinks[8] = {-2.0f, 0.5f, 3.0f, 9.0f, -1e30f, 1.0f, -6.0f, 0.0f};
  const size_t ncs = g_opt.small ? 1 : sizeof cs / sizeof *cs;
  for (size_t i = 0; i < ncs && !g_dead; i++) {
    tkv_stream s =
        tkv_stream_make(cs[i].hq, cs[i].hkv, cs[i].d, 310, cs[i].dt, g_seed(0, 200 + (int)i, 0));
    tkv_make(kv, "", "s", &s, 1, 310, 600, 0);
    g_set_current("sinks sessions %s D%lld", attn_dtype_name(cs[i].dt), (long long)cs[i].d);
    tkv_opts op = tkv_plain;
    op.stats = true, op.sinks = sinks;
    attn_status st = {0};
    double worst = tkv_step_error(kv, "s", &s, &op, 0, 300, &st);
    for (int64_t pos = 300; pos < 310 && worst < INFINITY; pos++)
      worst = fmax(worst, tkv_step_error(kv, "s", &s, &op, pos, 1, &st));
    const bool ok = worst <= g_tol_o(cs[i].dt);
    terr te = {.o = worst, .masked_ok = true};
    tg_errors(g, cs[i].dt, &te, false);
    tg_case(g, ok, "sinks sessions %s Hq%lld Hkv%lld D%lld prefill 300, decode to 310: %.2e%s%s",
            attn_dtype_name(cs[i].dt), (long long)cs[i].hq, (long long)cs[i].hkv,
            (long long)cs[i].d, worst, st.message[0] ? ": " : "", st.message);
    tkv_stream_free(&s);
    attn_kv_delete(kv, "", "s", 0, &st);
  }
  attn_kv_close(kv);
}

void group_sinks(tgroup *g, int grp, attn_engine *e, const char *backend) {
  backward_cases(g, grp, e, backend);
  if (strcmp(backend, "cuda") == 0)
    session_cases(g, e);
}
#endif
