/*
 * v1.h — attnd's own GET endpoints (v1.c), the handlers of their rows in
 * the route table (routes.h). HTTP thread.
 */
#ifndef ATTND_V1_H
#define ATTND_V1_H

#include "request.h"

void attnd_v1_healthz(attnd_req *r); /* GET /healthz */
void attnd_v1_readyz(attnd_req *r);  /* GET /readyz */
void attnd_v1_metrics(attnd_req *r); /* GET /metrics */
void attnd_v1_info(attnd_req *r);    /* GET /v1/info */
void attnd_v1_plan(attnd_req *r);    /* GET /attention/plan */
/* A console file (r->asset), or 304 when the browser holds these bytes
 * already. */
void attnd_v1_console(attnd_req *r);

#endif
