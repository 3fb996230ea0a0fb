/*
 * errors.c — the error table of DESIGN.md: every engine and wire-format
 * error code with its HTTP status and the stable "code" string of the JSON
 * error body. The server and the clients read it from here only.
 */
#include "proto.h"

#include <stdlib.h>
#include <string.h>

typedef struct http_err {
  int status;
  const char *code;
} http_err;

/* In the order of ATTN_ERRNO_MAP (engine/engine.h); the assertion below
 * fails the build when the two drift apart. */
static const http_err engine_errs[] = {
    {422, "invalid_request"},       /* EINVAL */
    {422, "invalid_shape"},         /* ESHAPE */
    {422, "invalid_heads"},         /* EHEADS */
    {422, "invalid_dtype"},         /* EDTYPE */
    {422, "invalid_scale"},         /* ESCALE */
    {422, "invalid_window"},        /* EWINDOW */
    {422, "non_finite"},            /* ENONFINITE */
    {413, "too_large"},             /* EOVERFLOW */
    {422, "out_of_range"},          /* ERANGE */
    {413, "too_large_for_backend"}, /* ETOOBIG */
    {503, "out_of_memory"},         /* ENOMEM */
    {422, "unknown_backend"},       /* EBACKEND */
    {422, "unsupported"},           /* EUNSUPPORTED */
    {422, "backend_unavailable"},   /* ENODEV */
    {500, "engine_failure"},        /* EDEVICE */
    {503, "shutting_down"},         /* ESHUTDOWN */
    {503, "canceled"},              /* ECANCELED */
};
_Static_assert(sizeof engine_errs / sizeof *engine_errs ==
                   ATTN__ERRNO_END - ATTN__ERRNO_BASE - 1,
               "engine_errs must list every code of ATTN_ERRNO_MAP");

#define PROTO_ERR(name, status, code, msg) {status, code},
static const http_err proto_errs[] = {ATTN_PROTO_ERRNO_MAP(PROTO_ERR)};

static const http_err *lookup(int code) {
  if (code > ATTN__ERRNO_BASE && code < ATTN__ERRNO_END)
    return &engine_errs[code - ATTN__ERRNO_BASE - 1];
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
