/*
 * config_int.h — what attnd's configuration files (server/config*.c) share:
 * a row of the flag table, the values flags take, the session flags, and
 * the usage text.
 *
 * Internal to them; config.h is the module's header. The files call one
 * way: config.c (the table and the parse) uses config_usage.c,
 * config_session.c and config_value.c; config_session.c uses
 * config_value.c; config_value.c and config_usage.c use none of them.
 */
#ifndef ATTND_CONFIG_INT_H
#define ATTND_CONFIG_INT_H

#include "config.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef struct attnd__flag {
  const char *name; /* --name; its variable is ATTND_NAME */
  const char *arg;  /* what the usage calls its value */
  const char *def;  /* the default, applied like any value */
  const char *help; /* the usage text, before "(default) [variable]" */
  int (*apply)(attnd_config *c, const char *what, const char *value);
} attnd__flag;

/* Values (config_value.c): each returns 0, or -1 after one line on stderr
 * naming `what`; attnd__cfg_size_value alone prints nothing. */
int attnd__cfg_bad(const char *what, const char *value, const char *expect);
int attnd__cfg_int(const char *what, const char *s, long lo, long hi, int *out);
int attnd__cfg_seconds(const char *what, const char *s, double lo, double *out);
bool attnd__cfg_size_value(const char *s, uint64_t *out);
int attnd__cfg_size(const char *what, const char *s, uint64_t *out);
int attnd__cfg_listen(const char *what, const char *s, attnd_config *c);
int attnd__cfg_devices(const char *what, const char *s, attnd_config *c);
int attnd__cfg_path(char *out, size_t cap, const char *what, const char *v);

/* The session flags (config_session.c), appliers of the table's rows. */
int attnd__apply_session_memory(attnd_config *c, const char *what, const char *v);
int attnd__apply_session_dir(attnd_config *c, const char *what, const char *v);
int attnd__apply_session_page_bytes(attnd_config *c, const char *what, const char *v);
int attnd__apply_session_batch(attnd_config *c, const char *what, const char *v);
int attnd__apply_session_memory_per_key(attnd_config *c, const char *what, const char *v);
int attnd__apply_session_ttl_max(attnd_config *c, const char *what, const char *v);
int attnd__apply_handover(attnd_config *c, const char *what, const char *v);
int attnd__apply_handover_timeout(attnd_config *c, const char *what, const char *v);
/* --session-memory-per-key's percentage (or auto) as bytes, once every
 * flag is in. */
void attnd__resolve_per_key(attnd_config *c);

/* --help (config_usage.c): f's variable's name, and the usage of n flags. */
void attnd__flag_env(const attnd__flag *f, char *out, size_t cap);
void attnd__config_usage(FILE *out, const attnd__flag *flags, int n);

#endif
