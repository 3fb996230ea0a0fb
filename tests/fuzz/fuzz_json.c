/*
 * fuzz_json.c — libFuzzer target for the JSON codec: any body either
 * decodes or is refused with a proto error code, never crashes or leaks,
 * and whatever decodes also encodes, as a request of either pass. The engine is not run (a fuzzer
 * wants thousands of inputs a second); the outputs are zeroed instead.
 */
#include "proto.h"
#include "../lib/strict_json.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Whatever the input, the error body the server would send is strict JSON. */
static void check_error_body(const attn_status *st) {
  size_t len = 0;
  char *b = attn_proto_error_body(attn_proto_code_name(st->code), st->message, &len);
  if (b && !strict_error_body(b, len, NULL, 0))
    abort();
  free(b);
}

/* Zeroes the outputs the engine would write (forward: o and the
 * statistics; backward: dq, dk, dv). */
static void zero_outputs(const attn_request *r) {
  size_t es = attn_dtype_size(r->dtype);
  size_t nq = (size_t)(r->batch * r->heads_q * r->seq_q * r->head_dim) * es;
  size_t nk = (size_t)(r->batch * r->heads_kv * r->seq_kv * r->head_dim) * es;
  size_t rows = (size_t)(r->batch * r->heads_q * r->seq_q);
  if (r->pass == ATTN_BACKWARD) {
    memset(r->dq, 0, nq);
    memset(r->dk, 0, nk);
    memset(r->dv, 0, nk);
    return;
  }
  memset(r->o, 0, nq);
  if (r->m) {
    memset(r->m, 0, rows * sizeof(float));
    memset(r->l, 0, rows * sizeof(float));
    memset(r->lse, 0, rows * sizeof(float));
  }
}

/* One decode of the body as a request of this pass. */
static void one_pass(const uint8_t *data, size_t size, attn_pass pass) {
  attn_proto_req pr;
  attn_status st;
  int rc = attn_proto_decode_json_pass((const char *)data, size, pass, NULL, &pr, &st);
  if (rc < 0) {
    if (rc <= ATTN_PROTO__ERRNO_BASE || rc >= ATTN_PROTO__ERRNO_END)
      if (rc <= ATTN__ERRNO_BASE || rc >= ATTN__ERRNO_END)
        abort(); /* not a code of either table */
    if (st.code != rc || !memchr(st.message, 0, sizeof st.message))
      abort();
    check_error_body(&st);
    return;
  }
  if (pr.req.pass != pass)
    abort();
  zero_outputs(&pr.req);
  char *out;
  size_t len;
  if (attn_proto_encode_json(&pr, "cpu", &out, &len, &st) == 0) {
    if (out[len] != 0 || strlen(out) != len)
      abort();
    free(out);
  }
  attn_proto_req_free(&pr);
}

/* Each body is decoded as both passes: a backward body (o, do, lse with its
 * nulls) reaches the backward decoder's paths, a forward one the other's. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  one_pass(data, size, ATTN_FORWARD);
  one_pass(data, size, ATTN_BACKWARD);
  return 0;
}
