/*
 * v2.c — the Open Inference Protocol's routes (KServe v2, as Triton serves
 * them), so that tritonclient and perf_analyzer work against attnd
 * unchanged.
 *
 * Routing and the cheap GET answers run on the HTTP thread like the other
 * GET endpoints; POST .../infer is computed exactly as POST /attention is
 * (the same body budget, queue, deadlines and engine), with proto/v2.c as
 * its codec. The documents themselves (metadata, configuration, replies,
 * errors) are the codec's: this file only decides which one a path gets.
 *
 *   /v2                                  server metadata
 *   /v2/health/live, /v2/health/ready    as /healthz and /readyz
 *   /v2/models/{model}[/versions/1]      model metadata
 *     .../ready, .../config, .../infer   readiness, Triton's config, inference
 */
#include "server.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The part of p up to the next '/' (or its end): its length. */
static size_t segment(const char *p) { return strcspn(p, "/"); }

static bool seg_is(const char *p, size_t n, const char *want) {
  return n == strlen(want) && !memcmp(p, want, n);
}

/* What follows the model (and its version): "", "/ready", "/config" or
 * "/infer". */
static attnd_route model_route(const char *rest) {
  if (!*rest)
    return ATTND_R_V2_MODEL;
  if (!strcmp(rest, "/ready"))
    return ATTND_R_V2_MODEL_READY;
  if (!strcmp(rest, "/config"))
    return ATTND_R_V2_CONFIG;
  if (!strcmp(rest, "/infer"))
    return ATTND_R_V2_INFER;
  return ATTND_R_NONE;
}

/* /v2/models/{model}[/versions/{version}]{rest}: the model's index (-1 for
 * none such), whether the version is one there is ("1", or none given), and
 * the rest. */
static const char *split_model(const char *p, int *model, bool *version_ok) {
  size_t n = segment(p);
  *model = attn_proto_v2_model(p, n);
  *version_ok = true;
  p += n;
  if (!strncmp(p, "/versions/", 10)) {
    size_t v = segment(p + 10);
    *version_ok = seg_is(p + 10, v, "1");
    p += 10 + v;
  }
  return p;
}

bool attnd_v2_route(attnd_req *r, const char *path) {
  if (strncmp(path, "/v2", 3) || (path[3] && path[3] != '/'))
    return false;
  r->v2 = true;
  r->v2_model = -1;
  r->v2_json_len = SIZE_MAX;
  r->route = ATTND_R_NONE;
  if (!strcmp(path, "/v2"))
    r->route = ATTND_R_V2_SERVER;
  else if (!strcmp(path, "/v2/health/live"))
    r->route = ATTND_R_V2_LIVE;
  else if (!strcmp(path, "/v2/health/ready"))
    r->route = ATTND_R_V2_READY;
  else if (!strncmp(path, "/v2/models/", 11)) {
    bool version_ok;
    int model;
    const char *rest = split_model(path + 11, &model, &version_ok);
    attnd_route route = model_route(rest);
    if (model >= 0 && version_ok && route != ATTND_R_NONE) {
      r->route = route;
      r->v2_model = model;
      /* the metrics' and the log line's model label */
      snprintf(r->model, sizeof r->model, "%s", attn_proto_v2_model_name(model));
    }
  }
  return true;
}

void attnd_v2_not_found(attnd_req *r) {
  char msg[400], what[96];
  const char *p = r->path + 11;
  int model = -1;
  bool version_ok = true;
  if (!strncmp(r->path, "/v2/models/", 11)) {
    split_model(p, &model, &version_ok);
    attn_quote(what, sizeof what, p, segment(p));
  }
  if (!strncmp(r->path, "/v2/models/", 11) && model < 0)
    snprintf(msg, sizeof msg,
             "unknown model \"%s\" (models: attention, attention_fp16, attention_bf16)", what);
  else if (model >= 0 && !version_ok)
    snprintf(msg, sizeof msg, "model \"%s\" has only version 1", what);
  else {
    attn_quote(what, sizeof what, r->path, strlen(r->path));
    snprintf(msg, sizeof msg,
             "no such path \"%s\" (the inference protocol here: GET /v2, /v2/health/live, "
             "/v2/health/ready, /v2/models/{model}[/versions/1][/ready|/config], POST "
             "/v2/models/{model}[/versions/1]/infer)",
             what);
  }
  attnd_req_fail(r, ATTND_ENOT_FOUND, msg);
}

static void reply_doc(attnd_req *r, attn_sbuf *b) {
  if (b->oom) {
    free(b->p);
    attnd_req_fail(r, ATTND_EOUT_OF_MEMORY, "out of memory building the reply");
    return;
  }
  attnd_req_reply(r, 200, b->p, b->len, ATTND_JSON_TYPE);
}

/* GET /v2/health/ready and .../ready: {"ready": true}, or the error of
 * /readyz (503). */
static void answer_ready(attnd_req *r, attn_sbuf *b) {
  char why[200];
  int code = attnd_server_ready(r->srv, why, sizeof why);
  if (code) {
    attnd_req_fail(r, code, why);
    return;
  }
  if (r->route == ATTND_R_V2_MODEL_READY) {
    attn_sbuf_puts(b, "{\"name\": ");
    attn_sbuf_json_str(b, attn_proto_v2_model_name(r->v2_model));
    attn_sbuf_puts(b, ", \"ready\": true}\n");
  } else {
    attn_sbuf_puts(b, "{\"ready\": true}\n");
  }
  reply_doc(r, b);
}

void attnd_v2_answer_get(attnd_req *r) {
  attn_sbuf b = {0};
  switch (r->route) {
  case ATTND_R_V2_SERVER: attn_proto_v2_server_metadata(&b); break;
  case ATTND_R_V2_LIVE: attn_sbuf_puts(&b, "{\"live\": true}\n"); break;
  case ATTND_R_V2_MODEL: attn_proto_v2_model_metadata(&b, r->v2_model); break;
  case ATTND_R_V2_CONFIG: attn_proto_v2_model_config(&b, r->v2_model); break;
  case ATTND_R_V2_READY:
  case ATTND_R_V2_MODEL_READY: answer_ready(r, &b); return;
  default: return;
  }
  reply_doc(r, &b);
}
