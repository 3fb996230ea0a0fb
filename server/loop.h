/*
 * loop.h — attnd's request loop on libuv, the main thread (loop.c):
 * admission, the bounded queue and its fair shares, dispatch to the
 * engine, completion, deadlines, signals and the drain.
 */
#ifndef ATTND_LOOP_H
#define ATTND_LOOP_H

#include "request.h"

/* 0, or -1 after one line to stderr. */
int attnd_loop_init(attnd_server *s);
/* From the HTTP thread: hand a complete computing request to the loop. */
void attnd_loop_submit(attnd_server *s, attnd_req *r);
/* Runs until a drain completes. */
void attnd_loop_run(attnd_server *s);
void attnd_loop_close(attnd_server *s);
/* Answers an admitted job now (504 timeout, 503 shutting_down, or for a
 * client that reset, no reply) and cancels its engine work; the job's end
 * is still awaited. Loop only. */
void attnd_loop_cancel(attnd_server *s, attnd_req *r, attnd_cancel_reason why);

#endif
