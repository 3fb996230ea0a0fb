/*
 * jobs.c — the loop's records of the jobs it admitted (jobs.h): the queue,
 * the list of every admitted job, and each client's share of the running
 * slots.
 */
#include "jobs.h"
#include "errors.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- fair shares: the running slots among client addresses ---------------- */

/* addr's record with one more job, made for its first; NULL when out of
 * memory. A client has a record only while it has jobs admitted, so there
 * are at most --max-queue: few enough that a list searched in order beats
 * a table. */
attnd_client *attnd_jobs_client_get(attnd_server *s, const char *addr) {
  attnd_client *c = s->clients;
  while (c && strcmp(c->addr, addr))
    c = c->next;
  if (!c) {
    if (!(c = calloc(1, sizeof *c)))
      return NULL;
    snprintf(c->addr, sizeof c->addr, "%s", addr);
    c->next = s->clients;
    s->clients = c;
  }
  c->jobs++;
  return c;
}

/* r's job has ended (run, or dropped from the queue): its client has one
 * job fewer, and no record once it has none. */
void attnd_jobs_client_put(attnd_server *s, attnd_req *r) {
  attnd_client *c = r->who, **pp = &s->clients;
  r->who = NULL;
  if (--c->jobs > 0)
    return;
  while (*pp != c)
    pp = &(*pp)->next;
  *pp = c->next;
  free(c);
}

/* The job a free slot goes to: the oldest queued job of the client running
 * the fewest jobs, among clients under their cap; NULL when every queued
 * job's client is at its cap. Those jobs keep their place in the queue and
 * their deadlines (deadline.c looks at every admitted job). */
attnd_req *attnd_jobs_next(const attnd_server *s) {
  attnd_req *best = NULL;
  for (attnd_req *r = s->pend_head; r; r = r->next) {
    int n = r->who->running;
    if (n >= s->client_cap || (best && n >= best->who->running))
      continue;
    best = r;
    if (n == 0) /* no client runs fewer */
      break;
  }
  return best;
}

/* ---- the list of every admitted job, queued or running ------------------------ */

void attnd_jobs_add(attnd_server *s, attnd_req *r) {
  r->act_prev = NULL;
  r->act_next = s->act_head;
  if (s->act_head)
    s->act_head->act_prev = r;
  s->act_head = r;
}

void attnd_jobs_remove(attnd_server *s, attnd_req *r) {
  if (r->act_prev)
    r->act_prev->act_next = r->act_next;
  else
    s->act_head = r->act_next;
  if (r->act_next)
    r->act_next->act_prev = r->act_prev;
  r->act_prev = r->act_next = NULL;
}

/* Appends r to a list of requests (the handoffs under s->mu, or the
 * loop's own pending queue). */
void attnd_jobs_push(attnd_req **head, attnd_req **tail, attnd_req *r) {
  r->next = NULL;
  if (*tail)
    (*tail)->next = r;
  else
    *head = r;
  *tail = r;
}

void attnd_jobs_unqueue(attnd_server *s, attnd_req *r) {
  attnd_req **pp = &s->pend_head, *prev = NULL;
  while (*pp && *pp != r) {
    prev = *pp;
    pp = &(*pp)->next;
  }
  if (!*pp)
    return;
  *pp = r->next;
  if (s->pend_tail == r)
    s->pend_tail = prev;
  attnd_metrics_gauge_add(s->metrics, ATTND_GAUGE_QUEUE_DEPTH, -1);
}

bool attnd_jobs_take_place(attnd_req *r) {
  attnd_server *s = r->srv;
  int had = atomic_fetch_add(&s->admitted, 1);
  if (had < s->cfg->max_queue)
    return true;
  s->admitted--;
  char msg[160];
  snprintf(msg, sizeof msg,
           "the queue is full (%d requests admitted, --max-queue %d); retry shortly", had,
           s->cfg->max_queue);
  attnd_req_fail(r, ATTND_EQUEUE_FULL, msg);
  return false;
}
