/*
 * bad_cases.h — the malformed-request table of the server tests: each entry
 * is one request (method, path, Content-Type, body) and the status and error
 * code docs/design.md and proto/README.md give it.
 */
#ifndef ATTND_TEST_BAD_CASES_H
#define ATTND_TEST_BAD_CASES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct bad_case {
  const char *name;
  const char *method; /* NULL: POST */
  const char *path;   /* NULL: /attention */
  const char *ctype;  /* NULL: no Content-Type header */
  bool st;            /* text is a safetensors header; the body is built */
  const char *text;   /* body text, or the safetensors header (NULL: no body) */
  size_t dlen;        /* safetensors: data bytes (filled with finite values) */
  uint64_t hlen;      /* safetensors: header length field, if not 0 */
  bool zero_hlen;     /* safetensors: header length field 0 */
  size_t cut;         /* bytes dropped from the end of the body */
  size_t poff;        /* patch: pbytes written at data offset poff */
  const char *pbytes;
  size_t plen;
  long status;
  const char *code;
  const char *allow; /* 405: a method the Allow header must list */
} bad_case;

extern const bad_case bad_cases[];
extern const size_t n_bad_cases;

/* The request body of a case, malloc'd (NULL when it has none). */
char *bad_body(const bad_case *c, size_t *plen);

#endif
