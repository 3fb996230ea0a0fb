/*
 * fuzz_json.c — libFuzzer target for the JSON codec: any body either
 * decodes or is refused with a proto error code, never crashes or leaks,
 * and whatever decodes also encodes. The engine is not run (a fuzzer wants
 * thousands of inputs a second); the outputs are zeroed instead.
 */
#include "proto.h"
#include "../unit/strict_json.h"

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

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  attn_proto_req pr;
  attn_status st;
  int rc = attn_proto_decode_json((const char *)data, size, NULL, &pr, &st);
  if (rc < 0) {
    if (rc <= ATTN_PROTO__ERRNO_BASE || rc >= ATTN_PROTO__ERRNO_END)
      if (rc <= ATTN__ERRNO_BASE || rc >= ATTN__ERRNO_END)
        abort(); /* not a code of either table */
    if (st.code != rc || !memchr(st.message, 0, sizeof st.message))
      abort();
    check_error_body(&st);
    return 0;
  }
  const attn_request *r = &pr.req;
  size_t on = (size_t)(r->batch * r->heads_q * r->seq_q * r->head_dim);
  memset(r->o, 0, on * attn_dtype_size(r->dtype));
  if (r->m) {
    size_t rows = (size_t)(r->batch * r->heads_q * r->seq_q);
    memset(r->m, 0, rows * sizeof(float));
    memset(r->l, 0, rows * sizeof(float));
    memset(r->lse, 0, rows * sizeof(float));
  }
  char *out;
  size_t len;
  if (attn_proto_encode_json(&pr, "cpu", &out, &len, &st) == 0) {
    if (out[len] != 0 || strlen(out) != len)
      abort();
    free(out);
  }
  attn_proto_req_free(&pr);
  return 0;
}
