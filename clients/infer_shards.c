/*
 * infer_shards.c — `attn infer --shards URL1,URL2,...`: exact attention with
 * K/V split along Nkv across servers.
 *
 * Shard i gets keys [a, b) (the request's K/V rows gathered per batch and
 * head), q whole, the options of the whole request plus stats and
 * diag_offset = off - a, so its mask is the unsharded mask restricted to its
 * keys. The shards go out in parallel (a thread each, one HTTP exchange
 * each) and come back with O, m and l; the merge is the engine's own
 * softmax merge rule (attn_softmax_merge): m = max mᵢ, l = Σ lᵢ·e^(mᵢ-m),
 * and O = Σ lᵢ·e^(mᵢ-m)·Oᵢ / l, in float64. The merged answer lands in the
 * whole request's outputs, where --check finds it as it finds a reply.
 */
#include "infer.h"
#include "url.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SHARDS 64

typedef struct shard {
  const tool_infer_args *a;
  char url[512];
  int64_t k0, nk;    /* keys [k0, k0 + nk) of the whole problem */
  void *kv;          /* this shard's K then V, contiguous */
  attn_proto_req pr; /* its request as this client's codec reads it: the reply's shapes */
  void *body;        /* the safetensors request */
  size_t len;
  tool_infer_reply rep; /* the reply */
  int status;           /* exit status of this shard's exchange */
} shard;

/* Splits a comma-separated list into sh[].url; the count, or -1 (with
 * why, when it is one URL's fault, in st). */
static int parse_urls(const char *list, shard *sh, attn_status *st) {
  int n = 0;
  for (const char *p = list; *p;) {
    size_t len = strcspn(p, ",");
    if (!len || len >= sizeof sh->url || n == MAX_SHARDS)
      return -1;
    memcpy(sh[n].url, p, len);
    sh[n].url[len] = 0;
    if (attn_url_base(sh[n++].url, st) < 0)
      return -1;
    p += len + (p[len] == ',');
  }
  return n;
}

/* K/V rows [k0, k0 + nk) of every batch and head, contiguous: k's rows
 * (D wide), then v's (Dv wide). */
static void *gather_kv(const attn_request *r, int64_t k0, int64_t nk) {
  const size_t es = attn_dtype_size(r->dtype), heads = (size_t)(r->batch * r->heads_kv);
  const size_t row[2] = {(size_t)r->head_dim * es, (size_t)attn_request_dv(r) * es};
  const size_t part[2] = {heads * (size_t)nk * row[0], heads * (size_t)nk * row[1]};
  char *out = malloc(part[0] + part[1] ? part[0] + part[1] : 1);
  const void *src[2] = {r->k, r->v};
  for (int t = 0; out && t < 2; t++)
    for (size_t bh = 0; bh < heads; bh++)
      memcpy(out + (t ? part[0] : 0) + bh * (size_t)nk * row[t],
             (const char *)src[t] + (bh * (size_t)r->seq_kv + (size_t)k0) * row[t],
             (size_t)nk * row[t]);
  return out;
}

/* Shard s's body and the request its reply is read against. */
static int prepare(shard *s, const attn_proto_req *whole, attn_status *st) {
  const attn_request *r = &whole->req;
  const size_t es = attn_dtype_size(r->dtype);
  if (!(s->kv = gather_kv(r, s->k0, s->nk)))
    return attn_status_set(st, ATTN_PROTO_ENOMEM, "out of memory for the shards");
  attn_options o = whole->opts;
  o.stats = true;
  o.diag_offset = attn_request_offset(r) - s->k0;
  o.set |= ATTN_OPT_STATS | ATTN_OPT_DIAG_OFFSET;
  const int64_t sq[4] = {r->batch, r->heads_q, r->seq_q, r->head_dim};
  const int64_t sk[4] = {r->batch, r->heads_kv, s->nk, r->head_dim}, dv = attn_request_dv(r);
  const char *v = (const char *)s->kv + (size_t)(sk[0] * sk[1] * sk[2] * sk[3]) * es;
  attn_proto_tensor t[ATTN_PROTO_MAX_TENSORS] = {
      {"q", r->dtype, 4, {sq[0], sq[1], sq[2], sq[3]}, r->q},
      {"k", r->dtype, 4, {sk[0], sk[1], sk[2], sk[3]}, s->kv},
      {"v", r->dtype, 4, {sk[0], sk[1], sk[2], dv}, v}};
  int rc = attn_proto_build_pass(&s->pr, ATTN_FORWARD, t, &o, st);
  return rc < 0 ? rc : attn_proto_encode_request_safetensors(&s->pr.req, &o, &s->body, &s->len, st);
}

static void *exchange(void *arg) {
  shard *s = arg;
  tool_infer_args a = *s->a;
  attn_sbuf url = {0};
  a.url = s->url;
  a.json = false;           /* safetensors both ways */
  a.query = (attn_sbuf){0}; /* the options travel in the body's __metadata__ */
  tool_infer_url(&a, &url);
  s->status = url.oom ? 1 : tool_infer_send(&a, url.p, s->body, s->len, &s->rep);
  free(url.p);
  if (s->status == 0 && (s->rep.http < 200 || s->rep.http > 299)) {
    fprintf(stderr, TOOL_INFER_ME ": shard %s: ", s->url);
    tool_infer_print_error(&s->rep);
    s->status = 1;
  }
  attn_status st;
  if (s->status == 0 &&
      attn_proto_decode_reply_safetensors(s->rep.body.p, s->rep.body.len, &s->pr, &st) < 0) {
    fprintf(stderr, TOOL_INFER_ME ": shard %s: malformed reply: %s\n", s->url, st.message);
    s->status = 1;
  }
  return NULL;
}

/* The shards' O, m, l merged into whole's outputs (and statistics when it
 * asked for them). */
static void merge(const shard *sh, int n, attn_proto_req *whole) {
  attn_request *r = &whole->req;
  const size_t rows = (size_t)(r->batch * r->heads_q * r->seq_q), d = (size_t)attn_request_dv(r);
  for (size_t i = 0; i < rows; i++) {
    double m = -INFINITY, l = 0, acc[ATTN_MAX_HEAD_DIM_V] = {0};
    for (int s = 0; s < n; s++)
      attn_softmax_merge(&m, &l, sh[s].pr.req.m[i], sh[s].pr.req.l[i]);
    for (int s = 0; s < n && l > 0; s++) {
      const attn_request *x = &sh[s].pr.req;
      double w = x->l[i] * attn_softmax_weight(x->m[i], m) / l;
      for (size_t k = 0; w > 0 && k < d; k++)
        acc[k] += w * attn_load_elem(x->o, x->dtype, i * d + k);
    }
    for (size_t k = 0; k < d; k++)
      attn_store_elem(r->o, r->dtype, i * d + k, (float)acc[k]);
    if (r->m) {
      r->m[i] = l > 0 ? (float)m : -INFINITY;
      r->l[i] = (float)l;
      r->lse[i] = l > 0 ? (float)(m + log(l)) : -INFINITY;
    }
  }
}

/* Splits, sends, merges; the exit status (merged outputs in whole). */
static int run(const tool_infer_args *a, shard *sh, int n, attn_proto_req *whole) {
  const int64_t nkv = whole->req.seq_kv;
  attn_status st;
  for (int i = 0; i < n; i++) {
    sh[i].a = a;
    sh[i].k0 = i * nkv / n;
    sh[i].nk = (i + 1) * nkv / n - sh[i].k0;
    if (prepare(&sh[i], whole, &st) < 0) {
      fprintf(stderr, TOOL_INFER_ME ": shard %d: %s\n", i, st.message);
      return 1;
    }
  }
  pthread_t tid[MAX_SHARDS];
  int started = 0, status = 0;
  for (; started < n; started++)
    if (pthread_create(&tid[started], NULL, exchange, &sh[started]) != 0)
      break;
  for (int i = started; i < n; i++) /* no thread: do it here */
    exchange(&sh[i]);
  for (int i = 0; i < started; i++)
    pthread_join(tid[i], NULL);
  for (int i = 0; i < n; i++)
    status |= sh[i].status;
  if (status == 0)
    merge(sh, n, whole);
  return status;
}

int tool_infer_sharded(const tool_infer_args *a, attn_proto_req *whole) {
  shard *sh = calloc(MAX_SHARDS, sizeof *sh);
  attn_status st = {0};
  int n = sh ? parse_urls(a->shards, sh, &st) : -1;
  if (n < 1) {
    fprintf(stderr,
            TOOL_INFER_ME ": --shards expects base URLs separated by commas (at most %d)%s%s\n",
            MAX_SHARDS, *st.message ? ": " : "", st.message);
    free(sh);
    return 2;
  }
  if (whole->req.cu_seqlens_q) {
    fprintf(stderr, TOOL_INFER_ME ": --shards splits one problem's keys, not a variable-length "
                                  "batch\n");
    free(sh);
    return 2;
  }
  if (n > whole->req.seq_kv)
    n = (int)whole->req.seq_kv; /* a shard of no key would be no request */
  int status = run(a, sh, n, whole);
  if (status == 0 && !a->quiet)
    printf("sharded   %d shards over %lld keys, merged by lse\n", n, (long long)whole->req.seq_kv);
  if (status == 0 && a->check)
    status = tool_infer_check(a, whole);
  for (int i = 0; i < MAX_SHARDS; i++) {
    free(sh[i].kv);
    free(sh[i].body);
    attn_proto_req_free(&sh[i].pr);
    tool_infer_reply_free(&sh[i].rep);
  }
  free(sh);
  return status;
}
