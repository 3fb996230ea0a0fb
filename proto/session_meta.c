/*
 * session_meta.c — the small JSON documents of the session routes: a
 * create's parameters, a truncate's length, a session's description.
 */
#include "proto.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

typedef struct field {
  const char *name;
  bool required;
} field;

static const field create_fields[] = {{"heads_kv", true},   {"head_dim", true}, {"dtype", true},
                                      {"max_tokens", true}, {"layers", false},  {"ttl_s", false}};
#define NCREATE (sizeof create_fields / sizeof *create_fields)

/* The object of body, each member one of names; NULL with st set. */
static cJSON *parse_object(const char *body, size_t len, const field *names, size_t n,
                           const char *what, attn_status *st) {
  if (len == 0) {
    attn_status_set(st, ATTN_PROTO_EEMPTY, "the request has no body: send %s", what);
    return NULL;
  }
  cJSON *root = cJSON_ParseWithLength(body, len);
  if (!root || !cJSON_IsObject(root)) {
    attn_status_set(st, ATTN_PROTO_EJSON, "the body is not a JSON object: send %s", what);
    cJSON_Delete(root);
    return NULL;
  }
  for (const cJSON *c = root->child; c; c = c->next) {
    size_t i = 0;
    while (i < n && strcmp(c->string, names[i].name))
      i++;
    int twice = 0;
    for (const cJSON *p = root->child; p != c; p = p->next)
      twice |= !strcmp(p->string, c->string);
    if (i == n || twice) {
      attn_status_set(st, twice ? ATTN_PROTO_EJSON : ATTN_PROTO_EOPTION,
                      twice ? "the key \"%.40s\" appears twice"
                            : "unknown field \"%.40s\": send %s",
                      c->string, what);
      cJSON_Delete(root);
      return NULL;
    }
  }
  for (size_t i = 0; i < n; i++)
    if (names[i].required && !cJSON_GetObjectItemCaseSensitive(root, names[i].name)) {
      attn_status_set(st, ATTN_PROTO_EOPTVALUE, "field \"%s\" is missing: send %s", names[i].name,
                      what);
      cJSON_Delete(root);
      return NULL;
    }
  return root;
}

/* Member name as an integer from lo to hi, or def when absent. */
static int get_int(const cJSON *root, const char *name, int64_t lo, int64_t hi, int64_t def,
                   int64_t *out, attn_status *st) {
  const cJSON *c = cJSON_GetObjectItemCaseSensitive(root, name);
  *out = def;
  if (!c)
    return 0;
  double x = cJSON_IsNumber(c) ? c->valuedouble : NAN;
  if (!(x >= (double)lo && x <= (double)hi && x == floor(x)))
    return attn_status_set(st, ATTN_PROTO_EOPTVALUE, "\"%s\" must be an integer from %lld to %lld",
                           name, (long long)lo, (long long)hi);
  *out = (int64_t)x;
  return 0;
}

#define CREATE_WHAT                                                                             \
  "{\"heads_kv\": n, \"head_dim\": n, \"dtype\": \"F32\"|\"F16\"|\"BF16\", \"max_tokens\": n, " \
  "\"layers\"?: n, \"ttl_s\"?: seconds}"

static int create_fields_of(const cJSON *root, attn_kv_shape *sh, double ttl_max, double *ttl,
                            attn_status *st) {
  int rc;
  if ((rc = get_int(root, "heads_kv", 1, 4096, 0, &sh->heads_kv, st)) ||
      (rc = get_int(root, "head_dim", 1, ATTN_MAX_HEAD_DIM, 0, &sh->head_dim, st)) ||
      (rc = get_int(root, "layers", 1, ATTN_KV_MAX_LAYERS, 1, &sh->layers, st)) ||
      (rc = get_int(root, "max_tokens", 1, (int64_t)1 << 30, 0, &sh->max_tokens, st)))
    return rc;
  const cJSON *dt = cJSON_GetObjectItemCaseSensitive(root, "dtype");
  if (!cJSON_IsString(dt) || attn_dtype_parse(dt->valuestring, &sh->dtype))
    return attn_status_set(st, ATTN_PROTO_EOPTVALUE,
                           "\"dtype\" must be \"F32\", \"F16\" or \"BF16\"");
  const cJSON *t = cJSON_GetObjectItemCaseSensitive(root, "ttl_s");
  *ttl = 600;
  if (t && !(cJSON_IsNumber(t) && t->valuedouble > 0 && t->valuedouble <= ttl_max))
    return attn_status_set(st, ATTN_PROTO_EOPTVALUE,
                           "\"ttl_s\" must be a number of seconds above 0 and at most %g "
                           "(--session-ttl-max)",
                           ttl_max);
  if (t)
    *ttl = t->valuedouble;
  else if (*ttl > ttl_max)
    *ttl = ttl_max;
  return 0;
}

int attn_proto_session_create_decode(const char *body, size_t len, double ttl_max,
                                     attn_kv_shape *sh, double *ttl_s, attn_status *st) {
  cJSON *root = parse_object(body, len, create_fields, NCREATE, CREATE_WHAT, st);
  if (!root)
    return st->code;
  memset(sh, 0, sizeof *sh);
  int rc = create_fields_of(root, sh, ttl_max, ttl_s, st);
  cJSON_Delete(root);
  return rc;
}

int attn_proto_session_truncate_decode(const char *body, size_t len, int64_t *length,
                                       attn_status *st) {
  static const field f[] = {{"length", true}};
  cJSON *root = parse_object(body, len, f, 1, "{\"length\": n}", st);
  if (!root)
    return st->code;
  int rc = get_int(root, "length", 0, (int64_t)1 << 30, 0, length, st);
  cJSON_Delete(root);
  return rc;
}

void attn_proto_session_info_json(attn_sbuf *b, const attn_kv_info *info, const int64_t *lengths,
                                  double now) {
  const attn_kv_shape *sh = &info->shape;
  attn_sbuf_puts(b, "{\"id\": ");
  attn_sbuf_json_str(b, info->id);
  attn_sbuf_printf(b,
                   ", \"heads_kv\": %lld, \"head_dim\": %lld, \"dtype\": \"%s\", \"layers\": %lld, "
                   "\"max_tokens\": %lld, \"ttl_s\": %.17g, \"lengths\": [",
                   (long long)sh->heads_kv, (long long)sh->head_dim, attn_dtype_name(sh->dtype),
                   (long long)sh->layers, (long long)sh->max_tokens, info->ttl_s);
  for (int64_t l = 0; lengths && l < sh->layers; l++)
    attn_sbuf_printf(b, "%s%lld", l ? ", " : "", (long long)lengths[l]);
  double left = info->expires - now;
  attn_sbuf_printf(b, "], \"tokens\": %lld, \"reserved_bytes\": %llu, \"expires_in_s\": %.3f}",
                   (long long)info->tokens, (unsigned long long)info->reserved_bytes,
                   left > 0 ? left : 0.0);
}
