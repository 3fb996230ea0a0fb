/*
 * auth.h — the API key check: which routes stay open, how the
 * Authorization header is read, and a comparison whose time does not depend
 * on where a guess goes wrong.
 */
#ifndef ATTND_AUTH_H
#define ATTND_AUTH_H

#include <stdbool.h>
#include <stddef.h>

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

#endif
