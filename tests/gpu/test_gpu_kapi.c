/*
 * test_gpu_kapi.c — group "kapi": the kernels' C interface (kernels.h)
 * driven directly, as the benchmark drives it: attn_cu_prepare once,
 * attn_cu_select for a shape, buffers of our own in the packed layout
 * (head dim padded to dp with zero columns), attn_cu_launch on a stream.
 *
 * Group "hopper" runs the same cases on the Hopper instance, turned on by
 * attn_cu_select_hopper() as the start-up self-check turns it on: its own
 * list (head dims 64/128/256 and odd ones, both 16-bit dtypes, causal,
 * windows, GQA, tails, rows with no visible key, more work units than
 * CTAs) and every F16/BF16 problem of the conformance lists, packed. It is
 * skipped where the build has no sm_90a code or the device is not 9.0.
 *
 * Every device buffer sits between two guard zones of a known pattern, so a
 * kernel that writes past a tensor (or its split-KV scratch) fails the case
 * even where compute-sanitizer is not run; the inputs are read back and
 * must be unchanged. Outputs and scratch are poisoned (NaN bits) before
 * each launch.
 *
 * Group "kapi" also runs problems with K and V paged (kernels.h's paged
 * view; tests/lib's tpaged lays pages out in shuffled order, poisoning
 * every byte no key occupies): the packed launch and the paged one of the
 * same choice, each judged against float64, paged O within the tolerance
 * of packed O, the page pool and tables inside guards and read back
 * unchanged; and batches of sessions with per-entry key lengths
 * (seqused_k, tests/lib's tbatch): each entry of the batched launch within
 * the tolerance of its launch alone and of float64, an entry of no key O 0
 * with empty statistics.
 */
#include "gpu_test.h"

#ifdef ATTN_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GUARD 4096 /* bytes on each side; keeps the data 256-byte aligned */
#define GUARD_BYTE 0xA5

typedef struct dbuf {
  unsigned char *base; /* cudaMalloc'd: guard, data, guard */
  size_t bytes;        /* of data */
} dbuf;

static void *dptr(const dbuf *b) { return b->base ? b->base + GUARD : NULL; }

static int dalloc(dbuf *b, size_t bytes) {
  b->bytes = bytes;
  b->base = NULL;
  if (GCK(cudaMalloc((void **)&b->base, bytes + 2 * GUARD))) {
    b->base = NULL;
    return -1;
  }
  return GCK(cudaMemset(b->base, GUARD_BYTE, bytes + 2 * GUARD));
}

static void dfree(dbuf *b) {
  if (b->base)
    GCK(cudaFree(b->base));
  b->base = NULL;
}

/* Bytes of the two guard zones that changed; -1 when they cannot be read. */
static long guard_damage(const dbuf *b) {
  if (!b->base)
    return 0;
  unsigned char h[2 * GUARD];
  if (GCK(cudaMemcpy(h, b->base, GUARD, cudaMemcpyDeviceToHost)) ||
      GCK(cudaMemcpy(h + GUARD, b->base + GUARD + b->bytes, GUARD, cudaMemcpyDeviceToHost)))
    return -1;
  long n = 0;
  for (size_t i = 0; i < sizeof h; i++)
    n += h[i] != GUARD_BYTE;
  return n;
}

/* Contiguous [rows, d] elements -> [rows, dp] with zero columns after d. */
static unsigned char *pad_rows(const void *x, size_t rows, int64_t d, int dp, size_t es) {
  unsigned char *y = calloc(rows * (size_t)dp, es);
  if (!y)
    return NULL;
  for (size_t r = 0; r < rows; r++)
    memcpy(y + r * (size_t)dp * es, (const unsigned char *)x + r * (size_t)d * es, (size_t)d * es);
  return y;
}

static void unpad_rows(void *y, const unsigned char *x, size_t rows, int64_t d, int dp, size_t es) {
  for (size_t r = 0; r < rows; r++)
    memcpy((unsigned char *)y + r * (size_t)d * es, x + r * (size_t)dp * es, (size_t)d * es);
}

static int kapi_list(tprob *ps) {
  int n = 0;
  tprob p;
  p = tprob_make(1, 2, 1, 77, 200, 37, ATTN_F32);
  p.wl = 16;
  p.wr = 3;
  p.stats = 1;
  ps[n++] = p;
  p = tprob_make(2, 4, 4, 1, 4096, 64, ATTN_F16);
  ps[n++] = p;
  p = tprob_make(1, 1, 1, 100, 100, 7, ATTN_F16);
  p.stats = 1;
  ps[n++] = p;
  p = tprob_make(2, 8, 2, 300, 300, 64, ATTN_F16);
  p.causal = 1;
  p.stats = 1;
  ps[n++] = p;
  p = tprob_make(1, 4, 4, 1000, 1000, 128, ATTN_BF16);
  ps[n++] = p;
  p = tprob_make(1, 32, 8, 1, 32768, 128, ATTN_BF16);
  p.stats = 1;
  ps[n++] = p;
  p = tprob_make(1, 4, 2, 513, 513, 256, ATTN_F16);
  p.causal = 1;
  p.stats = 1;
  ps[n++] = p;
  p = tprob_make(1, 2, 2, 256, 256, 80, ATTN_BF16);
  p.causal = 1;
  ps[n++] = p;
  p = tprob_make(1, 4, 4, 1024, 1024, 64, ATTN_BF16);
  p.stats = 1;
  ps[n++] = p;
  p = tprob_make(4, 16, 16, 1024, 1024, 128, ATTN_F16);
  p.causal = 1;
  ps[n++] = p;
  /* the decode kernel (decode.cuh), beside the two decodes above: a group
   * of 16 rows (two n8 column tiles) causal, a windowed 12:4 decode with a
   * padded head dim, a negative scale, and a top-left diagonal whose rows
   * see one to four keys (the other splits are empty). (tcu_params sets no
   * variant: softcap and ALiBi reach it through the engine's tests and the
   * self-check.) */
  p = tprob_make(1, 8, 1, 2, 4096, 128, ATTN_F16);
  p.causal = 1;
  p.stats = 1;
  ps[n++] = p;
  p = tprob_make(2, 12, 4, 1, 3000, 96, ATTN_BF16);
  p.wl = 1000;
  p.stats = 1;
  ps[n++] = p;
  p = tprob_make(1, 16, 2, 1, 5000, 64, ATTN_F16);
  p.scale = -0.1;
  p.stats = 1;
  ps[n++] = p;
  p = tprob_make(1, 4, 4, 4, 2048, 64, ATTN_BF16);
  p.causal = 1;
  p.diag = 0;
  p.stats = 1;
  ps[n++] = p;
  p = tprob_make(1, 8, 2, 1, 3000, 250, ATTN_BF16); /* the 256 instance */
  p.causal = 1;
  p.stats = 1;
  ps[n++] = p;
  return n;
}

/* Everything one case holds, so that one exit path frees it all. */
typedef struct kcase {
  tcase c;
  tref ref;
  bool have_ref;
  dbuf q, k, v, o, m, l, lse, ws;
  unsigned char *hq, *hk, *hv, *ho;
} kcase;

static void kcase_free(kcase *kc) {
  dbuf *all[8] = {&kc->q, &kc->k, &kc->v, &kc->o, &kc->m, &kc->l, &kc->lse, &kc->ws};
  for (int i = 0; i < 8; i++)
    dfree(all[i]);
  free(kc->hq);
  free(kc->hk);
  free(kc->hv);
  free(kc->ho);
  if (kc->have_ref)
    tref_free(&kc->ref);
  tcase_free(&kc->c);
}

/* Inputs read back unchanged? */
static bool inputs_intact(kcase *kc, size_t qbytes, size_t kvbytes) {
  size_t n = qbytes > kvbytes ? qbytes : kvbytes;
  unsigned char *h = malloc(n);
  bool ok = h != NULL;
  if (ok)
    ok = !GCK(cudaMemcpy(h, dptr(&kc->q), qbytes, cudaMemcpyDeviceToHost)) &&
         memcmp(h, kc->hq, qbytes) == 0 &&
         !GCK(cudaMemcpy(h, dptr(&kc->k), kvbytes, cudaMemcpyDeviceToHost)) &&
         memcmp(h, kc->hk, kvbytes) == 0 &&
         !GCK(cudaMemcpy(h, dptr(&kc->v), kvbytes, cudaMemcpyDeviceToHost)) &&
         memcmp(h, kc->hv, kvbytes) == 0;
  free(h);
  return ok;
}

static void kapi_case(tgroup *g, const tprob *p, uint64_t seed, cudaStream_t s, int smem_max,
                      bool hopper) {
  char desc[200], why[400] = "", kdesc[160] = "";
  tdesc(p, desc, sizeof desc);
  g_set_current("kapi: %s", desc);
  if (g_dead) {
    tg_case(g, false, "%s: not run (CUDA context broken earlier)", desc);
    return;
  }
  kcase kc;
  memset(&kc, 0, sizeof kc);
  tcase_init(&kc.c, p, seed);
  tcase *c = &kc.c;
  attn_status st = {0};
  bool ok = false, same = true;
  terr err[2];
  memset(err, 0, sizeof err);
  float ms = 0;
  cudaEvent_t ev[2] = {NULL, NULL};
  unsigned char *run1 = NULL; /* run 1's padded O, to compare bits with run 2 */
  attn_cu_params prm;
  tcu_params(p, &prm);
  attn_cu_choice ch;
  memset(&ch, 0, sizeof ch);
  /* the Hopper instance takes only unsplit, unpacked choices: ask for one */
  const unsigned off =
      hopper ? ATTN_CU_HOPPER_OFF | ATTN_CU_SPLIT_BIT | ATTN_CU_PACK_BIT : ATTN_CU_HOPPER_OFF;
  int rc = attn_cu_select_masked(&prm, g_sms, off, &ch, &st);
  if (rc != 0) {
    snprintf(why, sizeof why, "attn_cu_select: %s: %s", attn_err_name(rc), st.message);
    goto out;
  }
  if (hopper && !attn_cu_select_hopper(&prm, g_sms, &ch)) {
    snprintf(why, sizeof why, "attn_cu_select_hopper refused the problem");
    goto out;
  }
  snprintf(kdesc, sizeof kdesc, "[%s/%d %dx%d %dw %zuB (%u,%u,%u)]", attn_cu_kernel_name(ch.kernel),
           ch.nsplit, ch.block_m, ch.block_n, ch.warps, ch.smem_bytes, ch.grid[0], ch.grid[1],
           ch.grid[2]);
  if (ch.nsplit > 1)
    g->split++;
  if (ch.nsplit < 1 || !ch.grid[0] || !ch.grid[1] || !ch.grid[2] || ch.warps < 1) {
    snprintf(why, sizeof why, "attn_cu_select returned an impossible launch shape");
    goto out;
  }
  if (ch.smem_bytes > (size_t)smem_max) {
    snprintf(why, sizeof why, "the choice needs %zu bytes of shared memory; the device allows %d",
             ch.smem_bytes, smem_max);
    goto out;
  }
  if (tref_compute(c, g_opt.ref_threads, &kc.ref, &st) < 0) {
    snprintf(why, sizeof why, "the reference failed: %s", st.message);
    goto out;
  }
  kc.have_ref = true;
  size_t es = attn_dtype_size(p->dt);
  size_t rq = (size_t)(p->b * p->hq * p->nq), rkv = (size_t)(p->b * p->hkv * p->nkv);
  size_t qbytes = rq * (size_t)prm.dp * es, kvbytes = rkv * (size_t)prm.dp * es;
  size_t wsb = attn_cu_split_bytes(&prm, &ch);
  kc.hq = pad_rows(c->q, rq, p->d, prm.dp, es);
  kc.hk = pad_rows(c->k, rkv, p->d, prm.dp, es);
  kc.hv = pad_rows(c->v, rkv, p->d, prm.dp, es);
  kc.ho = malloc(qbytes);
  if (!kc.hq || !kc.hk || !kc.hv || !kc.ho) {
    snprintf(why, sizeof why, "out of host memory");
    goto out;
  }
  if (dalloc(&kc.q, qbytes) || dalloc(&kc.k, kvbytes) || dalloc(&kc.v, kvbytes) ||
      dalloc(&kc.o, qbytes) ||
      (p->stats && (dalloc(&kc.m, rq * 4) || dalloc(&kc.l, rq * 4) || dalloc(&kc.lse, rq * 4))) ||
      (wsb && dalloc(&kc.ws, wsb))) {
    snprintf(why, sizeof why, "device allocation failed (%zu + 2 x %zu bytes)", qbytes, kvbytes);
    goto out;
  }
  if (GCK(cudaMemcpy(dptr(&kc.q), kc.hq, qbytes, cudaMemcpyHostToDevice)) ||
      GCK(cudaMemcpy(dptr(&kc.k), kc.hk, kvbytes, cudaMemcpyHostToDevice)) ||
      GCK(cudaMemcpy(dptr(&kc.v), kc.hv, kvbytes, cudaMemcpyHostToDevice)) ||
      GCK(cudaEventCreate(&ev[0])) || GCK(cudaEventCreate(&ev[1]))) {
    snprintf(why, sizeof why, "upload failed");
    goto out;
  }
  prm.q = dptr(&kc.q);
  prm.k = dptr(&kc.k);
  prm.v = dptr(&kc.v);
  prm.o = dptr(&kc.o);
  prm.m = dptr(&kc.m);
  prm.l = dptr(&kc.l);
  prm.lse = dptr(&kc.lse);
  prm.split_ws = wsb ? dptr(&kc.ws) : NULL;
  ok = true;
  for (int run = 0; run < 2 && ok; run++) {
    /* poison outputs and scratch: NaN bits everywhere */
    if (GCK(cudaMemsetAsync(prm.o, 0xff, qbytes, s)) ||
        (p->stats && (GCK(cudaMemsetAsync(prm.m, 0xff, rq * 4, s)) ||
                      GCK(cudaMemsetAsync(prm.l, 0xff, rq * 4, s)) ||
                      GCK(cudaMemsetAsync(prm.lse, 0xff, rq * 4, s)))) ||
        (wsb && GCK(cudaMemsetAsync(prm.split_ws, 0xff, wsb, s))) ||
        GCK(cudaEventRecord(ev[0], s))) {
      snprintf(why, sizeof why, "run %d: poisoning failed", run + 1);
      ok = false;
      break;
    }
    int lrc = attn_cu_launch(&prm, &ch, s);
    if (GCK(lrc) || GCK(cudaEventRecord(ev[1], s)) || GCK(cudaStreamSynchronize(s)) ||
        GCK(cudaGetLastError()) || GCK(cudaEventElapsedTime(&ms, ev[0], ev[1]))) {
      snprintf(why, sizeof why, "run %d: the launch failed (attn_cu_launch returned %d)", run + 1,
               lrc);
      ok = false;
      break;
    }
    tcase_poison(c);
    if (GCK(cudaMemcpy(kc.ho, prm.o, qbytes, cudaMemcpyDeviceToHost)) ||
        (p->stats && (GCK(cudaMemcpy(c->m, prm.m, rq * 4, cudaMemcpyDeviceToHost)) ||
                      GCK(cudaMemcpy(c->l, prm.l, rq * 4, cudaMemcpyDeviceToHost)) ||
                      GCK(cudaMemcpy(c->lse, prm.lse, rq * 4, cudaMemcpyDeviceToHost))))) {
      snprintf(why, sizeof why, "run %d: download failed", run + 1);
      ok = false;
      break;
    }
    if (run == 0) {
      run1 = malloc(qbytes);
      if (run1)
        memcpy(run1, kc.ho, qbytes);
    } else if (run1) {
      same = memcmp(run1, kc.ho, qbytes) == 0;
    }
    unpad_rows(c->o, kc.ho, rq, p->d, prm.dp, es);
    err[run] = tref_check(c, &kc.ref);
    if (!g_judge(g, p->dt, p->stats, &err[run], run, why, sizeof why))
      ok = false;
  }
  free(run1);
  if (ok && !same)
    g->nondet++;
  if (ok) {
    long dmg = 0;
    dbuf *all[8] = {&kc.q, &kc.k, &kc.v, &kc.o, &kc.m, &kc.l, &kc.lse, &kc.ws};
    static const char *const names[8] = {"q", "k", "v", "o", "m", "l", "lse", "split_ws"};
    for (int i = 0; i < 8 && ok; i++) {
      dmg = guard_damage(all[i]);
      if (dmg) {
        snprintf(why, sizeof why, "%ld guard bytes around %s were overwritten (or unreadable)", dmg,
                 names[i]);
        ok = false;
      }
    }
    if (ok && !inputs_intact(&kc, qbytes, kvbytes)) {
      snprintf(why, sizeof why, "the launch changed its inputs Q, K or V");
      ok = false;
    }
  }
out:
  if (ev[0])
    GCK(cudaEventDestroy(ev[0]));
  if (ev[1])
    GCK(cudaEventDestroy(ev[1]));
  if (ok)
    tg_case(g, true, "%s %s O %.2e stats %.2e kernel %.3f ms%s", desc, kdesc,
            fmax(err[0].o, err[1].o), fmax(err[0].stats, err[1].stats), (double)ms,
            same ? "" : " (runs differ in bits)");
  else
    tg_case(g, false, "%s %s seed %#llx: %s", desc, kdesc, (unsigned long long)seed, why);
  kcase_free(&kc);
}

/* ---- paged K/V (kernels.h's paged view) -------------------------------- */

/* One paged case: the packed launch (run 0) and the paged one (run 1) of
 * the same problem and choice, each output set of its own. */
typedef struct pgcase {
  tcase c;
  tref ref;
  bool have_ref;
  tpaged pg;
  dbuf q, k, v, ws, pool, kt, vt;
  dbuf o[2], st[2][3]; /* per run: O; m, l, lse */
  unsigned char *hq, *hk, *hv, *ho[2];
} pgcase;

/* Every device buffer of a paged case, with its name for guard reports. */
static int pg_bufs(pgcase *x, dbuf **all, const char **names) {
  static const char *const nm[] = {"q",       "k",       "v",       "split_ws", "page pool",
                                   "k_table", "v_table", "o",       "m",        "l",
                                   "lse",     "paged o", "paged m", "paged l",  "paged lse"};
  dbuf *b[] = {&x->q,        &x->k,    &x->v,        &x->ws,       &x->pool,
               &x->kt,       &x->vt,   &x->o[0],     &x->st[0][0], &x->st[0][1],
               &x->st[0][2], &x->o[1], &x->st[1][0], &x->st[1][1], &x->st[1][2]};
  for (int i = 0; i < 15; i++) {
    all[i] = b[i];
    names[i] = nm[i];
  }
  return 15;
}

static void pg_free(pgcase *x) {
  dbuf *all[15];
  const char *names[15];
  for (int i = 0, n = pg_bufs(x, all, names); i < n; i++)
    dfree(all[i]);
  free(x->hq);
  free(x->hk);
  free(x->hv);
  free(x->ho[0]);
  free(x->ho[1]);
  tpaged_free(&x->pg);
  if (x->have_ref)
    tref_free(&x->ref);
  tcase_free(&x->c);
}

/* Host copies: padded Q, K, V, their pages, room for both runs' O. */
static int pg_host(pgcase *x, const attn_cu_params *prm, int page_tokens, size_t page_bytes,
                   uint64_t seed) {
  const tprob *p = &x->c.p;
  size_t es = attn_dtype_size(p->dt);
  size_t rq = (size_t)(p->b * p->hq * p->nq), rkv = (size_t)(p->b * p->hkv * p->nkv);
  x->hq = pad_rows(x->c.q, rq, p->d, prm->dp, es);
  x->hk = pad_rows(x->c.k, rkv, p->d, prm->dp, es);
  x->hv = pad_rows(x->c.v, rkv, p->d, prm->dp, es);
  x->ho[0] = malloc(rq * (size_t)prm->dp * es);
  x->ho[1] = malloc(rq * (size_t)prm->dp * es);
  if (!x->hq || !x->hk || !x->hv || !x->ho[0] || !x->ho[1])
    return -1;
  return tpaged_make(&x->pg, x->hk, x->hv, p->b * p->hkv, p->nkv, (size_t)prm->dp * es, page_tokens,
                     page_bytes, seed);
}

/* Device buffers (each between guards) and the uploads. */
static int pg_device(pgcase *x, size_t qbytes, size_t kvbytes, size_t rq, size_t wsb) {
  size_t tbytes = (size_t)(x->c.p.b * x->c.p.hkv * x->pg.per_head) * sizeof(int32_t);
  if (dalloc(&x->q, qbytes) || dalloc(&x->k, kvbytes) || dalloc(&x->v, kvbytes) ||
      dalloc(&x->pool, x->pg.bytes) || dalloc(&x->kt, tbytes) || dalloc(&x->vt, tbytes) ||
      (wsb && dalloc(&x->ws, wsb)))
    return -1;
  for (int r = 0; r < 2; r++)
    if (dalloc(&x->o[r], qbytes) || dalloc(&x->st[r][0], rq * 4) || dalloc(&x->st[r][1], rq * 4) ||
        dalloc(&x->st[r][2], rq * 4))
      return -1;
  const void *src[] = {x->hq, x->hk, x->hv, x->pg.pool, x->pg.k_table, x->pg.v_table};
  dbuf *dst[] = {&x->q, &x->k, &x->v, &x->pool, &x->kt, &x->vt};
  for (int i = 0; i < 6; i++)
    if (GCK(cudaMemcpy(dptr(dst[i]), src[i], dst[i]->bytes, cudaMemcpyHostToDevice)))
      return -1;
  return 0;
}

/* Run r: poison its outputs and the scratch, launch, download O (padded,
 * into ho[r]) and the statistics (into the tcase). */
static int pg_run(pgcase *x, int r, attn_cu_params prm, const attn_cu_choice *ch, cudaStream_t s,
                  size_t rq) {
  prm.o = dptr(&x->o[r]);
  prm.m = dptr(&x->st[r][0]);
  prm.l = dptr(&x->st[r][1]);
  prm.lse = dptr(&x->st[r][2]);
  prm.split_ws = dptr(&x->ws);
  float *host[3] = {x->c.m, x->c.l, x->c.lse};
  if (GCK(cudaMemsetAsync(prm.o, 0xff, x->o[r].bytes, s)) ||
      (prm.split_ws && GCK(cudaMemsetAsync(prm.split_ws, 0xff, x->ws.bytes, s))))
    return -1;
  for (int i = 0; i < 3; i++)
    if (GCK(cudaMemsetAsync(dptr(&x->st[r][i]), 0xff, rq * 4, s)))
      return -1;
  if (GCK(attn_cu_launch(&prm, ch, s)) || GCK(cudaStreamSynchronize(s)) ||
      GCK(cudaMemcpy(x->ho[r], prm.o, x->o[r].bytes, cudaMemcpyDeviceToHost)))
    return -1;
  for (int i = 0; i < 3; i++)
    if (GCK(cudaMemcpy(host[i], dptr(&x->st[r][i]), rq * 4, cudaMemcpyDeviceToHost)))
      return -1;
  return 0;
}

static size_t zmax(size_t a, size_t b) { return a > b ? a : b; }

/* ||paged O − packed O|| / ||packed O|| over the padded outputs. */
static double pg_diff(const pgcase *x, size_t n) {
  double d = 0, ref = 0;
  for (size_t i = 0; i < n; i++) {
    double a = attn_load_elem(x->ho[0], x->c.p.dt, i), b = attn_load_elem(x->ho[1], x->c.p.dt, i);
    d += (a - b) * (a - b);
    ref += a * a;
  }
  return isnan(d) ? INFINITY : ref > 0 ? sqrt(d / ref) : sqrt(d);
}

/* Guards of every buffer, and the inputs (pages and tables too) unchanged. */
static bool pg_intact(pgcase *x, char *why, size_t cap) {
  dbuf *all[15];
  const char *names[15];
  int n = pg_bufs(x, all, names);
  for (int i = 0; i < n; i++) {
    long dmg = guard_damage(all[i]);
    if (dmg) {
      snprintf(why, cap, "%ld guard bytes around %s were overwritten (or unreadable)", dmg,
               names[i]);
      return false;
    }
  }
  const void *want[] = {x->hq, x->hk, x->hv, x->pg.pool, x->pg.k_table, x->pg.v_table};
  const dbuf *got[] = {&x->q, &x->k, &x->v, &x->pool, &x->kt, &x->vt};
  bool ok = true;
  for (int i = 0; i < 6 && ok; i++) {
    unsigned char *h = malloc(got[i]->bytes);
    ok = h && !GCK(cudaMemcpy(h, dptr(got[i]), got[i]->bytes, cudaMemcpyDeviceToHost)) &&
         memcmp(h, want[i], got[i]->bytes) == 0;
    free(h);
  }
  if (!ok)
    snprintf(why, cap, "the launches changed their inputs (Q, K, V, pages or tables)");
  return ok;
}

/* The two runs judged: each against float64, paged against packed. */
static bool pg_judge(tgroup *g, pgcase *x, int r, const attn_cu_params *prm, char *why, size_t cap,
                     terr *err) {
  const tprob *p = &x->c.p;
  size_t rq = (size_t)(p->b * p->hq * p->nq);
  unpad_rows(x->c.o, x->ho[r], rq, p->d, prm->dp, attn_dtype_size(p->dt));
  *err = tref_check(&x->c, &x->ref);
  return g_judge(g, p->dt, p->stats, err, r, why, cap);
}

static void paged_case(tgroup *g, const tprob *p, int page_tokens, size_t page_bytes, uint64_t seed,
                       cudaStream_t s) {
  char desc[200], why[400] = "";
  tdesc(p, desc, sizeof desc);
  g_set_current("kapi paged: %s", desc);
  pgcase x;
  memset(&x, 0, sizeof x);
  tcase_init(&x.c, p, seed);
  attn_cu_params prm, paged;
  tcu_params(p, &prm);
  paged = prm;
  static const int32_t any_table[1];
  paged.k_table = paged.v_table = any_table; /* for the choice; the device's are set below */
  attn_cu_choice ch, pch;                    /* pch: the 192 instance where ch is the 160 one */
  attn_status st = {0};
  terr err[2];
  double diff = INFINITY;
  memset(err, 0, sizeof err);
  bool ok = false;
  size_t es = attn_dtype_size(p->dt), rq = (size_t)(p->b * p->hq * p->nq);
  size_t qbytes = rq * (size_t)prm.dp * es,
         kvbytes = (size_t)(p->b * p->hkv * p->nkv) * prm.dp * es;
  if (attn_cu_select(&prm, g_sms, &ch, &st) != 0 || attn_cu_select(&paged, g_sms, &pch, &st) != 0)
    snprintf(why, sizeof why, "attn_cu_select: %s", st.message);
  else if (tref_compute(&x.c, g_opt.ref_threads, &x.ref, &st) < 0)
    snprintf(why, sizeof why, "the reference failed: %s", st.message);
  else if ((x.have_ref = true, pg_host(&x, &prm, page_tokens, page_bytes, seed ^ 0x5eed)) ||
           pg_device(&x, qbytes, kvbytes, rq,
                     zmax(attn_cu_split_bytes(&prm, &ch), attn_cu_split_bytes(&paged, &pch))))
    snprintf(why, sizeof why, "out of host or device memory, or an upload failed");
  else {
    paged.q = prm.q = dptr(&x.q);
    prm.k = dptr(&x.k);
    prm.v = dptr(&x.v);
    paged.k_table = dptr(&x.kt);
    paged.v_table = dptr(&x.vt);
    paged.page_base = dptr(&x.pool);
    paged.page_bytes = page_bytes;
    paged.page_tokens = page_tokens;
    paged.pages_per_head = x.pg.per_head;
    ok = !pg_run(&x, 0, prm, &ch, s, rq) && pg_judge(g, &x, 0, &prm, why, sizeof why, &err[0]) &&
         !pg_run(&x, 1, paged, &pch, s, rq) && pg_judge(g, &x, 1, &prm, why, sizeof why, &err[1]);
    if (!ok && !why[0])
      snprintf(why, sizeof why, "a launch, poisoning or download failed");
    diff = ok ? pg_diff(&x, rq * (size_t)prm.dp) : diff;
    if (ok && !(diff <= g_tol_o(p->dt)))
      ok = false, snprintf(why, sizeof why, "paged O differs from packed O by %.3g", diff);
    ok = ok && pg_intact(&x, why, sizeof why);
  }
  if (ok)
    tg_case(g, true, "paged %s [%s/%d pack %d, pages of %d] O %.2e vs packed %.2e%s", desc,
            attn_cu_kernel_name(pch.kernel), pch.nsplit, pch.pack, page_tokens, err[1].o, diff,
            diff == 0 ? " (same bits)" : "");
  else
    tg_case(g, false, "paged %s, pages of %d, seed %#llx: %s", desc, page_tokens,
            (unsigned long long)seed, why);
  pg_free(&x);
}

/* Paged problems: decodes that split and pack (the sessions' main use),
 * every dtype, head dims 37 to 256, masks, pages of 64 to 512 tokens. */
static int paged_list(tprob *ps, int *tokens, size_t *bytes) {
  int n = 0;
#define PAGED(prob, t, b) (ps[n] = (prob), tokens[n] = (t), bytes[n] = (b), n++)
  PAGED(tprob_make(1, 32, 8, 1, 32768, 128, ATTN_BF16), 256, 65536);
  PAGED(tprob_make(2, 8, 2, 300, 300, 64, ATTN_F16), 512, 65536);
  PAGED(tprob_make(1, 2, 1, 77, 200, 37, ATTN_F32), 64, 64 * 40 * 4);
  PAGED(tprob_make(4, 16, 4, 1, 8192, 256, ATTN_F16), 128, 65536);
  PAGED(tprob_make(1, 4, 4, 1000, 1000, 90, ATTN_BF16), 320, 320 * 96 * 2);
  PAGED(tprob_make(1, 8, 1, 4, 5000, 160, ATTN_BF16), 192, 192 * 160 * 2);
  PAGED(tprob_make(2, 4, 2, 1, 3000, 64, ATTN_F32), 256, 65536);
  PAGED(tprob_make(1, 4, 2, 129, 700, 192, ATTN_F16), 64, 64 * 192 * 2 + 256);
#undef PAGED
  ps[1].causal = ps[5].causal = ps[7].causal = true;
  ps[2].wl = 16, ps[2].wr = 3;
  for (int i = 0; i < n; i++)
    ps[i].stats = true;
  return n;
}

/* ---- per-entry key lengths (kernels.h's seqused_k) --------------------- */

/* A batch of sessions in one paged launch (run 0) and each entry launched
 * alone (run 1: batch 1, seq_kv its length, its rows of Q and its tables). */
typedef struct sqcase {
  tbatch t;
  tcase cs[5];
  tref ref[5];
  int ncs, nref;
  dbuf q, pool, kt, vt, used, ws;
  dbuf o[2], st[2][3];
  unsigned char *ho[2];
  float *hs[2][3];
} sqcase;

static void sq_free(sqcase *x) {
  dbuf *b[] = {&x->q, &x->pool, &x->kt, &x->vt, &x->used, &x->ws, &x->o[0], &x->o[1]};
  for (int i = 0; i < 8; i++)
    dfree(b[i]);
  for (int r = 0; r < 2; r++) {
    free(x->ho[r]);
    for (int i = 0; i < 3; i++) {
      dfree(&x->st[r][i]);
      free(x->hs[r][i]);
    }
  }
  for (int e = 0; e < x->nref; e++)
    tref_free(&x->ref[e]);
  for (int e = 0; e < x->ncs; e++)
    tcase_free(&x->cs[e]);
  tbatch_free(&x->t);
}

/* Device copies of Q, the pages, tables and lengths; output room for both
 * runs (the batched one's size) and wsb bytes of split scratch. */
static int sq_device(sqcase *x, size_t orow, size_t rows, size_t wsb) {
  const tbatch *t = &x->t;
  size_t tbytes = (size_t)(t->n * x->cs[0].p.hkv * t->pg.per_head) * sizeof(int32_t);
  if (dalloc(&x->q, rows * orow) || dalloc(&x->pool, t->pg.bytes) || dalloc(&x->kt, tbytes) ||
      dalloc(&x->vt, tbytes) || dalloc(&x->used, (size_t)t->n * 4) || (wsb && dalloc(&x->ws, wsb)))
    return -1;
  for (int r = 0; r < 2; r++) {
    if (dalloc(&x->o[r], rows * orow) || !(x->ho[r] = malloc(rows * orow)))
      return -1;
    for (int i = 0; i < 3; i++)
      if (dalloc(&x->st[r][i], rows * 4) || !(x->hs[r][i] = malloc(rows * 4)))
        return -1;
  }
  const void *src[] = {t->q, t->pg.pool, t->pg.k_table, t->pg.v_table, t->lens};
  dbuf *dst[] = {&x->q, &x->pool, &x->kt, &x->vt, &x->used};
  for (int i = 0; i < 5; i++)
    if (GCK(cudaMemcpy(dptr(dst[i]), src[i], dst[i]->bytes, cudaMemcpyHostToDevice)))
      return -1;
  return 0;
}

/* Run r of prm (rows of output): poison, launch, download into ho[r], hs[r]. */
static int sq_run(sqcase *x, int r, attn_cu_params prm, const attn_cu_choice *ch, size_t rows,
                  size_t orow, cudaStream_t s) {
  prm.o = dptr(&x->o[r]);
  prm.m = dptr(&x->st[r][0]);
  prm.l = dptr(&x->st[r][1]);
  prm.lse = dptr(&x->st[r][2]);
  prm.split_ws = dptr(&x->ws);
  if (GCK(cudaMemsetAsync(prm.o, 0xff, x->o[r].bytes, s)) ||
      (prm.split_ws && GCK(cudaMemsetAsync(prm.split_ws, 0xff, x->ws.bytes, s))))
    return -1;
  for (int i = 0; i < 3; i++)
    if (GCK(cudaMemsetAsync(dptr(&x->st[r][i]), 0xff, x->st[r][i].bytes, s)))
      return -1;
  if (GCK(attn_cu_launch(&prm, ch, s)) || GCK(cudaStreamSynchronize(s)) ||
      GCK(cudaMemcpy(x->ho[r], prm.o, rows * orow, cudaMemcpyDeviceToHost)))
    return -1;
  for (int i = 0; i < 3; i++)
    if (GCK(cudaMemcpy(x->hs[r][i], dptr(&x->st[r][i]), rows * 4, cudaMemcpyDeviceToHost)))
      return -1;
  return 0;
}

/* The paged view of x's pages, entry b's tables first. */
static void sq_paged(sqcase *x, attn_cu_params *prm, int b, int page_tokens, size_t page_bytes) {
  const size_t at = (size_t)b * (size_t)(x->cs[0].p.hkv * x->t.pg.per_head);
  prm->k_table = (const int32_t *)dptr(&x->kt) + at;
  prm->v_table = (const int32_t *)dptr(&x->vt) + at;
  prm->page_base = dptr(&x->pool);
  prm->page_bytes = page_bytes;
  prm->page_tokens = page_tokens;
  prm->pages_per_head = x->t.pg.per_head;
}

/* Entry b of the batched run (rows from b·rows): alone within the
 * tolerance of O, against float64, or with no key O 0 and empty stats. */
static bool sq_entry(tgroup *g, sqcase *x, int b, size_t rows, size_t orow, int page_tokens,
                     size_t page_bytes, cudaStream_t s, char *why, size_t cap) {
  tcase *c = &x->cs[b];
  const unsigned char *o = x->ho[0] + (size_t)b * rows * orow;
  const size_t r0 = (size_t)b * rows, es = attn_dtype_size(c->p.dt);
  if (x->t.lens[b] == 0) {
    bool ok = true;
    for (size_t i = 0; i < rows * orow; i++)
      ok = ok && o[i] == 0;
    for (size_t r = 0; r < rows; r++)
      ok = ok && x->hs[0][0][r0 + r] == -INFINITY && x->hs[0][1][r0 + r] == 0.0f &&
           x->hs[0][2][r0 + r] == -INFINITY;
    if (!ok)
      snprintf(why, cap, "entry %d of no key: O not 0 or its stats not empty", b);
    return ok;
  }
  attn_cu_params prm;
  tcu_params(&c->p, &prm);
  prm.q = (unsigned char *)dptr(&x->q) + r0 * orow;
  sq_paged(x, &prm, b, page_tokens, page_bytes);
  attn_cu_choice ch;
  attn_status st = {0};
  if (attn_cu_select(&prm, g_sms, &ch, &st) != 0 || attn_cu_split_bytes(&prm, &ch) > x->ws.bytes ||
      sq_run(x, 1, prm, &ch, rows, orow, s)) {
    snprintf(why, cap, "entry %d alone: no choice, scratch or launch (%s)", b, st.message);
    return false;
  }
  double d = 0, ref = 0;
  for (size_t i = 0; i < rows * orow / es; i++) {
    double a = attn_load_elem(x->ho[1], c->p.dt, i), e = attn_load_elem(o, c->p.dt, i);
    d += (a - e) * (a - e);
    ref += a * a;
  }
  d = isnan(d) ? INFINITY : ref > 0 ? sqrt(d / ref) : sqrt(d);
  if (!(d <= g_tol_o(c->p.dt))) {
    snprintf(why, cap, "entry %d differs from its launch alone by %.3g", b, d);
    return false;
  }
  unpad_rows(c->o, o, rows, c->p.d, prm.dp, es);
  memcpy(c->m, x->hs[0][0] + r0, rows * 4);
  memcpy(c->l, x->hs[0][1] + r0, rows * 4);
  memcpy(c->lse, x->hs[0][2] + r0, rows * 4);
  terr err = tref_check(c, &x->ref[b]);
  return g_judge(g, c->p.dt, true, &err, b, why, cap);
}

/* Guards of every buffer, and Q, pages, tables and lengths unchanged. */
static bool sq_intact(sqcase *x, char *why, size_t cap) {
  dbuf *all[] = {&x->q,        &x->pool,     &x->kt,       &x->vt,       &x->used,
                 &x->ws,       &x->o[0],     &x->o[1],     &x->st[0][0], &x->st[0][1],
                 &x->st[0][2], &x->st[1][0], &x->st[1][1], &x->st[1][2]};
  for (int i = 0; i < 14; i++)
    if (guard_damage(all[i])) {
      snprintf(why, cap, "guard bytes around buffer %d were overwritten", i);
      return false;
    }
  const void *want[] = {x->t.q, x->t.pg.pool, x->t.pg.k_table, x->t.pg.v_table, x->t.lens};
  const dbuf *got[] = {&x->q, &x->pool, &x->kt, &x->vt, &x->used};
  bool ok = true;
  for (int i = 0; i < 5 && ok; i++) {
    unsigned char *h = malloc(got[i]->bytes);
    ok = h && !GCK(cudaMemcpy(h, dptr(got[i]), got[i]->bytes, cudaMemcpyDeviceToHost)) &&
         memcmp(h, want[i], got[i]->bytes) == 0;
    free(h);
  }
  if (!ok)
    snprintf(why, cap, "the launches changed their inputs (Q, pages, tables or lengths)");
  return ok;
}

/* Batch entries of n lengths, each of shape p (b 1), in one launch. */
static void seqused_case(tgroup *g, const tprob *p, const int *lens, int n, int page_tokens,
                         size_t page_bytes, uint64_t seed, cudaStream_t s) {
  char desc[200], why[400] = "";
  tprob bp = *p;
  bp.b = n;
  tdesc(&bp, desc, sizeof desc);
  g_set_current("kapi seqused_k: %s", desc);
  sqcase x;
  memset(&x, 0, sizeof x);
  attn_status st = {0};
  bool ok = true;
  for (int b = 0; b < n; b++) {
    tprob e = *p;
    e.b = 1, e.nkv = lens[b] > 0 ? lens[b] : 1, e.stats = true;
    tcase_init(&x.cs[b], &e, seed + (uint64_t)b);
    x.ncs = b + 1;
    ok = ok && tref_compute(&x.cs[b], g_opt.ref_threads, &x.ref[b], &st) == 0;
    x.nref += ok;
  }
  attn_cu_params prm, alone;
  tcu_params(&x.cs[0].p, &alone);
  const size_t es = attn_dtype_size(p->dt), rows = (size_t)(p->hq * p->nq);
  const size_t orow = (size_t)alone.dp * es;
  attn_cu_choice ch;
  if (!ok)
    snprintf(why, sizeof why, "the reference failed: %s", st.message);
  else if (tbatch_make(&x.t, x.cs, lens, n, alone.dp, page_tokens, page_bytes, seed ^ 0x5eed))
    ok = false, snprintf(why, sizeof why, "out of host memory");
  if (ok) {
    bp.nkv = x.t.maxk;
    tcu_params(&bp, &prm);
    static const int32_t any_table[1];
    prm.k_table = prm.v_table = any_table; /* for the choice */
    ok = attn_cu_select(&prm, g_sms, &ch, &st) == 0;
    if (!ok)
      snprintf(why, sizeof why, "attn_cu_select: %s", st.message);
  }
  /* Scratch for the batched choice, more than any entry alone needs (fewer
   * rows, at most ATTN_CU_MAX_SPLITS splits). */
  const size_t wsb = (size_t)ATTN_CU_MAX_SPLITS * (size_t)n * rows * (size_t)(alone.dp + 2) * 4;
  if (ok && sq_device(&x, orow, (size_t)n * rows, wsb))
    ok = false, snprintf(why, sizeof why, "out of device memory, or an upload failed");
  if (ok) {
    prm.q = dptr(&x.q);
    sq_paged(&x, &prm, 0, page_tokens, page_bytes);
    prm.seqused_k = (const int32_t *)dptr(&x.used);
    ok = !sq_run(&x, 0, prm, &ch, (size_t)n * rows, orow, s);
    if (!ok)
      snprintf(why, sizeof why, "the batched launch failed");
    for (int b = 0; b < n && ok; b++)
      ok = sq_entry(g, &x, b, rows, orow, page_tokens, page_bytes, s, why, sizeof why);
    ok = ok && sq_intact(&x, why, sizeof why);
  }
  if (ok)
    tg_case(g, true, "seqused_k %s [%s/%d pack %d, pages of %d]: each entry as alone", desc,
            attn_cu_kernel_name(ch.kernel), ch.nsplit, ch.pack, page_tokens);
  else
    tg_case(g, false, "seqused_k %s, pages of %d, seed %#llx: %s", desc, page_tokens,
            (unsigned long long)seed, why);
  sq_free(&x);
}

/* Sessions' decodes batched (Nq 1, packed GQA, split), short queries (Nq
 * 4) causal, F32, an entry of no key, one shorter than its queries. */
static void seqused_cases(tgroup *g, int grp, int idx, cudaStream_t s) {
  static const int l0[] = {1, 300, 1000, 64, 0}, l1[] = {3, 1000, 300}, l2[] = {4000, 0, 257, 64},
                   l3[] = {513, 1, 64, 700};
  tprob p = tprob_make(1, 32, 8, 1, 1, 128, ATTN_BF16);
  seqused_case(g, &p, l0, 5, 256, 65536, g_seed(grp, idx, 0), s);
  p = tprob_make(1, 4, 4, 4, 1, 64, ATTN_F16);
  p.causal = true;
  seqused_case(g, &p, l1, 3, 64, 64 * 64 * 2, g_seed(grp, idx + 1, 0), s);
  p = tprob_make(1, 2, 1, 1, 1, 96, ATTN_F32);
  seqused_case(g, &p, l2, 4, 128, 65536, g_seed(grp, idx + 2, 0), s);
  p = tprob_make(1, 6, 2, 4, 1, 160, ATTN_F16);
  p.causal = true;
  seqused_case(g, &p, l3, 4, 192, 192 * 160 * 2, g_seed(grp, idx + 3, 0), s);
}

void group_kapi(tgroup *g, int grp) {
  if (g_dead) {
    tg_case(g, false, "not run (CUDA context broken earlier)");
    return;
  }
  int smem_max = 0;
  cudaStream_t s = NULL;
  if (GCK(cudaSetDevice(0)) ||
      GCK(cudaDeviceGetAttribute(&smem_max, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0)) ||
      GCK(attn_cu_prepare()) || GCK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking))) {
    tg_case(g, false, "setup failed (device, attn_cu_prepare or stream)");
    return;
  }
  tprob ps[16];
  int n = kapi_list(ps);
  if (g_opt.small)
    n = 3;
  for (int i = 0; i < n; i++)
    kapi_case(g, &ps[i], g_seed(grp, i, 0), s, smem_max, false);
  int tokens[16];
  size_t bytes[16];
  int np = paged_list(ps, tokens, bytes);
  if (g_opt.small)
    np = 2;
  for (int i = 0; i < np && !g_dead; i++)
    paged_case(g, &ps[i], tokens[i], bytes[i], g_seed(grp, n + i, 0), s);
  if (!g_opt.small && !g_dead)
    seqused_cases(g, grp, n + np, s);
  GCK(cudaStreamDestroy(s));
}

static int hopper_list(tprob *ps) {
  static const int dims[] = {64, 96, 128, 192, 256, 40, 72, 136, 160, 200, 8};
  int n = 0;
  for (int i = 0; i < 11; i++)
    for (int dt = 0; dt < 2; dt++) {
      tprob p = tprob_make(1 + i % 2, 4, i % 3 ? 2 : 4, 300 + 67 * i, 300 + 41 * i, dims[i],
                           dt ? ATTN_BF16 : ATTN_F16);
      p.causal = (i + dt) % 2;
      p.stats = dt;
      ps[n++] = p;
    }
  tprob p = tprob_make(2, 16, 4, 2048, 2048, 128, ATTN_BF16); /* units > CTAs */
  p.causal = 1;
  p.stats = 1;
  ps[n++] = p;
  p = tprob_make(1, 8, 8, 1000, 3000, 64, ATTN_F16); /* Nq < Nkv, window */
  p.wl = 200;
  p.wr = 30;
  ps[n++] = p;
  /* a band wide enough that each unit has masked tiles, then whole ones,
   * then masked ones again (the consumer's three loops), each head dim */
  for (int i = 0; i < 5; i++) {
    p = tprob_make(1, 4, 2, 1500, 1500, dims[i], i % 2 ? ATTN_BF16 : ATTN_F16);
    p.wl = 600;
    p.wr = 350;
    p.stats = 1;
    ps[n++] = p;
  }
  p = tprob_make(1, 4, 1, 700, 130, 128, ATTN_BF16); /* Nq > Nkv: rows see nothing */
  p.causal = 1;
  p.stats = 1;
  ps[n++] = p;
  p = tprob_make(1, 2, 2, 1, 1, 256, ATTN_F16);
  p.stats = 1;
  ps[n++] = p;
  p = tprob_make(4, 16, 16, 4096, 4096, 128, ATTN_BF16);
  ps[n++] = p;
  return n;
}

/* The 16-bit problems of a conformance list, packed (the kernels never see
 * strides: the backend packs). */
static int hopper_conformance(tprob *ps, int n) {
  int m = 0;
  for (int i = 0; i < n; i++)
    if (ps[i].dt == ATTN_F16 || ps[i].dt == ATTN_BF16) {
      ps[m] = ps[i];
      ps[m++].strided = false;
    }
  return m;
}

void group_hopper(tgroup *g, int grp) {
  int smem_max = 0, major = 0, minor = 0;
  cudaStream_t s = NULL;
  if (GCK(cudaSetDevice(0)) ||
      GCK(cudaDeviceGetAttribute(&smem_max, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0)) ||
      GCK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0)) ||
      GCK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0))) {
    tg_case(g, false, "setup failed (device attributes)");
    return;
  }
  if (!attn_cu_hopper_built() || major != 9 || minor != 0) {
    snprintf(g->note, sizeof g->note, "skipped: %s",
             attn_cu_hopper_built() ? "the device is not compute capability 9.0"
                                    : "this build has no sm_90a code (CUDA_ARCHS lacks 90a)");
    return;
  }
  if (GCK(attn_cu_prepare()) || GCK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking))) {
    tg_case(g, false, "setup failed (attn_cu_prepare or stream)");
    return;
  }
  static tprob ps[TCASES_MAX];
  int (*const lists[])(tprob *) = {hopper_list, tcases_sizes, tcases_masks, tcases_shapes,
                                   tcases_masked_rows};
  int idx = 0;
  for (int li = 0; li < 5 && !g_dead; li++) {
    int n = lists[li](ps);
    if (li > 0)
      n = hopper_conformance(ps, n);
    if (g_opt.small)
      n = n < 3 ? n : 3;
    for (int i = 0; i < n; i++, idx++)
      kapi_case(g, &ps[i], g_seed(grp, idx, 0), s, smem_max, true);
  }
  GCK(cudaStreamDestroy(s));
}
#else
/* Not called: without CUDA, test_gpu.c's main only reports itself skipped. */
void group_kapi(tgroup *g, int grp) {
  (void)g;
  (void)grp;
}
void group_hopper(tgroup *g, int grp) {
  (void)g;
  (void)grp;
}
#endif /* ATTN_HAVE_CUDA */
