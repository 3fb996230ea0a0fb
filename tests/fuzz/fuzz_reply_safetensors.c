/*
 * fuzz_reply_safetensors.c — libFuzzer target for the client's safetensors
 * reply decoder: the first byte picks the request (reply_common.h), the rest
 * is the reply. Decoding fails cleanly or fills the request's buffers; a
 * reply it accepts re-encodes to a file that decodes to the same bytes.
 */
#include "reply_common.h"

#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1)
    return 0;
  attn_proto_req pr, pr2;
  if (fuzz_reply_request(data[0], &pr) < 0 || fuzz_reply_request(data[0], &pr2) < 0)
    abort();
  attn_status st;
  if (attn_proto_decode_reply_safetensors(data + 1, size - 1, &pr, &st) < 0) {
    if (st.code >= 0 || !st.message[0])
      abort(); /* a refusal has a code and says why */
  } else {
    void *out;
    size_t len;
    if (attn_proto_encode_safetensors(&pr, &out, &len, &st) < 0 ||
        attn_proto_decode_reply_safetensors(out, len, &pr2, &st) < 0)
      abort();
    size_t ob = (size_t)(pr.req.batch * pr.req.heads_q * pr.req.seq_q * pr.req.head_dim) *
                attn_dtype_size(pr.req.dtype);
    if (memcmp(pr.req.o, pr2.req.o, ob) != 0)
      abort();
    free(out);
  }
  attn_proto_req_free(&pr);
  attn_proto_req_free(&pr2);
  return 0;
}
