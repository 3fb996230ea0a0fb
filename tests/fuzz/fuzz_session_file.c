/*
 * fuzz_session_file.c — libFuzzer target for a session file (PUT
 * /v1/sessions/{id}/import's body, attn_proto_session_file_decode).
 * Whatever the input, decoding fails with a code of the error table and a
 * 4xx (or out of memory's 503) status, or yields a session a create could
 * make whose every tensor lies within the body (or its aligned copy) at
 * the shape the metadata gives; and such a session written again
 * (attn_proto_session_file_encode) decodes to the same session.
 *
 * Input: the body, whole.
 */
#include "proto.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A layer's k or v as decoded: its rows in the dtype, or a quantized
 * session's codes (a byte each) and then its rows' F32 scales. */
static size_t tensor_bytes(const attn_kv_shape *sh, int64_t len, int t) {
  const size_t rows = (size_t)(sh->heads_kv * len),
               cols = (size_t)(t ? sh->head_dim_v : sh->head_dim);
  return sh->kv_quant ? rows * (cols + 4) : rows * cols * attn_dtype_size(sh->dtype);
}

/* Every byte of every tensor read (a sanitizer sees one out of bounds). */
static unsigned touch(const attn_proto_session_file *f) {
  unsigned x = 0;
  for (int64_t l = 0; l < f->shape.layers; l++)
    for (int t = 0; t < (f->shape.v_from_k ? 1 : 2); t++) {
      const unsigned char *p = t ? f->v[l] : f->k[l];
      size_t n = tensor_bytes(&f->shape, f->lengths[l], t);
      if (n && !p)
        abort();
      for (size_t i = 0; i < n; i++)
        x += p[i];
    }
  return x;
}

static void again(const attn_proto_session_file *f) {
  void *buf;
  size_t len;
  attn_status st;
  if (attn_proto_session_file_encode(&f->shape, f->ttl_s, f->lengths, (void *const *)f->k,
                                     (void *const *)f->v, &buf, &len, &st))
    return; /* out of memory */
  attn_proto_session_file *g = malloc(sizeof *g);
  if (g && attn_proto_session_file_decode(buf, len, 86400, g, &st) == 0) {
    if (memcmp(&g->shape, &f->shape, sizeof f->shape) || g->ttl_s != f->ttl_s ||
        memcmp(g->lengths, f->lengths, (size_t)f->shape.layers * sizeof *f->lengths))
      abort();
    attn_proto_session_file_free(g);
  } else if (g) {
    abort(); /* what was read once must read again */
  }
  free(g);
  free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  attn_proto_session_file *f = malloc(sizeof *f);
  attn_status st;
  if (!f)
    return 0;
  int rc = attn_proto_session_file_decode(data, size, 86400, f, &st);
  if (rc) {
    int status = attn_proto_http_status(rc);
    if (st.code != rc || !memchr(st.message, 0, sizeof st.message) ||
        !((status >= 400 && status < 500) || status == 503))
      abort();
  } else {
    const attn_kv_shape *sh = &f->shape;
    if (sh->heads_kv < 1 || sh->layers < 1 || sh->layers > ATTN_KV_MAX_LAYERS ||
        sh->head_dim_v < 1 || !(f->ttl_s >= 1 && f->ttl_s <= 86400))
      abort();
    for (int64_t l = 0; l < sh->layers; l++)
      if (f->lengths[l] < 0 || f->lengths[l] > sh->max_tokens)
        abort();
    volatile unsigned x = touch(f);
    (void)x;
    again(f);
    attn_proto_session_file_free(f);
  }
  free(f);
  return 0;
}
