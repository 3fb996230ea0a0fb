/*
 * selfcheck.c — the start-up self-check's cases (see selfcheck.h).
 *
 * Shapes are chosen so that the selection with nothing disabled reaches
 * each instance in an unsplit, unpacked case (listed first; one of them
 * runs a full 128-row block and a partial second), the split-KV path in
 * the decode cases (a query row over 700 keys splits on any device
 * with more multiprocessors than query blocks), then the GQA packing, then
 * the decode kernel (decode.cuh: which takes most decode rows), so
 * that a failure is laid at the right door (cuda.c's disable()). Errors are
 * normalized like the tests' (sqrt of the squared error over the squared
 * reference) and allowed four times the tests' per-dtype threshold: the
 * check is there to catch a wrong kernel, not rounding. The Hopper cases
 * come next; the backend runs them only where that instance may run. Last,
 * every backward shape again on the atomic dQ path. The sinks cases are a
 * table of their own (their failure is laid at the sinks' door).
 */
#include "selfcheck.h"

#include "request_int.h"
#include "reference.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct check_shape {
  attn_pass pass;
  attn_dtype dt;
  int hq, hkv, nq, nkv, d;
  bool causal;
  int wl;         /* window_left, -1: unbounded */
  double softcap; /* issue 17's variants: 0 off */
  bool alibi;     /* slopes [Hq], ALiBi's geometric sequence */
  bool hopper;    /* a case of the Hopper instance (kernels.h) */
  double scale;   /* 0: the default 1 / sqrt(head_dim) */
  bool topleft;   /* diag_offset 0 (torch's top-left is_causal) instead of Nkv − Nq */
} check_shape;

static const check_shape shapes[] = {
    /* unsplit: each instance, GQA 4:2 (65-query heads: two of them, 130
     * rows, fill no block, so nothing packs), masks, padded head dims */
    {ATTN_FORWARD, ATTN_F16, 4, 2, 65, 70, 61, true, -1, 0, false, false, 0, false},
    {ATTN_FORWARD, ATTN_BF16, 4, 2, 65, 70, 89, true, -1, 0, false, false, 0, false},
    {ATTN_FORWARD, ATTN_BF16, 4, 2, 65, 70, 125, false, 20, 0, false, false, 0, false},
    {ATTN_FORWARD, ATTN_F16, 4, 2, 65, 70, 150, false, 20, 0, false, false, 0, false},
    {ATTN_FORWARD, ATTN_BF16, 4, 2, 65, 70, 181, true, 30, 0, false, false, 0, false},
    {ATTN_FORWARD, ATTN_F16, 2, 1, 37, 70, 253, true, 30, 0, false, false, 0, false},
    {ATTN_FORWARD, ATTN_F32, 4, 2, 37, 70, 45, true, -1, 0, false, false, 0, false},
    /* a full 128-row block and a partial second one (7 key tiles of 32:
     * too few to split) */
    {ATTN_FORWARD, ATTN_F16, 2, 1, 200, 220, 128, true, -1, 0, false, false, 0, false},
    {ATTN_BACKWARD, ATTN_F16, 4, 2, 37, 70, 61, true, -1, 0, false, false, 0, false},
    {ATTN_BACKWARD, ATTN_BF16, 4, 2, 37, 70, 125, false, 20, 0, false, false, 0, false},
    {ATTN_BACKWARD, ATTN_F16, 2, 1, 37, 70, 253, true, -1, 0, false, false, 0, false},
    {ATTN_BACKWARD, ATTN_F32, 4, 2, 37, 70, 45, false, 9, 0, false, false, 0, false},
    /* decode rows: split-KV and the merge, unpacked first (MHA, F32); the
     * first on the tiled forward (17 rows: past the decode kernel's 16),
     * the next on the decode kernel */
    {ATTN_FORWARD, ATTN_BF16, 2, 2, 17, 700, 64, false, -1, 0, false, false, 0, false},
    {ATTN_FORWARD, ATTN_BF16, 2, 2, 1, 700, 64, false, -1, 0, false, false, 0, false},
    {ATTN_FORWARD, ATTN_BF16, 4, 2, 1, 700, 64, false, -1, 0, false, false, 0, false},
    {ATTN_FORWARD, ATTN_F32, 2, 1, 1, 700, 40, true, -1, 0, false, false, 0, false},
    /* GQA packing (a group's heads in one block's rows), each block size:
     * 32:8 and MQA decodes unsplit (few keys) and split (the 32:8 one
     * splits on devices with more than 8 multiprocessors), groups of 16
     * queries that fill a 128-row block (8 x 16) and a 64-row one (4 x
     * 16), 16:4 x 16 rows in half a 128-row block, and 4 x 5 rows whose
     * heads change inside a warp's 16, with masks and ALiBi (its slope
     * is per row) */
    {ATTN_FORWARD, ATTN_BF16, 32, 8, 1, 70, 128, false, -1, 0, false, false, 0, false},
    {ATTN_FORWARD, ATTN_BF16, 32, 8, 1, 700, 128, false, -1, 0, true, false, 0, false},
    {ATTN_FORWARD, ATTN_F16, 8, 1, 2, 70, 64, true, 20, 2.0, true, false, 0, false},
    {ATTN_FORWARD, ATTN_F16, 8, 1, 2, 700, 64, true, -1, 0, true, false, 0, false},
    /* 8 x 3 rows: past the decode kernel's 16, so packed and split on the
     * tiled forward */
    {ATTN_FORWARD, ATTN_F16, 8, 1, 3, 700, 64, true, -1, 0, true, false, 0, false},
    {ATTN_FORWARD, ATTN_F16, 8, 1, 16, 70, 150, true, -1, 0, true, false, 0, false},
    {ATTN_FORWARD, ATTN_BF16, 8, 2, 16, 70, 181, false, 20, 0, false, false, 0, false},
    {ATTN_FORWARD, ATTN_BF16, 16, 4, 16, 70, 61, true, -1, 0, true, false, 0, false},
    {ATTN_FORWARD, ATTN_F16, 4, 1, 5, 70, 253, true, 3, 0, true, false, 0, false},
    /* softcap and ALiBi, through every instance and the split path (a
     * wrong variant path disables the instance it ran on) */
    {ATTN_FORWARD, ATTN_F16, 4, 2, 65, 70, 61, true, -1, 2.0, true, false, 0, false},
    {ATTN_FORWARD, ATTN_BF16, 4, 2, 65, 70, 89, true, -1, 1.5, true, false, 0, false},
    {ATTN_FORWARD, ATTN_BF16, 4, 2, 65, 70, 125, false, 20, 1.5, false, false, 0, false},
    {ATTN_FORWARD, ATTN_F16, 4, 2, 65, 70, 150, false, 20, 0, true, false, 0, false},
    {ATTN_FORWARD, ATTN_BF16, 4, 2, 65, 70, 181, true, -1, 2.0, false, false, 0, false},
    {ATTN_FORWARD, ATTN_F16, 2, 1, 37, 70, 253, false, -1, 0, true, false, 0, false},
    {ATTN_FORWARD, ATTN_F32, 4, 2, 37, 70, 45, true, -1, 1.5, true, false, 0, false},
    {ATTN_BACKWARD, ATTN_F16, 4, 2, 37, 70, 61, true, -1, 2.0, true, false, 0, false},
    {ATTN_BACKWARD, ATTN_BF16, 4, 2, 37, 70, 125, false, 20, 1.5, true, false, 0, false},
    {ATTN_BACKWARD, ATTN_F16, 2, 1, 37, 70, 253, true, -1, 2.0, false, false, 0, false},
    {ATTN_BACKWARD, ATTN_F32, 4, 2, 37, 70, 45, false, 9, 1.5, true, false, 0, false},
    {ATTN_FORWARD, ATTN_BF16, 4, 2, 1, 700, 64, false, -1, 2.0, true, false, 0, false},
    /* a negative scale, which the forward kernels cannot fold into the
     * exponent (attn_cu_exp_factor): each instance, split and packed */
    {ATTN_FORWARD, ATTN_F16, 4, 2, 65, 70, 61, true, -1, 0, false, false, -0.09, false},
    {ATTN_FORWARD, ATTN_BF16, 4, 2, 65, 70, 89, false, 20, 0, false, false, -0.1, false},
    {ATTN_FORWARD, ATTN_BF16, 4, 4, 37, 70, 125, false, 20, 0, false, false, -0.2, false},
    {ATTN_FORWARD, ATTN_F16, 2, 2, 37, 70, 150, true, -1, 0, false, false, -0.07, false},
    {ATTN_FORWARD, ATTN_BF16, 4, 2, 65, 70, 181, true, 30, 0, false, false, -0.12, false},
    {ATTN_FORWARD, ATTN_F16, 2, 2, 37, 70, 253, true, -1, 0, false, false, -0.05, false},
    {ATTN_FORWARD, ATTN_F32, 4, 2, 37, 70, 45, true, -1, 0, false, false, -0.15, false},
    {ATTN_FORWARD, ATTN_BF16, 8, 2, 1, 700, 64, false, -1, 0, false, false, -0.1, false},
    /* the decode kernel (decode.cuh: keys in the MMA's M, a group's rows in
     * N), each instance, split on any device with more than one
     * multiprocessor: MHA (one column), GQA 4 (8 columns), 8 x 2 rows (two
     * n8 tiles) in a causal window, 4 x 3 rows causal with a padded head
     * dim, a top-left diagonal (one visible tile: the other splits are
     * empty), softcap and ALiBi, a negative scale */
    {ATTN_FORWARD, ATTN_F16, 2, 2, 1, 700, 64, false, -1, 0, false, false, 0, false},
    {ATTN_FORWARD, ATTN_BF16, 8, 2, 1, 900, 128, false, -1, 0, false, false, 0, false},
    {ATTN_FORWARD, ATTN_BF16, 8, 1, 2, 1000, 125, true, 600, 0, false, false, 0, false},
    {ATTN_FORWARD, ATTN_F16, 4, 1, 3, 800, 61, true, -1, 0, false, false, 0, false},
    {ATTN_FORWARD, ATTN_F16, 4, 4, 2, 700, 64, true, -1, 0, false, false, 0, true},
    {ATTN_FORWARD, ATTN_BF16, 8, 2, 1, 700, 125, true, -1, 1.5, true, false, 0, false},
    {ATTN_FORWARD, ATTN_F16, 8, 2, 1, 700, 128, false, -1, 0, false, false, -0.08, false},
    /* ... and the 256 instance (Q re-read from shared memory): GQA 4 with
     * a padded head dim, 8 x 2 rows with ALiBi, a negative scale */
    {ATTN_FORWARD, ATTN_BF16, 8, 2, 1, 700, 200, true, -1, 0, false, false, 0, false},
    {ATTN_FORWARD, ATTN_F16, 8, 1, 2, 700, 256, false, -1, 0, true, false, 0, false},
    {ATTN_FORWARD, ATTN_BF16, 4, 4, 1, 900, 256, false, 500, 0, false, false, -0.06, false},
    /* the Hopper instance, each head dim: a tail query tile and several
     * key tiles through the ring (too few to split); the first with a
     * top-left diagonal (diag_offset 0), which it once ignored; the 89
     * one with two query tiles per head (a whole one and a tail); the 181
     * one with its keys past a left window edge, so its consumers take
     * masked tiles, then whole ones, then the masked last tile */
    {ATTN_FORWARD, ATTN_F16, 2, 1, 100, 250, 61, true, -1, 0, false, true, 0, true},
    {ATTN_FORWARD, ATTN_F16, 2, 1, 200, 280, 89, true, -1, 0, false, true, 0, false},
    {ATTN_FORWARD, ATTN_BF16, 2, 1, 120, 250, 125, false, 20, 0, false, true, 0, false},
    {ATTN_FORWARD, ATTN_BF16, 2, 1, 110, 300, 181, false, 90, 0, false, true, 0, false},
    {ATTN_FORWARD, ATTN_F16, 2, 1, 90, 200, 253, true, -1, 0, false, true, 0, false},
};
enum { NSHAPES = sizeof shapes / sizeof *shapes };

/* Sinks: rows that see no key (Nq > Nkv, causal), a split decode on the
 * tiled forward and its merge (17 rows), the decode kernel, F32; a
 * backward of each kind of row. */
static const check_shape sink_shapes[] = {
    {ATTN_FORWARD, ATTN_F16, 4, 2, 65, 40, 61, true, -1, 0, false, false, 0, false},
    {ATTN_FORWARD, ATTN_BF16, 2, 2, 17, 700, 64, false, -1, 0, false, false, 0, false},
    {ATTN_FORWARD, ATTN_BF16, 4, 2, 1, 700, 128, false, -1, 0, false, false, 0, false},
    {ATTN_FORWARD, ATTN_F32, 4, 2, 37, 70, 45, true, -1, 0, false, false, 0, false},
    {ATTN_BACKWARD, ATTN_F16, 4, 2, 37, 70, 61, true, -1, 0, false, false, 0, false},
    {ATTN_BACKWARD, ATTN_F32, 4, 2, 37, 30, 45, true, -1, 0, false, false, 0, false},
};
enum { NSINKS = sizeof sink_shapes / sizeof *sink_shapes };

/* Case i's shape: shapes[i], or past them the (i − NSHAPES)-th backward
 * shape (an atomic case). */
static const check_shape *shape_at(int i) {
  for (int k = 0, n = NSHAPES; k < NSHAPES && i >= NSHAPES; k++)
    if (shapes[k].pass == ATTN_BACKWARD && n++ == i)
      return &shapes[k];
  return &shapes[i];
}

int attn_cu_check_count(void) {
  int n = NSHAPES;
  for (int k = 0; k < NSHAPES; k++)
    n += shapes[k].pass == ATTN_BACKWARD;
  return n;
}

bool attn_cu_check_is_hopper(int i) { return shape_at(i)->hopper; }

bool attn_cu_check_is_atomic(int i) { return i >= NSHAPES; }

static double tolerance(attn_dtype dt) {
  return 4 * (dt == ATTN_F16 ? 1e-3 : dt == ATTN_BF16 ? 8e-3 : 1e-5);
}

/* n elements of dtype dt at p, uniform in [-1, 1), from an xorshift. */
static void fill(void *p, attn_dtype dt, size_t n, uint64_t *x) {
  for (size_t i = 0; i < n; i++) {
    *x ^= *x << 13, *x ^= *x >> 7, *x ^= *x << 17;
    attn_store_elem(p, dt, i, (float)((double)(*x >> 11) / (double)(1ull << 52) - 1.0));
  }
}

static void request_of(const check_shape *s, attn_request *r) {
  attn_request_init(r);
  r->pass = s->pass;
  r->dtype = s->dt;
  r->batch = 1, r->heads_q = s->hq, r->heads_kv = s->hkv;
  r->seq_q = s->nq, r->seq_kv = s->nkv, r->head_dim = s->d;
  r->causal = s->causal;
  r->window_left = s->wl;
  r->softcap = s->softcap;
  if (s->scale != 0)
    r->scale = s->scale;
  if (s->topleft)
    r->diag_offset = 0;
}

/* Points the request's tensors into one buffer (inputs filled). */
static int lay_out(attn_cu_check *c, attn_status *st) {
  attn_request *r = &c->req;
  size_t es = attn_dtype_size(r->dtype);
  size_t nq = (size_t)(r->heads_q * r->seq_q * r->head_dim);
  size_t nk = (size_t)(r->heads_kv * r->seq_kv * r->head_dim);
  bool bwd = r->pass == ATTN_BACKWARD;
  size_t n = bwd ? 4 * nq + 4 * nk : 2 * nq + 2 * nk;
  unsigned char *b = calloc(n, es);
  if (!b)
    return attn_status_set(st, ATTN_ENOMEM, "out of memory for the cuda self-check");
  c->buf = b;
  uint64_t x = 0x9e3779b97f4a7c15ull ^ (uint64_t)n;
  /* q k v o, then do dq dk dv; the inputs random */
  const size_t lens[] = {nq, nk, nk, nq, nq, nq, nk, nk};
  void *at[8];
  for (int i = 0; i < (bwd ? 8 : 4); i++) {
    at[i] = b;
    if (i < 3 || i == 4)
      fill(b, r->dtype, lens[i], &x);
    b += lens[i] * es;
  }
  r->q = at[0], r->k = at[1], r->v = at[2], r->o = at[3];
  if (bwd)
    r->dout = at[4], r->dq = at[5], r->dk = at[6], r->dv = at[7];
  attn__request_fill_strides(r);
  return 0;
}

/* A backward case's O and lse_in: the reference forward, O rounded to the
 * dtype. */
static int forward_inputs(attn_cu_check *c, attn_status *st) {
  attn_request f = c->req;
  f.pass = ATTN_FORWARD;
  f.dout = NULL, f.dq = f.dk = f.dv = NULL;
  size_t n = (size_t)(f.heads_q * f.seq_q * f.head_dim);
  double *o = malloc(n * sizeof *o), lse[ATTN_CU_CHECK_ROWS];
  if (!o)
    return attn_status_set(st, ATTN_ENOMEM, "out of memory for the cuda self-check");
  int rc = attn_reference(&f, o, NULL, NULL, lse, st);
  for (size_t i = 0; rc == 0 && i < n; i++)
    attn_store_elem(c->req.o, f.dtype, i, (float)o[i]);
  for (int64_t i = 0; i < f.heads_q * f.seq_q; i++)
    c->lse[i] = (float)lse[i];
  c->req.lse_in = c->lse;
  free(o);
  return rc;
}

/* A sinks case's: sinks from −2 to 2.5 (the scores' range), dsinks wanted,
 * and (backward) no lse_in, so the device recomputes and folds it. */
static void add_sinks(attn_cu_check *c) {
  attn_request *r = &c->req;
  for (int64_t h = 0; h < r->heads_q; h++)
    c->sinks[h] = (float)(-2.0 + 1.5 * (double)(h % 4));
  r->sinks = c->sinks;
  if (r->pass == ATTN_BACKWARD)
    r->dsinks = c->dsinks;
}

/* Shape sh made a case (sinks: with them), inputs and reference. */
static int make(const check_shape *sh, bool atomic, bool sinks, attn_cu_check *c, attn_status *st) {
  memset(c, 0, sizeof *c);
  if (sh->hq > ATTN_CU_CHECK_HEADS || sh->hq * sh->nq > ATTN_CU_CHECK_ROWS)
    return attn_status_set(st, ATTN_EINVAL, "a self-check case has more rows than its buffers");
  request_of(sh, &c->req);
  c->atomic = atomic;
  attn_request *r = &c->req;
  if (sinks)
    add_sinks(c);
  if (sh->alibi) { /* 2^(-8 (h + 1) / Hq), as ALiBi's paper sets them */
    for (int h = 0; h < sh->hq; h++)
      c->slopes[h] = (float)exp2(-8.0 * (h + 1) / sh->hq);
    r->alibi_slopes = c->slopes;
  }
  size_t nq = (size_t)(r->heads_q * r->seq_q * r->head_dim);
  size_t nk = (size_t)(r->heads_kv * r->seq_kv * r->head_dim);
  int rc = lay_out(c, st);
  if (rc < 0)
    return rc;
  const size_t rows = (size_t)(r->heads_q * r->seq_q);
  c->ref = malloc((nq + 2 * nk + rows + (size_t)r->heads_q) * sizeof *c->ref);
  if (!c->ref) {
    attn_cu_check_free(c);
    return attn_status_set(st, ATTN_ENOMEM, "out of memory for the cuda self-check");
  }
  if (r->pass == ATTN_FORWARD) {
    r->lse = c->lse; /* the device's statistics, checked too */
    rc = attn_reference(r, c->ref, NULL, NULL, c->ref + nq, st);
  } else if ((rc = forward_inputs(c, st)) == 0) {
    rc = attn_reference_backward(r, c->ref, c->ref + nq, c->ref + nq + nk, st);
    if (rc == 0 && r->dsinks)
      rc = attn_reference_dsinks(r, c->ref + nq + 2 * nk + rows, st);
    if (r->sinks)
      r->lse_in = NULL;
  }
  if (rc < 0)
    attn_cu_check_free(c);
  return rc;
}

int attn_cu_check_make(int i, attn_cu_check *c, attn_status *st) {
  return make(shape_at(i), attn_cu_check_is_atomic(i), false, c, st);
}

int attn_cu_check_sinks_count(void) { return NSINKS; }

int attn_cu_check_sinks_make(int i, attn_cu_check *c, attn_status *st) {
  return make(&sink_shapes[i], false, true, c, st);
}

/* sqrt(sum (x - y)^2 / sum y^2) over n elements of x (dtype dt, or F32
 * statistics when f32 is set); NaN counts as infinite. */
static double norm_err(const void *x, attn_dtype dt, bool f32, const double *y, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; i++) {
    double a = f32 ? ((const float *)x)[i] : attn_load_elem(x, dt, i);
    if (isnan(a))
      return INFINITY;
    num += (a - y[i]) * (a - y[i]);
    den += y[i] * y[i];
  }
  return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* Why a case failed: the tensor, its error and the shape; returns false. */
static bool describe(const attn_cu_check *c, const char *tensor, double e, double tol, char *why,
                     size_t cap) {
  const attn_request *r = &c->req;
  snprintf(why, cap, "%s error %.2g > %.0e on %s %s [%lld, %lld, %lld, %lld, %lld]%s%s%s", tensor,
           e, tol, attn_dtype_name(r->dtype),
           r->pass == ATTN_FORWARD ? "forward"
           : c->atomic             ? "backward (atomic dQ)"
                                   : "backward",
           (long long)r->heads_q, (long long)r->heads_kv, (long long)r->seq_q, (long long)r->seq_kv,
           (long long)r->head_dim, r->causal ? " causal" : "",
           r->softcap > 0 || r->alibi_slopes ? " with softcap/alibi" : "",
           r->sinks ? " with sinks" : "");
  return false;
}

bool attn_cu_check_verify(const attn_cu_check *c, char *why, size_t cap) {
  const attn_request *r = &c->req;
  size_t nq = (size_t)(r->heads_q * r->seq_q * r->head_dim);
  size_t nk = (size_t)(r->heads_kv * r->seq_kv * r->head_dim);
  const void *out[3] = {r->o, NULL, NULL};
  const size_t len[3] = {nq, nk, nk};
  const char *name[3] = {"o", "dk", "dv"};
  if (r->pass == ATTN_BACKWARD)
    out[0] = r->dq, out[1] = r->dk, out[2] = r->dv, name[0] = "dq";
  const double tol = tolerance(r->dtype);
  for (size_t t = 0, at = 0; t < 3 && out[t]; at += len[t], t++) {
    double e = norm_err(out[t], r->dtype, false, c->ref + at, len[t]);
    if (!(e <= tol))
      return describe(c, name[t], e, tol, why, cap);
  }
  const size_t rows = (size_t)(r->heads_q * r->seq_q);
  if (r->pass == ATTN_FORWARD) {
    double e = norm_err(r->lse, r->dtype, true, c->ref + nq, rows);
    if (!(e <= 1e-4))
      return describe(c, "lse", e, 1e-4, why, cap);
  }
  if (r->dsinks) {
    double e = norm_err(r->dsinks, r->dtype, true, c->ref + nq + 2 * nk + rows, (size_t)r->heads_q);
    if (!(e <= tol))
      return describe(c, "dsinks", e, tol, why, cap);
  }
  return true;
}

void attn_cu_check_free(attn_cu_check *c) {
  free(c->buf);
  free(c->ref);
  c->buf = NULL;
  c->ref = NULL;
}
