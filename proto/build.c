/*
 * build.c — from the decoded tensors and the options to an engine request
 * with its output buffers; the tensor table of each pass (q, k, v; for a
 * backward pass also o, do and lse) and the shape rules both codecs share.
 */
#include "internal.h"
#include "proto.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void shape_str(char *buf, size_t cap, const attn_proto_tensor *t) {
  size_t o = (size_t)snprintf(buf, cap, "[");
  for (int i = 0; i < t->rank && o < cap; i++)
    o += (size_t)snprintf(buf + o, cap - o, i ? ", %lld" : "%lld", (long long)t->shape[i]);
  if (o < cap)
    snprintf(buf + o, cap - o, "]");
}

/* ---- the tensor table ------------------------------------------------------ */

static const char *const tensor_names[ATTN_PROTO_MAX_TENSORS] = {
    "q", "k", "v", "o", "do", "lse", "alibi_slopes", "cu_seqlens_q", "cu_seqlens_kv", "sinks"};

const char *attn_proto_tensor_name(int i) {
  return i >= 0 && i < ATTN_PROTO_MAX_TENSORS ? tensor_names[i] : NULL;
}

bool attn_proto_tensor_in_pass(int i, attn_pass pass) {
  if (i < 0 || i >= ATTN_PROTO_MAX_TENSORS)
    return false;
  return pass == ATTN_BACKWARD || i <= ATTN_PROTO_T_V || i >= ATTN_PROTO_T_ALIBI;
}

bool attn_proto_tensor_optional(int i) { return i >= ATTN_PROTO_T_LSE; }

bool attn__tensor_required(int i, attn_pass pass, const attn_options *o) {
  bool own = o->fields && o->fields->optional & (1u << i); /* a decode's own may leave it out */
  return attn_proto_tensor_in_pass(i, pass) && !attn_proto_tensor_optional(i) && !own;
}

int attn_proto_cu_dtype_bytes(const char *name) {
  return !strcmp(name, "I32") ? 4 : !strcmp(name, "I64") ? 8 : 0;
}

int attn_proto_cu_widen(const void *src, size_t n, int bytes, int64_t **pout, attn_status *st) {
  int64_t *out = *pout = malloc(n ? n * sizeof *out : 1);
  if (!out)
    return attn_status_set(st, ATTN_PROTO_ENOMEM, "out of memory for cu_seqlens");
  const unsigned char *p = src;
  for (size_t i = 0; i < n; i++, p += bytes) {
    uint64_t u = 0;
    for (int b = bytes - 1; b >= 0; b--)
      u = u << 8 | p[b];
    out[i] = bytes == 4 ? (int64_t)(int32_t)(uint32_t)u : (int64_t)u;
  }
  return 0;
}

const char *attn_proto_tensor_list(attn_pass pass) {
  return pass == ATTN_BACKWARD ? "q, k, v, o, do and optionally lse, alibi_slopes, sinks (and "
                                 "cu_seqlens_q, cu_seqlens_kv for a variable-length batch)"
                               : "q, k and v (and optionally alibi_slopes, sinks, and "
                                 "cu_seqlens_q, cu_seqlens_kv for a variable-length batch)";
}

/* Tensor t alone: its rank from lo to lo + 2 (lse drops q's last dimension,
 * so its lo is 1, the others' 2) and every dimension at least 1. */
int attn__check_one(const attn_proto_tensor *t, int lo, attn_status *st) {
  char s[128];
  if (t->rank < lo || t->rank > lo + 2)
    return attn_status_set(st, ATTN_PROTO_ETENSOR,
                           lo == 2 ? "tensor \"%s\" has %d dimensions; use [N, D], [H, N, D] or "
                                     "[B, H, N, D]"
                                   : "tensor \"%s\" has %d dimensions; use [N], [H, N] or "
                                     "[B, H, N] (q's shape without D)",
                           t->name, t->rank);
  for (int i = 0; i < t->rank; i++)
    if (t->shape[i] < 1) {
      shape_str(s, sizeof s, t);
      return attn_status_set(st, ATTN_PROTO_ETENSOR,
                             "tensor \"%s\": shape %s has a dimension below 1", t->name, s);
    }
  return 0;
}

/* [B, H, N, D] of a tensor of rank 2 to 4. */
void attn__bhnd(const attn_proto_tensor *t, int64_t d[4]) {
  d[0] = t->rank == 4 ? t->shape[0] : 1;
  d[1] = t->rank >= 3 ? t->shape[t->rank - 3] : 1;
  d[2] = t->shape[t->rank - 2];
  d[3] = t->shape[t->rank - 1];
}

static const char *backend_literal(const char *name) {
  static const char *const names[] = {"auto", "cpu", "cuda", "reference"};
  for (size_t i = 0; i < sizeof names / sizeof *names; i++)
    if (!strcmp(name, names[i]))
      return names[i];
  return "auto";
}

/* v against k: the same shape but for the last dimension, v's own Dv
 * (DeepSeek's MLA prefill: D 192, Dv 128); the engine bounds Dv. */
static int check_v(const attn_proto_tensor *k, const attn_proto_tensor *v, attn_status *st) {
  if (!memcmp(k->shape, v->shape, (size_t)(k->rank - 1) * sizeof k->shape[0]))
    return 0;
  char a[128], b[128];
  shape_str(a, sizeof a, k);
  shape_str(b, sizeof b, v);
  return attn_status_set(st, ATTN_PROTO_ESHAPE,
                         "tensor \"v\" has shape %s but \"k\" has %s; they must match but for "
                         "the last dimension (v's may differ: the value head dim Dv)",
                         b, a);
}

/* q, k and v together: one dtype and rank, v like k but for its last dim,
 * matching B and D of q and k, Hq a multiple of Hkv. */
static int check_qkv(const attn_proto_tensor t[3], attn_status *st) {
  for (int i = 1; i < 3; i++)
    if (t[i].dtype != t[0].dtype)
      return attn_status_set(st, ATTN_PROTO_EDTYPE,
                             "tensor \"%s\" is %s but \"q\" is %s; q, k and v must share "
                             "one dtype",
                             t[i].name, attn_dtype_name(t[i].dtype), attn_dtype_name(t[0].dtype));
  char a[128], b[128];
  if (t[1].rank != t[0].rank || t[2].rank != t[0].rank)
    return attn_status_set(st, ATTN_PROTO_ESHAPE,
                           "q, k and v must have the same number of dimensions (q %d, "
                           "k %d, v %d)",
                           t[0].rank, t[1].rank, t[2].rank);
  int rc = check_v(&t[1], &t[2], st);
  if (rc < 0)
    return rc;
  int64_t q[4], k[4];
  attn__bhnd(&t[0], q);
  attn__bhnd(&t[1], k);
  if (q[3] == k[3] && q[0] == k[0] && q[1] % k[1] == 0)
    return 0; /* the shapes are written only for the message of a refusal */
  shape_str(a, sizeof a, &t[0]);
  shape_str(b, sizeof b, &t[1]);
  if (q[3] != k[3])
    return attn_status_set(
        st, ATTN_PROTO_ESHAPE,
        "head dims differ: \"q\" %s ends in %lld, \"k\" %s in %lld; q and k must "
        "share D (only v may have its own last dimension)",
        a, (long long)q[3], b, (long long)k[3]);
  if (q[0] != k[0])
    return attn_status_set(st, ATTN_PROTO_ESHAPE,
                           "batch sizes differ: q %s has %lld, k %s has %lld", a, (long long)q[0],
                           b, (long long)k[0]);
  return attn_status_set(st, ATTN_PROTO_ESHAPE,
                         "q %s has %lld heads, k %s has %lld: query heads must be a "
                         "multiple of key/value heads",
                         a, (long long)q[1], b, (long long)k[1]);
}

/* Tensor x must have q's dtype (lse: F32) and o's shape, q's with v's last
 * dimension Dv (lse: q's less D). */
static int check_like_o(const attn_proto_tensor *x, bool lse, const attn_proto_tensor *t,
                        attn_status *st) {
  const attn_proto_tensor *q = &t[ATTN_PROTO_T_Q];
  attn_proto_tensor o = *q;
  o.shape[o.rank - 1] = t[ATTN_PROTO_T_V].shape[t[ATTN_PROTO_T_V].rank - 1];
  attn_dtype want = lse ? ATTN_F32 : q->dtype;
  if (x->dtype != want)
    return attn_status_set(st, ATTN_PROTO_EDTYPE, "tensor \"%s\" is %s; it must be %s%s", x->name,
                           attn_dtype_name(x->dtype), attn_dtype_name(want),
                           lse ? " (statistics are always F32)" : ", q's dtype");
  int rank = lse ? q->rank - 1 : q->rank;
  if (x->rank == rank && !memcmp(x->shape, o.shape, (size_t)rank * sizeof *x->shape))
    return 0;
  char a[128], b[128];
  o.rank = rank;
  shape_str(a, sizeof a, x);
  shape_str(b, sizeof b, &o);
  return attn_status_set(
      st, ATTN_PROTO_ESHAPE, "tensor \"%s\" has shape %s; it must be %s (%s)", x->name, a, b,
      lse ? "q's shape without its last dimension" : "o's shape: q's with v's last dimension Dv");
}

/* A backward request's own tensors (o, do, lse if given) and options. */
static int check_backward(const attn_proto_tensor *t, const attn_options *opts, attn_status *st) {
  if (opts->set & ATTN_OPT_STATS)
    return attn_status_set(st, ATTN_PROTO_EOPTVALUE,
                           "option \"stats\" is not one of a backward pass, which returns dq, "
                           "dk and dv only; leave it out");
  int rc;
  for (int i = ATTN_PROTO_T_O; i <= ATTN_PROTO_T_LSE; i++) {
    bool lse = i == ATTN_PROTO_T_LSE;
    if (!t[i].data && !lse)
      return attn_status_set(st, ATTN_PROTO_EMISSING,
                             "tensor \"%s\" is missing; a backward pass needs %s", tensor_names[i],
                             attn_proto_tensor_list(ATTN_BACKWARD));
    if (t[i].data && ((rc = attn__check_one(&t[i], lse ? 1 : 2, st)) < 0 ||
                      (rc = check_like_o(&t[i], lse, t, st)) < 0))
      return rc;
  }
  return 0;
}

/* alibi_slopes, when sent: F32, [Hq] or [B, Hq] of q's B and Hq. */
int attn__check_alibi(const attn_proto_tensor *a, const attn_proto_tensor *t, attn_status *st) {
  if (!a->data)
    return 0;
  if (a->dtype != ATTN_F32)
    return attn_status_set(st, ATTN_PROTO_EDTYPE, "tensor \"alibi_slopes\" is %s; it must be F32",
                           attn_dtype_name(a->dtype));
  int64_t d[4];
  attn__bhnd(&t[0], d);
  if (t[ATTN_PROTO_T_CU_Q].data) /* a variable-length batch: B is its sequence count */
    d[0] = t[ATTN_PROTO_T_CU_Q].shape[0] - 1;
  bool ok = (a->rank == 1 && a->shape[0] == d[1]) ||
            (a->rank == 2 && a->shape[0] == d[0] && a->shape[1] == d[1]);
  if (ok)
    return 0;
  char s[128];
  shape_str(s, sizeof s, a);
  return attn_status_set(st, ATTN_PROTO_ESHAPE,
                         "tensor \"alibi_slopes\" has shape %s; it must be [%lld] (one slope a "
                         "query head) or [%lld, %lld] (one a batch and query head)",
                         s, (long long)d[1], (long long)d[0], (long long)d[1]);
}

/* sinks, when sent: F32 [Hq], one logit a query head, shared by the batch
 * (a variable-length one too, so unlike the slopes no [B, Hq] form). */
int attn__check_sinks(const attn_proto_tensor *s, const attn_proto_tensor *t, attn_status *st) {
  if (!s->data)
    return 0;
  if (s->dtype != ATTN_F32)
    return attn_status_set(st, ATTN_PROTO_EDTYPE, "tensor \"sinks\" is %s; it must be F32",
                           attn_dtype_name(s->dtype));
  int64_t d[4];
  attn__bhnd(&t[0], d);
  if (s->rank == 1 && s->shape[0] == d[1])
    return 0;
  char sh[128];
  shape_str(sh, sizeof sh, s);
  return attn_status_set(st, ATTN_PROTO_ESHAPE,
                         "tensor \"sinks\" has shape %s; it must be [%lld] (one logit a query "
                         "head, q's Hq)",
                         sh, (long long)d[1]);
}

/* cu_seqlens_q and cu_seqlens_kv: both or neither, each [B+1], B >= 1, and
 * q, k, v with their sequences concatenated (no batch dimension). The
 * offsets themselves are the engine's to check. */
static int check_cu(const attn_proto_tensor *t, attn_status *st) {
  const attn_proto_tensor *cq = &t[ATTN_PROTO_T_CU_Q], *ck = &t[ATTN_PROTO_T_CU_KV];
  if (!cq->data && !ck->data)
    return 0;
  if (!cq->data || !ck->data)
    return attn_status_set(st, ATTN_PROTO_EMISSING,
                           "tensor \"%s\" is missing; a variable-length batch needs both "
                           "cu_seqlens_q and cu_seqlens_kv",
                           cq->data ? "cu_seqlens_kv" : "cu_seqlens_q");
  for (int i = 0; i < 2; i++) {
    const attn_proto_tensor *c = i ? ck : cq;
    if (c->rank != 1 || c->shape[0] < 2)
      return attn_status_set(st, ATTN_PROTO_ETENSOR,
                             "tensor \"%s\" must be [B+1] offsets with B >= 1 (%d dimensions, "
                             "%lld elements)",
                             c->name, c->rank, (long long)(c->rank ? c->shape[0] : 0));
  }
  if (cq->shape[0] != ck->shape[0])
    return attn_status_set(st, ATTN_PROTO_ESHAPE,
                           "cu_seqlens_q has %lld offsets but cu_seqlens_kv %lld; both are [B+1]",
                           (long long)cq->shape[0], (long long)ck->shape[0]);
  if (t[0].rank == 4)
    return attn_status_set(st, ATTN_PROTO_ESHAPE,
                           "with cu_seqlens, q, k and v hold their sequences concatenated along "
                           "N: [H, total, D] or [total, D], not rank 4");
  return 0;
}

/* pr->req from the tensors and options, outputs not yet allocated. */
static void fill_request(attn_proto_req *pr, attn_pass pass, const attn_proto_tensor *t,
                         const attn_options *opts) {
  int64_t q[4], k[4];
  attn__bhnd(&t[0], q);
  attn__bhnd(&t[1], k);
  pr->opts = *opts;
  pr->rank = t[0].rank;
  memcpy(pr->shape_q, t[0].shape, sizeof pr->shape_q);
  memcpy(pr->shape_kv, t[1].shape, sizeof pr->shape_kv);
  attn__shapes_dv(pr, t[2].shape[t[2].rank - 1]);
  attn_request *r = &pr->req;
  attn_request_init(r);
  r->pass = pass;
  r->batch = q[0];
  r->heads_q = q[1];
  r->heads_kv = k[1];
  r->seq_q = q[2];
  r->seq_kv = k[2];
  r->head_dim = q[3];
  r->head_dim_v = t[2].shape[t[2].rank - 1] == q[3] ? 0 : t[2].shape[t[2].rank - 1];
  r->dtype = t[0].dtype;
  r->scale = opts->scale;
  r->causal = opts->causal;
  r->window_left = opts->window_left;
  r->window_right = opts->window_right;
  r->softcap = opts->softcap;
  r->alibi_slopes = t[ATTN_PROTO_T_ALIBI].data;
  r->alibi_stride_b = t[ATTN_PROTO_T_ALIBI].rank == 2 ? q[1] : 0;
  r->sinks = t[ATTN_PROTO_T_SINKS].data;
  r->diag_offset = opts->diag_offset;
  r->backend = backend_literal(opts->backend);
  r->q = t[0].data;
  r->k = t[1].data;
  r->v = t[2].data;
  if (pass == ATTN_BACKWARD) {
    /* o is an input of a backward pass, which never writes it; the request
     * keeps the forward's non-const field. */
    r->o = (void *)(uintptr_t)t[ATTN_PROTO_T_O].data;
    r->dout = t[ATTN_PROTO_T_DO].data;
    r->lse_in = t[ATTN_PROTO_T_LSE].data;
  }
  if (t[ATTN_PROTO_T_CU_Q].data) {
    r->batch = t[ATTN_PROTO_T_CU_Q].shape[0] - 1;
    r->cu_seqlens_q = t[ATTN_PROTO_T_CU_Q].data;
    r->cu_seqlens_kv = t[ATTN_PROTO_T_CU_KV].data;
  }
}

/* Validation wants the outputs to exist; the real ones come after it. */
static void probe_outputs(attn_request *r) {
  static char probe;
  static float probe_sinks;
  if (r->pass != ATTN_BACKWARD) {
    r->o = &probe;
    return;
  }
  r->dq = r->dk = r->dv = &probe;
  r->dsinks = r->sinks ? &probe_sinks : NULL;
}

/* One buffer for the outputs, each part 4-byte aligned: forward O and, with
 * stats, m, l, lse; backward dq, dk, dv and, with sinks, dsinks [Hq]. */
int attn__alloc_outputs(attn_proto_req *pr, attn_status *st) {
  attn_request *r = &pr->req;
  const int64_t nb = r->cu_seqlens_q ? 1 : r->batch; /* varlen: one [H, total, D] */
  size_t es = attn_dtype_size(r->dtype), rows = (size_t)(nb * r->heads_q * r->seq_q);
  size_t kvrows = (size_t)(nb * r->heads_kv * r->seq_kv), dv = (size_t)attn_request_dv(r);
  bool bwd = r->pass == ATTN_BACKWARD, stats = !bwd && pr->opts.stats;
  /* forward: O of Dv; backward: dq of D, dk of D, dv of Dv */
  size_t qn = ((rows * (bwd ? (size_t)r->head_dim : dv) * es) + 3) & ~(size_t)3;
  size_t kn = ((kvrows * (size_t)r->head_dim * es) + 3) & ~(size_t)3;
  size_t vn = ((kvrows * dv * es) + 3) & ~(size_t)3;
  size_t sn = bwd && r->sinks ? (size_t)r->heads_q * sizeof(float) : 0;
  size_t total = qn + (bwd ? kn + vn + sn : stats ? 3 * rows * sizeof(float) : 0);
  char *out = pr->out = malloc(total ? total : 1);
  if (!out)
    return attn_status_set(st, ATTN_PROTO_ENOMEM, "out of memory for the %zu-byte result", total);
  pr->out_bytes = total;
  if (bwd) {
    r->dq = out;
    r->dk = out + qn;
    r->dv = out + qn + kn;
    r->dsinks = sn ? (float *)(void *)(out + qn + kn + vn) : NULL;
    return 0;
  }
  r->o = out;
  if (stats) {
    r->m = (float *)(void *)(out + qn);
    r->l = r->m + rows;
    r->lse = r->l + rows;
  }
  return 0;
}

int attn_proto_build_pass(attn_proto_req *pr, attn_pass pass, const attn_proto_tensor *t,
                          const attn_options *opts, attn_status *st) {
  int rc;
  for (int i = 0; i < 3; i++)
    if ((rc = attn__check_one(&t[i], 2, st)) < 0)
      return rc;
  if ((rc = check_qkv(t, st)) < 0 || (rc = check_cu(t, st)) < 0 ||
      (rc = attn__check_alibi(&t[ATTN_PROTO_T_ALIBI], t, st)) < 0 ||
      (rc = attn__check_sinks(&t[ATTN_PROTO_T_SINKS], t, st)) < 0 ||
      (pass == ATTN_BACKWARD && (rc = check_backward(t, opts, st)) < 0))
    return rc;
  fill_request(pr, pass, t, opts);
  probe_outputs(&pr->req);
  if ((rc = attn_request_validate(&pr->req, st)) < 0)
    return rc;
  return attn__alloc_outputs(pr, st);
}

int attn_proto_build(attn_proto_req *pr, const attn_proto_tensor t[ATTN_PROTO_MAX_TENSORS],
                     const attn_options *opts, attn_status *st) {
  return attn_proto_build_pass(pr, ATTN_FORWARD, t, opts, st);
}

void attn__shapes_dv(attn_proto_req *pr, int64_t dv) {
  memcpy(pr->shape_o, pr->shape_q, sizeof pr->shape_o);
  memcpy(pr->shape_v, pr->shape_kv, sizeof pr->shape_v);
  if (pr->rank >= 1)
    pr->shape_o[pr->rank - 1] = pr->shape_v[pr->rank - 1] = dv;
}

static size_t elems(const int64_t *shape, int rank) {
  size_t n = 1;
  for (int i = 0; i < rank; i++)
    n *= (size_t)shape[i];
  return n;
}

static void set_out(attn__out *t, const char *name, attn_dtype dt, const int64_t *shape, int rank,
                    void *data) {
  *t = (attn__out){name, dt, shape, rank, elems(shape, rank), data};
}

int attn__reply_outs(const attn_proto_req *pr, bool all, attn__out t[ATTN__MAX_OUTS]) {
  const attn_request *r = &pr->req;
  if (r->pass == ATTN_BACKWARD) {
    set_out(&t[0], "dq", r->dtype, pr->shape_q, pr->rank, r->dq);
    set_out(&t[1], "dk", r->dtype, pr->shape_kv, pr->rank, r->dk);
    set_out(&t[2], "dv", r->dtype, pr->shape_v, pr->rank, r->dv);
    if (!all && !r->dsinks)
      return 3;
    set_out(&t[3], "dsinks", ATTN_F32, &r->heads_q, 1, r->dsinks);
    return 4;
  }
  set_out(&t[0], "o", r->dtype, pr->shape_o, pr->rank, r->o);
  if (!all && !pr->opts.stats)
    return 1;
  set_out(&t[1], "m", ATTN_F32, pr->shape_q, pr->rank - 1, r->m);
  set_out(&t[2], "l", ATTN_F32, pr->shape_q, pr->rank - 1, r->l);
  set_out(&t[3], "lse", ATTN_F32, pr->shape_q, pr->rank - 1, r->lse);
  return 4;
}

static void free_out(attn_proto_req *pr) {
  if (pr->out_free)
    pr->out_free(pr->out_ctx, pr->out);
  else
    free(pr->out);
}

static void *moved(void *p, const char *from, char *to) {
  return p ? to + ((const char *)p - from) : NULL;
}

void attn_proto_req_set_out(attn_proto_req *pr, void *buf, void (*free_fn)(void *ctx, void *p),
                            void *ctx) {
  attn_request *r = &pr->req;
  const char *from = pr->out;
  char *to = buf;
  if (r->pass == ATTN_BACKWARD) {
    r->dq = moved(r->dq, from, to), r->dk = moved(r->dk, from, to);
    r->dv = moved(r->dv, from, to);
    r->dsinks = moved(r->dsinks, from, to);
  } else {
    r->o = moved(r->o, from, to);
    r->m = moved(r->m, from, to), r->l = moved(r->l, from, to);
    r->lse = moved(r->lse, from, to);
  }
  free_out(pr);
  pr->out = buf;
  pr->out_free = free_fn;
  pr->out_ctx = ctx;
}

void attn_proto_req_free(attn_proto_req *pr) {
  for (int i = 0; i < ATTN_PROTO_MAX_TENSORS; i++)
    free(pr->owned[i]);
  free_out(pr);
  free(pr->reply_json);
  free(pr->reply_meta);
  memset(pr, 0, sizeof *pr);
}
