/*
 * dv.c — values with a head dim of their own, by padding.
 *
 * Attention with q·k over D columns and values of Dv columns is attention
 * of head dim W = max(D, Dv) with the narrower side padded with zeros:
 * zero columns of q and k add nothing to a score, and zero columns of v
 * give zero columns of O that are cut off. So every backend runs such a
 * request with its ordinary kernels: the narrower tensors are copied into
 * [B, H, N, W] buffers (inputs zero-padded, outputs of width W cut back to
 * their own after the job), and the scale stays D's. It costs the padded
 * columns' arithmetic and one copy of the narrow side: O(N·W) memory, never
 * O(N²). The padded job carries Dv as v_cols, so a backend may leave v's
 * padding out of its products (the CPU kernels' P·V over query blocks
 * and their backward do). Pages (a session's cache) are not copied: their
 * rows are W wide already (engine.h), k's zero past D, so only q and O are
 * padded, and a latent session's v (its k pages) goes through whole, its
 * columns past Dv feeding only O's columns that are cut.
 */
#include "dv.h"

#include "request_int.h"

#include <stdlib.h>
#include <string.h>

enum { NBUF = 6 };

typedef struct dv_job {
  attn_request orig; /* the caller's request, strides filled */
  attn_request in;   /* the padded one the backend runs */
  attn_done_fn done;
  void *arg;
  void *buf[NBUF];
  int nbuf;
} dv_job;

static void dv_free(dv_job *j) {
  for (int i = 0; i < j->nbuf; i++)
    free(j->buf[i]);
  free(j);
}

/* A zeroed [B, H, N, W] buffer of the job's (NULL out of memory). */
static void *dv_alloc(dv_job *j, int64_t h, int64_t n) {
  const attn_request *r = &j->orig;
  const int64_t b = r->cu_seqlens_q ? 1 : r->batch, w = j->in.head_dim;
  void *p = calloc((size_t)(b * h * n * w), attn_dtype_size(r->dtype));
  if (p)
    j->buf[j->nbuf++] = p;
  return p;
}

/* Row i (of B·H·N) of a tensor at strides s. */
static size_t row_at(const int64_t s[3], int64_t h, int64_t n, int64_t i) {
  return (size_t)(i / (h * n) * s[0] + i / n % h * s[1] + i % n * s[2]);
}

/* The strides of one of the job's [B, H, N, W] buffers. */
static void wide_strides(const dv_job *j, int64_t h, int64_t n, int64_t s[3]) {
  s[2] = j->in.head_dim;
  s[1] = n * s[2];
  s[0] = h * s[1];
}

/* The first w elements of every row, from src (strides ss) to dst (strides
 * ds). */
static void copy_rows(const dv_job *j, void *dst, const int64_t ds[3], const void *src,
                      const int64_t ss[3], int64_t h, int64_t n, int64_t w) {
  const attn_request *r = &j->orig;
  const int64_t rows = (r->cu_seqlens_q ? 1 : r->batch) * h * n;
  const size_t es = attn_dtype_size(r->dtype);
  for (int64_t i = 0; i < rows; i++)
    memcpy((char *)dst + row_at(ds, h, n, i) * es, (const char *)src + row_at(ss, h, n, i) * es,
           (size_t)w * es);
}

/* An output as a buffer of width W in the padded request (its strides *ps
 * zeroed: contiguous), cut back by dv_done; 0 or -1 out of memory. */
static int pad_output(dv_job *j, void **pout, int64_t ps[3], int64_t h, int64_t n) {
  void *p = dv_alloc(j, h, n);
  if (!p)
    return -1;
  *pout = p;
  memset(ps, 0, 3 * sizeof *ps);
  return 0;
}

/* An input of width w as such a buffer, zero-padded. */
static int pad_input(dv_job *j, const void **pin, int64_t ps[3], int64_t h, int64_t n, int64_t w) {
  const void *src = *pin;
  int64_t ss[3] = {ps[0], ps[1], ps[2]}, ws[3];
  void *p;
  if (pad_output(j, &p, ps, h, n) < 0)
    return -1;
  wide_strides(j, h, n, ws);
  copy_rows(j, p, ws, src, ss, h, n, w);
  *pin = p;
  return 0;
}

/* An output of width w back from the padded job's buffer. */
static void cut_output(const dv_job *j, void *dst, const int64_t ds[3], const void *wide, int64_t h,
                       int64_t n, int64_t w) {
  int64_t ws[3];
  wide_strides(j, h, n, ws);
  copy_rows(j, dst, ds, wide, ws, h, n, w);
}

/* Dv < D: v (and a backward's o and dO) padded to D, unless it is pages;
 * O (a backward's dV) made D wide. */
static int plan_narrow_v(dv_job *j) {
  attn_request *in = &j->in;
  const attn_request *r = &j->orig;
  const int64_t hq = r->heads_q, hk = r->heads_kv, nq = r->seq_q, nk = r->seq_kv;
  const int64_t dv = attn_request_dv(r);
  if (!r->v_pages && pad_input(j, &in->v, in->v_stride, hk, nk, dv) < 0)
    return -1;
  in->v_cols = dv;
  if (r->pass == ATTN_FORWARD)
    return pad_output(j, &in->o, in->o_stride, hq, nq);
  const void *o = in->o;
  if (pad_input(j, &o, in->o_stride, hq, nq, dv) < 0 ||
      pad_input(j, &in->dout, in->do_stride, hq, nq, dv) < 0)
    return -1;
  in->o = (void *)(uintptr_t)o;
  return pad_output(j, &in->dv, in->dv_stride, hk, nk);
}

/* D < Dv: q and k (unless it is pages) padded to Dv; a backward's dQ and
 * dK made Dv wide. */
static int plan_narrow_qk(dv_job *j) {
  attn_request *in = &j->in;
  const attn_request *r = &j->orig;
  const int64_t hq = r->heads_q, hk = r->heads_kv, nq = r->seq_q, nk = r->seq_kv;
  if (pad_input(j, &in->q, in->q_stride, hq, nq, r->head_dim) < 0 ||
      (!r->k_pages && pad_input(j, &in->k, in->k_stride, hk, nk, r->head_dim) < 0))
    return -1;
  if (r->pass == ATTN_FORWARD)
    return 0;
  return pad_output(j, &in->dq, in->dq_stride, hq, nq) < 0 ||
                 pad_output(j, &in->dk, in->dk_stride, hk, nk) < 0
             ? -1
             : 0;
}

/* The padded job's outputs cut back to their own widths, then the caller's
 * callback with the caller's request's FLOPs. */
static void dv_done(const attn_result *res, void *arg) {
  dv_job *j = arg;
  const attn_request *r = &j->orig, *in = &j->in;
  const int64_t hq = r->heads_q, hk = r->heads_kv, nq = r->seq_q, nk = r->seq_kv;
  const int64_t dv = attn_request_dv(r);
  if (res->status.code == 0 && dv < r->head_dim) {
    if (r->pass == ATTN_FORWARD)
      cut_output(j, r->o, r->o_stride, in->o, hq, nq, dv);
    else
      cut_output(j, r->dv, r->dv_stride, in->dv, hk, nk, dv);
  } else if (res->status.code == 0 && r->pass == ATTN_BACKWARD) {
    cut_output(j, r->dq, r->dq_stride, in->dq, hq, nq, r->head_dim);
    cut_output(j, r->dk, r->dk_stride, in->dk, hk, nk, r->head_dim);
  }
  attn_result out = *res;
  out.flops = attn_request_flops(r);
  j->done(&out, j->arg);
  dv_free(j);
}

int attn__dv_submit(attn_engine *e, const attn_request *r, bool here, attn_done_fn done, void *arg,
                    attn__submit_fn submit, attn_status *st) {
  dv_job *j = calloc(1, sizeof *j);
  if (!j)
    return attn_status_set(st, ATTN_ENOMEM, "out of memory queueing a job");
  j->orig = *r;
  attn__request_fill_strides(&j->orig);
  j->in = j->orig;
  j->done = done;
  j->arg = arg;
  const int64_t D = r->head_dim, Dv = attn_request_dv(r);
  j->in.head_dim = D > Dv ? D : Dv;
  j->in.head_dim_v = 0;
  j->in.scale = attn_request_scale(r); /* D's, not the padded width's */
  if ((Dv < D ? plan_narrow_v(j) : plan_narrow_qk(j)) < 0) {
    dv_free(j);
    return attn_status_set(st, ATTN_ENOMEM,
                           "out of memory for the copies that pad head_dim %lld and head_dim_v "
                           "%lld to one width",
                           (long long)D, (long long)Dv);
  }
  int rc = submit(e, &j->in, here, dv_done, j, st);
  if (rc < 0)
    dv_free(j);
  return rc;
}
