/*
 * jobs.h — the loop's records of the jobs it admitted (jobs.c): the queue
 * in arrival order, the list of every admitted job (which the deadlines
 * look at), and each client's share of the running slots. Loop thread,
 * except attnd_jobs_push, which the handoffs use under s->mu.
 */
#ifndef ATTND_JOBS_H
#define ATTND_JOBS_H

#include "request.h"

/* A client address with jobs admitted: its share of the running slots. */
typedef struct attnd_client {
  char addr[48];
  int jobs;    /* admitted and not ended; the record is freed at 0 */
  int running; /* of those, dispatched and not ended */
  struct attnd_client *next;
} attnd_client;

/* addr's record with one more job, made for its first; NULL when out of
 * memory. */
attnd_client *attnd_jobs_client_get(attnd_server *s, const char *addr);
/* r's job has ended (run, or dropped from the queue): its client has one
 * job fewer, and no record once it has none. */
void attnd_jobs_client_put(attnd_server *s, attnd_req *r);

/* The job a free slot goes to: the oldest queued job of the client running
 * the fewest jobs, among clients under their cap; NULL when every queued
 * job's client is at its cap. */
attnd_req *attnd_jobs_next(const attnd_server *s);

/* Appends r to a list of requests (a handoff, or the queue). */
void attnd_jobs_push(attnd_req **head, attnd_req **tail, attnd_req *r);
/* Takes r out of the queue (a no-op when it is not there). */
void attnd_jobs_unqueue(attnd_server *s, attnd_req *r);

/* r joins, or leaves, the list of every admitted job. */
void attnd_jobs_add(attnd_server *s, attnd_req *r);
void attnd_jobs_remove(attnd_server *s, attnd_req *r);

/* Any thread: one of --max-queue's places taken for r (the loop's jobs
 * and tiny ones share them; s->admitted, given back with s->admitted--);
 * false with r's 503 set. */
bool attnd_jobs_take_place(attnd_req *r);

#endif
