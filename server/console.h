/*
 * console.h — the web console at GET / (server/console/): its files,
 * compiled into attnd, and the headers they are served with.
 *
 * The page holds no data, so it is served without the API key; the calls
 * it makes to the API carry the key the user typed. Its Content-Security-
 * Policy allows nothing but this server: no inline script or style, no
 * other origin, no framing.
 */
#ifndef ATTND_CONSOLE_H
#define ATTND_CONSOLE_H

#include <stdbool.h>
#include <stddef.h>

/* One file: the path it is served at, its Content-Type, its bytes and a
 * strong ETag (quoted) made from them. */
typedef struct attnd_console_asset {
  const char *path;
  const char *type;
  const unsigned char *data;
  size_t len;
  const char *etag;
} attnd_console_asset;

/* The table the build generates (server/console/embed.c). */
extern const attnd_console_asset attnd_console_assets[];
extern const int attnd_console_n_assets;

/* The asset served at path (exact match, no query), or NULL. */
const attnd_console_asset *attnd_console_find(const char *path);

/* Whether an If-None-Match header value (NULL when absent) names etag: a
 * list of entity tags, weak ones compared weakly as RFC 9110 13.1.2 says,
 * or "*". */
bool attnd_console_not_modified(const char *if_none_match, const char *etag);

/* The headers every console reply carries besides Content-Type and ETag,
 * as name/value pairs ending with a NULL name. */
typedef struct attnd_console_header {
  const char *name, *value;
} attnd_console_header;
extern const attnd_console_header attnd_console_headers[];

#endif
