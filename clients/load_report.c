/*
 * load_report.c — see load_report.h. The text report puts the invariant
 * and the errors before the rates, so a broken run is not read as a fast
 * one; the JSON object carries the same numbers under stable keys.
 */
#include "load_report.h"

#include <stdio.h>

static void fmt_bytes(char *b, size_t cap, uint64_t n) {
  if (n >= 1000000000ull)
    snprintf(b, cap, "%.2f GB", (double)n * 1e-9);
  else if (n >= 1000000)
    snprintf(b, cap, "%.2f MB", (double)n * 1e-6);
  else if (n >= 1000)
    snprintf(b, cap, "%.2f kB", (double)n * 1e-3);
  else
    snprintf(b, cap, "%llu B", (unsigned long long)n);
}

static const char *const terr_name[TOOL_TERR_COUNT] = {"connect", "write", "read", "timeout",
                                                       "protocol"};

uint64_t tool_load_transport_errors(const tool_load_counts *n) {
  uint64_t t = 0;
  for (int i = 0; i < TOOL_TERR_COUNT; i++)
    t += n->terr[i];
  return t;
}

void tool_load_print_text(const tool_load_report *R, const tool_load_counts *n,
                          const tool_hist *h) {
  uint64_t terr = tool_load_transport_errors(n);
  printf("attn load %s: ", R->url);
  if (R->open_loop)
    printf("open loop, %g requests/s, up to %d connections (%d used)", R->rate, R->max_pool,
           R->connections);
  else
    printf("closed loop, %d connections", R->concurrency);
  if (R->max_requests > 0)
    printf(", %lld requests\n", (long long)R->max_requests);
  else
    printf(", %g s\n", R->duration);
  printf("body       %s %zu bytes, %s\n", R->body_kind, R->body_len, R->body_desc);
  printf("requests   sent %llu, answered %llu, successful (2xx) %llu, in flight at the end %llu\n",
         (unsigned long long)n->sent, (unsigned long long)n->answered, (unsigned long long)n->ok,
         (unsigned long long)n->in_flight_end);
  bool holds = n->sent == n->answered + terr + n->in_flight_end;
  printf("invariant  sent %llu = answered %llu + transport errors %llu + in flight %llu: %s\n",
         (unsigned long long)n->sent, (unsigned long long)n->answered, (unsigned long long)terr,
         (unsigned long long)n->in_flight_end, holds ? "holds" : "BROKEN");
  printf("errors     HTTP:");
  bool any = false;
  for (int s = 0; s < 600; s++)
    if (n->status[s] && (s < 200 || s >= 300)) {
      printf(" %d x%llu", s, (unsigned long long)n->status[s]);
      any = true;
    }
  if (n->status_other) {
    printf(" other x%llu", (unsigned long long)n->status_other);
    any = true;
  }
  printf("%s; transport:", any ? "" : " none");
  for (int t = 0; t < TOOL_TERR_COUNT; t++)
    printf(" %s %llu%s", terr_name[t], (unsigned long long)n->terr[t],
           t + 1 < TOOL_TERR_COUNT ? "," : "");
  printf("\n");
  if (n->backlog_end)
    printf("backlog    %llu requests were due but never sent (all %d connections busy)\n",
           (unsigned long long)n->backlog_end, R->max_pool);
  printf("throughput %.1f requests/s, %.1f successful/s, ", (double)n->answered / R->elapsed,
         (double)n->ok / R->elapsed);
  if (R->flops >= 0)
    printf("%.2f GFLOP/s served", (double)n->ok * R->flops / R->elapsed * 1e-9);
  else
    printf("GFLOP/s unknown");
  printf(" over %.3f s\n", R->elapsed);
  printf("latency ms p50 %.3f  p90 %.3f  p99 %.3f  p99.9 %.3f  max %.3f  (min %.3f, mean %.3f%s)\n",
         tool_hist_percentile(h, 50) / 1e3, tool_hist_percentile(h, 90) / 1e3,
         tool_hist_percentile(h, 99) / 1e3, tool_hist_percentile(h, 99.9) / 1e3,
         (double)tool_hist_max(h) / 1e3, (double)tool_hist_min(h) / 1e3, tool_hist_mean(h) / 1e3,
         R->open_loop ? ", from the intended start" : "");
  char bs[32], br[32];
  fmt_bytes(bs, sizeof bs, n->bytes_sent);
  fmt_bytes(br, sizeof br, n->bytes_recv);
  printf("bytes      sent %s (%llu), received %s (%llu)\n", bs, (unsigned long long)n->bytes_sent,
         br, (unsigned long long)n->bytes_recv);
}

static void json_str(const char *s) {
  putchar('"');
  for (; *s; s++) {
    unsigned char ch = (unsigned char)*s;
    if (ch == '"' || ch == '\\')
      printf("\\%c", ch);
    else if (ch < 0x20)
      printf("\\u%04x", ch);
    else
      putchar(ch);
  }
  putchar('"');
}

void tool_load_print_json(const tool_load_report *R, const tool_load_counts *n,
                          const tool_hist *h) {
  uint64_t terr = tool_load_transport_errors(n);
  printf("{\"url\": ");
  json_str(R->url);
  printf(", \"mode\": \"%s\", \"concurrency\": %d, \"rate\": ", R->open_loop ? "open" : "closed",
         R->open_loop ? R->connections : R->concurrency);
  if (R->open_loop)
    printf("%.17g", R->rate);
  else
    printf("null");
  printf(", \"connections\": %d, \"duration_s\": %.6f, \"body_bytes\": %zu, \"body\": ",
         R->connections, R->elapsed, R->body_len);
  json_str(R->body_desc);
  printf(",\n \"sent\": %llu, \"answered\": %llu, \"successful\": %llu, \"in_flight\": %llu, "
         "\"backlog\": %llu, \"transport_errors\": %llu",
         (unsigned long long)n->sent, (unsigned long long)n->answered, (unsigned long long)n->ok,
         (unsigned long long)n->in_flight_end, (unsigned long long)n->backlog_end,
         (unsigned long long)terr);
  printf(",\n \"errors\": {\"status\": {");
  bool first = true;
  for (int s = 0; s < 600; s++)
    if (n->status[s] && (s < 200 || s >= 300)) {
      printf("%s\"%d\": %llu", first ? "" : ", ", s, (unsigned long long)n->status[s]);
      first = false;
    }
  if (n->status_other)
    printf("%s\"other\": %llu", first ? "" : ", ", (unsigned long long)n->status_other);
  printf("}, \"transport\": {");
  for (int t = 0; t < TOOL_TERR_COUNT; t++)
    printf("%s\"%s\": %llu", t ? ", " : "", terr_name[t], (unsigned long long)n->terr[t]);
  printf("}},\n \"status\": {");
  first = true;
  for (int s = 0; s < 600; s++)
    if (n->status[s]) {
      printf("%s\"%d\": %llu", first ? "" : ", ", s, (unsigned long long)n->status[s]);
      first = false;
    }
  printf("},\n \"requests_per_s\": %.3f, \"successful_per_s\": %.3f, \"gflops\": ",
         (double)n->answered / R->elapsed, (double)n->ok / R->elapsed);
  if (R->flops >= 0)
    printf("%.4f, \"flops_per_request\": %.17g", (double)n->ok * R->flops / R->elapsed * 1e-9,
           R->flops);
  else
    printf("null, \"flops_per_request\": null");
  printf(",\n \"latency_ms\": {\"p50\": %.4f, \"p90\": %.4f, \"p99\": %.4f, \"p99.9\": %.4f, "
         "\"max\": %.4f, \"min\": %.4f, \"mean\": %.4f, \"count\": %llu}",
         tool_hist_percentile(h, 50) / 1e3, tool_hist_percentile(h, 90) / 1e3,
         tool_hist_percentile(h, 99) / 1e3, tool_hist_percentile(h, 99.9) / 1e3,
         (double)tool_hist_max(h) / 1e3, (double)tool_hist_min(h) / 1e3, tool_hist_mean(h) / 1e3,
         (unsigned long long)tool_hist_count(h));
  printf(",\n \"bytes_sent\": %llu, \"bytes_received\": %llu", (unsigned long long)n->bytes_sent,
         (unsigned long long)n->bytes_recv);
  printf(",\n \"invariant\": {\"holds\": %s, \"text\": \"sent %llu = answered %llu + transport "
         "errors %llu + in flight %llu\"}}\n",
         n->sent == n->answered + terr + n->in_flight_end ? "true" : "false",
         (unsigned long long)n->sent, (unsigned long long)n->answered, (unsigned long long)terr,
         (unsigned long long)n->in_flight_end);
}
