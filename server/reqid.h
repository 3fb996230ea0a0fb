/*
 * reqid.h — request ids: the client's X-Request-Id when it is one a log and
 * a header can carry safely, else one made here.
 *
 * A made id is 32 hex digits: a per-process random seed and a counter, mixed
 * (splitmix64), so ids are unique within a process, unlikely to repeat across
 * processes, and cost no system call. They are labels, not secrets.
 */
#ifndef ATTND_REQID_H
#define ATTND_REQID_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#define ATTND_REQID_HEADER "X-Request-Id"

/* The longest id accepted from a client; longer ones are replaced. */
#define ATTND_REQID_MAX 128

typedef struct attnd_reqid_gen {
  uint64_t seed;
  _Atomic uint64_t next;
} attnd_reqid_gen;

/* Seeds g from the system's random source (the clock when it has none). */
void attnd_reqid_init(attnd_reqid_gen *g);
/* A new id into out (33 bytes: 32 hex digits and a NUL). Thread-safe. */
void attnd_reqid_make(attnd_reqid_gen *g, char out[33]);
/* Whether a client's id is kept: 1 to ATTND_REQID_MAX visible ASCII
 * characters (no spaces, no quotes or backslashes, which logs would have
 * to escape). NULL is not. */
bool attnd_reqid_valid(const char *v);

#endif
