/*
 * inflate.h — request bodies sent with Content-Encoding: gzip or deflate,
 * decoded with zlib under a bound on the decoded size, so that a small body
 * that inflates to gigabytes (a zip bomb) costs at most the bound.
 */
#ifndef ATTND_INFLATE_H
#define ATTND_INFLATE_H

#include <stdbool.h>
#include <stddef.h>

typedef enum attnd_encoding {
  ATTND_ENC_IDENTITY, /* no header, or "identity" */
  ATTND_ENC_GZIP,     /* "gzip" or "x-gzip" (RFC 1952; members may be concatenated) */
  ATTND_ENC_DEFLATE,  /* "deflate": zlib format (RFC 1950), or raw deflate as some clients send */
  ATTND_ENC_UNKNOWN   /* anything else, or a list of codings */
} attnd_encoding;

/* The coding a Content-Encoding value names (NULL: identity). */
attnd_encoding attnd_encoding_of(const char *header);

/* Asked before the decoded buffer grows by `more` bytes (a memory budget);
 * false stops decoding. */
typedef bool (*attnd_inflate_grow)(void *ctx, size_t more);

/*
 * Decodes in[0, n) into *out (malloc'd, owned by the caller) and *out_len,
 * never holding more than max decoded bytes. Returns 0, or an error code of
 * errors.h with a message in msg: ATTND_ETOO_LARGE (decoded size past max),
 * ATTND_EBAD_REQUEST (not valid data of that coding, or truncated),
 * ATTND_EQUEUE_FULL (grow said no), ATTND_EOUT_OF_MEMORY.
 */
int attnd_inflate(attnd_encoding enc, const char *in, size_t n, size_t max, attnd_inflate_grow grow,
                  void *ctx, char **out, size_t *out_len, char *msg, size_t cap);

#endif
