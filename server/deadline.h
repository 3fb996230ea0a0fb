/*
 * deadline.h — the rule of --timeout and of hung-up clients, for every
 * admitted job (deadline.c), which the loop's one timer and its dispatch
 * both apply. Loop thread.
 */
#ifndef ATTND_DEADLINE_H
#define ATTND_DEADLINE_H

#include "request.h"

#include <stdint.h>

/* The loop looks for clients that reset their connection at least this
 * often while any job waits. */
#define ATTND_POLL_MS 100

/* Why r's job must end now: past its deadline (counted from its headers'
 * arrival) or its client gone, in that order; -1 to let it go on. */
int attnd_deadline_due(const attnd_server *s, attnd_req *r, double now);

/* Milliseconds until the earliest deadline of a job not yet answered, at
 * most ATTND_POLL_MS; -1 when no job waits. */
int64_t attnd_deadline_next(const attnd_server *s, double now);

#endif
