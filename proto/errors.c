/*
 * errors.c — the error table of docs/design.md: every engine and wire-format
 * error code with its HTTP status and the stable "code" string of the JSON
 * error body. The server and the clients read it from here only.
 */
#include "proto.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct http_err {
  int status;
  const char *code;
} http_err;

/* Indexed by code (designated initializers), so reordering ATTN_ERRNO_MAP
 * cannot change a mapping; the assertion below fails the build when a code
 * is added there and not here, and lookup() refuses a hole. */
#define ENGINE_ERR(name) [ATTN_##name - ATTN__ERRNO_BASE - 1]
static const http_err engine_errs[] = {
    ENGINE_ERR(EINVAL) = {422, "invalid_request"},
    ENGINE_ERR(ESHAPE) = {422, "invalid_shape"},
    ENGINE_ERR(EHEADS) = {422, "invalid_heads"},
    ENGINE_ERR(EDTYPE) = {422, "invalid_dtype"},
    ENGINE_ERR(ESCALE) = {422, "invalid_scale"},
    ENGINE_ERR(EWINDOW) = {422, "invalid_window"},
    ENGINE_ERR(ENONFINITE) = {422, "non_finite"},
    ENGINE_ERR(EOVERFLOW) = {413, "too_large"},
    ENGINE_ERR(ERANGE) = {422, "out_of_range"},
    ENGINE_ERR(ETOOBIG) = {413, "too_large_for_backend"},
    ENGINE_ERR(ENOMEM) = {503, "out_of_memory"},
    ENGINE_ERR(EBACKEND) = {422, "unknown_backend"},
    ENGINE_ERR(EUNSUPPORTED) = {422, "unsupported"},
    /* a backend that cannot run now (no device, or one that failed): the
     * same answer as /readyz gives, and another server may have one */
    ENGINE_ERR(ENODEV) = {503, "backend_unavailable"},
    ENGINE_ERR(EDEVICE) = {500, "engine_failure"},
    ENGINE_ERR(ESHUTDOWN) = {503, "shutting_down"},
    ENGINE_ERR(ECANCELED) = {503, "canceled"},
    ENGINE_ERR(ESESSION_EXISTS) = {409, "session_exists"},
    ENGINE_ERR(ESESSION_NOT_FOUND) = {404, "session_not_found"},
    ENGINE_ERR(ESESSION_CONFLICT) = {409, "session_conflict"},
    ENGINE_ERR(ESESSION_FULL) = {422, "session_full"},
    /* 507 Insufficient Storage: retrying will not help until a session
     * goes, unlike a full queue's 503 */
    ENGINE_ERR(ESESSION_MEMORY) = {507, "session_memory_full"},
};
#undef ENGINE_ERR
_Static_assert(sizeof engine_errs / sizeof *engine_errs == ATTN__ERRNO_END - ATTN__ERRNO_BASE - 1,
               "engine_errs must list every code of ATTN_ERRNO_MAP");

#define PROTO_ERR(name, status, code, msg) {status, code},
static const http_err proto_errs[] = {ATTN_PROTO_ERRNO_MAP(PROTO_ERR)};

static const http_err *lookup(int code) {
  if (code > ATTN__ERRNO_BASE && code < ATTN__ERRNO_END)
    return engine_errs[code - ATTN__ERRNO_BASE - 1].code ? &engine_errs[code - ATTN__ERRNO_BASE - 1]
                                                         : NULL;
  if (code > ATTN_PROTO__ERRNO_BASE && code < ATTN_PROTO__ERRNO_END)
    return &proto_errs[code - ATTN_PROTO__ERRNO_BASE - 1];
  return NULL;
}

int attn_proto_http_status(int code) {
  if (code == 0)
    return 200;
  const http_err *e = lookup(code);
  return e ? e->status : 500;
}

const char *attn_proto_code_name(int code) {
  if (code == 0)
    return "ok";
  const http_err *e = lookup(code);
  return e ? e->code : "internal_error";
}

char *attn_proto_error_body(const char *code, const char *message, size_t *plen) {
  attn_sbuf b = {0};
  attn_sbuf_puts(&b, "{\"error\": {\"code\": ");
  attn_sbuf_json_str(&b, code);
  attn_sbuf_puts(&b, ", \"message\": ");
  attn_sbuf_json_strn(&b, message, strlen(message), ATTN_PROTO_MAX_MESSAGE);
  attn_sbuf_puts(&b, "}}\n");
  if (b.oom) {
    free(b.p);
    return NULL;
  }
  *plen = b.len;
  return b.p;
}

bool attn_proto_error_read(const char *body, size_t len, char *code, size_t ccap, char *msg,
                           size_t mcap) {
  cJSON *j = body ? cJSON_ParseWithLength(body, len) : NULL;
  const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "error");
  const cJSON *c = cJSON_GetObjectItemCaseSensitive(e, "code");
  const cJSON *m = cJSON_GetObjectItemCaseSensitive(e, "message");
  bool ok = cJSON_IsString(c) && cJSON_IsString(m);
  if (ok) {
    snprintf(code, ccap, "%s", c->valuestring);
    snprintf(msg, mcap, "%s", m->valuestring);
  }
  cJSON_Delete(j);
  return ok;
}
