/*
 * kind_attention.c — the stateless kinds (kind.h): POST /attention and
 * POST /attention/backward, whose body is the whole request (JSON or
 * safetensors, options also in the query string) and whose reply is its
 * outputs.
 */
#include "kind.h"

#include <string.h>

/* A JSON body's tensors take up to twice the body. */
uint64_t attnd_kind_need_tensors(const attnd_req *r, size_t len) {
  return r->json_in ? attn_proto_json_decode_bound(len) : 0;
}

static int decode(attnd_req *r, const char *body, size_t len, attn_status *st) {
  attn_options q;
  attn_options_init(&q);
  int rc = attn_options_parse_query(&q, r->query, st);
  attn_pass pass = r->route->kind->pass;
  if (rc == 0)
    rc = r->json_in ? attn_proto_decode_json_pass(body, len, pass, &q, &r->pr, st)
                    : attn_proto_decode_safetensors_pass(body, len, pass, &q, &r->pr, st);
  return rc;
}

int attnd_kind_submit_engine(attnd_req *r, attn_done_fn done, attn_status *st) {
  return attn_engine_submit(r->srv->engine, &r->pr.req, done, r, st);
}

/* A tiny job: a forward pass, small, on the CPU backend (a GPU job would
 * block the HTTP thread on the device's round trip). */
int attnd_kind_here_engine(attnd_req *r) {
  const attn_request *q = &r->pr.req;
  if (q->pass != ATTN_FORWARD || q->cu_seqlens_q || strcmp(q->backend, "cpu") ||
      attn_request_flops(q) > (double)r->srv->cfg->tiny_flops)
    return 1;
  attn_status st = {0};
  if (attn_engine_run_here(r->srv->engine, q, &r->res, &st) && !r->res.status.code)
    r->res.status = st; /* refused before it ran: no result was filled */
  return 0;
}

int attnd_kind_encode_tensors(attnd_req *r, attn_status *st) {
  if (!r->binary_out) {
    r->out_ctype = "application/json";
    return attn_proto_encode_json(&r->pr, r->res.backend, &r->out, &r->out_len, st);
  }
  void *head = NULL;
  int rc = attn_proto_encode_safetensors_parts(&r->pr, &head, &r->out_len, r->out_parts,
                                               &r->out_nparts, st);
  r->out = head;
  r->out_ctype = "application/octet-stream";
  return rc;
}

/* The two differ only in the pass their engine request computes. */
#define STATELESS(p)                                                                           \
  {                                                                                            \
    .pass = p, .need = attnd_kind_need_tensors, .too_large = ATTND_KIND_TOO_LARGE,             \
    .decode = decode, .submit = attnd_kind_submit_engine, .encode = attnd_kind_encode_tensors, \
    .here = attnd_kind_here_engine, .slot = true, .max_pairs = true, .pin = true               \
  }

const attnd_kind attnd_kind_forward = STATELESS(ATTN_FORWARD);
const attnd_kind attnd_kind_backward = STATELESS(ATTN_BACKWARD);
