/*
 * helpers.h — shared by the unit tests: random attention problems, the
 * float64 reference, and the normalized error the thresholds apply to.
 */
#ifndef ATTN_TEST_HELPERS_H
#define ATTN_TEST_HELPERS_H

#include "engine.h"

typedef struct tprob {
  int64_t b, hq, hkv, nq, nkv, d;
  attn_dtype dt;
  bool causal;
  int64_t wl, wr; /* -1 unbounded */
  double scale;   /* NaN: default */
  bool stats;
  bool strided;   /* lay tensors out [B, N, H, D] (as FlashAttention's API does) */
  double softcap; /* 0: off */
  int alibi;      /* 0: off; 1: slopes [Hq]; 2: slopes [B, Hq] (tcase_init draws them) */
  int64_t diag;   /* the request's diag_offset; ATTN_DIAG_AUTO: Nkv - Nq */
  bool sinks;     /* a sink logit per query head (tcase_init draws them) */
} tprob;

/* A problem with inputs filled, outputs poisoned (NaN) and allocated. The
 * backward's buffers are NULL until tcase_backward(). */
typedef struct tcase {
  tprob p;
  attn_request req;
  void *q, *k, *v, *o;
  float *m, *l, *lse;
  void *dout, *dq, *dk, *dv;
  float *lse_in;
  float *alibi;  /* the slopes when p.alibi */
  float *sinks;  /* [Hq] when p.sinks */
  float *dsinks; /* [Hq], a backward case's, when p.sinks */
} tcase;

tprob tprob_make(int64_t b, int64_t hq, int64_t hkv, int64_t nq, int64_t nkv, int64_t d,
                 attn_dtype dt);
void tcase_init(tcase *c, const tprob *p, uint64_t seed);
void tcase_poison(tcase *c);
void tcase_free(tcase *c);

/* The engine of cfg; aborts, printing why, when it does not open. */
attn_engine *topen_config(const attn_config *cfg);
/* Engine with `threads` workers and CPU kernel `isa` (NULL: best). */
attn_engine *topen(int threads, const char *isa);
/* Engine with `threads` workers and `streams` CUDA streams per device. */
attn_engine *topen_streams(int threads, int streams);

/* An engine of `threads` workers on CPU kernel isa, or NULL (after printing
 * "skipped: ...") when this CPU lacks it; aborts when the engine lists no
 * cpu backend or lacks "generic", the kernel that runs everywhere. */
attn_engine *topen_isa(const char *isa, int threads);

/* Runs c on backend; returns the engine's code. */
int trun(attn_engine *e, tcase *c, const char *backend, attn_status *st);

/* Errors of c's outputs against the float64 reference of the same inputs. */
typedef struct terr {
  double o;       /* ||O - ref||_2 / ||ref||_2 (absolute when ref is 0) */
  double stats;   /* max over rows of |m - ref|, |lse - ref| and |l/ref_l - 1|,
                     each relative to max(1, |ref|); a NaN counts as infinite */
  bool masked_ok; /* rows with no visible key: O == 0, m = lse = -inf, l = 0 */
} terr;
terr tcheck(const tcase *c);

/*
 * The same check in two steps, for suites that compare several runs with one
 * reference or need it faster: tref_compute() runs the float64 reference of
 * c's inputs on `threads` threads, one (batch, head) at a time each (1: the
 * serial attn_reference() that tcheck() uses; the numbers are the same bits
 * either way), and tref_check() measures c's outputs against it. S and P of
 * one head, 16 * seq_q * seq_kv bytes, are allocated per thread.
 */
typedef struct tref {
  double *o;           /* [B, Hq, Nq, D] */
  double *m, *l, *lse; /* [B, Hq, Nq] */
} tref;
int tref_compute(const tcase *c, int threads, tref *ref, attn_status *st);
terr tref_check(const tcase *c, const tref *ref);
void tref_free(tref *ref);

/*
 * Makes c (from tcase_init) a backward case: dO drawn from seed, O the
 * float64 forward of c's inputs rounded to the dtype, lse_in (F32) that
 * forward's lse when with_lse (else NULL: the backend recomputes it), dq, dk
 * and dv allocated and poisoned, strides as c's layout, statistics NULL.
 * Returns 0 or the reference's error.
 */
int tcase_backward(tcase *c, bool with_lse, uint64_t seed, attn_status *st);
/* NaN into dq, dk and dv again (before another run). */
void tcase_poison_grads(tcase *c);

/* The float64 reference backward of a backward tcase: contiguous doubles. */
typedef struct tref_bwd {
  double *dq;      /* [B, Hq, Nq, D] */
  double *dk, *dv; /* [B, Hkv, Nkv, D] */
} tref_bwd;
int tref_bwd_compute(const tcase *c, tref_bwd *ref, attn_status *st);
void tref_bwd_free(tref_bwd *ref);

/* Normalized errors ||x - ref||_2 / ||ref||_2 (absolute when ref is 0; a NaN
 * counts as infinite) of dq, dk, dv; zeros_ok: the rows that see nothing
 * (dq of a query row with no visible key, dk and dv of a key no query row
 * sees) are exactly 0. */
typedef struct terr_bwd {
  double dq, dk, dv;
  bool zeros_ok;
} terr_bwd;
terr_bwd tref_bwd_check(const tcase *c, const tref_bwd *ref);
/* Whether dq, dk and dv are each within tol (zeros_ok is not looked at). */
bool terr_bwd_within(const terr_bwd *e, double tol);

/* The mask's off of a problem: diag, or Nkv - Nq when it is ATTN_DIAG_AUTO. */
int64_t tprob_off(const tprob *p);
/* The CUDA kernels' view of problem p (kernels.h's attn_cu_params), no
 * device pointers yet. */
struct attn_cu_params;
void tcu_params(const tprob *p, struct attn_cu_params *prm);
/* A launch shape for the selection tests: no mask, the default scale. */
void tcu_shape(struct attn_cu_params *prm, attn_dtype dt, int b, int hq, int hkv, int nq, int nkv,
               int d);

/* ||x - ref||_2 / ||ref||_2 over n contiguous elements of dtype dt
 * (absolute when ref is 0; a NaN counts as infinite). */
double tnerr(const void *x, attn_dtype dt, const double *ref, int64_t n);
/* That error of a backward case's dsinks ([Hq], F32) against ref. */
double tdsinks_err(const tcase *c, const double *ref);

/* Threshold on terr.o for a dtype (F32 1e-5; F16 1e-3; BF16 8e-3). */
double ttol(attn_dtype dt);

/* Human description of a problem, for failure messages. */
const char *tdesc(const tprob *p, char *buf, size_t cap);

/* Rows [r0, r0 + n) of every head of a packed (variable-length) [H, T, W]
 * buffer to (out) or from a contiguous [H, n, W] one; W in bytes. */
void trows_copy(void *packed, void *alone, int64_t h, int64_t t, int64_t r0, int64_t n, size_t w,
                bool out);

/* A safetensors file of tcase c's q, k, v (contiguous [B, H, N, D]) with an optional
 * __metadata__ object text (e.g. "{\"causal\":\"true\"}"); malloc'd. */
char *tsafetensors(const tcase *c, const char *metadata, size_t *plen);

/* Runs `$ATTN_BIN SUB ARGS` (default build/attn) with stderr merged into
 * out; returns its exit status (-1 when it did not exit). */
int tattn(const char *sub, const char *args, char *out, size_t cap);

/* Whether this machine's engine has a working CUDA device. */
bool tcuda_available(void);

/* A field of /proc/self/status ("VmRSS", "VmHWM") in KiB, or -1. */
long tproc_kib(const char *field);
/* Resets the peak RSS (VmHWM) to the current RSS (VmRSS); false when this
 * kernel does not let us (no /proc/self/clear_refs). */
bool treset_peak_rss(void);

/*
 * A paged copy of packed K and V (heads × nkv rows of rowb bytes each, the
 * kernels' packed layout) for the paged view of kernels.h: one pool of
 * npages pages of page_bytes, holding page_tokens rows each, K's and V's
 * pages of every head in an order shuffled by seed, and their tables
 * [heads × per_head]. per_head is one more than the keys need (its spare
 * entry names a page nothing is written to), and every byte no key row
 * occupies (rows past nkv, page tails, unwritten pages) is 0xff, NaN in
 * every dtype, so a read through a wrong address shows in the output.
 * Returns 0, or -1 when out of memory.
 */
typedef struct tpaged {
  unsigned char *pool; /* 256-byte aligned */
  size_t bytes;
  int npages, per_head;
  int32_t *k_table, *v_table;
} tpaged;
int tpaged_make(tpaged *pg, const void *k, const void *v, int64_t heads, int64_t nkv, size_t rowb,
                int page_tokens, size_t page_bytes, uint64_t seed);
void tpaged_free(tpaged *pg);

/*
 * A batch of sessions for one paged launch with per-entry key lengths
 * (kernels.h's seqused_k): entry b is cs[b], a batch-1 case with the same
 * heads, queries and head dim, of which the first lens[b] keys are cached
 * (lens[b] <= cs[b].p.nkv; a case of 0 keys needs one key for tcase_init).
 * q is [n·Hq·Nq, dp] padded, k and v [n·Hkv·maxk, dp] with every row past
 * an entry's keys 0xff, paged into pg; the table entries past an entry's
 * pages name pg's unwritten page (NaN), so a read beyond its keys shows.
 * Entry b's tables start at b·Hkv·per_head. Returns 0, or -1 when out of
 * memory.
 */
typedef struct tbatch {
  int n;
  int64_t maxk; /* the largest lens[b], at least 1: the launch's seq_kv */
  unsigned char *q, *k, *v;
  int32_t *lens;
  tpaged pg;
} tbatch;
int tbatch_make(tbatch *t, const tcase *cs, const int *lens, int n, int dp, int page_tokens,
                size_t page_bytes, uint64_t seed);
void tbatch_free(tbatch *t);

uint64_t trand(uint64_t *s);
double tuniform(uint64_t *s); /* [-1, 1) */

#endif
