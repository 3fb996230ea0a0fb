/* harness_bodies.c — see harness_bodies.h. */
#define _GNU_SOURCE
#include "harness_bodies.h"

#include "harness_buf.h"

#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

void shape_of(const tprob *p, bool kv, int rank, int64_t out[4]) {
  int64_t h = kv ? p->hkv : p->hq, n = kv ? p->nkv : p->nq;
  int64_t full[4] = {p->b, h, n, p->d};
  for (int i = 0; i < rank; i++)
    out[i] = full[4 - rank + i];
}

static void shape_txt(buf *b, const int64_t *s, int rank) {
  char t[32];
  buf_add(b, "[", 1);
  for (int i = 0; i < rank; i++) {
    int n = snprintf(t, sizeof t, i ? ",%lld" : "%lld", (long long)s[i]);
    buf_add(b, t, (size_t)n);
  }
  buf_add(b, "]", 1);
}

static void json_num(buf *b, double x) {
  char t[40];
  int n = snprintf(t, sizeof t, "%.9g", x);
  buf_add(b, t, (size_t)n);
}

static void json_tensor(buf *b, const char *name, const void *data, attn_dtype dt,
                        const int64_t *shape, int rank) {
  char t[64];
  int n = snprintf(t, sizeof t, "\"%s\":{\"shape\":", name);
  buf_add(b, t, (size_t)n);
  shape_txt(b, shape, rank);
  n = snprintf(t, sizeof t, ",\"dtype\":\"%s\",\"data\":[", attn_dtype_name(dt));
  buf_add(b, t, (size_t)n);
  size_t cnt = 1;
  for (int i = 0; i < rank; i++)
    cnt *= (size_t)shape[i];
  for (size_t i = 0; i < cnt; i++) {
    if (i)
      buf_add(b, ",", 1);
    json_num(b, attn_load_elem(data, dt, i));
  }
  buf_add(b, "]}", 2);
}

char *json_body(const tcase *c, int rank, const char *extra, size_t *plen) {
  buf b = {0};
  int64_t sq[4], sk[4];
  shape_of(&c->p, false, rank, sq);
  shape_of(&c->p, true, rank, sk);
  buf_add(&b, "{", 1);
  json_tensor(&b, "q", c->q, c->p.dt, sq, rank);
  buf_add(&b, ",", 1);
  json_tensor(&b, "k", c->k, c->p.dt, sk, rank);
  buf_add(&b, ",", 1);
  json_tensor(&b, "v", c->v, c->p.dt, sk, rank);
  if (extra)
    buf_add(&b, extra, strlen(extra));
  buf_add(&b, "}", 1);
  *plen = b.n;
  return b.p;
}

static void nested(buf *b, const void *data, attn_dtype dt, const int64_t *shape, int rank,
                   size_t *idx) {
  buf_add(b, "[", 1);
  for (int64_t i = 0; i < shape[0]; i++) {
    if (i)
      buf_add(b, ",", 1);
    if (rank == 1)
      json_num(b, attn_load_elem(data, dt, (*idx)++));
    else
      nested(b, data, dt, shape + 1, rank - 1, idx);
  }
  buf_add(b, "]", 1);
}

char *json_nested_body(const tcase *c, int rank, const char *extra, size_t *plen) {
  buf b = {0};
  int64_t sq[4], sk[4];
  shape_of(&c->p, false, rank, sq);
  shape_of(&c->p, true, rank, sk);
  size_t i = 0;
  buf_add(&b, "{\"q\":", 5);
  nested(&b, c->q, c->p.dt, sq, rank, &i);
  i = 0;
  buf_add(&b, ",\"k\":", 5);
  nested(&b, c->k, c->p.dt, sk, rank, &i);
  i = 0;
  buf_add(&b, ",\"v\":", 5);
  nested(&b, c->v, c->p.dt, sk, rank, &i);
  if (extra)
    buf_add(&b, extra, strlen(extra));
  buf_add(&b, "}", 1);
  *plen = b.n;
  return b.p;
}

char *st_body(const tcase *c, int rank, const char *metadata, size_t *plen) {
  const tprob *p = &c->p;
  size_t es = attn_dtype_size(p->dt);
  size_t nq = (size_t)(p->b * p->hq * p->nq * p->d) * es;
  size_t nk = (size_t)(p->b * p->hkv * p->nkv * p->d) * es;
  int64_t sq[4], sk[4];
  shape_of(p, false, rank, sq);
  shape_of(p, true, rank, sk);
  buf h = {0};
  char t[160];
  buf_add(&h, "{", 1);
  if (metadata) {
    buf_add(&h, "\"__metadata__\":", 15);
    buf_add(&h, metadata, strlen(metadata));
    buf_add(&h, ",", 1);
  }
  const char *names[3] = {"q", "k", "v"};
  size_t off[4] = {0, nq, nq + nk, nq + 2 * nk};
  for (int i = 0; i < 3; i++) {
    int n = snprintf(t, sizeof t, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":", i ? "," : "", names[i],
                     attn_dtype_name(p->dt));
    buf_add(&h, t, (size_t)n);
    shape_txt(&h, i ? sk : sq, rank);
    n = snprintf(t, sizeof t, ",\"data_offsets\":[%zu,%zu]}", off[i], off[i + 1]);
    buf_add(&h, t, (size_t)n);
  }
  buf_add(&h, "}", 1);
  size_t len = 8 + h.n + off[3];
  char *b = malloc(len);
  for (int i = 0; i < 8; i++)
    b[i] = (char)((uint64_t)h.n >> (8 * i));
  memcpy(b + 8, h.p, h.n);
  memcpy(b + 8 + h.n, c->q, nq);
  memcpy(b + 8 + h.n + nq, c->k, nk);
  memcpy(b + 8 + h.n + nq + nk, c->v, nk);
  free(h.p);
  *plen = len;
  return b;
}

char *slow_body(tcase *c, int heads, int n, size_t *plen) {
  tprob p = tprob_make(1, heads, heads, n, n, 64, ATTN_F32);
  tcase_init(c, &p, 4242);
  return st_body(c, 4, "{\"backend\":\"reference\"}", plen);
}

char *held_body(tcase *c, size_t *plen) { return slow_body(c, 1, 64, plen); }

static bool shape_is(const cJSON *sh, const int64_t *want, int rank) {
  if (!cJSON_IsArray(sh) || cJSON_GetArraySize(sh) != rank)
    return false;
  for (int i = 0; i < rank; i++) {
    const cJSON *d = cJSON_GetArrayItem(sh, i);
    if (!cJSON_IsNumber(d) || d->valuedouble != (double)want[i])
      return false;
  }
  return true;
}

static const char *rank_shape(const int64_t *s, int rank, char *b, size_t cap) {
  size_t o = (size_t)snprintf(b, cap, "[");
  for (int i = 0; i < rank && o < cap; i++)
    o += (size_t)snprintf(b + o, cap - o, i ? ",%lld" : "%lld", (long long)s[i]);
  if (o < cap)
    snprintf(b + o, cap - o, "]");
  return b;
}

/* The "shape" and "dtype" of a reply tensor (JSON object or safetensors
 * header entry) against what the request implies; false with err set. */
static bool check_entry(const cJSON *x, const char *name, const int64_t *sq, int r, attn_dtype dt,
                        char *err, size_t cap) {
  char sb[96];
  const cJSON *sh = cJSON_GetObjectItemCaseSensitive(x, "shape");
  const cJSON *dtj = cJSON_GetObjectItemCaseSensitive(x, "dtype");
  if (!shape_is(sh, sq, r)) {
    char *got = cJSON_PrintUnformatted(sh);
    snprintf(err, cap, "tensor \"%s\": shape %s, want %s", name, got ? got : "missing",
             rank_shape(sq, r, sb, sizeof sb));
    free(got);
    return false;
  }
  if (!cJSON_IsString(dtj) || strcmp(dtj->valuestring, attn_dtype_name(dt))) {
    snprintf(err, cap, "tensor \"%s\": dtype %s, want %s", name,
             cJSON_IsString(dtj) ? dtj->valuestring : "missing", attn_dtype_name(dt));
    return false;
  }
  return true;
}

int parse_json_reply(const char *body, size_t len, tcase *c, int rank, char *err, size_t cap) {
  cJSON *j = cJSON_ParseWithLength(body, len);
  int rc = -1;
  if (!cJSON_IsObject(j)) {
    snprintf(err, cap, "reply is not a JSON object");
    goto out;
  }
  int64_t sq[4];
  shape_of(&c->p, false, rank, sq);
  size_t rows = (size_t)(c->p.b * c->p.hq * c->p.nq);
  const char *names[4] = {"o", "m", "l", "lse"};
  for (int t = 0; t < 4; t++) {
    cJSON *x = cJSON_GetObjectItemCaseSensitive(j, names[t]);
    if (t > 0 && !c->p.stats) {
      if (x) {
        snprintf(err, cap, "reply has \"%s\" but stats were not asked for", names[t]);
        goto out;
      }
      continue;
    }
    if (!cJSON_IsObject(x)) {
      snprintf(err, cap, "reply has no object \"%s\"", names[t]);
      goto out;
    }
    int r = t ? rank - 1 : rank;
    attn_dtype dt = t ? ATTN_F32 : c->p.dt;
    cJSON *data = cJSON_GetObjectItemCaseSensitive(x, "data");
    if (!check_entry(x, names[t], sq, r, dt, err, cap))
      goto out;
    size_t want = t ? rows : rows * (size_t)c->p.d;
    if (!cJSON_IsArray(data) || (size_t)cJSON_GetArraySize(data) != want) {
      snprintf(err, cap, "\"%s\".data has %d values, want %zu", names[t],
               cJSON_IsArray(data) ? cJSON_GetArraySize(data) : -1, want);
      goto out;
    }
    size_t i = 0;
    float *stat = t == 1 ? c->m : t == 2 ? c->l : c->lse;
    for (cJSON *e = data->child; e; e = e->next, i++) {
      double v;
      if (cJSON_IsNumber(e)) {
        v = e->valuedouble;
      } else if (cJSON_IsNull(e) && (t == 1 || t == 3)) {
        v = -INFINITY; /* m and lse of a row with no visible key */
      } else {
        snprintf(err, cap, "\"%s\".data[%zu] is not a number", names[t], i);
        goto out;
      }
      if (t == 0)
        attn_store_elem(c->o, dt, i, (float)v);
      else
        stat[i] = (float)v;
    }
  }
  rc = 0;
out:
  cJSON_Delete(j);
  return rc;
}

int parse_st_reply(const void *bodyv, size_t len, tcase *c, int rank, char *err, size_t cap) {
  const unsigned char *body = bodyv;
  if (len < 8) {
    snprintf(err, cap, "safetensors reply of %zu bytes", len);
    return -1;
  }
  uint64_t n = 0;
  for (int i = 0; i < 8; i++)
    n |= (uint64_t)body[i] << (8 * i);
  if (n > len - 8) {
    snprintf(err, cap, "safetensors header length %llu past the %zu-byte reply",
             (unsigned long long)n, len);
    return -1;
  }
  if ((8 + n) % 8) {
    snprintf(err, cap, "safetensors data starts at %llu, not a multiple of 8",
             (unsigned long long)(8 + n));
    return -1;
  }
  const unsigned char *data = body + 8 + n;
  size_t dlen = len - 8 - (size_t)n;
  cJSON *j = cJSON_ParseWithLength((const char *)body + 8, (size_t)n);
  int rc = -1;
  if (!cJSON_IsObject(j)) {
    snprintf(err, cap, "safetensors reply header is not a JSON object");
    goto out;
  }
  int64_t sq[4];
  shape_of(&c->p, false, rank, sq);
  size_t rows = (size_t)(c->p.b * c->p.hq * c->p.nq);
  size_t covered = 0;
  const char *names[4] = {"o", "m", "l", "lse"};
  for (cJSON *e = j->child; e; e = e->next)
    if (strcmp(e->string, "__metadata__") && strcmp(e->string, "o") &&
        (!c->p.stats ||
         (strcmp(e->string, "m") && strcmp(e->string, "l") && strcmp(e->string, "lse")))) {
      snprintf(err, cap, "safetensors reply has an unexpected tensor \"%s\"", e->string);
      goto out;
    }
  for (int t = 0; t < 4; t++) {
    cJSON *x = cJSON_GetObjectItemCaseSensitive(j, names[t]);
    if (t > 0 && !c->p.stats)
      continue;
    if (!cJSON_IsObject(x)) {
      snprintf(err, cap, "safetensors reply has no tensor \"%s\"", names[t]);
      goto out;
    }
    int r = t ? rank - 1 : rank;
    attn_dtype dt = t ? ATTN_F32 : c->p.dt;
    cJSON *off = cJSON_GetObjectItemCaseSensitive(x, "data_offsets");
    if (!check_entry(x, names[t], sq, r, dt, err, cap))
      goto out;
    size_t es = attn_dtype_size(dt);
    size_t want = (t ? rows : rows * (size_t)c->p.d) * es;
    if (!cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2) {
      snprintf(err, cap, "tensor \"%s\" has no data_offsets pair", names[t]);
      goto out;
    }
    double b0 = cJSON_GetArrayItem(off, 0)->valuedouble,
           b1 = cJSON_GetArrayItem(off, 1)->valuedouble;
    if (b0 < 0 || b1 < b0 || b1 > (double)dlen || (size_t)(b1 - b0) != want) {
      snprintf(err, cap, "tensor \"%s\" data_offsets [%.0f, %.0f] (data %zu bytes), want %zu bytes",
               names[t], b0, b1, dlen, want);
      goto out;
    }
    covered += want;
    void *dst = t == 0 ? c->o : t == 1 ? (void *)c->m : t == 2 ? (void *)c->l : (void *)c->lse;
    memcpy(dst, data + (size_t)b0, want);
  }
  if (covered != dlen) {
    snprintf(err, cap, "safetensors reply data is %zu bytes, its tensors cover %zu", dlen, covered);
    goto out;
  }
  rc = 0;
out:
  cJSON_Delete(j);
  return rc;
}

const char *check_correct(const http_res *rs, tcase *c, int rank, bool st_reply, char *err,
                          size_t cap) {
  char ct[128] = "", sn[300], d[256];
  tdesc(&c->p, d, sizeof d);
  if (rs->status != 200) {
    snprintf(err, cap, "%s: status %ld (%s), body: %s", d, rs->status, rs->status ? "" : rs->error,
             snip(rs->body ? rs->body : "", rs->len, sn, sizeof sn));
    return err;
  }
  http_header(rs, "Content-Type", ct, sizeof ct);
  const char *want = st_reply ? "application/octet-stream" : "application/json";
  if (strncasecmp(ct, want, strlen(want))) {
    snprintf(err, cap, "%s: reply Content-Type \"%s\", want %s", d, ct, want);
    return err;
  }
  tcase_poison(c);
  char e2[400];
  int rc = st_reply ? parse_st_reply(rs->body, rs->len, c, rank, e2, sizeof e2)
                    : parse_json_reply(rs->body, rs->len, c, rank, e2, sizeof e2);
  if (rc < 0) {
    snprintf(err, cap, "%s: %s", d, e2);
    return err;
  }
  terr e = tcheck(c);
  bool ok = e.o <= ttol(c->p.dt) && e.masked_ok && (!c->p.stats || e.stats <= 1e-5);
  if (!ok) {
    snprintf(err, cap, "%s: O error %.3g (tol %.0e), stats error %.3g, masked rows %s", d, e.o,
             ttol(c->p.dt), e.stats, e.masked_ok ? "ok" : "WRONG");
    return err;
  }
  return NULL;
}

bool expect_correct(const http_res *rs, tcase *c, int rank, bool st_reply, const char *what) {
  char err[1024];
  const char *m = check_correct(rs, c, rank, st_reply, err, sizeof err);
  cr_expect(m == NULL, "%s: %s", what, m ? m : "");
  return m == NULL;
}

const char *jstr(const cJSON *o, const char *k) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
  return cJSON_IsString(v) ? v->valuestring : NULL;
}
