/*
 * session_meta.c — the small JSON documents of the session routes: a
 * create's parameters, a truncate's length, a fork's, a session's
 * description.
 */
#include "internal.h"
#include "proto.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DTYPE_WANT "\"dtype\" must be \"F32\", \"F16\" or \"BF16\""
/* ttl_s at least a second, as --session-ttl-max is: a shorter one would
 * end before the session's next call (or its create's reply, the sweep
 * running every tenth of a second). */
#define TTL_MIN 1.0

typedef struct field {
  const char *name;
  bool required;
} field;

static const field create_fields[] = {
    {"heads_kv", true}, {"head_dim", true}, {"dtype", true},       {"max_tokens", true},
    {"layers", false},  {"ttl_s", false},   {"head_dim_v", false}, {"v_from_k", false},
    {"reserve", false}, {"kv_dtype", false}};
#define NCREATE (sizeof create_fields / sizeof *create_fields)

/* Whether the JSON string opening at s[i] holds a NUL, raw or escaped
 * (\u0000); *end gets the index past it. cJSON keeps such a string cut at
 * the NUL: "F32\u0000x" would read as "F32", "ttl_s\u0000x" as ttl_s. */
static bool string_has_nul(const char *s, size_t n, size_t i, size_t *end) {
  bool nul = false;
  for (i++; i < n && s[i] != '"'; i++) {
    if (s[i] == 0)
      nul = true;
    else if (s[i] == '\\' && i + 1 < n)
      nul |= s[++i] == 'u' && i + 4 < n && !memcmp(s + i + 1, "0000", 4);
  }
  *end = i + 1;
  return nul;
}

/* The first string of body that holds a NUL: 0 when none, else 1 for a
 * member's name and 2 for a value, then with the name of the member it is
 * the value of (as written, up to cap - 1 bytes) in key. */
static int nul_string(const char *body, size_t len, char *key, size_t cap) {
  key[0] = 0;
  for (size_t i = 0, end; i < len; i++) {
    if (body[i] != '"')
      continue;
    bool nul = string_has_nul(body, len, i, &end);
    size_t j = end;
    while (j < len && strchr(" \t\r\n", body[j]) && body[j])
      j++;
    bool is_key = j < len && body[j] == ':';
    if (nul)
      return is_key ? 1 : 2;
    if (is_key)
      snprintf(key, cap, "%.*s", (int)(end - i - 2 < cap ? end - i - 2 : cap - 1), body + i + 1);
    i = end - 1;
  }
  return 0;
}

/* A body none of whose strings holds a NUL; 0, or st: a name with one is
 * no field's (EOPTION), a dtype with one no dtype (ATTN_EDTYPE, as
 * create_fields_of refuses the others), another value out of range. */
static int check_nul(const char *body, size_t len, const char *what, attn_status *st) {
  char key[16];
  int where = nul_string(body, len, key, sizeof key);
  if (where == 0)
    return 0;
  if (where == 1)
    return attn_status_set(st, ATTN_PROTO_EOPTION,
                           "a field name holds a NUL (\\u0000), which no field's does: send %s",
                           what);
  if (!strcmp(key, "dtype"))
    return attn_status_set(st, ATTN_EDTYPE, "\"dtype\" holds a NUL (\\u0000): %s", DTYPE_WANT);
  return attn_status_set(st, ATTN_PROTO_EOPTVALUE,
                         "a string in the body holds a NUL (\\u0000), which no field takes: "
                         "send %s",
                         what);
}

/* The object of body, each member one of names; NULL with st set. */
/* root's members: each one of names, none twice, the required ones all
 * there; 0 or the refusal. */
static int fields_check(const cJSON *root, const field *names, size_t n, const char *what,
                        attn_status *st) {
  for (const cJSON *c = root->child; c; c = c->next) {
    size_t i = 0;
    while (i < n && strcmp(c->string, names[i].name))
      i++;
    int twice = 0;
    for (const cJSON *p = root->child; p != c; p = p->next)
      twice |= !strcmp(p->string, c->string);
    if (i == n || twice)
      return attn_status_set(st, twice ? ATTN_PROTO_EJSON : ATTN_PROTO_EOPTION,
                             twice ? "the key \"%.40s\" appears twice"
                                   : "unknown field \"%.40s\": send %s",
                             c->string, what);
  }
  for (size_t i = 0; i < n; i++)
    if (names[i].required && !cJSON_GetObjectItemCaseSensitive(root, names[i].name))
      return attn_status_set(st, ATTN_PROTO_EOPTVALUE, "field \"%s\" is missing: send %s",
                             names[i].name, what);
  return 0;
}

static cJSON *parse_object(const char *body, size_t len, const field *names, size_t n,
                           const char *what, attn_status *st) {
  if (len == 0) {
    attn_status_set(st, ATTN_PROTO_EEMPTY, "the request has no body: send %s", what);
    return NULL;
  }
  /* cJSON stops after the first value: what follows must be white space
   * ({"length": 5} {"length": 9} is no one object) */
  const char *end = NULL;
  cJSON *root = cJSON_ParseWithLengthOpts(body, len, &end, false);
  while (root && end < body + len && strchr(" \t\r\n", *end) && *end)
    end++;
  if (!root || !cJSON_IsObject(root) || end != body + len) {
    attn_status_set(st, ATTN_PROTO_EJSON, "the body is not one JSON object: send %s", what);
    cJSON_Delete(root);
    return NULL;
  }
  if (fields_check(root, names, n, what, st) || check_nul(body, len, what, st)) {
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
  "\"layers\"?: n, \"ttl_s\"?: seconds, \"head_dim_v\"?: n, \"v_from_k\"?: n, "                 \
  "\"reserve\"?: \"whole\"|\"grow\", \"kv_dtype\"?: \"F8_E4M3\"|\"I8\"|dtype}"

/* How the rows are stored: "kv_dtype" F8_E4M3 or I8 (quantized), or the
 * dtype's own name, the default (not quantized). */
static int kv_dtype_of(const cJSON *root, attn_kv_shape *sh, attn_status *st) {
  const cJSON *q = cJSON_GetObjectItemCaseSensitive(root, "kv_dtype");
  sh->kv_quant = ATTN_KVQ_NONE;
  if (!q || (cJSON_IsString(q) && !strcmp(q->valuestring, attn_dtype_name(sh->dtype))))
    return 0;
  if (cJSON_IsString(q) && attn_kv_quant_parse(q->valuestring, &sh->kv_quant) == 0)
    return 0;
  return attn_status_set(st, ATTN_PROTO_EOPTVALUE,
                         "\"kv_dtype\" must be \"F8_E4M3\" or \"I8\" (rows stored quantized, a "
                         "scale a row) or \"%s\" (the dtype: not quantized, the default)",
                         attn_dtype_name(sh->dtype));
}

/* The values' head dim: head_dim_v (default head_dim) or, for a latent
 * session, v_from_k, which is at most head_dim (v is the first v_from_k
 * columns of each k row); both given, they must agree. */
static int value_dims_of(const cJSON *root, attn_kv_shape *sh, attn_status *st) {
  int64_t dv, latent;
  int rc;
  if ((rc = get_int(root, "head_dim_v", 1, ATTN_MAX_HEAD_DIM_V, 0, &dv, st)) ||
      (rc = get_int(root, "v_from_k", 1, ATTN_MAX_HEAD_DIM_V, 0, &latent, st)))
    return rc;
  if (latent > sh->head_dim)
    return attn_status_set(st, ATTN_PROTO_EOPTVALUE,
                           "\"v_from_k\" %lld is more than \"head_dim\" %lld: a latent session's v "
                           "is the first v_from_k columns of each k row",
                           (long long)latent, (long long)sh->head_dim);
  if (latent && dv && dv != latent)
    return attn_status_set(st, ATTN_PROTO_EOPTVALUE,
                           "\"head_dim_v\" %lld and \"v_from_k\" %lld differ: a latent session's "
                           "values are v_from_k wide (send one of them, or both equal)",
                           (long long)dv, (long long)latent);
  if (!latent && !dv && sh->head_dim > ATTN_MAX_HEAD_DIM_V)
    return attn_status_set(st, ATTN_PROTO_EOPTVALUE,
                           "\"head_dim\" %lld makes v as wide, past the %d a value head dim may "
                           "have: send \"head_dim_v\" (1 to %d), or \"v_from_k\" for a latent "
                           "session",
                           (long long)sh->head_dim, ATTN_MAX_HEAD_DIM_V, ATTN_MAX_HEAD_DIM_V);
  /* 0 when it is head_dim, as attn_kv_shape has it, so that a create
   * naming head_dim_v equal to head_dim is one that does not */
  sh->v_from_k = latent > 0;
  sh->head_dim_v = latent ? latent : dv == sh->head_dim ? 0 : dv;
  return 0;
}

/* "ttl_s" into *ttl when there is one, from TTL_MIN to ttl_max. */
static int get_ttl(const cJSON *root, double ttl_max, double *ttl, attn_status *st) {
  const cJSON *t = cJSON_GetObjectItemCaseSensitive(root, "ttl_s");
  if (t && !(cJSON_IsNumber(t) && t->valuedouble >= TTL_MIN && t->valuedouble <= ttl_max))
    return attn_status_set(st, ATTN_PROTO_EOPTVALUE,
                           "\"ttl_s\" must be a number of seconds from %g to %g "
                           "(--session-ttl-max)",
                           TTL_MIN, ttl_max);
  if (t)
    *ttl = t->valuedouble;
  return 0;
}

static int create_fields_of(const cJSON *root, attn_kv_shape *sh, double ttl_max, double *ttl,
                            attn_status *st) {
  int rc;
  if ((rc = get_int(root, "heads_kv", 1, 4096, 0, &sh->heads_kv, st)) ||
      (rc = get_int(root, "head_dim", 1, ATTN_MAX_HEAD_DIM, 0, &sh->head_dim, st)) ||
      (rc = get_int(root, "layers", 1, ATTN_KV_MAX_LAYERS, 1, &sh->layers, st)) ||
      (rc = get_int(root, "max_tokens", 1, (int64_t)1 << 30, 0, &sh->max_tokens, st)) ||
      (rc = value_dims_of(root, sh, st)))
    return rc;
  const cJSON *dt = cJSON_GetObjectItemCaseSensitive(root, "dtype");
  if (!cJSON_IsString(dt) || attn_dtype_parse(dt->valuestring, &sh->dtype))
    return attn_status_set(st, ATTN_EDTYPE, "%s", DTYPE_WANT);
  const cJSON *rs = cJSON_GetObjectItemCaseSensitive(root, "reserve");
  if (rs && !(cJSON_IsString(rs) &&
              (!strcmp(rs->valuestring, "whole") || !strcmp(rs->valuestring, "grow"))))
    return attn_status_set(st, ATTN_PROTO_EOPTVALUE,
                           "\"reserve\" must be \"whole\" (pages for all of max_tokens at create, "
                           "the default) or \"grow\" (pages as tokens arrive)");
  sh->grow = rs && !strcmp(rs->valuestring, "grow");
  if ((rc = kv_dtype_of(root, sh, st)))
    return rc;
  *ttl = 600 < ttl_max ? 600 : ttl_max;
  return get_ttl(root, ttl_max, ttl, st);
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

#define FORK_WHAT "{\"id\": \"new id\", \"length\"?: n, \"ttl_s\"?: seconds}"

int attn_proto_session_fork_decode(const char *body, size_t len, double ttl_max,
                                   char new_id[ATTN_KV_ID_MAX + 1], int64_t *length, double *ttl_s,
                                   attn_status *st) {
  static const field f[] = {{"id", true}, {"length", false}, {"ttl_s", false}};
  cJSON *root = parse_object(body, len, f, 3, FORK_WHAT, st);
  if (!root)
    return st->code;
  const cJSON *id = cJSON_GetObjectItemCaseSensitive(root, "id");
  *ttl_s = 0;
  int rc = cJSON_IsString(id) ? attn_kv_id_check(id->valuestring, strlen(id->valuestring), st)
                              : attn_status_set(st, ATTN_PROTO_EOPTVALUE,
                                                "\"id\" must be the new session's id, a string: "
                                                "send %s",
                                                FORK_WHAT);
  if (rc == 0)
    snprintf(new_id, ATTN_KV_ID_MAX + 1, "%s", id->valuestring);
  if (rc == 0)
    rc = get_int(root, "length", 0, (int64_t)1 << 30, -1, length, st);
  if (rc == 0)
    rc = get_ttl(root, ttl_max, ttl_s, st);
  cJSON_Delete(root);
  return rc;
}

void attn_proto_session_info_json(attn_sbuf *b, const attn_kv_info *info, const int64_t *lengths,
                                  double now) {
  const attn_kv_shape *sh = &info->shape;
  attn_sbuf_puts(b, "{\"id\": ");
  attn_sbuf_json_str(b, info->id);
  attn_sbuf_printf(b,
                   ", \"heads_kv\": %lld, \"head_dim\": %lld, \"dtype\": \"%s\", \"kv_dtype\": "
                   "\"%s\", \"layers\": %lld, \"max_tokens\": %lld, \"ttl_s\": %.17g, "
                   "\"head_dim_v\": %lld, ",
                   (long long)sh->heads_kv, (long long)sh->head_dim, attn_dtype_name(sh->dtype),
                   attn_kv_shape_kv_dtype(sh), (long long)sh->layers, (long long)sh->max_tokens,
                   info->ttl_s, (long long)attn_kv_shape_dv(sh));
  if (sh->v_from_k)
    attn_sbuf_printf(b, "\"v_from_k\": %lld, ", (long long)attn_kv_shape_dv(sh));
  attn_sbuf_puts(b, "\"lengths\": [");
  for (int64_t l = 0; lengths && l < sh->layers; l++)
    attn_sbuf_printf(b, "%s%lld", l ? ", " : "", (long long)lengths[l]);
  double left = info->expires - now;
  attn_sbuf_printf(b,
                   "], \"tokens\": %lld, \"reserve\": \"%s\", \"reserved_bytes\": %llu, "
                   "\"used_bytes\": %llu, \"shared_bytes\": %llu, \"expires_in_s\": %.3f}",
                   (long long)info->tokens, sh->grow ? "grow" : "whole",
                   (unsigned long long)info->reserved_bytes, (unsigned long long)info->used_bytes,
                   (unsigned long long)info->shared_bytes, left > 0 ? left : 0.0);
}

/* A session file's __metadata__: the create's fields and "lengths", each a
 * string (safetensors' metadata holds only strings). */
static const field file_fields[] = {{"heads_kv", true},   {"head_dim", true},  {"dtype", true},
                                    {"max_tokens", true}, {"layers", true},    {"ttl_s", true},
                                    {"head_dim_v", true}, {"v_from_k", false}, {"lengths", true},
                                    {"format", false},    {"reserve", false},  {"kv_dtype", false}};
#define NFILE (sizeof file_fields / sizeof *file_fields)
#define FILE_WHAT                                                                             \
  "__metadata__ {\"heads_kv\", \"head_dim\", \"head_dim_v\", \"v_from_k\"?, \"dtype\", "      \
  "\"layers\", \"max_tokens\", \"ttl_s\", \"reserve\"?, \"kv_dtype\"?, \"lengths\"}, each a " \
  "string "                                                                                   \
  "(\"lengths\": \"[n, ...]\")"

/* The metadata as the create's JSON object: each number's string made a
 * number (all of it one JSON number, or it stays a string and is refused
 * as the create refuses one); NULL out of memory. */
static cJSON *meta_as_create(const cJSON *meta) {
  cJSON *o = cJSON_CreateObject();
  for (const cJSON *c = meta->child; o && c; c = c->next) {
    if (!strcmp(c->string, "lengths") || !strcmp(c->string, "format"))
      continue;
    const char *v = c->valuestring;
    char *end = NULL;
    double x =
        strcmp(c->string, "dtype") && strcmp(c->string, "kv_dtype") && *v && !strchr(" \t\r\n", *v)
            ? strtod(v, &end)
            : 0;
    cJSON *item = end && !*end ? cJSON_CreateNumber(x) : cJSON_CreateString(v);
    if (!item || !cJSON_AddItemToObject(o, c->string, item)) {
      cJSON_Delete(item);
      cJSON_Delete(o);
      return NULL;
    }
  }
  return o;
}

/* "lengths": a JSON array of layers integers, each 0 to max_tokens. */
static int lengths_of(const char *text, const attn_kv_shape *sh, int64_t *lengths,
                      attn_status *st) {
  cJSON *a = cJSON_Parse(text);
  int64_t n = cJSON_IsArray(a) ? cJSON_GetArraySize(a) : -1;
  int rc = n == sh->layers ? 0
                           : attn_status_set(st, ATTN_PROTO_EOPTVALUE,
                                             "__metadata__ \"lengths\" must be a JSON array of "
                                             "%lld integers (one a layer)",
                                             (long long)sh->layers);
  int64_t l = 0;
  for (const cJSON *c = a ? a->child : NULL; rc == 0 && c; c = c->next, l++) {
    double x = cJSON_IsNumber(c) ? c->valuedouble : NAN;
    if (!(x >= 0 && x <= (double)sh->max_tokens && x == floor(x)))
      rc = attn_status_set(st, ATTN_PROTO_EOPTVALUE,
                           "__metadata__ \"lengths\"[%lld] must be an integer from 0 to "
                           "max_tokens (%lld)",
                           (long long)l, (long long)sh->max_tokens);
    else
      lengths[l] = (int64_t)x;
  }
  cJSON_Delete(a);
  return rc;
}

int attn_proto_session_meta_decode(const cJSON *meta, double ttl_max, attn_kv_shape *sh,
                                   double *ttl_s, int64_t *lengths, attn_status *st) {
  if (!cJSON_IsObject(meta))
    return attn_status_set(st, ATTN_PROTO_EOPTVALUE, "the file has no %s", FILE_WHAT);
  for (const cJSON *c = meta->child; c; c = c->next)
    if (!cJSON_IsString(c))
      return attn_status_set(st, ATTN_PROTO_EOPTVALUE, "__metadata__ \"%.40s\" must be a string",
                             c->string);
  int rc = fields_check(meta, file_fields, NFILE, FILE_WHAT, st);
  if (rc)
    return rc;
  cJSON *root = meta_as_create(meta);
  if (!root)
    return attn_status_set(st, ATTN_PROTO_ENOMEM, "out of memory reading a session file");
  memset(sh, 0, sizeof *sh);
  rc = create_fields_of(root, sh, ttl_max, ttl_s, st);
  cJSON_Delete(root);
  if (rc == 0 && sh->head_dim_v == 0)
    sh->head_dim_v = sh->head_dim;
  return rc ? rc
            : lengths_of(cJSON_GetObjectItemCaseSensitive(meta, "lengths")->valuestring, sh,
                         lengths, st);
}
