/*
 * config_session.c — attnd's session flags: the memory sessions may
 * reserve (in all and per API key), its page size, where they are saved, where they are
 * handed over at shutdown, batching, and the longest TTL.
 */
#include "config_int.h"
#include "kv/kv.h" /* the page sizes a session store takes */

#include <errno.h>
#include <fcntl.h> /* AT_FDCWD, AT_EACCESS */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A quarter of the machine's physical memory: room for the KV caches that
 * leaves the rest to request bodies, replies and the engine. (In a
 * container that is the host's memory, not the container's limit: give a
 * size there.) */
static int quarter_of_memory(const char *what, uint64_t *out) {
  errno = 0;
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) {
    fprintf(stderr, "attnd: %s: cannot tell this machine's memory (sysconf: %s): give a size\n",
            what, errno ? strerror(errno) : "no answer");
    return -1;
  }
  *out = (uint64_t)pages * (uint64_t)page / 4;
  return 0;
}

int attnd__apply_session_memory(attnd_config *c, const char *what, const char *v) {
  if (!strcmp(v, "auto"))
    return quarter_of_memory(what, &c->session_memory);
  c->session_memory = 0;
  if (!strcmp(v, "0") || attnd__cfg_size_value(v, &c->session_memory))
    return 0;
  return attnd__cfg_bad(
      what, v,
      "0 (no sessions), auto (a quarter of physical memory) or a size such as 512M or 64G "
      "(at most 1024G)");
}

int attnd__apply_session_page_bytes(attnd_config *c, const char *what, const char *v) {
  if (attnd__cfg_size_value(v, &c->session_page_bytes) &&
      attn_kv_page_bytes_ok(c->session_page_bytes))
    return 0;
  return attnd__cfg_bad(what, v, "16K, 32K or 64K (a power of two from 16K to 64K)");
}

/* Checked now, not at shutdown: a directory that cannot take the sessions
 * would lose them all when the server stops. */
int attnd__apply_session_dir(attnd_config *c, const char *what, const char *v) {
  struct stat st;
  c->session_dir[0] = 0;
  if (!*v) /* the default: none */
    return 0;
  if (attnd__cfg_path(c->session_dir, sizeof c->session_dir, what, v) < 0)
    return -1;
  const char *why = NULL;
  if (stat(v, &st) < 0)
    why = strerror(errno);
  else if (!S_ISDIR(st.st_mode))
    why = "not a directory";
  else if (faccessat(AT_FDCWD, v, W_OK | X_OK, AT_EACCESS) < 0)
    why = errno == EROFS ? "on a read-only file system" : "not writable by attnd";
  if (!why)
    return 0;
  fprintf(stderr,
          "attnd: %s: \"%s\": %s; it must be a directory attnd can write in (leave the flag out "
          "to keep sessions in memory only)\n",
          what, v, why);
  return -1;
}

int attnd__apply_session_batch(attnd_config *c, const char *what, const char *v) {
  if (strcmp(v, "on") && strcmp(v, "off"))
    return attnd__cfg_bad(what, v, "on or off");
  c->session_batch = !strcmp(v, "on");
  return 0;
}

/* What one API key's sessions may reserve: a size, a percentage of
 * --session-memory, 0 for no cap, or auto. The percentages are resolved
 * once every flag is in (resolve_per_key), since --session-memory and the
 * keys may come after this flag. */
int attnd__apply_session_memory_per_key(attnd_config *c, const char *what, const char *v) {
  size_t n = strlen(v);
  int pct;
  c->session_memory_per_key = 0;
  c->session_per_key_pct = 0;
  if (!strcmp(v, "auto"))
    c->session_per_key_pct = -1;
  else if (n > 1 && v[n - 1] == '%') {
    char num[8];
    if (n - 1 >= sizeof num)
      return attnd__cfg_bad(what, v, "a percentage from 1% to 100%");
    memcpy(num, v, n - 1);
    num[n - 1] = 0;
    if (attnd__cfg_int(what, num, 1, 100, &pct) < 0)
      return -1;
    c->session_per_key_pct = pct;
  } else if (strcmp(v, "0") && !attnd__cfg_size_value(v, &c->session_memory_per_key)) {
    return attnd__cfg_bad(
        what, v,
        "auto (half of --session-memory with two keys or more, else no cap), 0 (no cap), "
        "a percentage of --session-memory such as 25%, or a size such as 512M");
  }
  return 0;
}

/* auto: half of the session memory once two keys or more share it (one
 * key, or none, is one tenant: nobody to lock out). */
void attnd__resolve_per_key(attnd_config *c) {
  int pct = c->session_per_key_pct;
  if (pct < 0)
    pct = c->keys.n >= 2 ? 50 : 0;
  if (pct > 0)
    c->session_memory_per_key = c->session_memory * (uint64_t)pct / 100;
}

/* At least a second (a shorter TTL keeps nothing between two calls); a
 * year is past any cache a decode keeps. */
int attnd__apply_session_ttl_max(attnd_config *c, const char *what, const char *v) {
  char *end;
  errno = 0;
  double t = strtod(v, &end);
  if (!*v || *end || errno || !(t >= 1) || t > 31536000)
    return attnd__cfg_bad(what, v, "a number of seconds from 1 to 31536000 (a year)");
  c->session_ttl_max = t;
  return 0;
}

/* Checked now, not at shutdown: a URL the handover cannot use would be
 * found out only when the sessions are on their way out. */
int attnd__apply_handover(attnd_config *c, const char *what, const char *v) {
  attn_status st;
  c->handover[0] = 0;
  if (!*v) /* the default: none */
    return 0;
  const char *why = NULL;
  if (attn_url_parse(v, &c->handover_url, &st) < 0)
    why = st.message;
  else if (!strcmp(c->handover_url.scheme, "https"))
    why = "the handover speaks plain HTTP: give the inheritor's http:// address (the proxy's "
          "port inside the cluster)";
  else if (c->handover_url.has_query)
    why = "a query has no place in it: give the base URL that /v1/sessions/{id}/import is "
          "added to";
  else if (strlen(v) >= sizeof c->handover)
    why = "too long";
  if (why) {
    fprintf(stderr, "attnd: %s: \"%.160s\": %s\n", what, v, why);
    return -1;
  }
  size_t n = strlen(c->handover_url.path); /* "/base/" and "/base" are one place */
  while (n > 0 && c->handover_url.path[n - 1] == '/')
    c->handover_url.path[--n] = 0;
  snprintf(c->handover, sizeof c->handover, "%s", v);
  return 0;
}

/* Above 0 (a handover with no time cannot move anything); an hour is past
 * any grace period an orchestrator gives a stopping replica. */
int attnd__apply_handover_timeout(attnd_config *c, const char *what, const char *v) {
  if (attnd__cfg_seconds(what, v, 0, &c->handover_timeout) < 0)
    return -1;
  if (c->handover_timeout > 0 && c->handover_timeout <= 3600)
    return 0;
  return attnd__cfg_bad(what, v, "a number of seconds above 0, at most 3600");
}
