/*
 * auth.h — the API keys: which routes stay open, how the Authorization
 * header is read, the set of keys a server accepts (each with a name: the
 * tenant its requests belong to), how a key file is read into it, and a
 * comparison whose time does not depend on where a guess goes wrong nor on
 * which key it matches.
 */
#ifndef ATTND_AUTH_H
#define ATTND_AUTH_H

#include <stdbool.h>
#include <stddef.h>

enum {
  ATTND_KEY_NAME_MAX = 63, /* a key's name: 1 to 63 of [A-Za-z0-9._-] */
  ATTND_KEY_MAX = 255,     /* a key: 1 to 255 visible ASCII characters */
  /* Keys a server holds at most: a fixed set, so the per-key metrics stay
   * bounded; more tenants than this want a proxy that authenticates. */
  ATTND_MAX_KEYS = 64,
};

typedef struct attnd_key {
  char name[ATTND_KEY_NAME_MAX + 1];
  char key[ATTND_KEY_MAX + 1]; /* never printed: not in logs, errors or /v1/info */
  size_t len;                  /* strlen(key) */
} attnd_key;

/* The keys a server accepts; n == 0: none (the server needs no key). */
typedef struct attnd_keys {
  attnd_key k[ATTND_MAX_KEYS];
  int n;
} attnd_keys;

/* Whether path is served without a key: the routes the table (routes.h)
 * marks open, such as the liveness and readiness probes, which
 * orchestrators call without credentials. */
bool attnd_auth_open(const char *path);

/* Whether a and b hold the same bytes. The time taken depends only on
 * b_len (pass the secret as b), never on the contents of either, nor on
 * where they first differ. */
bool attnd_auth_equal(const char *a, size_t a_len, const char *b, size_t b_len);

/* Whether an Authorization header value ("Bearer <key>", the scheme in any
 * case, NULL when absent) carries key. */
bool attnd_auth_check(const char *header, const char *key);

/* The index in ks of the key an Authorization header value carries, or -1
 * (no header, another scheme, no such key). Every key is compared, whole,
 * whichever matches: the time depends on the keys' lengths only. */
int attnd_auth_match(const char *header, const attnd_keys *ks);

/* Whether s is a key's name: 1 to ATTND_KEY_NAME_MAX of [A-Za-z0-9._-]. */
bool attnd_key_name_valid(const char *s, size_t n);
/* Whether s is a key a header can carry: 1 to ATTND_KEY_MAX visible ASCII
 * characters, no spaces. */
bool attnd_key_valid(const char *s, size_t n);

/* Adds key (n bytes) under name to ks. 0, or -1 with err (never showing
 * the key) saying why: a bad name or key, a name or key ks already holds
 * (dup_of: the index it has there), or no room. */
int attnd_keys_add(attnd_keys *ks, const char *name, const char *key, size_t n, int *dup_of,
                   char *err, size_t cap);

/*
 * Reads a key file's text (len bytes) into ks, emptied first. One key a
 * line, "key" or "name:key" (split at the first ':', so a key that holds
 * ':' needs a name); surrounding whitespace is trimmed, and blank lines and
 * lines starting with '#' are skipped. The n-th line without a name is
 * named "key<n>" (key1, key2, ... in file order, counting only those
 * lines). A bad name or key, a name or key given twice, more than
 * ATTND_MAX_KEYS keys or none at all is refused: -1 with err ("line 3:
 * ...", never showing a key). 0 when ks holds the file's keys.
 */
int attnd_keys_parse(attnd_keys *ks, const char *text, size_t len, char *err, size_t cap);

#endif
