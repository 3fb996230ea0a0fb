/*
 * harness_prom.h — the server's /metrics read and waited on: how tests see
 * that a job is queued or running, a connection counted, a listener closed.
 */
#ifndef ATTND_TEST_HARNESS_PROM_H
#define ATTND_TEST_HARNESS_PROM_H

#include "harness_proc.h"

#include <stdbool.h>

/* Sum of the samples named name whose labels include every "key=value" of
 * labels (NULL-terminated, may be NULL); *n (optional) gets how many
 * samples matched. */
double prom_sum(const char *text, const char *name, const char *const *labels, int *n);

/* Tests wait for what they need (a gauge, a closed socket, an exit) within a
 * generous deadline and never assert how long it took: the machine may be
 * loaded (make test must pass beside CPU hogs). Durations belong in
 * tests/bench/. */

/* A metric from GET /metrics, summed over the series matching labels (as
 * prom_sum); -1 when /metrics did not answer. */
double srv_metric(const srv *s, const char *name, const char *const *labels);
/* Poll until the metric is >= (ge) or <= (le) want; false after timeout_s. */
bool srv_wait_metric_ge(const srv *s, const char *name, const char *const *labels, double want,
                        double timeout_s);
bool srv_wait_metric_le(const srv *s, const char *name, const char *const *labels, double want,
                        double timeout_s);
/* The metric once it reaches want (or after 60 s), for a check that it is
 * exactly want: a request is counted when it ends, which with several HTTP
 * threads may come after its reply reached the client and after another
 * thread answered a GET /metrics. */
double srv_metric_reach(const srv *s, const char *name, const char *const *labels, double want);
/* attnd_queue_depth + attnd_inflight, or -1. */
int srv_jobs(const srv *s);
/* Poll until srv_jobs is >= want (at_least) or <= want; false after timeout_s. */
bool srv_wait_jobs(const srv *s, int want, bool at_least, double timeout_s);
/* Poll until a connect to s->port fails (a drain has closed the listener). */
bool srv_wait_listener_closed(const srv *s, double timeout_s);

#endif
