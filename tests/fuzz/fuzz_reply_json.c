/*
 * fuzz_reply_json.c — libFuzzer target for the client's JSON reply decoder:
 * the first byte picks the request (reply_common.h), the rest is the reply.
 * Whatever the reply, decoding fails cleanly with a message or fills the
 * request's buffers, and never reads or writes past them (ASan).
 */
#include "reply_common.h"

#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1)
    return 0;
  attn_proto_req pr;
  if (fuzz_reply_request(data[0], &pr) < 0)
    abort();
  attn_status st;
  char backend[16];
  if (attn_proto_decode_reply_json((const char *)data + 1, size - 1, &pr, backend, sizeof backend,
                                   &st) < 0 &&
      (st.code >= 0 || !st.message[0]))
    abort(); /* a refusal has a code and says why */
  attn_proto_req_free(&pr);
  return 0;
}
