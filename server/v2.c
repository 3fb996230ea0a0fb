/*
 * v2.c — the Open Inference Protocol's GET answers (KServe v2, as Triton
 * serves them), so that tritonclient and perf_analyzer work against attnd
 * unchanged. Which path is which route is the route table's (routes.c);
 * the documents themselves (metadata, configuration, replies, errors) are
 * the codec's (proto/v2.c): this file only answers with them.
 */
#include "v2.h"

#include <stdio.h>

void attnd_v2_server(attnd_req *r) {
  attn_sbuf b = {0};
  attn_proto_v2_server_metadata(&b);
  attnd_req_reply_json(r, 200, &b);
}

void attnd_v2_live(attnd_req *r) {
  attn_sbuf b = {0};
  attn_sbuf_puts(&b, "{\"live\": true}\n");
  attnd_req_reply_json(r, 200, &b);
}

void attnd_v2_model(attnd_req *r) {
  attn_sbuf b = {0};
  attn_proto_v2_model_metadata(&b, r->v2_model);
  attnd_req_reply_json(r, 200, &b);
}

void attnd_v2_config(attnd_req *r) {
  attn_sbuf b = {0};
  attn_proto_v2_model_config(&b, r->v2_model);
  attnd_req_reply_json(r, 200, &b);
}

/* {"ready": true} (with the model's name for one model), or the error of
 * /readyz (503). */
static void answer_ready(attnd_req *r, bool model) {
  char why[200];
  int code = attnd_server_ready(r->srv, why, sizeof why);
  if (code) {
    attnd_req_fail(r, code, why);
    return;
  }
  attn_sbuf b = {0};
  if (model) {
    attn_sbuf_puts(&b, "{\"name\": ");
    attn_sbuf_json_str(&b, attn_proto_v2_model_name(r->v2_model));
    attn_sbuf_puts(&b, ", \"ready\": true}\n");
  } else {
    attn_sbuf_puts(&b, "{\"ready\": true}\n");
  }
  attnd_req_reply_json(r, 200, &b);
}

void attnd_v2_ready(attnd_req *r) { answer_ready(r, false); }

void attnd_v2_model_ready(attnd_req *r) { answer_ready(r, true); }
