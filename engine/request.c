/*
 * request.c — the rules of docs/design.md for one request, checked once.
 *
 * Backends may assume a request that passed attn_request_validate(): every
 * dimension in range, every size product free of overflow, strides filled
 * in. Messages name the field and the value so the server can pass them to
 * the user verbatim.
 */
#include "request_int.h"

#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#define ATTN_ERRNO_NAME(name, msg) #name,
#define ATTN_ERRNO_MSG(name, msg) msg,
static const char *const err_names[] = {ATTN_ERRNO_MAP(ATTN_ERRNO_NAME)};
static const char *const err_msgs[] = {ATTN_ERRNO_MAP(ATTN_ERRNO_MSG)};

static int err_index(int code) {
  int i = code - ATTN__ERRNO_BASE - 1;
  return i >= 0 && i < (int)(sizeof err_names / sizeof *err_names) ? i : -1;
}

const char *attn_strerror(int code) {
  if (code == 0)
    return "success";
  int i = err_index(code);
  return i < 0 ? "unknown error" : err_msgs[i];
}

const char *attn_err_name(int code) {
  if (code == 0)
    return "OK";
  int i = err_index(code);
  return i < 0 ? "EUNKNOWN" : err_names[i];
}

int attn_status_set(attn_status *st, int code, const char *fmt, ...) {
  if (st) {
    st->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(st->message, sizeof st->message, fmt, ap);
    va_end(ap);
  }
  return code;
}

void attn_request_init(attn_request *r) {
  memset(r, 0, sizeof *r);
  r->dtype = ATTN_F32;
  r->scale = NAN;
  r->window_left = -1;
  r->window_right = -1;
  r->diag_offset = ATTN_DIAG_AUTO;
}

double attn_request_scale(const attn_request *r) {
  return isnan(r->scale) ? 1.0 / sqrt((double)r->head_dim) : r->scale;
}

/* |i + off| <= 2^41 and 0 <= j < 2^40 in every valid request, so a side past
 * 2^42 excludes no key: it is unbounded, and i + off +- side stays far from
 * int64's limits. */
#define WINDOW_FAR ((int64_t)1 << 42)

void attn_request_window(const attn_request *r, int64_t *pleft, int64_t *pright) {
  int64_t wl = r->window_left, wr = r->causal ? 0 : r->window_right;
  *pleft = wl > WINDOW_FAR ? -1 : wl;
  *pright = wr > WINDOW_FAR ? -1 : wr;
}

int64_t attn_request_offset(const attn_request *r) {
  return r->diag_offset == ATTN_DIAG_AUTO ? r->seq_kv - r->seq_q : r->diag_offset;
}

int64_t attn_request_dv(const attn_request *r) {
  return r->head_dim_v ? r->head_dim_v : r->head_dim;
}

double attn_request_alibi_slope(const attn_request *r, int64_t b, int64_t h) {
  return r->alibi_slopes ? (double)r->alibi_slopes[b * r->alibi_stride_b + h] : 0.0;
}

static int check_dim(attn_status *st, const char *name, int64_t v) {
  if (v < 1)
    return attn_status_set(st, ATTN_ESHAPE, "%s must be at least 1 (got %lld)", name, (long long)v);
  if (v > ATTN_MAX_DIM)
    return attn_status_set(st, ATTN_ESHAPE, "%s = %lld is larger than %lld", name, (long long)v,
                           (long long)ATTN_MAX_DIM);
  return 0;
}

/* Bytes spanned by a [B, H, N, D] tensor with strides s; -1 on overflow. */
static int64_t span_bytes(int64_t b, int64_t h, int64_t n, int64_t d, const int64_t s[3],
                          size_t esize) {
  int64_t last = d - 1, t;
  const int64_t dims[3] = {b, h, n};
  for (int i = 0; i < 3; i++) {
    if (__builtin_mul_overflow(dims[i] - 1, s[i], &t) || __builtin_add_overflow(last, t, &last))
      return -1;
  }
  if (__builtin_add_overflow(last, 1, &last) || __builtin_mul_overflow(last, (int64_t)esize, &t))
    return -1;
  return t;
}

static int check_tensor(attn_status *st, const char *name, const void *p, int64_t b, int64_t h,
                        int64_t n, int64_t d, const int64_t s[3], size_t esize) {
  if (!p)
    return attn_status_set(st, ATTN_EINVAL, "tensor %s has no data (NULL)", name);
  bool zero = s[0] == 0 && s[1] == 0 && s[2] == 0;
  if (!zero && (s[0] < 0 || s[1] < 0 || s[2] < d))
    return attn_status_set(st, ATTN_EINVAL,
                           "tensor %s: strides [%lld, %lld, %lld] are invalid "
                           "(negative, or a row stride under head_dim %lld)",
                           name, (long long)s[0], (long long)s[1], (long long)s[2], (long long)d);
  int64_t cs[3] = {0, 0, d};
  bool ovf = __builtin_mul_overflow(n, d, &cs[1]) || __builtin_mul_overflow(h, cs[1], &cs[0]);
  if (ovf || span_bytes(b, h, n, d, zero ? cs : s, esize) < 0)
    return attn_status_set(st, ATTN_EOVERFLOW,
                           "tensor %s: [%lld, %lld, %lld, %lld] overflows "
                           "64-bit byte sizes",
                           name, (long long)b, (long long)h, (long long)n, (long long)d);
  return 0;
}

/* softcap and the ALiBi slopes. A slope's bias reaches |slope|·(largest
 * |i + off - j|); kept under a quarter of FLT_MAX (in base 2, as the CPU
 * kernels compute), it cannot overflow float32 added to a score. */
static int validate_variants(const attn_request *r, attn_status *st) {
  if (!(r->softcap == 0 || (r->softcap >= 1e-12 && r->softcap <= 1e12)))
    return attn_status_set(st, ATTN_EINVAL,
                           "softcap must be 0 (off) or a number between 1e-12 and 1e12 "
                           "(got %g)",
                           r->softcap);
  if (!r->alibi_slopes)
    return 0;
  if (r->alibi_stride_b != 0 && r->alibi_stride_b != r->heads_q)
    return attn_status_set(st, ATTN_EINVAL,
                           "alibi_stride_b must be 0 (slopes [Hq]) or heads_q = %lld "
                           "(slopes [B, Hq]); got %lld",
                           (long long)r->heads_q, (long long)r->alibi_stride_b);
  const int64_t nb = r->alibi_stride_b ? r->batch : 1, off = attn_request_offset(r);
  const double far = (double)llabs(off) + (double)r->seq_q + (double)r->seq_kv;
  for (int64_t b = 0; b < nb; b++)
    for (int64_t h = 0; h < r->heads_q; h++) {
      double x = attn_request_alibi_slope(r, b, h);
      if (!isfinite(x))
        return r->alibi_stride_b
                   ? attn_status_set(st, ATTN_ENONFINITE,
                                     "tensor alibi_slopes holds a non-finite value (%g) at "
                                     "[%lld, %lld]; slopes must be finite",
                                     x, (long long)b, (long long)h)
                   : attn_status_set(st, ATTN_ENONFINITE,
                                     "tensor alibi_slopes holds a non-finite value (%g) at "
                                     "[%lld]; slopes must be finite",
                                     x, (long long)h);
      if (fabs(x) * far * M_LOG2E > FLT_MAX / 4)
        return attn_status_set(st, ATTN_ERANGE,
                               "alibi_slopes: slope %g times a distance of up to %.0f "
                               "overflows float32; use smaller slopes",
                               x, far);
    }
  return 0;
}

/* The sinks, a few floats read here like the slopes; dsinks only where a
 * backward pass has sinks to differentiate. */
static int validate_sinks(const attn_request *r, attn_status *st) {
  if (r->dsinks && (r->pass != ATTN_BACKWARD || !r->sinks))
    return attn_status_set(st, ATTN_EINVAL,
                           r->sinks ? "dsinks is a backward pass's output"
                                    : "dsinks needs sinks: a gradient of sinks the "
                                      "request does not have");
  for (int64_t h = 0; r->sinks && h < r->heads_q; h++)
    if (!isfinite(r->sinks[h]))
      return attn_status_set(st, ATTN_ENONFINITE,
                             "tensor sinks holds a non-finite value (%g) at [%lld]; sinks "
                             "must be finite",
                             (double)r->sinks[h], (long long)h);
  return 0;
}

/* The backward pass's own tensors; the shared ones were checked already. */
static int validate_backward(const attn_request *r, int64_t b, size_t es, attn_status *st) {
  if (r->pass != ATTN_BACKWARD)
    return attn_status_set(st, ATTN_EINVAL, "unknown pass %d (forward or backward)", (int)r->pass);
  if (r->m || r->l || r->lse)
    return attn_status_set(st, ATTN_EINVAL,
                           "a backward pass returns dq, dk and dv, not m, l or lse; "
                           "pass the forward's lse as an input instead");
  int64_t hq = r->heads_q, hk = r->heads_kv, d = r->head_dim, dv = attn_request_dv(r);
  int rc;
  if ((rc = check_tensor(st, "do", r->dout, b, hq, r->seq_q, dv, r->do_stride, es)) ||
      (rc = check_tensor(st, "dq", r->dq, b, hq, r->seq_q, d, r->dq_stride, es)) ||
      (rc = check_tensor(st, "dk", r->dk, b, hk, r->seq_kv, d, r->dk_stride, es)) ||
      (rc = check_tensor(st, "dv", r->dv, b, hk, r->seq_kv, dv, r->dv_stride, es)))
    return rc;
  return 0;
}

int attn_offsets_check(attn_status *st, const char *name, const int64_t *cu, int64_t batch,
                       int64_t total, const char *rows) {
  if (cu[0] != 0)
    return attn_status_set(st, ATTN_ESHAPE, "%s[0] is %lld; the offsets must start at 0", name,
                           (long long)cu[0]);
  for (int64_t b = 1; b <= batch; b++)
    if (cu[b] < cu[b - 1])
      return attn_status_set(st, ATTN_ESHAPE,
                             "%s[%lld] = %lld is below %s[%lld] = %lld; the offsets must not "
                             "decrease",
                             name, (long long)b, (long long)cu[b], name, (long long)(b - 1),
                             (long long)cu[b - 1]);
  if (cu[batch] != total)
    return attn_status_set(st, ATTN_ESHAPE,
                           "%s[%lld] = %lld but %s %lld; the last offset must equal the "
                           "total length",
                           name, (long long)batch, (long long)cu[batch], rows, (long long)total);
  return 0;
}

/* diag_offset's range and the variable-length batch's offsets. */
static int validate_offsets(const attn_request *r, attn_status *st) {
  int64_t d = r->diag_offset;
  if (d != ATTN_DIAG_AUTO && (d > ATTN_MAX_DIM || d < -ATTN_MAX_DIM))
    return attn_status_set(st, ATTN_EWINDOW, "diag_offset = %lld is beyond +-%lld", (long long)d,
                           (long long)ATTN_MAX_DIM);
  if (!r->cu_seqlens_q != !r->cu_seqlens_kv)
    return attn_status_set(st, ATTN_EINVAL,
                           "cu_seqlens_q and cu_seqlens_kv come together; %s is missing",
                           r->cu_seqlens_q ? "cu_seqlens_kv" : "cu_seqlens_q");
  if (!r->cu_seqlens_q)
    return 0;
  if (d != ATTN_DIAG_AUTO)
    return attn_status_set(st, ATTN_EINVAL,
                           "diag_offset cannot be combined with cu_seqlens: each sequence of a "
                           "variable-length batch is aligned bottom-right on its own");
  int rc = attn_offsets_check(st, "cu_seqlens_q", r->cu_seqlens_q, r->batch, r->seq_q, "seq_q is");
  return rc ? rc
            : attn_offsets_check(st, "cu_seqlens_kv", r->cu_seqlens_kv, r->batch, r->seq_kv,
                                 "seq_kv is");
}

/* The longest sequence's keys: seq_kv, or the largest of a variable-length
 * batch (whose offsets were checked already). */
static int64_t longest_kv(const attn_request *r) {
  if (!r->cu_seqlens_kv)
    return r->seq_kv;
  int64_t most = 0;
  for (int64_t b = 0; b < r->batch; b++) {
    const int64_t n = r->cu_seqlens_kv[b + 1] - r->cu_seqlens_kv[b];
    most = n > most ? n : most;
  }
  return most;
}

/* Paged K and V (a session's cache), used instead of k and v: the page
 * geometry, its tables' size, and what the pages promise (kv_absmax). */
static int validate_pages(const attn_request *r, attn_status *st) {
  if (!r->k_pages || !r->v_pages)
    return attn_status_set(st, ATTN_EINVAL, "k_pages and v_pages come together; %s is missing",
                           r->k_pages ? "v_pages" : "k_pages");
  if (r->k || r->v)
    return attn_status_set(st, ATTN_EINVAL,
                           "paged K/V (k_pages, v_pages) replaces tensors k and v, which must "
                           "then be NULL");
  if (r->pass == ATTN_BACKWARD)
    return attn_status_set(st, ATTN_EUNSUPPORTED,
                           "the backward pass does not read paged K/V (sessions); pass tensors k "
                           "and v");
  /* with head_dim_v, a page's rows hold W = max(D, Dv) elements, k's and v's alike */
  const int64_t dv = attn_request_dv(r), w = dv > r->head_dim ? dv : r->head_dim;
  const int64_t widest =
      ATTN_MAX_HEAD_DIM > ATTN_MAX_HEAD_DIM_V ? ATTN_MAX_HEAD_DIM : ATTN_MAX_HEAD_DIM_V;
  if (r->page_pitch && (r->page_pitch < w || r->page_pitch > widest + 64))
    return attn_status_set(st, ATTN_EINVAL,
                           "page_pitch must be 0 (host pages) or from %s %lld up to %lld, not %lld",
                           dv != r->head_dim ? "max(head_dim, head_dim_v)" : "head_dim",
                           (long long)w, (long long)widest + 64, (long long)r->page_pitch);
  if (r->npage_rows && dv != r->head_dim)
    return attn_status_set(st, ATTN_EINVAL,
                           "page_rows are not taken with head_dim_v: write the rows of pages "
                           "whose K and V differ in width before the job");
  if (r->seqused_kv && (!r->page_pitch || r->cu_seqlens_q || r->diag_offset != ATTN_DIAG_AUTO))
    return attn_status_set(st, ATTN_EINVAL,
                           "seqused_kv comes with a device's pages (page_pitch), no cu_seqlens "
                           "and the automatic diagonal");
  for (int64_t b = 0; r->seqused_kv && b < r->batch; b++)
    if (r->seqused_kv[b] < 0 || r->seqused_kv[b] > r->seq_kv)
      return attn_status_set(st, ATTN_EINVAL, "seqused_kv[%lld] = %lld is not in [0, seq_kv %lld]",
                             (long long)b, (long long)r->seqused_kv[b], (long long)r->seq_kv);
  const int64_t pt = r->page_tokens, pph = r->pages_per_head;
  if (pt < ATTN_PAGE_MIN_TOKENS || pt % ATTN_PAGE_MIN_TOKENS || pt > ATTN_MAX_DIM)
    return attn_status_set(st, ATTN_EINVAL,
                           "page_tokens must be a positive multiple of %d up to %lld (got %lld)",
                           ATTN_PAGE_MIN_TOKENS, (long long)ATTN_MAX_DIM, (long long)pt);
  const int64_t keys = longest_kv(r), need = (keys + pt - 1) / pt;
  int64_t t;
  if (pph < need || pph > ATTN_MAX_DIM)
    return attn_status_set(st, ATTN_ESHAPE,
                           "pages_per_head = %lld does not fit %lld keys in pages of %lld tokens "
                           "(%lld pages needed, at most %lld)",
                           (long long)pph, (long long)keys, (long long)pt, (long long)need,
                           (long long)ATTN_MAX_DIM);
  if (__builtin_mul_overflow(r->batch, r->heads_kv, &t) || __builtin_mul_overflow(t, pph, &t) ||
      t > ATTN_MAX_DIM)
    return attn_status_set(st, ATTN_EOVERFLOW,
                           "the page tables (batch x heads_kv x pages_per_head) are too large");
  for (int i = 0; i < 2; i++)
    if (!(r->kv_absmax[i] >= 0 && isfinite(r->kv_absmax[i])))
      return attn_status_set(st, ATTN_EINVAL,
                             "kv_absmax[%d] = %g; the pages' largest |%c| must be a finite "
                             "number >= 0",
                             i, (double)r->kv_absmax[i], i ? 'v' : 'k');
  return 0;
}

/* K and V: dense tensors, or pages. */
static int validate_kv(const attn_request *r, int64_t b, size_t es, attn_status *st) {
  if (r->kv_quant != ATTN_KVQ_NONE &&
      ((unsigned)r->kv_quant >= ATTN_KVQ_COUNT || !r->k_pages || r->page_pitch))
    return attn_status_set(st, ATTN_EINVAL,
                           "kv_quant (%d) is for host pages (k_pages, page_pitch 0) of "
                           "F8_E4M3 (1) or I8 (2) rows only",
                           (int)r->kv_quant);
  if (r->k_pages || r->v_pages)
    return validate_pages(r, st);
  const int64_t hk = r->heads_kv, d = r->head_dim, dv = attn_request_dv(r);
  int rc = check_tensor(st, "k", r->k, b, hk, r->seq_kv, d, r->k_stride, es);
  return rc ? rc : check_tensor(st, "v", r->v, b, hk, r->seq_kv, dv, r->v_stride, es);
}

int attn_request_validate(const attn_request *r, attn_status *st) {
  int rc;
  if (!r)
    return attn_status_set(st, ATTN_EINVAL, "no request");
  if ((rc = check_dim(st, "batch", r->batch)) || (rc = check_dim(st, "heads_q", r->heads_q)) ||
      (rc = check_dim(st, "heads_kv", r->heads_kv)) || (rc = check_dim(st, "seq_q", r->seq_q)) ||
      (rc = check_dim(st, "seq_kv", r->seq_kv)))
    return rc;
  if (r->head_dim < 1 || r->head_dim > ATTN_MAX_HEAD_DIM)
    return attn_status_set(st, ATTN_ESHAPE, "head_dim must be between 1 and %d (got %lld)",
                           ATTN_MAX_HEAD_DIM, (long long)r->head_dim);
  /* v as wide as q (head_dim_v 0) has that width for Dv's limit too. */
  if (r->head_dim_v < 0 || attn_request_dv(r) > ATTN_MAX_HEAD_DIM_V)
    return attn_status_set(st, ATTN_ESHAPE,
                           "head_dim_v (v's last dimension) must be between 1 and %d (got %lld)",
                           ATTN_MAX_HEAD_DIM_V, (long long)attn_request_dv(r));
  if (r->v_cols)
    return attn_status_set(st, ATTN_EINVAL,
                           "v_cols (%lld) is the engine's own: leave it 0 (head_dim_v gives "
                           "the values' width)",
                           (long long)r->v_cols);
  if (r->heads_q % r->heads_kv)
    return attn_status_set(st, ATTN_EHEADS, "heads_q (%lld) is not a multiple of heads_kv (%lld)",
                           (long long)r->heads_q, (long long)r->heads_kv);
  size_t es = attn_dtype_size(r->dtype);
  if (!es)
    return attn_status_set(st, ATTN_EDTYPE, "unknown dtype %d (use F32, F16 or BF16)",
                           (int)r->dtype);
  if (isinf(r->scale))
    return attn_status_set(st, ATTN_ESCALE, "scale must be a finite number (got %g)", r->scale);
  if (r->window_left < -1 || r->window_right < -1)
    return attn_status_set(st, ATTN_EWINDOW,
                           "window_left and window_right must be -1 (unbounded) "
                           "or at least 0 (got %lld, %lld)",
                           (long long)r->window_left, (long long)r->window_right);
  if (r->causal && r->window_right > 0)
    return attn_status_set(st, ATTN_EWINDOW,
                           "causal=true means window_right=0; window_right=%lld "
                           "contradicts it",
                           (long long)r->window_right);
  if ((rc = validate_offsets(r, st)) || (rc = validate_variants(r, st)) ||
      (rc = validate_sinks(r, st)))
    return rc;
  /* A variable-length batch is one [H, N, D] tensor per input: batch 1 for
   * the size checks (the sum of its problems is at most seq_q x seq_kv). */
  int64_t t, b = r->cu_seqlens_q ? 1 : r->batch;
  if (__builtin_mul_overflow(r->seq_q, r->seq_kv, &t) || __builtin_mul_overflow(t, b, &t) ||
      __builtin_mul_overflow(t, r->heads_q, &t))
    return attn_status_set(st, ATTN_EOVERFLOW,
                           "batch x heads_q x seq_q x seq_kv overflows 64 bits");
  int64_t hq = r->heads_q, d = r->head_dim, dv = attn_request_dv(r);
  if ((rc = check_tensor(st, "q", r->q, b, hq, r->seq_q, d, r->q_stride, es)) ||
      (rc = validate_kv(r, b, es, st)) ||
      (rc = check_tensor(st, "o", r->o, b, hq, r->seq_q, dv, r->o_stride, es)))
    return rc;
  return r->pass == ATTN_FORWARD ? 0 : validate_backward(r, b, es, st);
}

static void fill(int64_t s[3], int64_t h, int64_t n, int64_t d) {
  if (s[0] == 0 && s[1] == 0 && s[2] == 0) {
    s[2] = d;
    s[1] = n * d;
    s[0] = h * n * d;
  }
}

void attn__request_fill_strides(attn_request *r) {
  int64_t d = r->head_dim, dv = attn_request_dv(r);
  fill(r->q_stride, r->heads_q, r->seq_q, d);
  fill(r->k_stride, r->heads_kv, r->seq_kv, d);
  fill(r->v_stride, r->heads_kv, r->seq_kv, dv);
  fill(r->o_stride, r->heads_q, r->seq_q, dv);
  if (r->pass == ATTN_BACKWARD) {
    fill(r->do_stride, r->heads_q, r->seq_q, dv);
    fill(r->dq_stride, r->heads_q, r->seq_q, d);
    fill(r->dk_stride, r->heads_kv, r->seq_kv, d);
    fill(r->dv_stride, r->heads_kv, r->seq_kv, dv);
  }
}

static const void *rows_at(const void *p, int64_t row, const int64_t s[3], size_t es) {
  return p ? (const char *)p + (size_t)(row * s[2]) * es : NULL;
}

void attn__varlen_sub(const attn_request *r, int64_t b, attn_request *sub) {
  const int64_t q0 = r->cu_seqlens_q[b], k0 = r->cu_seqlens_kv[b];
  const size_t es = attn_dtype_size(r->dtype);
  *sub = *r;
  attn__request_fill_strides(sub); /* the whole tensors' strides, before N shrinks */
  sub->batch = 1;
  sub->seq_q = r->cu_seqlens_q[b + 1] - q0;
  sub->seq_kv = r->cu_seqlens_kv[b + 1] - k0;
  sub->cu_seqlens_q = sub->cu_seqlens_kv = NULL;
  if (r->alibi_slopes) { /* sequence b's row of [B, Hq], or the shared [Hq] */
    sub->alibi_slopes = r->alibi_slopes + b * r->alibi_stride_b;
    sub->alibi_stride_b = 0;
  }
  sub->q = rows_at(r->q, q0, sub->q_stride, es);
  sub->k = rows_at(r->k, k0, sub->k_stride, es);
  sub->v = rows_at(r->v, k0, sub->v_stride, es);
  if (r->k_pages) { /* sequence b's own tables; its keys count from 0 */
    sub->k_pages = r->k_pages + b * r->heads_kv * r->pages_per_head;
    sub->v_pages = r->v_pages + b * r->heads_kv * r->pages_per_head;
  }
  /* o is the forward's output and the backward's input; the others are
   * NULL in the pass that does not use them */
  sub->o = (void *)(uintptr_t)rows_at(r->o, q0, sub->o_stride, es);
  sub->dout = rows_at(r->dout, q0, sub->do_stride, es);
  sub->dq = (void *)(uintptr_t)rows_at(r->dq, q0, sub->dq_stride, es);
  sub->dk = (void *)(uintptr_t)rows_at(r->dk, k0, sub->dk_stride, es);
  sub->dv = (void *)(uintptr_t)rows_at(r->dv, k0, sub->dv_stride, es);
  sub->m = sub->l = sub->lse = NULL;
  sub->lse_in = NULL;
  sub->dsinks = NULL; /* a sum over the sequences: each caller gives its own */
}

void attn__request_keys(const attn_request *r, int64_t i, int64_t *lo, int64_t *hi) {
  int64_t wl, wr, off = attn_request_offset(r);
  attn_request_window(r, &wl, &wr);
  *lo = wl < 0 ? 0 : i + off - wl;
  *hi = wr < 0 ? r->seq_kv - 1 : i + off + wr;
  if (*lo < 0)
    *lo = 0;
  if (*hi > r->seq_kv - 1)
    *hi = r->seq_kv - 1;
}

uint64_t attn_request_visible_pairs(const attn_request *r) {
  if (r->cu_seqlens_q) {
    uint64_t sum = 0;
    for (int64_t b = 0; b < r->batch; b++) {
      attn_request sub;
      attn__varlen_sub(r, b, &sub);
      if (sub.seq_q > 0 && sub.seq_kv > 0)
        sum += attn_request_visible_pairs(&sub);
    }
    return sum;
  }
  uint64_t per_head = 0;
  for (int64_t i = 0; i < r->seq_q; i++) {
    int64_t lo, hi;
    attn__request_keys(r, i, &lo, &hi);
    if (hi >= lo)
      per_head += (uint64_t)(hi - lo + 1);
  }
  return per_head * (uint64_t)r->batch * (uint64_t)r->heads_q;
}

uint64_t attn_request_pairs(const attn_request *r) {
  const uint64_t hq = (uint64_t)r->heads_q;
  if (!r->cu_seqlens_q)
    return (uint64_t)r->batch * hq * (uint64_t)r->seq_q * (uint64_t)r->seq_kv;
  uint64_t sum = 0;
  for (int64_t b = 0; b < r->batch; b++)
    sum += (uint64_t)(r->cu_seqlens_q[b + 1] - r->cu_seqlens_q[b]) *
           (uint64_t)(r->cu_seqlens_kv[b + 1] - r->cu_seqlens_kv[b]);
  return sum * hq;
}

double attn_request_flops(const attn_request *r) {
  const double dims = (double)r->head_dim + (double)attn_request_dv(r); /* Q·Kᵀ, then P·V */
  double fwd = 2.0 * dims * (double)attn_request_visible_pairs(r);
  return r->pass == ATTN_BACKWARD ? 2.5 * fwd : fwd;
}

void attn_request_sequence(const attn_request *r, int64_t b, attn_request *sub) {
  attn__varlen_sub(r, b, sub);
}
