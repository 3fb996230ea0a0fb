/*
 * errors.c — the server's error list (errors.h) as tables, and one lookup
 * over it and the engine's and codecs' lists (proto/errors.c).
 */
#include "errors.h"
#include "proto.h"

#include <stddef.h>

#define ATTND_ERRNO_ROW(name, status, reason, code, refusal) \
  [ATTND_E##name - ATTND__ERRNO_BASE - 1] = {status, reason, code, refusal},
static const attnd_refusal errs[] = {ATTND_ERRNO_MAP(ATTND_ERRNO_ROW)};
#undef ATTND_ERRNO_ROW

enum { N_ERRS = sizeof errs / sizeof *errs };

static const attnd_refusal *own(int code) {
  return code > ATTND__ERRNO_BASE && code < ATTND__ERRNO_END ? &errs[code - ATTND__ERRNO_BASE - 1]
                                                             : NULL;
}

int attnd_err_status(int code) {
  const attnd_refusal *e = own(code);
  return e ? e->status : attn_proto_http_status(code);
}

const char *attnd_err_code(int code) {
  const attnd_refusal *e = own(code);
  return e ? e->code : attn_proto_code_name(code);
}

const attnd_refusal *attnd_err_refusal(int status) {
  for (size_t i = 0; i < N_ERRS; i++)
    if (errs[i].status == status && errs[i].message)
      return &errs[i];
  return own(ATTND_EINTERNAL);
}

const char *attnd_err_reason(int status) {
  for (size_t i = 0; i < N_ERRS; i++)
    if (errs[i].status == status)
      return errs[i].reason;
  return "Error";
}
