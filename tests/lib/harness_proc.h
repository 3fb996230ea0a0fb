/*
 * harness_proc.h — the server under test as a child process: started on a
 * free port with its stdout and stderr in files, waited for, stopped,
 * killed with the test process whatever ends it.
 *
 * The server binary is $ATTND_BIN (default build/attnd). $ATTND_START_TIMEOUT
 * (seconds, default 10) bounds the wait for /healthz after a start. The
 * server gets none of the test's ATTND_* variables but ATTND_HTTP_THREADS,
 * so that a whole suite can run with several HTTP threads.
 */
#ifndef ATTND_TEST_HARNESS_PROC_H
#define ATTND_TEST_HARNESS_PROC_H

#include <stdbool.h>
#include <sys/types.h>

typedef struct srv {
  pid_t pid; /* 0 once reaped */
  int port;
  char log[128];   /* file holding the server's stderr */
  char out[128];   /* file holding its stdout */
  char url[64];    /* http://127.0.0.1:PORT */
  int status;      /* exit status once reaped: code, or 128 + signal */
  const char *bin; /* the binary to start; NULL: srv_bin() (see harness_hold.h) */
} srv;

/* $ATTND_BIN or build/attnd. */
const char *srv_bin(void);

/* A port nobody listens on now (bind 127.0.0.1:0, getsockname, close). */
int free_port(void);

/* Starts attnd --listen 127.0.0.1:PORT plus the NULL-terminated flags, waits
 * until GET /healthz answers 200 and cr_asserts that it does. */
void srv_start(srv *s, ...);
/* The same with an argument vector and extra environment ("NAME=value"
 * strings; either may be NULL). With listen false no --listen is passed (the
 * test sets ATTND_LISTEN itself, with s->port from free_port()). */
void srv_startv(srv *s, const char *const *args, const char *const *env, bool listen);
/* Spawns without waiting for health; returns the pid. */
pid_t srv_spawn(srv *s, const char *const *args, const char *const *env, bool listen);

/* SIGTERM, then waits up to timeout_s for the exit; returns the status
 * (exit code, 128 + signal), or -1 when it had to be killed. */
int srv_stop(srv *s, double timeout_s);
/* Waits up to timeout_s for an exit; -1 when still running. */
int srv_wait(srv *s, double timeout_s);
/* SIGKILL and reap. */
void srv_kill(srv *s);
/* Teardown: srv_kill, then removes the log files (kept when $ATTND_KEEP_LOGS
 * is set). */
void srv_cleanup(srv *s);
bool srv_running(srv *s);
/* The server's stderr so far, malloc'd. */
char *srv_log(const srv *s);
/* Waits up to timeout_s for needle in the server's stderr (a line may be
 * written just after the event a test saw); whether it came. */
bool srv_wait_log(const srv *s, const char *needle, double timeout_s);

/* Runs attnd with args to completion (at most timeout_s, then kills it).
 * Returns the exit status (-1: killed on timeout); *out and *err (optional)
 * receive stdout and stderr, malloc'd. */
int run_attnd(const char *const *args, const char *const *env, double timeout_s, char **out,
              char **err);

/* Kills every server this process started (also registered with atexit). */
void srv_kill_all(void);

#endif
