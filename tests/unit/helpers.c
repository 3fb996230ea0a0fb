/* helpers.c — see helpers.h. */
#include "helpers.h"

#include "benchlib.h"
#include "reference.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

uint64_t trand(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

double tuniform(uint64_t *s) { return (double)(trand(s) >> 11) * 0x1p-52 - 1.0; }

tprob tprob_make(int64_t b, int64_t hq, int64_t hkv, int64_t nq, int64_t nkv,
                 int64_t d, attn_dtype dt) {
  tprob p = {.b = b, .hq = hq, .hkv = hkv, .nq = nq, .nkv = nkv, .d = d, .dt = dt,
             .wl = -1, .wr = -1, .scale = NAN};
  return p;
}

/* Strides of a [B, N, H, D] layout seen as [B, H, N, D]. */
static void bnhd(int64_t s[3], int64_t h, int64_t n, int64_t d) {
  s[0] = n * h * d;
  s[1] = d;
  s[2] = h * d;
}

void tcase_init(tcase *c, const tprob *p, uint64_t seed) {
  memset(c, 0, sizeof *c);
  c->p = *p;
  size_t es = attn_dtype_size(p->dt);
  size_t nq = (size_t)(p->b * p->hq * p->nq * p->d), nk = (size_t)(p->b * p->hkv * p->nkv * p->d);
  c->q = malloc(nq * es);
  c->k = malloc(nk * es);
  c->v = malloc(nk * es);
  c->o = malloc(nq * es);
  size_t rows = (size_t)(p->b * p->hq * p->nq);
  if (p->stats) {
    c->m = malloc(rows * 4);
    c->l = malloc(rows * 4);
    c->lse = malloc(rows * 4);
  }
  /* Scores of a few units: softmax neither uniform nor one-hot. */
  for (size_t i = 0; i < nq; i++)
    attn_store_elem(c->q, p->dt, i, (float)(2.0 * tuniform(&seed)));
  for (size_t i = 0; i < nk; i++) {
    attn_store_elem(c->k, p->dt, i, (float)(2.0 * tuniform(&seed)));
    attn_store_elem(c->v, p->dt, i, (float)tuniform(&seed));
  }
  attn_request *r = &c->req;
  attn_request_init(r);
  r->batch = p->b;
  r->heads_q = p->hq;
  r->heads_kv = p->hkv;
  r->seq_q = p->nq;
  r->seq_kv = p->nkv;
  r->head_dim = p->d;
  r->dtype = p->dt;
  r->scale = p->scale;
  r->causal = p->causal;
  r->window_left = p->wl;
  r->window_right = p->wr;
  r->q = c->q;
  r->k = c->k;
  r->v = c->v;
  r->o = c->o;
  r->m = c->m;
  r->l = c->l;
  r->lse = c->lse;
  if (p->strided) {
    bnhd(r->q_stride, p->hq, p->nq, p->d);
    bnhd(r->o_stride, p->hq, p->nq, p->d);
    bnhd(r->k_stride, p->hkv, p->nkv, p->d);
    bnhd(r->v_stride, p->hkv, p->nkv, p->d);
  }
  tcase_poison(c);
}

void tcase_poison(tcase *c) {
  size_t es = attn_dtype_size(c->p.dt);
  size_t nq = (size_t)(c->p.b * c->p.hq * c->p.nq * c->p.d);
  memset(c->o, 0xff, nq * es); /* all-ones bits: a NaN in every dtype */
  size_t rows = (size_t)(c->p.b * c->p.hq * c->p.nq);
  if (c->m) {
    memset(c->m, 0xff, rows * 4);
    memset(c->l, 0xff, rows * 4);
    memset(c->lse, 0xff, rows * 4);
  }
}

void tcase_free(tcase *c) {
  free(c->q);
  free(c->k);
  free(c->v);
  free(c->o);
  free(c->m);
  free(c->l);
  free(c->lse);
}

attn_engine *topen(int threads, const char *isa) {
  attn_config cfg;
  attn_config_init(&cfg);
  cfg.threads = threads;
  cfg.cpu_isa = isa;
  attn_engine *e = NULL;
  attn_status st;
  if (attn_engine_open(&cfg, &e, &st) < 0) {
    fprintf(stderr, "engine open failed: %s\n", st.message);
    abort();
  }
  return e;
}

int trun(attn_engine *e, tcase *c, const char *backend, attn_status *st) {
  c->req.backend = backend;
  return attn_engine_run(e, &c->req, NULL, st);
}

double ttol(attn_dtype dt) {
  switch (dt) {
  case ATTN_F16: return 1e-3;
  case ATTN_BF16: return 8e-3;
  default: return 1e-5;
  }
}

static double rel(double x, double ref) {
  if (isinf(ref) || isinf(x))
    return x == ref ? 0 : INFINITY;
  return fabs(x - ref) / fmax(1.0, fabs(ref));
}

terr tcheck(const tcase *c) {
  const tprob *p = &c->p;
  const attn_request *r = &c->req;
  size_t rows = (size_t)(p->b * p->hq * p->nq), n = rows * (size_t)p->d;
  double *o = malloc(n * sizeof *o), *m = malloc(rows * 8), *l = malloc(rows * 8),
         *lse = malloc(rows * 8);
  attn_status st;
  terr e = {.o = INFINITY, .stats = 0, .masked_ok = true};
  if (attn_reference(r, o, m, l, lse, &st) < 0) {
    fprintf(stderr, "reference failed: %s\n", st.message);
    goto out;
  }
  double num = 0, den = 0, maxerr = 0;
  for (int64_t b = 0; b < p->b; b++)
    for (int64_t h = 0; h < p->hq; h++)
      for (int64_t i = 0; i < p->nq; i++) {
        size_t row = (size_t)((b * p->hq + h) * p->nq + i);
        /* the engine's own strides decide where row (b, h, i) lives */
        int64_t s0 = r->o_stride[0], s1 = r->o_stride[1], s2 = r->o_stride[2];
        if (!s0 && !s1 && !s2) {
          s2 = p->d;
          s1 = p->nq * p->d;
          s0 = p->hq * s1;
        }
        for (int64_t d = 0; d < p->d; d++) {
          double x = attn_load_elem(c->o, p->dt, (size_t)(b * s0 + h * s1 + i * s2 + d));
          double y = o[row * (size_t)p->d + (size_t)d];
          if (x != x) /* NaN left from the poison, or produced */
            maxerr = INFINITY;
          num += (x - y) * (x - y);
          den += y * y;
          if (l[row] == 0 && x != 0)
            e.masked_ok = false;
        }
        if (c->m) {
          double el = l[row] > 0 ? fabs(c->l[row] / l[row] - 1) : (c->l[row] == 0 ? 0 : INFINITY);
          e.stats = fmax(e.stats, fmax(rel(c->m[row], m[row]), fmax(rel(c->lse[row], lse[row]), el)));
          if (l[row] == 0 && !(c->m[row] == -INFINITY && c->lse[row] == -INFINITY && c->l[row] == 0))
            e.masked_ok = false;
        }
      }
  e.o = den > 0 ? sqrt(num / den) : sqrt(num);
  if (maxerr == INFINITY)
    e.o = INFINITY;
out:
  free(o);
  free(m);
  free(l);
  free(lse);
  return e;
}

const char *tdesc(const tprob *p, char *buf, size_t cap) {
  snprintf(buf, cap,
           "B=%lld Hq=%lld Hkv=%lld Nq=%lld Nkv=%lld D=%lld %s causal=%d window=(%lld,%lld)%s%s",
           (long long)p->b, (long long)p->hq, (long long)p->hkv, (long long)p->nq,
           (long long)p->nkv, (long long)p->d, attn_dtype_name(p->dt), p->causal,
           (long long)p->wl, (long long)p->wr, p->strided ? " strided" : "",
           isnan(p->scale) ? "" : " scale");
  return buf;
}

char *tsafetensors(const tcase *c, const char *metadata, size_t *plen) {
  return attn_bench_safetensors(&c->req, metadata, plen);
}
