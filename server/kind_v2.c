/*
 * kind_v2.c — the inference protocol's kind (kind.h): POST
 * /v2/models/{model}/infer, whose body is the protocol's JSON (with its
 * binary tensors after it when Inference-Header-Content-Length says so),
 * its options in the body's "parameters" only, and whose reply is the
 * protocol's.
 */
#include "kind.h"

#include <stdint.h>

/* The body's JSON part: the whole body unless the header said less. */
static size_t json_len(const attnd_req *r, size_t len) {
  return r->v2_json_len < len ? r->v2_json_len : len;
}

/* The tensors of its JSON part plus an aligned copy of its binary part. */
static uint64_t need(const attnd_req *r, size_t len) {
  return attn_proto_v2_decode_bound(len, json_len(r, len));
}

static int decode(attnd_req *r, const char *body, size_t len, attn_status *st) {
  size_t n = r->v2_json_len == SIZE_MAX ? len : r->v2_json_len;
  return attn_proto_decode_v2(body, len, n, &r->pr, &r->v2_info, st);
}

/* The request's id (X-Request-Id, or made) when the body had none; the
 * outputs sent as binary parts after the JSON when the request asked. */
static int encode(attnd_req *r, attn_status *st) {
  void *head = NULL;
  int rc = attn_proto_encode_v2_parts(&r->pr, &r->v2_info, attn_proto_v2_model_name(r->v2_model),
                                      r->id, r->res.backend, &head, &r->out_len, r->out_parts,
                                      &r->out_nparts, st);
  r->out = head;
  r->out_json_len = r->out_nparts ? r->out_len : 0;
  r->out_ctype = r->out_nparts ? "application/octet-stream" : "application/json";
  return rc;
}

#define TOO_LARGE "send the tensors as binary data, or raise --max-queue"

const attnd_kind attnd_kind_v2 = {.pass = ATTN_FORWARD,
                                  .need = need,
                                  .too_large = TOO_LARGE,
                                  .decode = decode,
                                  .submit = attnd_kind_submit_engine,
                                  .encode = encode,
                                  .here = attnd_kind_here_engine,
                                  .slot = true,
                                  .max_pairs = true,
                                  .pin = true};
