/*
 * infer.h — what the parts of `attn infer` share: the parsed command line,
 * and one HTTP exchange as infer_send.c made it (the reply's bytes, status,
 * type and timings, with no curl handle left open). infer_cmd.c reads the
 * arguments and runs the steps; infer_send.c sends; infer_report.c prints;
 * infer_check.c compares the reply with float64 attention.
 */
#ifndef TOOL_INFER_H
#define TOOL_INFER_H

#include "proto.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TOOL_INFER_ME "attn infer"

typedef struct tool_infer_args {
  const char *url, *in, *out;
  const char *shards; /* --shards URL1,URL2,...: K/V split across servers */
  int64_t shape[4], shape_kv[4];
  int64_t head_dim_v; /* --head-dim-v: v's (and o's) last dim, Dv; 0: D */
  bool have_shape, have_shape_kv, have_dtype, have_seed;
  attn_dtype dtype;
  uint64_t seed;
  bool json, check, quiet;
  attn_pass pass; /* --backward: POST /attention/backward */
  double timeout;
  attn_options opts; /* the flags, validated by the server's own parser */
  float *alibi;      /* --alibi-slopes (malloc'd), or NULL */
  int64_t nalibi;
  int alibi_rank;         /* 0: a comma list; 1 or 2: a file's [Hq] or [B, Hq] */
  int64_t alibi_shape[2]; /* the file's */
  float *sinks;           /* --sinks (malloc'd), or NULL: F32 [Hq] */
  int64_t nsinks;
  int64_t *cu_q, *cu_kv; /* --cu-seqlens-q/kv (malloc'd), or NULL */
  int64_t ncu_q, ncu_kv;
  attn_sbuf query; /* the same flags as a query string */
} tool_infer_args;

typedef struct tool_infer_reply {
  attn_sbuf body; /* NUL-terminated (body.p; body.oom: out of memory for it) */
  long http;
  char ctype[128];                   /* "" when the reply has none */
  double connect, pre, first, total; /* seconds: connected, request about to
                                        go, first reply byte, done */
  long long up, down;                /* body bytes each way */
} tool_infer_reply;

/* URL/attention, or URL/attention/backward for a backward pass (or URL
 * when it already ends so), with the query. */
void tool_infer_url(const tool_infer_args *a, attn_sbuf *url);

/* POSTs body to url; 0 when an HTTP reply came (any status), else the exit
 * status after one line on stderr (2 for a URL curl cannot use). */
int tool_infer_send(const tool_infer_args *a, const char *url, const void *body, size_t len,
                    tool_infer_reply *r);
void tool_infer_reply_free(tool_infer_reply *r);

/* An error reply as one line: status, code and message of its body. */
void tool_infer_print_error(const tool_infer_reply *r);
/* The report of a successful exchange (status, problem, time, bytes,
 * GFLOP/s served, the file written). */
void tool_infer_print_report(const tool_infer_args *a, const attn_proto_req *pr,
                             const tool_infer_reply *r, const char *url, bool st_reply,
                             const char *backend, size_t up, bool wrote_out);

/* --check: the reply in pr's outputs against float64 attention (for a
 * backward request, dq, dk, dv against the float64 reference backward, and
 * dsinks with sinks against attn_reference_dsinks());
 * prints the check line and returns the exit status (0 pass, 1 fail). */
int tool_infer_check(const tool_infer_args *a, const attn_proto_req *pr);

/* infer_inputs.c: a flag's comma list of offsets into *pv (malloc'd, *pn
 * of them); --alibi-slopes as a comma list or a FILE.safetensors; 0, or 2
 * after a message. */
int tool_infer_parse_offsets(const char *flag, const char *s, int64_t **pv, int64_t *pn);
int tool_infer_parse_slopes(const char *s, tool_infer_args *a);
/* --sinks as a comma list of Hq numbers or a FILE.safetensors holding the
 * F32 tensor sinks, into *sinks (malloc'd; what it held is freed) and
 * *nsinks; 0, or 2 after a message starting with me (the command's name):
 * attn infer's and attn session attend's. */
int tool_infer_parse_sinks(const char *me, const char *s, float **sinks, int64_t *nsinks);
/* With --cu-seqlens-q/kv: both given, no IN or --shards, and a->shape,
 * a->shape_kv with B the sequence count and N the totals (a --shape or
 * --shape-kv saying otherwise is refused). 0, or 2 after a message. */
int tool_infer_varlen_shapes(tool_infer_args *a);
/* The slopes against a->shape: 0 with *stride_b (0: [Hq], Hq: [B, Hq]),
 * or 2 after a message. */
int tool_infer_alibi_shape(const tool_infer_args *a, int64_t *stride_b);

/* --shards (infer_shards.c): whole's K/V split along Nkv across the listed
 * servers, each shard with diag_offset = off - its first key and stats,
 * sent in parallel and merged by lse into whole's outputs; then the report
 * line and --check. The exit status. */
int tool_infer_sharded(const tool_infer_args *a, attn_proto_req *whole);

#endif
