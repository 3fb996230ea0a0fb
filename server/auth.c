/*
 * auth.c — the API keys (auth.h): the check of a request's header against
 * every key, and the key file's parser.
 */
#include "auth.h"
#include "routes.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

bool attnd_auth_open(const char *path) {
  const attnd_route *route = attnd_route_find(path, NULL, NULL);
  return route && route->open;
}

bool attnd_auth_equal(const char *a, size_t a_len, const char *b, size_t b_len) {
  /* Every byte of b is visited whatever a holds; a shorter a is read as
   * zeros past its end, and the length difference is folded in last. */
  volatile unsigned char diff = 0;
  for (size_t i = 0; i < b_len; i++) {
    unsigned char x = i < a_len ? (unsigned char)a[i] : 0;
    diff |= (unsigned char)(x ^ (unsigned char)b[i]);
  }
  return (diff | (a_len != b_len)) == 0;
}

/* The token of "Bearer <token>" (the scheme in any case, blanks around the
 * token dropped); false when the header is absent or of another scheme.
 * Where this stops early depends on the header's form only, never on a
 * key. */
static bool bearer_token(const char *header, const char **tok, size_t *len) {
  static const char scheme[] = "Bearer";
  if (!header)
    return false;
  while (*header == ' ' || *header == '\t')
    header++;
  if (strncasecmp(header, scheme, sizeof scheme - 1) != 0)
    return false;
  const char *p = header + sizeof scheme - 1;
  if (*p != ' ' && *p != '\t')
    return false;
  while (*p == ' ' || *p == '\t')
    p++;
  size_t n = strlen(p);
  while (n > 0 && (p[n - 1] == ' ' || p[n - 1] == '\t'))
    n--;
  *tok = p;
  *len = n;
  return true;
}

bool attnd_auth_check(const char *header, const char *key) {
  const char *tok;
  size_t n;
  return bearer_token(header, &tok, &n) && attnd_auth_equal(tok, n, key, strlen(key));
}

int attnd_auth_match(const char *header, const attnd_keys *ks) {
  const char *tok;
  size_t n;
  if (!bearer_token(header, &tok, &n))
    return -1;
  /* No early exit and no branch on a result: which key matched (if any)
   * is folded in by a mask, so the time is the sum over every key. Keys
   * are distinct, so at most one matches. */
  unsigned hit = 0;
  for (int i = 0; i < ks->n; i++) {
    unsigned mask = 0u - (unsigned)attnd_auth_equal(tok, n, ks->k[i].key, ks->k[i].len);
    hit = (hit & ~mask) | ((unsigned)(i + 1) & mask);
  }
  return (int)hit - 1;
}

bool attnd_key_name_valid(const char *s, size_t n) {
  bool ok = n > 0 && n <= ATTND_KEY_NAME_MAX;
  for (size_t i = 0; ok && i < n; i++)
    ok = isalnum((unsigned char)s[i]) || s[i] == '.' || s[i] == '_' || s[i] == '-';
  return ok;
}

bool attnd_key_valid(const char *s, size_t n) {
  bool ok = n > 0 && n <= ATTND_KEY_MAX;
  for (size_t i = 0; ok && i < n; i++)
    ok = s[i] > 0x20 && s[i] < 0x7f;
  return ok;
}

/* Which of ks's keys has this name or this key already, or -1; *by_key
 * says which of the two. Start-up only: no need for constant time. */
static int duplicate(const attnd_keys *ks, const char *name, const char *key, size_t n,
                     bool *by_key) {
  for (int i = 0; i < ks->n; i++) {
    *by_key = ks->k[i].len == n && !memcmp(ks->k[i].key, key, n);
    if (*by_key || !strcmp(ks->k[i].name, name))
      return i;
  }
  return -1;
}

int attnd_keys_add(attnd_keys *ks, const char *name, const char *key, size_t n, int *dup_of,
                   char *err, size_t cap) {
  bool by_key = false;
  *dup_of = -1;
  if (!attnd_key_name_valid(name, strlen(name)))
    snprintf(err, cap, "the name is not 1 to %d of A-Z a-z 0-9 . _ -", ATTND_KEY_NAME_MAX);
  else if (!attnd_key_valid(key, n))
    snprintf(err, cap,
             "the key is not 1 to %d visible ASCII characters without spaces (the key is not "
             "shown)",
             ATTND_KEY_MAX);
  else if ((*dup_of = duplicate(ks, name, key, n, &by_key)) >= 0 && by_key)
    snprintf(err, cap, "the key named \"%s\" is the same as the key named \"%s\"", name,
             ks->k[*dup_of].name);
  else if (*dup_of >= 0)
    snprintf(err, cap, "the name \"%s\" is given twice", name);
  else if (ks->n >= ATTND_MAX_KEYS)
    snprintf(err, cap, "more than %d keys", ATTND_MAX_KEYS);
  else {
    attnd_key *k = &ks->k[ks->n++];
    snprintf(k->name, sizeof k->name, "%s", name);
    memcpy(k->key, key, n);
    k->key[n] = 0;
    k->len = n;
    return 0;
  }
  return -1;
}

/* ---- the key file --------------------------------------------------------- */

static void trim(const char **p, const char **e) {
  while (*p < *e && isspace((unsigned char)**p))
    (*p)++;
  while (*e > *p && isspace((unsigned char)(*e)[-1]))
    (*e)--;
}

/* One line of a key file, [p, e), number `line`; lines[i] is the line key i
 * came from, *unnamed counts the lines without a name so far. */
static int parse_line(attnd_keys *ks, const char *p, const char *e, int line, int *lines,
                      int *unnamed, char *err, size_t cap) {
  trim(&p, &e);
  if (p == e || *p == '#')
    return 0;
  char name[ATTND_KEY_NAME_MAX + 1], why[256];
  const char *colon = memchr(p, ':', (size_t)(e - p)), *key = colon ? colon + 1 : p, *ne = colon;
  if (colon) {
    trim(&p, &ne);
    /* not shown: what stands before the ':' may be part of a key */
    if (!attnd_key_name_valid(p, (size_t)(ne - p))) {
      snprintf(err, cap,
               "line %d: the name before ':' is not 1 to %d of A-Z a-z 0-9 . _ - (it is not "
               "shown, in case it is part of a key: a key that holds ':' needs a name)",
               line, ATTND_KEY_NAME_MAX);
      return -1;
    }
    memcpy(name, p, (size_t)(ne - p));
    name[ne - p] = 0;
    trim(&key, &e);
  } else {
    snprintf(name, sizeof name, "key%d", ++*unnamed);
  }
  int dup;
  if (attnd_keys_add(ks, name, key, (size_t)(e - key), &dup, why, sizeof why) == 0) {
    lines[ks->n - 1] = line;
    return 0;
  }
  if (dup < 0) {
    snprintf(err, cap, "line %d: %s", line, why);
    return -1;
  }
  /* a made name can meet a name given on another line: naming this key
   * resolves it */
  bool made = !colon && !strcmp(ks->k[dup].name, name);
  snprintf(err, cap, "line %d: %s, first on line %d%s", line, why, lines[dup],
           made ? " (key1, key2... are the names of the lines without one: name this key)" : "");
  return -1;
}

int attnd_keys_parse(attnd_keys *ks, const char *text, size_t len, char *err, size_t cap) {
  int lines[ATTND_MAX_KEYS], unnamed = 0, line = 0;
  ks->n = 0;
  if (memchr(text, 0, len)) {
    snprintf(err, cap, "it holds a NUL byte: give the keys as text, one a line");
    return -1;
  }
  for (const char *p = text, *end = text + len; p < end;) {
    const char *nl = memchr(p, '\n', (size_t)(end - p)), *e = nl ? nl : end;
    if (parse_line(ks, p, e, ++line, lines, &unnamed, err, cap) < 0)
      return -1;
    p = nl ? nl + 1 : end;
  }
  if (ks->n == 0) {
    snprintf(err, cap,
             "it holds no key (only blank lines and comments): give one a line, as "
             "KEY or NAME:KEY");
    return -1;
  }
  return 0;
}
