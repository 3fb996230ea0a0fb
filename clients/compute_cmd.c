/*
 * compute_cmd.c — `attn compute IN.safetensors OUT.safetensors`: decode a
 * request file with the same codec the server uses, run the engine in this
 * process, write the reply file; with --backward, the backward pass (q, k,
 * v, o, do [, lse] in; dq, dk, dv out) as POST /attention/backward.
 *
 * Flags carry options the way a URL query string does, so a file's
 * __metadata__ overrides them exactly as it would over HTTP. The output is
 * written to a temporary file beside OUT and renamed into place, so a
 * failure never leaves a half-written OUT. Exit status: 0 done, 1 an I/O or
 * engine failure, 2 bad usage or a bad input file.
 */
#include "args.h"
#include "benchlib.h"
#include "cmds.h"
#include "files.h"
#include "proto.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char usage[] =
    "usage: attn compute IN.safetensors OUT.safetensors [--causal] [--scale X]\n"
    "                    [--window-left N] [--window-right N] [--diag-offset N] [--stats]\n"
    "                    [--threads N]\n"
    "                    [--backend auto|cpu|cuda|reference] [--backward]\n"
    "                    [--isa auto|amx|avx512bf16|avx512|avx2|generic]\n"
    "                    [--cpu-tune auto|intel|amd]\n"
    "\n"
    "Reads tensors q, k, v (and the optional alibi_slopes, sinks) from IN, computes\n"
    "attention in this process and writes o (and m, l, lse with --stats) to OUT.\n"
    "Flags are options as in the HTTP query\n"
    "string; IN's __metadata__, when it sets the same option, wins (as over HTTP).\n"
    "--backward computes the backward pass instead, as POST /attention/backward does:\n"
    "IN holds q, k, v, o (the forward's output), do (dL/dO) and optionally lse (the\n"
    "forward's, F32), and OUT gets dq, dk, dv, and dsinks when IN has sinks (--stats\n"
    "is refused).\n"
    "--isa picks the CPU kernel (default: the best this CPU runs); one the CPU lacks\n"
    "is an error. --cpu-tune picks the F32 products' tuning (default auto: intel on\n"
    "Intel CPUs, amd on others); the results are the same bits either way.\n";

/* What the command runs with, besides the API options. */
typedef struct run_opts {
  int threads;
  const char *isa;  /* NULL: auto */
  const char *tune; /* NULL: auto */
  attn_pass pass;   /* --backward */
} run_opts;

/* Encodes pr's result, writes it to OUT and says so; the exit status. */
static int write_reply(const attn_proto_req *pr, const attn_result *res, const char *in,
                       const char *out) {
  void *obuf;
  size_t olen;
  attn_status st;
  if (attn_proto_encode_safetensors(pr, &obuf, &olen, &st) < 0) {
    fprintf(stderr, "attn compute: %s\n", st.message);
    return 1;
  }
  int status = 0;
  if (tool_write_file(out, obuf, olen) < 0) {
    fprintf(stderr, "attn compute: cannot write %s: %s\n", out, strerror(errno));
    status = 1;
  } else {
    const attn_request *r = &pr->req;
    char dv[32] = ""; /* a value head dim of its own, when v has one */
    if (attn_request_dv(r) != r->head_dim)
      snprintf(dv, sizeof dv, " Dv=%lld", (long long)attn_request_dv(r));
    printf("%s: %sB=%lld Hq=%lld Hkv=%lld Nq=%lld Nkv=%lld D=%lld%s %s on %s: %.3f ms, "
           "%.1f GFLOP/s -> %s (%zu bytes)\n",
           in, r->pass == ATTN_BACKWARD ? "backward " : "", (long long)r->batch,
           (long long)r->heads_q, (long long)r->heads_kv, (long long)r->seq_q, (long long)r->seq_kv,
           (long long)r->head_dim, dv, attn_dtype_name(r->dtype), res->backend,
           res->engine_seconds * 1e3,
           res->engine_seconds > 0 ? res->flops / res->engine_seconds * 1e-9 : 0.0, out, olen);
  }
  free(obuf);
  return status;
}

/* Flags into *flags and *ro; 0, 2 after a message, or -1 for --help. */
static int parse_flags(int argc, char **argv, attn_options *flags, run_opts *ro) {
  static const struct option opts[] = {TOOL_API_OPTIONS,
                                       {"threads", required_argument, 0, 'T'},
                                       {"isa", required_argument, 0, 'I'},
                                       {"cpu-tune", required_argument, 0, 'U'},
                                       {"backward", no_argument, 0, 'W'},
                                       {"help", no_argument, 0, 'x'},
                                       {0, 0, 0, 0}};
  attn_options_init(flags);
  int c;
  optind = 1;
  while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
    const char *name, *value;
    /* Flags go through the option parser, as the query string does. */
    int rc = tool_arg_api_option(c, optarg, "attn compute", flags, &name, &value);
    if (rc < 0)
      return 2;
    if (rc > 0)
      continue;
    switch (c) {
    case 'T':
      if (tool_arg_int("--threads", optarg, 0, 1024, &ro->threads) < 0)
        return 2;
      break;
    case 'I': ro->isa = optarg; break;
    case 'U':
      if (tool_arg_tune("--cpu-tune", optarg) < 0)
        return 2;
      ro->tune = optarg;
      break;
    case 'W': ro->pass = ATTN_BACKWARD; break;
    case 'x': fputs(usage, stdout); return -1;
    default: fputs(usage, stderr); return 2;
    }
  }
  return 0;
}

/* Runs the engine on pr and writes OUT; the exit status. */
static int compute(attn_proto_req *pr, const run_opts *ro, const char *in, const char *out) {
  attn_status st;
  int status = 0;
  attn_engine *e = tool_bench_open(ro->threads, ro->isa, ro->tune, &st);
  attn_result res;
  if (!e) {
    fprintf(stderr, "attn compute: %s\n", st.message);
    status = ro->isa ? 2 : 1; /* a kernel asked for and not here is the caller's error */
  } else if (attn_engine_run(e, &pr->req, &res, &st) < 0) {
    fprintf(stderr, "attn compute: %s: %s\n", in, st.message);
    /* what the input asked for is wrong (4xx), or the engine failed (5xx) */
    status = attn_proto_http_status(st.code) < 500 ? 2 : 1;
  } else {
    status = write_reply(pr, &res, in, out);
  }
  attn_engine_close(e);
  return status;
}

int tool_cmd_compute(int argc, char **argv) {
  attn_options flags;
  run_opts ro = {0, NULL, NULL, ATTN_FORWARD};
  int rc = parse_flags(argc, argv, &flags, &ro);
  if (rc != 0)
    return rc < 0 ? 0 : rc;
  if (argc - optind != 2) {
    fprintf(stderr, "attn compute: expected IN and OUT files\n%s", usage);
    return 2;
  }
  const char *in = argv[optind], *out = argv[optind + 1];
  void *body;
  size_t len;
  if (tool_read_file(in, &body, &len) < 0) {
    fprintf(stderr, "attn compute: cannot read %s: %s\n", in, strerror(errno));
    return 2;
  }
  attn_proto_req pr;
  attn_status st;
  if (attn_proto_decode_safetensors_pass(body, len, ro.pass, &flags, &pr, &st) < 0) {
    fprintf(stderr, "attn compute: %s: %s\n", in, st.message);
    free(body);
    return 2;
  }
  int status = compute(&pr, &ro, in, out);
  attn_proto_req_free(&pr);
  free(body);
  return status;
}
