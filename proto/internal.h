/*
 * internal.h — helpers the codecs of proto/ share; not part of the
 * contract (proto.h is).
 */
#ifndef ATTN_PROTO_INTERNAL_H
#define ATTN_PROTO_INTERNAL_H

#include "engine.h"

#include <stdbool.h>
#include <stddef.h>

struct cJSON;

/* Client bytes s[0..len) for a message: non-printing bytes, quotes and
 * backslashes as \xNN, cut with "..." to fit cap. Returns dst. */
const char *attn__quote(char *dst, size_t cap, const char *s, size_t len);

/* Length of the well-formed UTF-8 sequence of 2 to 4 bytes at s (n bytes
 * left), or 0 when there is none: an ASCII byte, a stray continuation byte,
 * a cut sequence, an overlong form, a surrogate or a code point past
 * U+10FFFF (RFC 3629). */
size_t attn__utf8_len(const unsigned char *s, size_t n);

/* "an object", "a string", ... for messages about a JSON value's type. */
const char *attn__json_type(const struct cJSON *j);

/* Calls fn for each name=value pair of a URL query string, both
 * percent-decoded and NUL-terminated; has_value is false for a bare "name".
 * Stops at, and returns, the first error fn returns. */
typedef int (*attn__query_fn)(void *ctx, const char *name, size_t nlen, const char *value,
                              size_t vlen, bool has_value, attn_status *st);
int attn__query_each(const char *query, attn__query_fn fn, void *ctx, attn_status *st);

#endif
