/*
 * fuzz_safetensors.c — libFuzzer target for the safetensors codec: the input
 * is a request body. Whatever the header claims, decoding must fail cleanly
 * or yield a request whose result encodes; the engine is left out so that
 * each input costs microseconds and the fuzzer explores the header.
 */
#include "proto.h"
#include "../lib/strict_json.h"

#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Whatever the input, the error body the server would send is strict JSON. */
static void check_error_body(const attn_status *st) {
  size_t len = 0;
  char *b = attn_proto_error_body(attn_proto_code_name(st->code), st->message, &len);
  if (b && !strict_error_body(b, len, NULL, 0))
    abort();
  free(b);
}

/* One decode of the body as a request of this pass. */
static void one_pass(const uint8_t *data, size_t size, attn_pass pass) {
  attn_proto_req pr;
  attn_status st;
  if (attn_proto_decode_safetensors_pass(data, size, pass, NULL, &pr, &st) < 0) {
    check_error_body(&st);
    return;
  }
  if (pr.req.pass != pass)
    abort();
  void *out = NULL;
  size_t len = 0;
  if (attn_proto_encode_safetensors(&pr, &out, &len, &st) == 0 && len < 16)
    abort(); /* a reply holds at least its length and "{}" */
  free(out);
  attn_proto_req_free(&pr);
}

/* Each body is decoded as both passes (q, k, v; q, k, v, o, do, lse). */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  one_pass(data, size, ATTN_FORWARD);
  one_pass(data, size, ATTN_BACKWARD);
  return 0;
}
