/*
 * session_wire.c — the safetensors bodies of session.h: a call's 3-D
 * tensors written out, random inputs, and what a reply holds (o read
 * through its header, the __metadata__ length).
 */
#include "proto.h"
#include "session.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int rank_of(const tool_sess_tensor *t) { return t->rank ? t->rank : 3; }

static size_t tensor_bytes(const tool_sess_tensor *t) {
  size_t n = attn_dtype_size(t->dtype);
  for (int i = 0; i < rank_of(t); i++)
    n *= (size_t)t->shape[i];
  return n;
}

/* The header JSON of t[0..n) into b, padded with spaces so that the data
 * starts at a multiple of 8 bytes after the 8-byte length. */
static void header(const tool_sess_tensor *t, int n, attn_sbuf *b) {
  size_t off = 0;
  attn_sbuf_puts(b, "{");
  for (int i = 0; i < n; i++) {
    size_t nb = tensor_bytes(&t[i]);
    attn_sbuf_printf(b, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[", i ? "," : "", t[i].name,
                     attn_dtype_name(t[i].dtype));
    for (int d = 0; d < rank_of(&t[i]); d++)
      attn_sbuf_printf(b, "%s%lld", d ? "," : "", (long long)t[i].shape[d]);
    attn_sbuf_printf(b, "],\"data_offsets\":[%zu,%zu]}", off, off + nb);
    off += nb;
  }
  attn_sbuf_puts(b, "}");
  while (!b->oom && (8 + b->len) % 8 != 0)
    attn_sbuf_puts(b, " ");
}

int tool_sess_encode(const tool_sess_tensor *t, int n, void **pbuf, size_t *plen) {
  attn_sbuf h = {0};
  header(t, n, &h);
  size_t data = 0;
  for (int i = 0; i < n; i++)
    data += tensor_bytes(&t[i]);
  unsigned char *p = h.oom ? NULL : malloc(8 + h.len + data);
  if (!p) {
    free(h.p);
    return -1;
  }
  uint64_t hl = h.len;
  for (int i = 0; i < 8; i++)
    p[i] = (unsigned char)(hl >> (8 * i)); /* little-endian */
  memcpy(p + 8, h.p, h.len);
  size_t at = 8 + h.len;
  for (int i = 0; i < n; i++) {
    memcpy(p + at, t[i].data, tensor_bytes(&t[i]));
    at += tensor_bytes(&t[i]);
  }
  free(h.p);
  *pbuf = p;
  *plen = at;
  return 0;
}

static uint64_t next(uint64_t *s) {
  /* splitmix64 */
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

void tool_sess_random(void *buf, int64_t count, attn_dtype dt, uint64_t *seed) {
  for (int64_t i = 0; i < count; i++) {
    float x = (float)((double)(next(seed) >> 11) * 0x1p-52 - 1.0); /* [-1, 1) */
    if (dt == ATTN_F32)
      ((float *)buf)[i] = x;
    else if (dt == ATTN_F16)
      ((uint16_t *)buf)[i] = attn_f32_to_f16(x);
    else
      ((uint16_t *)buf)[i] = attn_f32_to_bf16(x);
  }
}

/* Element i of a dtype's data as a double. */
static double element(const unsigned char *p, attn_dtype dt, size_t i) {
  if (dt == ATTN_F32) {
    float f;
    memcpy(&f, p + 4 * i, 4);
    return f;
  }
  uint16_t h;
  memcpy(&h, p + 2 * i, 2);
  return dt == ATTN_F16 ? attn_f16_to_f32(h) : attn_bf16_to_f32(h);
}

/* o's entry of the header: dtype, shape, data offsets; 0 or -1. */
static int o_entry(const cJSON *hdr, tool_sess_out *o, size_t *begin, size_t *end) {
  const cJSON *e = cJSON_GetObjectItemCaseSensitive(hdr, "o");
  const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
  const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
  const cJSON *off = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
  if (!cJSON_IsString(dt) || attn_dtype_parse(dt->valuestring, &o->dtype) < 0 ||
      !cJSON_IsArray(sh) || cJSON_GetArraySize(sh) > 4 || cJSON_GetArraySize(off) != 2)
    return -1;
  o->rank = cJSON_GetArraySize(sh);
  for (int i = 0; i < o->rank; i++)
    o->shape[i] = (int64_t)cJSON_GetArrayItem(sh, i)->valuedouble;
  *begin = (size_t)cJSON_GetArrayItem(off, 0)->valuedouble;
  *end = (size_t)cJSON_GetArrayItem(off, 1)->valuedouble;
  return *end >= *begin ? 0 : -1;
}

static void summary(const unsigned char *data, size_t n, tool_sess_out *o) {
  double mx = 0, sum = 0;
  for (size_t i = 0; i < n; i++) {
    double a = fabs(element(data, o->dtype, i));
    mx = a > mx ? a : mx;
    sum += a;
  }
  o->absmax = mx;
  o->absmean = n ? sum / (double)n : 0;
}

static void meta_length(const cJSON *hdr, tool_sess_out *o) {
  const cJSON *m = cJSON_GetObjectItemCaseSensitive(hdr, "__metadata__");
  const cJSON *len = cJSON_GetObjectItemCaseSensitive(m, "length");
  o->length = cJSON_IsString(len) ? strtoll(len->valuestring, NULL, 10) : -1;
}

int tool_sess_reply_out(const void *body, size_t len, tool_sess_out *o, char *why, size_t cap) {
  const unsigned char *p = body;
  memset(o, 0, sizeof *o);
  uint64_t hl = 0;
  for (int i = 0; len >= 8 && i < 8; i++)
    hl |= (uint64_t)p[i] << (8 * i);
  cJSON *hdr = len >= 8 && hl <= len - 8 ? cJSON_ParseWithLength((const char *)p + 8, hl) : NULL;
  size_t begin = 0, end = 0;
  int rc = -1;
  if (!hdr)
    snprintf(why, cap, "the reply is not a safetensors file");
  else if (o_entry(hdr, o, &begin, &end) < 0 || end > len - 8 - hl)
    snprintf(why, cap, "the reply holds no tensor o that fits");
  else
    rc = 0;
  if (rc == 0) {
    summary(p + 8 + hl + begin, (end - begin) / attn_dtype_size(o->dtype), o);
    o->stats = cJSON_GetObjectItemCaseSensitive(hdr, "lse") != NULL;
    meta_length(hdr, o);
  }
  cJSON_Delete(hdr);
  return rc;
}
