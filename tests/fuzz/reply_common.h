/*
 * reply_common.h — what the reply fuzz targets share: the request a reply
 * answers, chosen by the input's first byte (dtype, stats, a small shape),
 * or a backward pass, so the fuzzer explores replies to several requests.
 */
#ifndef ATTN_FUZZ_REPLY_COMMON_H
#define ATTN_FUZZ_REPLY_COMMON_H

#include "proto.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Builds pr from the selector byte (its top bit: a backward request, whose
 * reply is dq, dk, dv); 0, or -1 when the build fails (which it must not
 * for these shapes). */
static int fuzz_reply_request(uint8_t sel, attn_proto_req *pr) {
  static const float zeros[64];
  attn_dtype dt = (attn_dtype)(sel % 3);
  int64_t n = 1 + (sel >> 3) % 3, d = 1 + (sel >> 5) % 4;
  attn_pass pass = sel & 0x80 ? ATTN_BACKWARD : ATTN_FORWARD;
  attn_proto_tensor t[ATTN_PROTO_MAX_TENSORS] = {
      {"q", dt, 3, {2, n, d}, zeros},  {"k", dt, 3, {1, 2, d}, zeros},
      {"v", dt, 3, {1, 2, d}, zeros},  {"o", dt, 3, {2, n, d}, zeros},
      {"do", dt, 3, {2, n, d}, zeros}, {"lse", ATTN_F32, 2, {2, n}, NULL}};
  attn_options o;
  attn_options_init(&o);
  o.stats = pass == ATTN_FORWARD && ((sel >> 2) & 1);
  attn_status st;
  memset(pr, 0, sizeof *pr); /* attn_proto_build fills, the decoders zero */
  return attn_proto_build_pass(pr, pass, t, &o, &st) < 0 ? -1 : 0;
}

#endif
