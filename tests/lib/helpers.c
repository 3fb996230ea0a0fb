/* helpers.c — see helpers.h. */
#include "helpers.h"

#include "cuda/kernels.h"

#include "reference.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

uint64_t trand(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

double tuniform(uint64_t *s) { return (double)(trand(s) >> 11) * 0x1p-52 - 1.0; }

tprob tprob_make(int64_t b, int64_t hq, int64_t hkv, int64_t nq, int64_t nkv, int64_t d,
                 attn_dtype dt) {
  tprob p = {.b = b,
             .hq = hq,
             .hkv = hkv,
             .nq = nq,
             .nkv = nkv,
             .d = d,
             .dt = dt,
             .wl = -1,
             .wr = -1,
             .scale = NAN,
             .diag = ATTN_DIAG_AUTO};
  return p;
}

int64_t tprob_off(const tprob *p) { return p->diag == ATTN_DIAG_AUTO ? p->nkv - p->nq : p->diag; }

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
  r->diag_offset = p->diag;
  r->q = c->q;
  r->k = c->k;
  r->v = c->v;
  r->o = c->o;
  r->m = c->m;
  r->l = c->l;
  r->lse = c->lse;
  r->softcap = p->softcap;
  if (p->alibi) {
    /* ALiBi's geometric slopes 2^(-8(h+1)/Hq), each batch's halved again
     * when they are [B, Hq], so a wrong batch index shows. */
    const int64_t nb = p->alibi == 2 ? p->b : 1;
    c->alibi = malloc((size_t)(nb * p->hq) * sizeof *c->alibi);
    for (int64_t b = 0; b < nb; b++)
      for (int64_t h = 0; h < p->hq; h++)
        c->alibi[b * p->hq + h] = (float)(exp2(-8.0 * (double)(h + 1) / (double)p->hq) / (b + 1));
    r->alibi_slopes = c->alibi;
    r->alibi_stride_b = p->alibi == 2 ? p->hq : 0;
  }
  if (p->sinks) {
    /* -3 .. 7 in steps of 2.5: from a sink the row hardly notices to one
     * that takes most of the mass of a few hundred keys */
    c->sinks = malloc((size_t)p->hq * sizeof *c->sinks);
    for (int64_t h = 0; h < p->hq; h++)
      c->sinks[h] = (float)(-3.0 + 2.5 * (double)(h % 5));
    r->sinks = c->sinks;
  }
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
  free(c->dout);
  free(c->dq);
  free(c->dk);
  free(c->dv);
  free(c->lse_in);
  free(c->alibi);
  free(c->sinks);
  free(c->dsinks);
  free(c->q);
  free(c->k);
  free(c->v);
  free(c->o);
  free(c->m);
  free(c->l);
  free(c->lse);
}

attn_engine *topen_config(const attn_config *cfg) {
  attn_engine *e = NULL;
  attn_status st;
  if (attn_engine_open(cfg, &e, &st) < 0) {
    fprintf(stderr, "engine open failed: %s\n", st.message);
    abort();
  }
  return e;
}

attn_engine *topen(int threads, const char *isa) {
  attn_config cfg;
  attn_config_init(&cfg);
  cfg.threads = threads;
  cfg.cpu_isa = isa;
  return topen_config(&cfg);
}

attn_engine *topen_streams(int threads, int streams) {
  attn_config cfg;
  attn_config_init(&cfg);
  cfg.threads = threads;
  cfg.cuda_streams = streams;
  return topen_config(&cfg);
}

/* Backend `name` as e lists it; false when e does not list it. */
static bool backend_info(const attn_engine *e, const char *name, attn_backend_info *out) {
  attn_backend_info info[8];
  int n = attn_engine_backends(e, info, 8);
  for (int i = 0; i < n && i < 8; i++)
    if (!strcmp(info[i].name, name)) {
      *out = info[i];
      return true;
    }
  return false;
}

attn_engine *topen_isa(const char *isa, int threads) {
  attn_engine *e = topen(threads, isa);
  attn_backend_info cpu;
  if (!backend_info(e, "cpu", &cpu)) {
    fprintf(stderr, "no cpu backend listed\n");
    abort();
  }
  if (cpu.available)
    return e;
  if (!strcmp(isa, "generic")) {
    fprintf(stderr, "the generic kernel is unavailable: %s\n", cpu.detail);
    abort();
  }
  printf("skipped: this CPU has no %s (%s)\n", isa, cpu.detail);
  attn_engine_close(e);
  return NULL;
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

double tnerr(const void *x, attn_dtype dt, const double *ref, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; i++) {
    const double a = attn_load_elem(x, dt, (size_t)i);
    num += isnan(a) ? INFINITY : (a - ref[i]) * (a - ref[i]);
    den += ref[i] * ref[i];
  }
  return den > 0 ? sqrt(num / den) : sqrt(num);
}

double tdsinks_err(const tcase *c, const double *ref) {
  return tnerr(c->dsinks, ATTN_F32, ref, c->p.hq);
}

static double rel(double x, double ref) {
  if (isnan(x) || isnan(ref))
    return INFINITY; /* an unwritten (poisoned) or NaN statistic */
  if (isinf(ref) || isinf(x))
    return x == ref ? 0 : INFINITY;
  return fabs(x - ref) / fmax(1.0, fabs(ref));
}

void tref_free(tref *ref) {
  free(ref->o);
  free(ref->m);
  free(ref->l);
  free(ref->lse);
  memset(ref, 0, sizeof *ref);
}

/* All-zero strides of one tensor -> the contiguous [B, H, N, D] layout. */
static void fill_strides(int64_t s[3], int64_t h, int64_t n, int64_t d) {
  if (s[0] || s[1] || s[2])
    return;
  s[2] = d;
  s[1] = n * d;
  s[0] = h * n * d;
}

/* The parallel reference: workers take (batch, head) items in turn. */
typedef struct ref_par {
  const attn_request *r;
  tref *ref;
  pthread_mutex_t mu;
  int64_t next, items;
  int rc;
  attn_status st;
} ref_par;

static void *ref_worker(void *arg) {
  ref_par *rp = arg;
  const attn_request *r = rp->r;
  const int64_t nq = r->seq_q, D = r->head_dim;
  size_t n = (size_t)nq * (size_t)r->seq_kv;
  double *S = malloc(n * sizeof *S), *P = malloc(n * sizeof *P);
  for (;;) {
    pthread_mutex_lock(&rp->mu);
    int64_t item = rp->rc ? rp->items : rp->next++;
    if (!S || !P) {
      if (!rp->rc)
        rp->rc = attn_status_set(&rp->st, ATTN_ENOMEM, "out of memory for the reference's S and P");
      item = rp->items;
    }
    pthread_mutex_unlock(&rp->mu);
    if (item >= rp->items)
      break;
    int64_t b = item / r->heads_q, h = item % r->heads_q;
    size_t row = (size_t)item * (size_t)nq;
    attn_status st = {0};
    int rc = attn_reference_head(r, b, h, S, P, rp->ref->o + row * (size_t)D, rp->ref->m + row,
                                 rp->ref->l + row, rp->ref->lse + row, &st);
    if (rc < 0) {
      pthread_mutex_lock(&rp->mu);
      if (!rp->rc) {
        rp->rc = rc;
        rp->st = st;
      }
      pthread_mutex_unlock(&rp->mu);
    }
  }
  free(S);
  free(P);
  return NULL;
}

int tref_compute(const tcase *c, int threads, tref *ref, attn_status *st) {
  const tprob *p = &c->p;
  size_t rows = (size_t)(p->b * p->hq * p->nq), n = rows * (size_t)p->d;
  memset(ref, 0, sizeof *ref);
  ref->o = malloc(n * sizeof *ref->o);
  ref->m = malloc(rows * sizeof *ref->m);
  ref->l = malloc(rows * sizeof *ref->l);
  ref->lse = malloc(rows * sizeof *ref->lse);
  if (!ref->o || !ref->m || !ref->l || !ref->lse) {
    tref_free(ref);
    return attn_status_set(st, ATTN_ENOMEM, "out of memory for the reference");
  }
  int64_t items = p->b * p->hq;
  if (threads > items)
    threads = (int)items;
  int rc;
  if (threads <= 1) {
    rc = attn_reference(&c->req, ref->o, ref->m, ref->l, ref->lse, st);
  } else if ((rc = attn_request_validate(&c->req, st)) == 0) {
    attn_request r = c->req;
    fill_strides(r.q_stride, r.heads_q, r.seq_q, r.head_dim);
    fill_strides(r.o_stride, r.heads_q, r.seq_q, r.head_dim);
    fill_strides(r.k_stride, r.heads_kv, r.seq_kv, r.head_dim);
    fill_strides(r.v_stride, r.heads_kv, r.seq_kv, r.head_dim);
    ref_par rp = {.r = &r, .ref = ref, .items = items};
    pthread_mutex_init(&rp.mu, NULL);
    pthread_t *tid = calloc((size_t)threads, sizeof *tid);
    int started = 0;
    for (; tid && started < threads; started++)
      if (pthread_create(&tid[started], NULL, ref_worker, &rp) != 0)
        break;
    if (started == 0) /* no thread could start: do the work here */
      ref_worker(&rp);
    for (int i = 0; i < started; i++)
      pthread_join(tid[i], NULL);
    free(tid);
    pthread_mutex_destroy(&rp.mu);
    rc = rp.rc;
    if (rc < 0 && st)
      *st = rp.st;
  }
  if (rc < 0)
    tref_free(ref);
  return rc;
}

terr tref_check(const tcase *c, const tref *ref) {
  const tprob *p = &c->p;
  const attn_request *r = &c->req;
  const double *o = ref->o, *m = ref->m, *l = ref->l, *lse = ref->lse;
  terr e = {.o = INFINITY, .stats = 0, .masked_ok = true};
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
          if (isnan(el))
            el = INFINITY;
          e.stats =
              fmax(e.stats, fmax(rel(c->m[row], m[row]), fmax(rel(c->lse[row], lse[row]), el)));
          if (l[row] == 0 &&
              !(c->m[row] == -INFINITY && c->lse[row] == -INFINITY && c->l[row] == 0))
            e.masked_ok = false;
        }
      }
  e.o = den > 0 ? sqrt(num / den) : sqrt(num);
  if (maxerr == INFINITY)
    e.o = INFINITY;
  return e;
}

terr tcheck(const tcase *c) {
  tref ref;
  attn_status st;
  if (tref_compute(c, 1, &ref, &st) < 0) {
    fprintf(stderr, "reference failed: %s\n", st.message);
    terr e = {.o = INFINITY, .stats = 0, .masked_ok = true};
    return e;
  }
  terr e = tref_check(c, &ref);
  tref_free(&ref);
  return e;
}

const char *tdesc(const tprob *p, char *buf, size_t cap) {
  snprintf(buf, cap,
           "B=%lld Hq=%lld Hkv=%lld Nq=%lld Nkv=%lld D=%lld %s causal=%d window=(%lld,%lld)%s%s "
           "off=%lld softcap=%g alibi=%d%s",
           (long long)p->b, (long long)p->hq, (long long)p->hkv, (long long)p->nq,
           (long long)p->nkv, (long long)p->d, attn_dtype_name(p->dt), p->causal, (long long)p->wl,
           (long long)p->wr, p->strided ? " strided" : "", isnan(p->scale) ? "" : " scale",
           (long long)tprob_off(p), p->softcap, p->alibi, p->sinks ? " sinks" : "");
  return buf;
}

/* Written here, not with proto's request encoder: the tests' bodies stay
 * independent of the codecs under test (see harness.h). */
char *tsafetensors(const tcase *c, const char *metadata, size_t *plen) {
  const attn_request *r = &c->req;
  size_t es = attn_dtype_size(r->dtype);
  size_t qb = (size_t)(r->batch * r->heads_q * r->seq_q * r->head_dim) * es;
  size_t kb = (size_t)(r->batch * r->heads_kv * r->seq_kv * r->head_dim) * es;
  char hdr[1024];
  int n = snprintf(hdr, sizeof hdr, "{%s%s%s", metadata ? "\"__metadata__\":" : "",
                   metadata ? metadata : "", metadata ? "," : "");
  const char *names[3] = {"q", "k", "v"};
  size_t off[4] = {0, qb, qb + kb, qb + 2 * kb};
  for (int i = 0; i < 3 && n > 0 && (size_t)n < sizeof hdr; i++)
    n += snprintf(hdr + n, sizeof hdr - (size_t)n,
                  "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[%lld,%lld,%lld,%lld],"
                  "\"data_offsets\":[%zu,%zu]}",
                  i ? "," : "", names[i], attn_dtype_name(r->dtype), (long long)r->batch,
                  (long long)(i ? r->heads_kv : r->heads_q), (long long)(i ? r->seq_kv : r->seq_q),
                  (long long)r->head_dim, off[i], off[i + 1]);
  if (n < 0 || (size_t)n >= sizeof hdr - 8)
    return NULL;
  hdr[n++] = '}';
  while (n % 8) /* data 8-byte aligned, so the decoder may read it in place */
    hdr[n++] = ' ';
  char *b = malloc(8 + (size_t)n + off[3]);
  if (!b)
    return NULL;
  for (int i = 0; i < 8; i++)
    b[i] = (char)((uint64_t)n >> (8 * i));
  memcpy(b + 8, hdr, (size_t)n);
  const void *src[3] = {r->q, r->k, r->v};
  for (int i = 0; i < 3; i++)
    memcpy(b + 8 + n + off[i], src[i], off[i + 1] - off[i]);
  *plen = 8 + (size_t)n + off[3];
  return b;
}

int tattn(const char *sub, const char *args, char *out, size_t cap) {
  const char *bin = getenv("ATTN_BIN") ? getenv("ATTN_BIN") : "build/attn";
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "%s %s %s 2>&1", bin, sub, args);
  FILE *f = popen(cmd, "r");
  if (!f)
    return -1;
  size_t n = fread(out, 1, cap - 1, f);
  out[n] = 0;
  int status = pclose(f);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

bool tcuda_available(void) {
  attn_engine *e;
  attn_status st;
  attn_config cfg;
  attn_config_init(&cfg);
  cfg.threads = 1;
  if (attn_engine_open(&cfg, &e, &st) < 0)
    return false;
  attn_backend_info cuda;
  bool up = backend_info(e, "cuda", &cuda) && cuda.available;
  attn_engine_close(e);
  return up;
}

long tproc_kib(const char *field) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  long v = -1;
  size_t n = strlen(field);
  while (f && fgets(line, sizeof line, f))
    if (strncmp(line, field, n) == 0 && line[n] == ':')
      v = strtol(line + n + 1, NULL, 10);
  if (f)
    fclose(f);
  return v;
}

bool treset_peak_rss(void) {
  FILE *f = fopen("/proc/self/clear_refs", "w"); /* "5" resets VmHWM to VmRSS */
  if (!f)
    return false;
  bool ok = fputs("5", f) >= 0;
  return fclose(f) == 0 && ok;
}

/* ---- backward cases ---------------------------------------------------------- */

/* Element (b, h, i, d) of a [B, H, N, D] tensor with strides s (zero:
 * contiguous). */
static size_t at4(const int64_t s[3], int64_t h, int64_t n, int64_t d, int64_t b, int64_t hh,
                  int64_t i, int64_t dd) {
  int64_t t[3] = {s[0], s[1], s[2]};
  fill_strides(t, h, n, d);
  return (size_t)(b * t[0] + hh * t[1] + i * t[2] + dd);
}

void tcase_poison_grads(tcase *c) {
  size_t es = attn_dtype_size(c->p.dt);
  memset(c->dq, 0xff, (size_t)(c->p.b * c->p.hq * c->p.nq * c->p.d) * es);
  memset(c->dk, 0xff, (size_t)(c->p.b * c->p.hkv * c->p.nkv * c->p.d) * es);
  memset(c->dv, 0xff, (size_t)(c->p.b * c->p.hkv * c->p.nkv * c->p.d) * es);
  if (c->dsinks)
    memset(c->dsinks, 0xff, (size_t)c->p.hq * sizeof *c->dsinks);
}

/* O (rounded to the dtype, at c's strides) and lse_in from the float64 forward. */
static int fill_forward(tcase *c, bool with_lse, attn_status *st) {
  const tprob *p = &c->p;
  tref ref;
  int rc = tref_compute(c, 2, &ref, st);
  if (rc < 0)
    return rc;
  for (int64_t b = 0; b < p->b; b++)
    for (int64_t h = 0; h < p->hq; h++)
      for (int64_t i = 0; i < p->nq; i++)
        for (int64_t d = 0; d < p->d; d++) {
          size_t row = (size_t)((b * p->hq + h) * p->nq + i);
          double x = ref.o[row * (size_t)p->d + (size_t)d];
          size_t at = at4(c->req.o_stride, p->hq, p->nq, p->d, b, h, i, d);
          if (p->dt == ATTN_F32)
            ((float *)c->o)[at] = (float)x;
          else
            ((uint16_t *)c->o)[at] = p->dt == ATTN_F16 ? attn_f64_to_f16(x) : attn_f64_to_bf16(x);
        }
  size_t rows = (size_t)(p->b * p->hq * p->nq);
  if (with_lse && (c->lse_in = malloc(rows * sizeof *c->lse_in)))
    for (size_t i = 0; i < rows; i++)
      c->lse_in[i] = (float)ref.lse[i];
  tref_free(&ref);
  return with_lse && !c->lse_in ? attn_status_set(st, ATTN_ENOMEM, "out of memory") : 0;
}

int tcase_backward(tcase *c, bool with_lse, uint64_t seed, attn_status *st) {
  const tprob *p = &c->p;
  attn_request *r = &c->req;
  size_t es = attn_dtype_size(p->dt);
  size_t nq = (size_t)(p->b * p->hq * p->nq * p->d), nk = (size_t)(p->b * p->hkv * p->nkv * p->d);
  r->m = r->l = r->lse = NULL; /* a backward pass returns no statistics */
  int rc = fill_forward(c, with_lse, st);
  if (rc < 0)
    return rc;
  c->dout = malloc(nq * es);
  c->dq = malloc(nq * es);
  c->dk = malloc(nk * es);
  c->dv = malloc(nk * es);
  if (p->sinks)
    c->dsinks = malloc((size_t)p->hq * sizeof *c->dsinks);
  if (!c->dout || !c->dq || !c->dk || !c->dv || (p->sinks && !c->dsinks))
    return attn_status_set(st, ATTN_ENOMEM, "out of memory");
  r->dsinks = c->dsinks;
  for (size_t i = 0; i < nq; i++)
    attn_store_elem(c->dout, p->dt, i, (float)tuniform(&seed));
  r->pass = ATTN_BACKWARD;
  r->dout = c->dout;
  r->dq = c->dq;
  r->dk = c->dk;
  r->dv = c->dv;
  r->lse_in = c->lse_in;
  if (p->strided) {
    bnhd(r->do_stride, p->hq, p->nq, p->d);
    bnhd(r->dq_stride, p->hq, p->nq, p->d);
    bnhd(r->dk_stride, p->hkv, p->nkv, p->d);
    bnhd(r->dv_stride, p->hkv, p->nkv, p->d);
  }
  tcase_poison_grads(c);
  return 0;
}

int tref_bwd_compute(const tcase *c, tref_bwd *ref, attn_status *st) {
  const tprob *p = &c->p;
  size_t nq = (size_t)(p->b * p->hq * p->nq * p->d), nk = (size_t)(p->b * p->hkv * p->nkv * p->d);
  ref->dq = malloc(nq * sizeof *ref->dq);
  ref->dk = malloc(nk * sizeof *ref->dk);
  ref->dv = malloc(nk * sizeof *ref->dv);
  int rc = ref->dq && ref->dk && ref->dv
               ? attn_reference_backward(&c->req, ref->dq, ref->dk, ref->dv, st)
               : attn_status_set(st, ATTN_ENOMEM, "out of memory for the reference");
  if (rc < 0)
    tref_bwd_free(ref);
  return rc;
}

void tref_bwd_free(tref_bwd *ref) {
  free(ref->dq);
  free(ref->dk);
  free(ref->dv);
  memset(ref, 0, sizeof *ref);
}

/* Whether row n of a query tensor (keys: is_key) sees anything: a query
 * row some key, a key some query row (docs/design.md's bottom-right rule). */
static bool sees(const tprob *p, bool is_key, int64_t n) {
  const int64_t off = tprob_off(p), wl = p->wl, wr = p->causal ? 0 : p->wr;
  int64_t lo, hi, last;
  if (is_key) { /* query i sees key n iff n - off - wr <= i <= n - off + wl */
    lo = wr < 0 ? 0 : n - off - wr;
    hi = wl < 0 ? p->nq - 1 : n - off + wl;
    last = p->nq - 1;
  } else {
    lo = wl < 0 ? 0 : n + off - wl;
    hi = wr < 0 ? p->nkv - 1 : n + off + wr;
    last = p->nkv - 1;
  }
  return (lo < 0 ? 0 : lo) <= (hi > last ? last : hi);
}

/* One tensor's normalized error; clears *zeros_ok where a row that sees
 * nothing is not exactly 0. */
static double grad_err(const tcase *c, const void *x, const int64_t s[3], bool is_key,
                       const double *ref, bool *zeros_ok) {
  const tprob *p = &c->p;
  const int64_t h = is_key ? p->hkv : p->hq, n = is_key ? p->nkv : p->nq;
  double num = 0, den = 0;
  bool nan = false;
  for (int64_t b = 0; b < p->b; b++)
    for (int64_t hh = 0; hh < h; hh++)
      for (int64_t i = 0; i < n; i++) {
        const bool zero = !sees(p, is_key, i);
        for (int64_t d = 0; d < p->d; d++) {
          double v = attn_load_elem(x, p->dt, at4(s, h, n, p->d, b, hh, i, d));
          double y = ref[(size_t)(((b * h + hh) * n + i) * p->d + d)];
          nan |= v != v;
          if (zero && v != 0)
            *zeros_ok = false;
          num += (v - y) * (v - y);
          den += y * y;
        }
      }
  if (nan)
    return INFINITY;
  return den > 0 ? sqrt(num / den) : sqrt(num);
}

terr_bwd tref_bwd_check(const tcase *c, const tref_bwd *ref) {
  const attn_request *r = &c->req;
  terr_bwd e = {.zeros_ok = true};
  e.dq = grad_err(c, c->dq, r->dq_stride, false, ref->dq, &e.zeros_ok);
  e.dk = grad_err(c, c->dk, r->dk_stride, true, ref->dk, &e.zeros_ok);
  e.dv = grad_err(c, c->dv, r->dv_stride, true, ref->dv, &e.zeros_ok);
  return e;
}

bool terr_bwd_within(const terr_bwd *e, double tol) {
  return e->dq <= tol && e->dk <= tol && e->dv <= tol;
}

void trows_copy(void *packed, void *alone, int64_t h, int64_t t, int64_t r0, int64_t n, size_t w,
                bool out) {
  for (int64_t i = 0; i < h; i++) {
    char *p = (char *)packed + (size_t)(i * t + r0) * w, *a = (char *)alone + (size_t)(i * n) * w;
    memcpy(out ? a : p, out ? p : a, (size_t)n * w);
  }
}

/* Key rows [0, nkv) of each of heads heads of x into the pages table names. */
static void tpaged_fill(tpaged *pg, const int32_t *table, const void *x, int64_t heads, int64_t nkv,
                        size_t rowb, int page_tokens, size_t page_bytes) {
  for (int64_t h = 0; h < heads; h++)
    for (int64_t j = 0; j < nkv; j++) {
      int32_t page = table[h * pg->per_head + j / page_tokens];
      memcpy(pg->pool + (size_t)page * page_bytes + (size_t)(j % page_tokens) * rowb,
             (const char *)x + (size_t)(h * nkv + j) * rowb, rowb);
    }
}

int tpaged_make(tpaged *pg, const void *k, const void *v, int64_t heads, int64_t nkv, size_t rowb,
                int page_tokens, size_t page_bytes, uint64_t seed) {
  memset(pg, 0, sizeof *pg);
  pg->per_head = (int)((nkv + page_tokens - 1) / page_tokens) + 1; /* one spare entry */
  const int64_t entries = heads * pg->per_head;
  pg->npages = (int)(2 * entries + 1); /* and a page no table names */
  pg->bytes = (size_t)pg->npages * page_bytes;
  pg->pool = aligned_alloc(256, (pg->bytes + 255) / 256 * 256);
  int32_t *order = malloc((size_t)(2 * entries) * sizeof *order);
  if (!pg->pool || !order) {
    free(order);
    tpaged_free(pg);
    return -1;
  }
  memset(pg->pool, 0xff, pg->bytes);
  /* Pages 0..npages-1 but the last, in a shuffled order: K's entries take
   * the first half, V's the second. */
  for (int64_t i = 0; i < 2 * entries; i++)
    order[i] = (int32_t)i;
  for (int64_t i = 2 * entries - 1; i > 0; i--) {
    int64_t j = (int64_t)(trand(&seed) % (uint64_t)(i + 1));
    int32_t t = order[i];
    order[i] = order[j];
    order[j] = t;
  }
  pg->k_table = order;
  pg->v_table = order + entries;
  tpaged_fill(pg, pg->k_table, k, heads, nkv, rowb, page_tokens, page_bytes);
  tpaged_fill(pg, pg->v_table, v, heads, nkv, rowb, page_tokens, page_bytes);
  return 0;
}

void tpaged_free(tpaged *pg) {
  free(pg->pool);
  free(pg->k_table); /* v_table is its second half */
  memset(pg, 0, sizeof *pg);
}

/* Rows [0, n) of contiguous [rows, d] x into [.., dp] y from row r0,
 * padding columns zero. */
static void tbatch_rows(unsigned char *y, size_t r0, const void *x, int64_t n, int64_t d, int dp,
                        size_t es) {
  for (int64_t r = 0; r < n; r++) {
    unsigned char *row = y + (r0 + (size_t)r) * (size_t)dp * es;
    memset(row, 0, (size_t)dp * es);
    memcpy(row, (const unsigned char *)x + (size_t)(r * d) * es, (size_t)d * es);
  }
}

/* Entry b's table entries past its pages: the page no key is written to. */
static void tbatch_unused(tbatch *t, int64_t hkv, int page_tokens) {
  for (int b = 0; b < t->n; b++) {
    const int used = (t->lens[b] + page_tokens - 1) / page_tokens;
    for (int64_t hk = 0; hk < hkv; hk++)
      for (int e = used; e < t->pg.per_head; e++) {
        const size_t at = (size_t)((b * hkv + hk) * t->pg.per_head + e);
        t->pg.k_table[at] = t->pg.v_table[at] = t->pg.npages - 1;
      }
  }
}

int tbatch_make(tbatch *t, const tcase *cs, const int *lens, int n, int dp, int page_tokens,
                size_t page_bytes, uint64_t seed) {
  memset(t, 0, sizeof *t);
  const tprob *p = &cs[0].p;
  const size_t es = attn_dtype_size(p->dt);
  t->n = n;
  t->maxk = 1;
  for (int b = 0; b < n; b++)
    t->maxk = lens[b] > t->maxk ? lens[b] : t->maxk;
  const size_t qrows = (size_t)(n * p->hq * p->nq), kvrows = (size_t)(n * p->hkv * t->maxk);
  t->q = malloc(qrows * (size_t)dp * es);
  t->k = malloc(kvrows * (size_t)dp * es);
  t->v = malloc(kvrows * (size_t)dp * es);
  t->lens = malloc((size_t)n * sizeof *t->lens);
  if (!t->q || !t->k || !t->v || !t->lens) {
    tbatch_free(t);
    return -1;
  }
  memset(t->k, 0xff, kvrows * (size_t)dp * es);
  memset(t->v, 0xff, kvrows * (size_t)dp * es);
  for (int b = 0; b < n; b++) {
    const tprob *e = &cs[b].p;
    t->lens[b] = lens[b];
    tbatch_rows(t->q, (size_t)(b * p->hq * p->nq), cs[b].q, p->hq * p->nq, p->d, dp, es);
    for (int64_t hk = 0; hk < p->hkv; hk++) {
      const size_t r0 = (size_t)((b * p->hkv + hk) * t->maxk), src = (size_t)(hk * e->nkv * p->d);
      tbatch_rows(t->k, r0, (const unsigned char *)cs[b].k + src * es, lens[b], p->d, dp, es);
      tbatch_rows(t->v, r0, (const unsigned char *)cs[b].v + src * es, lens[b], p->d, dp, es);
    }
  }
  if (tpaged_make(&t->pg, t->k, t->v, n * p->hkv, t->maxk, (size_t)dp * es, page_tokens, page_bytes,
                  seed)) {
    tbatch_free(t);
    return -1;
  }
  tbatch_unused(t, p->hkv, page_tokens);
  return 0;
}

void tbatch_free(tbatch *t) {
  free(t->q);
  free(t->k);
  free(t->v);
  free(t->lens);
  tpaged_free(&t->pg);
  memset(t, 0, sizeof *t);
}

void tcu_params(const tprob *p, attn_cu_params *prm) {
  memset(prm, 0, sizeof *prm);
  attn_request r;
  attn_request_init(&r);
  r.head_dim = p->d;
  r.scale = p->scale;
  r.causal = p->causal;
  r.window_left = p->wl;
  r.window_right = p->wr;
  prm->dtype = p->dt;
  prm->batch = (int)p->b;
  prm->heads_q = (int)p->hq;
  prm->heads_kv = (int)p->hkv;
  prm->seq_q = (int)p->nq;
  prm->seq_kv = (int)p->nkv;
  prm->head_dim = (int)p->d;
  prm->dp = attn_cu_dp(p->d);
  prm->scale_log2 = (float)(attn_request_scale(&r) * M_LOG2E);
  prm->scale = (float)attn_request_scale(&r);
  attn_request_window(&r, &prm->window_left, &prm->window_right);
  prm->off = tprob_off(p); /* the mask's diagonal, as attn_request_offset() gives it */
}

void tcu_shape(attn_cu_params *prm, attn_dtype dt, int b, int hq, int hkv, int nq, int nkv, int d) {
  tprob p = {.dt = dt, .b = b, .hq = hq, .hkv = hkv, .nq = nq, .nkv = nkv, .d = d};
  p.wl = p.wr = -1;
  p.scale = NAN;
  p.diag = ATTN_DIAG_AUTO;
  tcu_params(&p, prm);
}
