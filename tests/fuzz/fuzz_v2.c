/*
 * fuzz_v2.c — libFuzzer target for the Open Inference Protocol codec
 * (proto/v2.c): any body, with any Inference-Header-Content-Length, either
 * decodes or is refused with a proto error code, never crashes, reads out
 * of bounds or leaks; whatever decodes also encodes (JSON and binary
 * outputs), and the error body is strict JSON. The engine is not run: the
 * outputs are zeroed instead.
 *
 * Input: 4 bytes little-endian giving the JSON's length (taken modulo the
 * rest's length + 1, so most values are in range and some are the whole
 * body), then the body.
 */
#include "proto.h"

#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void zero_outputs(const attn_request *r) {
  size_t nq = (size_t)(r->batch * r->heads_q * r->seq_q * r->head_dim);
  size_t rows = (size_t)(r->batch * r->heads_q * r->seq_q);
  memset(r->o, 0, nq * attn_dtype_size(r->dtype));
  if (r->m) {
    memset(r->m, 0, rows * sizeof(float));
    memset(r->l, 0, rows * sizeof(float));
    memset(r->lse, 0, rows * sizeof(float));
  }
}

static void check_error_body(const attn_status *st) {
  size_t len = 0;
  char *b = attn_proto_v2_error_body(st->message, &len);
  cJSON *j = b ? cJSON_ParseWithLength(b, len) : NULL;
  if (b && !cJSON_IsString(cJSON_GetObjectItem(j, "error")))
    abort();
  cJSON_Delete(j);
  free(b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 4)
    return 0;
  size_t json_len = (size_t)(data[0] | data[1] << 8 | data[2] << 16 | (uint32_t)data[3] << 24);
  size_t len = size - 4;
  json_len %= len + 1;
  /* a copy of exactly len bytes, so ASan sees any read past the body */
  uint8_t *body = malloc(len ? len : 1);
  memcpy(body, data + 4, len);
  attn_proto_req pr;
  attn_v2_info info;
  attn_status st;
  if (attn_proto_decode_v2(body, len, json_len, &pr, &info, &st) < 0) {
    if (st.code >= 0)
      abort(); /* a refusal always has a code */
    check_error_body(&st);
    free(body);
    return 0;
  }
  zero_outputs(&pr.req);
  for (int bin = 0; bin < 2; bin++) {
    void *out = NULL;
    size_t olen = 0;
    attn_proto_part parts[ATTN_PROTO_MAX_PARTS];
    int np = 0;
    attn_v2_info i2 = info;
    i2.binary = bin ? info.outputs : 0;
    if (attn_proto_encode_v2_parts(&pr, &i2, "attention", "fallback", "cpu", &out, &olen, parts,
                                   &np, &st) == 0) {
      cJSON *j = cJSON_ParseWithLength(out, olen);
      if (!cJSON_IsObject(j) || (!bin && np)) /* no binary asked: none follows */
        abort();
      cJSON_Delete(j);
    }
    free(out);
  }
  attn_proto_req_free(&pr);
  free(body);
  return 0;
}
