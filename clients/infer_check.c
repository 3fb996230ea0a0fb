/*
 * infer_check.c — `attn infer --check`: the reply against float64 standard
 * attention on the same inputs (the engine's attn_reference()), with the
 * tolerances the usage text gives: normalized error of o per dtype, and m,
 * l, lse within 1e-5 relative to max(1, |ref|); for a backward reply, the
 * normalized errors of dq, dk and dv against the float64 reference backward
 * (attn_reference_backward()) with o's tolerance, and with sinks dsinks
 * against attn_reference_dsinks() with the same.
 */
#include "infer.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

static int fail(char *err, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(char *err, size_t cap, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, cap, fmt, ap);
  va_end(ap);
  return -1;
}

/* Query rows: the statistics' element count, o's over Dv (a variable-length
 * batch's are [Hq, total]). */
static size_t rows_of(const attn_request *r) {
  return (size_t)((r->cu_seqlens_q ? 1 : r->batch) * r->heads_q * r->seq_q);
}

static double rel_err(double x, double ref) {
  if (isinf(ref) || isinf(x) || isnan(x))
    return x == ref ? 0 : INFINITY;
  return fabs(x - ref) / fmax(1.0, fabs(ref));
}

static double tolerance(attn_dtype dt) {
  return dt == ATTN_F32 ? 1e-5 : dt == ATTN_F16 ? 1e-3 : 8e-3;
}

/* The running errors of a forward reply: o's squared differences and
 * norm, and the largest error of each statistic. */
typedef struct fwd_err {
  double num, den, stat[3];
  bool nan;
} fwd_err;

/* Rows [q0, q0 + nq) of each of g row groups (total rows each) of the
 * reply in pr against the float64 ones: o [g, nq, Dv], statistics
 * [3][g * nq]. A whole request is g = B·Hq groups of all Nq rows; one
 * sequence of a variable-length batch Hq groups of its rows. */
static void add_rows(const attn_proto_req *pr, int64_t g, int64_t total, int64_t q0, int64_t nq,
                     const double *o, const double *st, fwd_err *e) {
  const attn_request *r = &pr->req;
  const float *got[3] = {r->m, r->l, r->lse};
  const size_t D = (size_t)attn_request_dv(r), rows = (size_t)(g * nq);
  for (int64_t h = 0; h < g; h++)
    for (int64_t i = 0; i < nq; i++) {
      size_t at = (size_t)(h * total + q0 + i), ref = (size_t)(h * nq + i);
      for (size_t d = 0; d < D; d++) {
        double x = attn_load_elem(r->o, r->dtype, at * D + d), diff = x - o[ref * D + d];
        e->nan |= x != x;
        e->num += diff * diff;
        e->den += o[ref * D + d] * o[ref * D + d];
      }
      for (int k = 0; pr->opts.stats && k < 3; k++)
        e->stat[k] = fmax(e->stat[k], rel_err(got[k][at], st[(size_t)k * rows + ref]));
    }
}

/* Float64 attention of one problem into o and st (as add_rows() reads
 * them); a problem with no key is the definition's O = 0, m = lse = -inf,
 * l = 0 (the reference takes at least one key), or with sinks m = lse =
 * sinks[h], l = 1: the sink is the one key of the row. */
static int reference(const attn_request *r, double *o, double *st, attn_status *s) {
  const size_t rows = (size_t)(r->batch * r->heads_q * r->seq_q);
  if (r->seq_kv > 0)
    return attn_reference(r, o, st, st + rows, st + 2 * rows, s);
  for (size_t i = 0; i < rows * (size_t)attn_request_dv(r); i++)
    o[i] = 0;
  for (size_t i = 0; i < rows; i++) {
    const double sink = r->sinks ? r->sinks[i / (size_t)r->seq_q % (size_t)r->heads_q] : -INFINITY;
    st[i] = st[2 * rows + i] = sink;
    st[rows + i] = r->sinks ? 1 : 0;
  }
  return 0;
}

/*
 * Errors of the reply (in pr's output buffers) against float64 standard
 * attention on the same inputs, a variable-length batch one sequence at a
 * time (its own problem, as the engine splits it): e[0] the normalized
 * error of o, e[1..3] the largest error of m, l, lse relative to max(1,
 * |ref|). Returns 0, or -1 with the reason in err.
 */
static int check_reply(const attn_proto_req *pr, double e[4], char *err, size_t cap) {
  const attn_request *r = &pr->req;
  const bool varlen = r->cu_seqlens_q != NULL;
  size_t rows = rows_of(r), n = rows * (size_t)attn_request_dv(r);
  double *o = malloc(n * sizeof *o + 1), *st = malloc(3 * rows * sizeof *st + 1);
  fwd_err acc = {0};
  attn_status s;
  int rc = 0;
  if (!o || !st)
    rc = fail(err, cap, "out of memory for the float64 reference");
  for (int64_t b = 0; rc == 0 && b < (varlen ? r->batch : 1); b++) {
    attn_request one = *r;
    if (varlen)
      attn_request_sequence(r, b, &one);
    if (one.seq_q == 0)
      continue;
    if (reference(&one, o, st, &s) < 0)
      rc = fail(err, cap, "the float64 reference failed: %s", s.message);
    else if (varlen)
      add_rows(pr, r->heads_q, r->seq_q, r->cu_seqlens_q[b], one.seq_q, o, st, &acc);
    else
      add_rows(pr, r->batch * r->heads_q, r->seq_q, 0, r->seq_q, o, st, &acc);
  }
  e[0] = acc.nan ? INFINITY : acc.den > 0 ? sqrt(acc.num / acc.den) : sqrt(acc.num);
  for (int k = 0; k < 3; k++)
    e[1 + k] = acc.stat[k];
  free(o);
  free(st);
  return rc;
}

/* ||x - ref|| / ||ref|| of a reply buffer (dtype dt) against doubles
 * (absolute when ref is 0; a NaN counts as infinite). */
static double norm_err(const void *x, attn_dtype dt, const double *ref, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; i++) {
    double v = attn_load_elem(x, dt, i), d = v - ref[i];
    if (v != v)
      return INFINITY;
    num += d * d;
    den += ref[i] * ref[i];
  }
  return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* The float64 gradients of a backward request into g: dq (nq), dk (nk),
 * dv (nv: Dv wide), then dsinks [Hq] when it has sinks. 0, or 1 after a
 * message. */
static int reference_grads(const attn_request *r, const size_t n[3], double *g) {
  attn_status s;
  int rc = g ? attn_reference_backward(r, g, g + n[0], g + n[0] + n[1], &s) : -1;
  if (rc == 0 && r->sinks)
    rc = attn_reference_dsinks(r, g + n[0] + n[1] + n[2], &s);
  if (rc < 0)
    fprintf(stderr, TOOL_INFER_ME ": --check: %s\n",
            g ? s.message : "out of memory for the float64 reference");
  return rc < 0 ? 1 : 0;
}

/* A backward reply: dq, dk, dv (and dsinks) against the float64 reference
 * backward on the same inputs (which reads neither o nor lse but checks
 * them). */
static int check_backward(const tool_infer_args *a, const attn_proto_req *pr) {
  const attn_request *r = &pr->req;
  const size_t kv_rows = (size_t)(r->batch * r->heads_kv * r->seq_kv),
               ns = r->sinks ? (size_t)r->heads_q : 0;
  const size_t n[3] = {rows_of(r) * (size_t)r->head_dim, kv_rows * (size_t)r->head_dim,
                       kv_rows * (size_t)attn_request_dv(r)};
  double *g = malloc((n[0] + n[1] + n[2] + ns) * sizeof *g), e[4] = {0, 0, 0, 0};
  if (reference_grads(r, n, g) != 0) {
    free(g);
    return 1;
  }
  const void *got[3] = {r->dq, r->dk, r->dv};
  for (size_t i = 0, at = 0; i < 3; at += n[i], i++)
    e[i] = norm_err(got[i], r->dtype, g + at, n[i]);
  if (ns)
    e[3] = norm_err(r->dsinks, ATTN_F32, g + n[0] + n[1] + n[2], ns);
  free(g);
  double tol = tolerance(r->dtype);
  bool pass = e[0] <= tol && e[1] <= tol && e[2] <= tol && e[3] <= tol;
  if (pass && a->quiet)
    return 0;
  FILE *f = pass ? stdout : stderr;
  fprintf(f, "check     dq %.2e, dk %.2e, dv %.2e", e[0], e[1], e[2]);
  if (ns)
    fprintf(f, ", dsinks %.2e", e[3]);
  fprintf(f, " (tolerance %s %g) against the float64 backward: %s\n", attn_dtype_name(r->dtype),
          tol, pass ? "PASS" : "FAIL");
  return pass ? 0 : 1;
}

int tool_infer_check(const tool_infer_args *a, const attn_proto_req *pr) {
  if (pr->req.cu_seqlens_q && pr->req.pass == ATTN_BACKWARD) {
    fprintf(stderr, TOOL_INFER_ME ": --check does not check the backward pass of a "
                                  "variable-length batch yet (its forward, yes)\n");
    return 1;
  }
  if (pr->req.pass == ATTN_BACKWARD)
    return check_backward(a, pr);
  double e[4];
  double tol = tolerance(pr->req.dtype), stol = 1e-5;
  char err[512];
  if (check_reply(pr, e, err, sizeof err) < 0) {
    fprintf(stderr, TOOL_INFER_ME ": --check: %s\n", err);
    return 1;
  }
  bool pass = e[0] <= tol;
  for (int k = 1; k < 4; k++)
    pass = pass && e[k] <= stol;
  FILE *f = pass ? stdout : stderr;
  if (!pass || !a->quiet) {
    fprintf(f, "check     o %.2e", e[0]);
    if (pr->opts.stats)
      fprintf(f, ", m %.2e, l %.2e, lse %.2e", e[1], e[2], e[3]);
    fprintf(f, " (tolerance %s %g%s) against float64: %s\n", attn_dtype_name(pr->req.dtype), tol,
            pr->opts.stats ? ", statistics 1e-05" : "", pass ? "PASS" : "FAIL");
  }
  return pass ? 0 : 1;
}
