/*
 * internal.h — helpers the codecs of proto/ share; not part of the
 * contract (proto.h is).
 */
#ifndef ATTN_PROTO_INTERNAL_H
#define ATTN_PROTO_INTERNAL_H

#include <stddef.h>

struct cJSON;

/* Client bytes s[0..len) for a message: non-printing bytes, quotes and
 * backslashes as \xNN, cut with "..." to fit cap. Returns dst. */
const char *attn__quote(char *dst, size_t cap, const char *s, size_t len);

/* "an object", "a string", ... for messages about a JSON value's type. */
const char *attn__json_type(const struct cJSON *j);

#endif
