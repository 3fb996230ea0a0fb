/*
 * v2.h — the Open Inference Protocol's GET answers (v2.c), the handlers of
 * their rows in the route table (routes.h). HTTP thread. Its POST .../infer
 * computes like POST /attention, with proto/v2.c as its codec.
 */
#ifndef ATTND_V2_H
#define ATTND_V2_H

#include "request.h"

void attnd_v2_server(attnd_req *r);      /* GET /v2 */
void attnd_v2_live(attnd_req *r);        /* GET /v2/health/live */
void attnd_v2_ready(attnd_req *r);       /* GET /v2/health/ready */
void attnd_v2_model(attnd_req *r);       /* GET /v2/models/{model}[/versions/1] */
void attnd_v2_model_ready(attnd_req *r); /* GET .../ready */
void attnd_v2_config(attnd_req *r);      /* GET .../config */

#endif
