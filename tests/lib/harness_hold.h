/*
 * harness_hold.h — build/tests/attnd-hold, attnd whose backend=reference
 * jobs are held (tests/lib/hold_backend.c), and the gate that releases them:
 * how a test gets a job that is still running when it acts, whatever the
 * machine's speed.
 */
#ifndef ATTND_TEST_HARNESS_HOLD_H
#define ATTND_TEST_HARNESS_HOLD_H

/* $ATTND_HOLD_BIN, or tests/attnd-hold beside srv_bin(). A test sets
 * srv.bin to it before srv_start. */
const char *srv_hold_bin(void);

/* A release file for held jobs, not yet created, and the environment entry
 * that names it to the server (srv_startv's env). While it is absent, held
 * jobs keep their slots even once canceled; hold_release creates it. */
typedef struct hold_gate {
  char path[128];
  char env[160]; /* "ATTN_HOLD_RELEASE=<path>" */
} hold_gate;

void hold_gate_init(hold_gate *g);
void hold_release(const hold_gate *g);
/* Removes the file. */
void hold_gate_free(hold_gate *g);

struct srv;
/* Opens gate g and starts build/tests/attnd-hold with args (NULL-ended,
 * may be NULL), its held jobs waiting for g: the one start every gated
 * test makes. */
void srv_start_gated(struct srv *s, hold_gate *g, const char *const *args);

#endif
