/*
 * infer_report.c — what `attn infer` prints: where the time went, bytes
 * and throughput each way, GFLOP/s served, or an error reply on one line.
 */
#include "infer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* "1.23 MB" style sizes for people; exact bytes stay in the parentheses. */
static const char *human_bytes(double b, char *buf, size_t cap) {
  if (b < 1e3)
    snprintf(buf, cap, "%.0f B", b);
  else if (b < 1e6)
    snprintf(buf, cap, "%.2f kB", b * 1e-3);
  else if (b < 1e9)
    snprintf(buf, cap, "%.2f MB", b * 1e-6);
  else
    snprintf(buf, cap, "%.2f GB", b * 1e-9);
  return buf;
}

static void print_problem(const tool_infer_args *a, const attn_proto_req *pr, const char *fmt_name,
                          size_t up) {
  const attn_request *r = &pr->req;
  char hb[32];
  printf("problem   B=%lld Hq=%lld Hkv=%lld Nq=%lld Nkv=%lld D=%lld %s", (long long)r->batch,
         (long long)r->heads_q, (long long)r->heads_kv, (long long)r->seq_q, (long long)r->seq_kv,
         (long long)r->head_dim, attn_dtype_name(r->dtype));
  if (attn_request_dv(r) != r->head_dim)
    printf(" Dv=%lld", (long long)attn_request_dv(r));
  if (r->causal)
    printf(" causal");
  if (r->window_left >= 0 || (!r->causal && r->window_right >= 0))
    printf(" window=(%lld,%lld)", (long long)r->window_left, (long long)r->window_right);
  if (!isnan(r->scale))
    printf(" scale=%g", r->scale);
  if (pr->opts.stats)
    printf(" stats");
  if (r->pass == ATTN_BACKWARD)
    printf(" backward%s", r->lse_in ? " (lse sent)" : "");
  printf(", %s body of %s%s\n", fmt_name, human_bytes((double)up, hb, sizeof hb),
         a->in ? " from IN" : "");
}

/* The error reply as one line: status, code and message of its body. */
void tool_infer_print_error(const tool_infer_reply *r) {
  long status = r->http;
  char code[64], msg[ATTN_PROTO_MAX_MESSAGE + 1];
  if (attn_proto_error_read(r->body.p, r->body.len, code, sizeof code, msg, sizeof msg)) {
    fprintf(stderr, "attnd: HTTP %ld %s: %s\n", status, code, msg);
  } else {
    /* not attnd's error body: show its start, on one line */
    int n = r->body.len > 200 ? 200 : (int)r->body.len;
    char *t = r->body.p ? strndup(r->body.p, (size_t)n) : NULL;
    for (char *p = t; p && *p; p++)
      if (*p == '\n' || *p == '\r')
        *p = ' ';
    fprintf(stderr, "attnd: HTTP %ld (no attnd error body)%s%s\n", status, t && *t ? ": " : "",
            t ? t : "");
    free(t);
  }
}

void tool_infer_print_report(const tool_infer_args *a, const attn_proto_req *pr,
                             const tool_infer_reply *r, const char *url, bool st_reply,
                             const char *backend, size_t up, bool wrote_out) {
  /* curl's clock starts inside curl_easy_perform(), ours just before it:
   * microseconds apart, so clamp rather than print a negative span */
  double pre = r->pre, total = r->total, first = fmin(fmax(r->first, pre), total);
  char hb1[32], hb2[32];
  printf("HTTP %ld from %s, %s reply%s%s%s\n", r->http, url, st_reply ? "safetensors" : "JSON",
         *backend ? " (backend " : "", backend, *backend ? ")" : "");
  print_problem(a, pr, a->json ? "JSON" : "safetensors", up);
  /* curl's clock: the upload and the server's queueing and compute are
   * not separable from outside, so they are reported as one span */
  printf("time      connect %.3f ms, upload+server %.3f ms (until the first byte), download "
         "%.3f ms, total %.3f ms\n",
         r->connect * 1e3, (first - pre) * 1e3, (total - first) * 1e3, total * 1e3);
  printf("bytes     up %s (%lld B, %.1f MB/s over upload+server), down %s (%lld B, %.1f MB/s "
         "over download)\n",
         human_bytes((double)r->up, hb1, sizeof hb1), r->up,
         first > pre ? (double)r->up / (first - pre) * 1e-6 : 0.0,
         human_bytes((double)r->down, hb2, sizeof hb2), r->down,
         total > first ? (double)r->down / (total - first) * 1e-6 : 0.0);
  double flops = attn_request_flops(&pr->req);
  printf("served    %.4g GFLOP in %.3f ms: %.2f GFLOP/s (4*D per visible pair%s over the "
         "total time)\n",
         flops * 1e-9, total * 1e3, total > 0 ? flops / total * 1e-9 : 0.0,
         pr->req.pass == ATTN_BACKWARD ? ", times 2.5 for the backward pass," : "");
  if (wrote_out)
    printf("out       %s (%zu bytes)\n", a->out, r->body.len);
  fflush(stdout);
}
