/*
 * session_http.c — the HTTP side of session.h: one libcurl handle a
 * thread, the session routes' methods (PUT, GET, DELETE, POST), the
 * X-Session-Length header, error bodies and GET's JSON.
 */
#include "args.h"
#include "session.h"
#include "url.h"

#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static size_t on_body(char *data, size_t size, size_t nmemb, void *arg) {
  tool_sess_reply *r = arg;
  size_t n = size * nmemb;
  attn_sbuf_put(&r->body, data, n);
  return r->body.oom ? 0 : n; /* 0: curl fails the transfer */
}

static size_t on_header(char *data, size_t size, size_t nmemb, void *arg) {
  tool_sess_reply *r = arg;
  size_t n = size * nmemb;
  static const char name[] = "X-Session-Length:";
  if (n > sizeof name && strncasecmp(data, name, sizeof name - 1) == 0) {
    char tmp[32];
    size_t k = n - (sizeof name - 1);
    snprintf(tmp, sizeof tmp, "%.*s", (int)(k < 31 ? k : 31), data + sizeof name - 1);
    char *end;
    long long v = strtoll(tmp, &end, 10);
    if (end != tmp && v >= 0)
      r->length = v;
  }
  return n;
}

static struct curl_slist *headers(const char *type, const char *key) {
  char line[600];
  snprintf(line, sizeof line, "Content-Type: %s", type);
  struct curl_slist *h = curl_slist_append(NULL, line);
  snprintf(line, sizeof line, "Accept: %s", type);
  h = h ? curl_slist_append(h, line) : NULL;
  if (h && key) {
    snprintf(line, sizeof line, "Authorization: Bearer %.500s", key);
    h = curl_slist_append(h, line);
  }
  return h ? curl_slist_append(h, "Expect:") : NULL;
}

static int base_url(tool_sess_http *c, const char *url) {
  attn_status st;
  if (attn_url_base(url, &st) != 0) {
    fprintf(stderr, "%s: %s\n", c->me, st.message);
    return 2;
  }
  size_t n = strlen(url);
  while (n > 0 && url[n - 1] == '/')
    n--;
  if (n >= sizeof c->base - 256) {
    fprintf(stderr, "%s: the URL is too long\n", c->me);
    return 2;
  }
  snprintf(c->base, sizeof c->base, "%.*s", (int)n, url);
  return 0;
}

int tool_sess_http_init(tool_sess_http *c, const char *url, double timeout, const char *me) {
  memset(c, 0, sizeof *c);
  c->me = me;
  c->timeout = timeout;
  int rc = base_url(c, url);
  bool bad_key;
  const char *key = tool_arg_api_key(me, &bad_key);
  if (rc != 0 || bad_key)
    return 2;
  c->curl = curl_easy_init();
  c->hdr_json = headers("application/json", key);
  c->hdr_binary = headers("application/octet-stream", key);
  if (!c->curl || !c->hdr_json || !c->hdr_binary) {
    fprintf(stderr, "%s: cannot initialize libcurl\n", me);
    tool_sess_http_free(c);
    return 1;
  }
  return 0;
}

void tool_sess_http_free(tool_sess_http *c) {
  if (c->curl)
    curl_easy_cleanup(c->curl);
  curl_slist_free_all(c->hdr_json);
  curl_slist_free_all(c->hdr_binary);
  c->curl = c->hdr_json = c->hdr_binary = NULL;
}

/* The method and body on the handle, which keeps the last call's. */
static void set_method(CURL *h, const char *method, const void *body, size_t len) {
  if (body) {
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
  } else {
    curl_easy_setopt(h, CURLOPT_HTTPGET, 1L);
  }
  bool plain = strcmp(method, body ? "POST" : "GET") == 0;
  curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, plain ? NULL : method);
}

static void set_reply(CURL *h, tool_sess_reply *r) {
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, r);
  curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(h, CURLOPT_HEADERDATA, r);
}

int tool_sess_call(tool_sess_http *c, const char *method, const char *path, const void *body,
                   size_t len, bool binary, tool_sess_reply *r) {
  CURL *h = c->curl;
  char url[4096], err[CURL_ERROR_SIZE] = "";
  snprintf(url, sizeof url, "%s%s", c->base, path);
  memset(r, 0, sizeof *r);
  r->length = -1;
  curl_easy_setopt(h, CURLOPT_URL, url);
  set_method(h, method, body, len);
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, binary ? c->hdr_binary : c->hdr_json);
  set_reply(h, r);
  curl_easy_setopt(h, CURLOPT_ERRORBUFFER, err);
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_USERAGENT, "attn-session/" ATTN_VERSION);
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)(c->timeout * 1e3));
  CURLcode cc = curl_easy_perform(h);
  curl_easy_setopt(h, CURLOPT_ERRORBUFFER, NULL);
  if (cc != CURLE_OK) {
    fprintf(stderr, "%s: %s %s: %s\n", c->me, method, url, *err ? err : curl_easy_strerror(cc));
    return 1;
  }
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &r->status);
  curl_off_t us = 0;
  curl_easy_getinfo(h, CURLINFO_TOTAL_TIME_T, &us);
  r->seconds = (double)us * 1e-6;
  return 0;
}

void tool_sess_reply_free(tool_sess_reply *r) {
  free(r->body.p);
  r->body = (attn_sbuf){0};
}

void tool_sess_print_error(const char *me, const tool_sess_reply *r) {
  char code[64], msg[ATTN_PROTO_MAX_MESSAGE + 1];
  if (attn_proto_error_read(r->body.p, r->body.len, code, sizeof code, msg, sizeof msg))
    fprintf(stderr, "%s: HTTP %ld %s: %s\n", me, r->status, code, msg);
  else
    fprintf(stderr, "%s: HTTP %ld (no attnd error body)\n", me, r->status);
}

bool tool_sess_id_ok(const char *id) {
  size_t n = strlen(id);
  if (n < 1 || n > 128 || id[0] == '_' || id[0] == '.')
    return false;
  for (size_t i = 0; i < n; i++) {
    char ch = id[i];
    bool ok = (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') ||
              ch == '.' || ch == '_' || ch == '-';
    if (!ok)
      return false;
  }
  return true;
}

static bool int_field(const cJSON *j, const char *name, int64_t *out) {
  const cJSON *x = cJSON_GetObjectItemCaseSensitive(j, name);
  if (!cJSON_IsNumber(x))
    return false;
  *out = (int64_t)x->valuedouble;
  return true;
}

static int parse_lengths(const cJSON *j, tool_sess_info *info) {
  const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, "lengths");
  if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) != info->layers)
    return -1;
  info->lengths = calloc((size_t)info->layers, sizeof *info->lengths);
  if (!info->lengths)
    return -1;
  int i = 0;
  const cJSON *x;
  cJSON_ArrayForEach(x, a) info->lengths[i++] = cJSON_IsNumber(x) ? (int64_t)x->valuedouble : -1;
  return 0;
}

int tool_sess_info_parse(const char *json, size_t len, tool_sess_info *info) {
  memset(info, 0, sizeof *info);
  cJSON *j = cJSON_ParseWithLength(json, len);
  const cJSON *dt = cJSON_GetObjectItemCaseSensitive(j, "dtype");
  const cJSON *ttl = cJSON_GetObjectItemCaseSensitive(j, "ttl_s");
  const cJSON *exp = cJSON_GetObjectItemCaseSensitive(j, "expires_in_s");
  int rc = -1;
  if (int_field(j, "heads_kv", &info->heads_kv) && int_field(j, "head_dim", &info->head_dim) &&
      int_field(j, "layers", &info->layers) && int_field(j, "max_tokens", &info->max_tokens) &&
      cJSON_IsString(dt) && attn_dtype_parse(dt->valuestring, &info->dtype) == 0 &&
      info->layers >= 1 && info->layers <= ATTN_KV_MAX_LAYERS)
    rc = parse_lengths(j, info);
  int64_t latent = 0;
  info->v_from_k = int_field(j, "v_from_k", &latent) && latent > 0;
  if (!int_field(j, "head_dim_v", &info->head_dim_v) || info->head_dim_v < 1)
    info->head_dim_v = info->v_from_k ? latent : info->head_dim;
  int_field(j, "reserved_bytes", &info->reserved_bytes);
  int_field(j, "shared_bytes", &info->shared_bytes);
  const cJSON *rs = cJSON_GetObjectItemCaseSensitive(j, "reserve");
  info->grow = cJSON_IsString(rs) && !strcmp(rs->valuestring, "grow");
  const cJSON *kq = cJSON_GetObjectItemCaseSensitive(j, "kv_dtype");
  if (!cJSON_IsString(kq) || attn_kv_quant_parse(kq->valuestring, &info->kv_quant))
    info->kv_quant = ATTN_KVQ_NONE; /* the dtype's name, or a server that predates it */
  info->ttl_s = cJSON_IsNumber(ttl) ? ttl->valuedouble : -1;
  info->expires_in_s = cJSON_IsNumber(exp) ? exp->valuedouble : -1;
  cJSON_Delete(j);
  return rc;
}

void tool_sess_info_free(tool_sess_info *info) {
  free(info->lengths);
  info->lengths = NULL;
}
