/*
 * tiny.h — a job so small it is computed where its body was read (tiny.c):
 * on the HTTP thread, at the body's last byte, without the hops through
 * the loop, the threadpool and an engine worker, which cost a tiny job many
 * times its work (a 2 x 2 attention is nanoseconds). It still takes a place
 * of --max-queue and is held to --timeout, and its reply, log line and
 * metrics are those of a queued job.
 */
#ifndef ATTND_TINY_H
#define ATTND_TINY_H

#include "request.h"

/* Bodies at most this large are decoded here to see whether their job is
 * tiny; larger ones go to the queue undecoded. */
#define ATTND_TINY_BODY ((size_t)64 * 1024)
/* A tiny job: a forward pass of at most --tiny-flops FLOPs
 * (attn_request_flops; 1 MFLOP by default, tens of microseconds on one
 * core) on the CPU backend; for a session call, also one whose layers no
 * other call holds (kv.h, attn_kv_run_here). */

/* HTTP thread, r's body whole: true when r was computed here and has its
 * reply (or its error: a body that does not decode, a full queue); false
 * when it goes to the loop as before, possibly already decoded
 * (r->decoded). */
bool attnd_tiny_run(attnd_req *r);

#endif
