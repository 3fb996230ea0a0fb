/*
 * fuzz_session.c — libFuzzer target for the session routes' parsing, as
 * the server runs it: a create's, a truncate's and a fork's JSON body, and a call's
 * query string and body (JSON or safetensors, one session or a batch)
 * decoded with its session fields, then cut into the store's entries
 * (attn_proto_session_entries). Whatever the input, decoding fails with a
 * code of the error table, or yields entries that tile the rows sent.
 *
 * Input: one byte choosing the route and codec (its value modulo 6:
 * c create (and the same body as a truncate's and a fork's), t truncate, j/J one session/batch in
 * JSON, s/S in safetensors, by ROUTES' order below), then for a call the query string up to the
 * first
 * '\n', then the body (the rest).
 */
#include "proto.h"
#include "../lib/strict_json.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char ROUTES[] = "ctjJsS";

/* Whatever the input, a refusal is a code of either table with a 4xx (or
 * out of memory's 503) status, and the error body the server would send is
 * strict JSON. */
static void check_refusal(int rc, const attn_status *st) {
  int status = attn_proto_http_status(rc);
  if (st->code != rc || !memchr(st->message, 0, sizeof st->message) ||
      !((status >= 400 && status < 500) || status == 503))
    abort();
  size_t len = 0;
  char *b = attn_proto_error_body(attn_proto_code_name(st->code), st->message, &len);
  if (b && !strict_error_body(b, len, NULL, 0))
    abort();
  free(b);
}

/* A fork's body: a valid id, a length within a truncate's limits or -1
 * (each layer's own), a ttl within [1, ttl_max] or 0 (the source's). */
static void fork_body(const char *body, size_t len) {
  char id[ATTN_KV_ID_MAX + 1];
  int64_t n;
  double ttl;
  attn_status st;
  int rc = attn_proto_session_fork_decode(body, len, 86400, id, &n, &ttl, &st);
  if (rc)
    check_refusal(rc, &st);
  else if (attn_kv_id_check(id, strlen(id), &st) || n < -1 || n > ((int64_t)1 << 30) ||
           !(ttl == 0 || (ttl >= 1 && ttl <= 86400)))
    abort();
}

/* A create's body: a shape within the store's limits, a ttl within
 * [1, ttl_max], and a description that is strict JSON; a truncate's and a
 * fork's. */
static void create_and_truncate(const char *body, size_t len) {
  attn_kv_shape sh;
  double ttl;
  attn_status st;
  int rc = attn_proto_session_create_decode(body, len, 86400, &sh, &ttl, &st);
  if (rc) {
    check_refusal(rc, &st);
  } else {
    if (sh.heads_kv < 1 || sh.heads_kv > 4096 || sh.head_dim < 1 ||
        sh.head_dim > ATTN_MAX_HEAD_DIM || sh.layers < 1 || sh.layers > ATTN_KV_MAX_LAYERS ||
        sh.max_tokens < 1 || sh.max_tokens > ((int64_t)1 << 30) || !(ttl >= 1 && ttl <= 86400) ||
        attn_dtype_size(sh.dtype) == 0 || sh.head_dim_v < 0 ||
        sh.head_dim_v > ATTN_MAX_HEAD_DIM_V || (!sh.v_from_k && sh.head_dim_v == sh.head_dim) ||
        (sh.v_from_k && (sh.head_dim_v < 1 || sh.head_dim_v > sh.head_dim)) ||
        (unsigned)sh.kv_quant >= ATTN_KVQ_COUNT)
      abort();
    attn_kv_info info = {.id = "s", .shape = sh, .ttl_s = ttl, .expires = ttl};
    attn_sbuf b = {0};
    attn_proto_session_info_json(&b, &info, NULL, 0);
    if (!b.oom && !strict_utf8(b.p, b.len))
      abort();
    free(b.p);
  }
  int64_t n;
  rc = attn_proto_session_truncate_decode(body, len, &n, &st);
  if (rc)
    check_refusal(rc, &st);
  else if (n < 0 || n > ((int64_t)1 << 30))
    abort();
  fork_body(body, len);
}

/* The entries of a decoded call: one a session, each new row of k and v
 * taken once and in order, positions and the layer within their limits. */
static void check_entries(const attn_proto_session *ps, const attn_request *req,
                          const attn_kv_entry *en, int64_t n) {
  if (n != (ps->batch ? ps->nids : 1) || n < 1 || n > ATTN_PROTO_MAX_BATCH || ps->layer < 0 ||
      ps->layer >= ATTN_KV_MAX_LAYERS)
    abort();
  int64_t at = 0;
  for (int64_t e = 0; e < n; e++) {
    if (!en[e].id || !*en[e].id || en[e].kv_off != at || en[e].n_new < 0 || en[e].pos < 0 ||
        en[e].pos > ATTN_MAX_DIM || (!req->k && en[e].n_new))
      abort();
    at += en[e].n_new;
  }
  if (at != (req->k ? req->seq_kv : 0))
    abort();
}

/* A latent session's shape (D 8, Dv 4), as the server's lookup gives it. */
static int latent_shape(void *arg, const attn_proto_session *ps, attn_kv_shape *sh,
                        attn_status *st) {
  (void)arg, (void)ps, (void)st;
  *sh = (attn_kv_shape){.heads_kv = 1, .head_dim = 8, .head_dim_v = 4, .v_from_k = true};
  return 0;
}

/* A call's query string and body, decoded as the server does (latent: for
 * a latent session, which takes no v and answers o of its Dv). */
static void call(bool batch, bool json, bool latent, const char *query, const char *body,
                 size_t len) {
  attn_proto_session ps;
  attn_proto_req pr;
  attn_status st;
  attn_proto_session_init(&ps, batch);
  ps.shape_of = latent ? latent_shape : NULL;
  int rc = attn_proto_decode_session(body, len, json, query, &ps, &pr, &st);
  if (rc) {
    check_refusal(rc, &st);
    return;
  }
  if (latent && (pr.req.v || pr.shape_o[pr.rank - 1] != 4))
    abort();
  static attn_kv_entry entries[ATTN_PROTO_MAX_BATCH];
  int64_t n = attn_proto_session_entries(&ps, &pr.req, "route-id", entries);
  check_entries(&ps, &pr.req, entries, n);
  attn_proto_req_free(&pr);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size == 0)
    return 0;
  const char *hit = memchr(ROUTES, data[0], sizeof ROUTES - 1);
  int route = hit ? (int)(hit - ROUTES) : data[0] % 6;
  const char *rest = (const char *)data + 1;
  size_t n = size - 1;
  if (route == 0 || route == 1) {
    create_and_truncate(rest, n);
    return 0;
  }
  const char *nl = memchr(rest, '\n', n);
  size_t qlen = nl ? (size_t)(nl - rest) : 0;
  char *query = malloc(qlen + 1);
  if (!query)
    return 0;
  memcpy(query, rest, qlen);
  query[qlen] = 0;
  size_t skip = nl ? qlen + 1 : 0;
  for (int latent = 0; latent < 2; latent++)
    call(route == 3 || route == 5, route == 2 || route == 3, latent, query, rest + skip, n - skip);
  free(query);
  return 0;
}
