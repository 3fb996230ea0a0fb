/*
 * bench_cmd.c — `attn bench`: GFLOP/s of the flash engine (CPU, or CUDA end
 * to end: staging, transfers and kernels).
 *
 * FLOPs are 4·D per visible (query, key) pair, so a causal run is credited
 * with about half the work of a full one; --backward times the backward
 * pass (given the forward's lse, as training runs it), credited with 2.5
 * times the forward's FLOPs (attn_request_flops). Each row is the median of
 * --repeat runs after one warm-up. With no shape flag it runs the standard
 * set (the table in docs/performance.md); `make bench` adds the OpenBLAS baselines.
 */
#include "args.h"
#include "benchlib.h"
#include "cmds.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char usage[] =
    "usage: attn bench [--batch B] [--heads H] [--heads-kv H] [--seq N] [--seq-q N]\n"
    "                  [--seq-kv N] [--head-dim D] [--dtype F32|F16|BF16] [--causal]\n"
    "                  [--threads T] [--repeat R] [--backend cpu|cuda] [--backward]\n"
    "                  [--isa auto|amx|avx512bf16|avx512|avx2|generic] [--varlen]\n"
    "                  [--cpu-tune auto|intel|amd]\n"
    "\n"
    "Times a flash backend and prints GFLOP/s (4*D per visible query-key pair).\n"
    "--backward times the backward pass instead (dq, dk, dv from q, k, v, o, do\n"
    "and the forward's lse), credited with 2.5 times the forward's FLOPs.\n"
    "--varlen runs the B sequences as one variable-length request instead\n"
    "(packed along N with cu_seqlens; the same work, to compare with the\n"
    "batched run).\n"
    "Without shape flags it runs H=8 N=1024 D=64, H=8 N=4096 D=64, H=8 N=4096\n"
    "D=128 and H=1 N=16384 D=64, causal and not, on 1 thread and on every core.\n"
    "Defaults: batch 1, F32, repeat 3, backend cpu. With --backend cuda the time\n"
    "is the engine's whole job: host staging, transfers, input scan and kernels\n"
    "(tests/gpu's bench-gpu times the kernels alone).\n"
    "--cpu-tune picks the F32 products' tuning (default auto: intel on Intel CPUs,\n"
    "amd on others; the kernel column says \"intel tuning\" where it is on), to\n"
    "compare the two on one machine: the results are the same bits either way.\n";

/* How every case of a run is timed. */
typedef struct bench_run {
  bool causal, backward, varlen;
  int threads, reps;
  const char *isa, *tune, *backend; /* isa, tune: NULL for auto */
} bench_run;

/* The B sequences of c as one varlen request over the same buffers. */
static void make_varlen(tool_bench_case *c, int64_t *cuq, int64_t *cuk) {
  attn_request *r = &c->req;
  for (int64_t b = 0; b <= r->batch; b++) {
    cuq[b] = b * r->seq_q;
    cuk[b] = b * r->seq_kv;
  }
  r->seq_q *= r->batch;
  r->seq_kv *= r->batch;
  r->cu_seqlens_q = cuq;
  r->cu_seqlens_kv = cuk;
}

static int run_one(const tool_shape_args *s, const bench_run *br) {
  const bool causal = br->causal, backward = br->backward;
  const char *backend = br->backend;
  attn_status st;
  attn_engine *e = tool_bench_open(br->threads, br->isa, br->tune, &st);
  if (!e) {
    fprintf(stderr, "attn bench: %s\n", st.message);
    return 1;
  }
  tool_bench_case c;
  int rc = tool_bench_case_init(&c, s->batch, s->heads, s->heads_kv ? s->heads_kv : s->heads,
                                s->seq_q, s->seq_kv, s->head_dim, s->dtype, causal, 42);
  if (rc < 0) {
    fprintf(stderr, "attn bench: out of memory for the inputs\n");
    attn_engine_close(e);
    return 1;
  }
  int brc = backward ? tool_bench_case_backward(&c, e, 43, &st) : 0;
  int64_t *cu = br->varlen ? malloc(2 * (size_t)(s->batch + 1) * sizeof *cu) : NULL;
  if (cu)
    make_varlen(&c, cu, cu + s->batch + 1);
  c.req.backend = backend;
  double t = brc < 0 ? brc : tool_bench_engine(e, &c.req, br->reps, &st);
  if (t < 0) {
    fprintf(stderr, "attn bench: %s\n", st.message);
  } else {
    attn_backend_info info[4];
    int n = attn_engine_backends(e, info, 4), b = 0;
    while (b < n - 1 && strcmp(info[b].name, backend))
      b++;
    printf("%5lld %4lld %6lld %6lld %4lld %5s %-6s %4s %7d %10.2f %9.1f   %s%s\n",
           (long long)s->batch, (long long)s->heads, (long long)s->seq_q, (long long)s->seq_kv,
           (long long)s->head_dim, attn_dtype_name(s->dtype), causal ? "yes" : "no",
           backward ? "bwd" : "fwd", attn_engine_threads(e), t * 1e3,
           attn_request_flops(&c.req) / t * 1e-9, info[b].detail,
           cu ? ", varlen (one request of B sequences)" : "");
    fflush(stdout);
  }
  free(cu);
  tool_bench_case_free(&c);
  attn_engine_close(e);
  return t < 0 ? 1 : 0;
}

int tool_cmd_bench(int argc, char **argv) {
  static const struct option opts[] = {TOOL_SHAPE_OPTIONS,
                                       {"causal", no_argument, 0, 'c'},
                                       {"threads", required_argument, 0, 'T'},
                                       {"repeat", required_argument, 0, 'r'},
                                       {"isa", required_argument, 0, 'i'},
                                       {"cpu-tune", required_argument, 0, 'u'},
                                       {"backend", required_argument, 0, 'B'},
                                       {"backward", no_argument, 0, 'w'},
                                       {"varlen", no_argument, 0, 'V'},
                                       {"help", no_argument, 0, 'x'},
                                       {0, 0, 0, 0}};
  tool_shape_args s = {
      .batch = 1, .heads = 8, .seq_q = 4096, .seq_kv = 4096, .head_dim = 64, .dtype = ATTN_F32};
  int threads = -1, c, bad = 0;
  bool custom = false;
  bench_run br = {.reps = 3, .backend = "cpu"};
  optind = 1;
  while (!bad && (c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
    custom |= !strchr("TriuBwV", c);
    int r = tool_arg_shape(c, optarg, &s);
    if (r) {
      bad = r < 0;
      continue;
    }
    switch (c) {
    case 'c': br.causal = true; break;
    case 'w': br.backward = true; break;
    case 'V': br.varlen = true; break;
    case 'T': bad = tool_arg_int("--threads", optarg, 0, 1024, &threads); break;
    case 'r': bad = tool_arg_int("--repeat", optarg, 1, 64, &br.reps); break;
    case 'i': br.isa = optarg; break;
    case 'u':
      bad = tool_arg_tune("--cpu-tune", optarg);
      br.tune = optarg;
      break;
    case 'B':
      if (strcmp(optarg, "cpu") && strcmp(optarg, "cuda")) {
        fprintf(stderr, "attn bench: --backend expects cpu or cuda (got \"%s\")\n", optarg);
        return 2;
      }
      br.backend = optarg;
      break;
    case 'x': fputs(usage, stdout); return 0;
    default: fputs(usage, stderr); return 2;
    }
  }
  if (bad)
    return 2;
  if (optind < argc) {
    fprintf(stderr, "attn bench: unexpected argument \"%s\"\n%s", argv[optind], usage);
    return 2;
  }
  printf("%5s %4s %6s %6s %4s %5s %-6s %4s %7s %10s %9s   %s\n", "batch", "H", "Nq", "Nkv", "D",
         "dtype", "causal", "pass", "threads", "ms", "GFLOP/s", "kernel");
  if (custom) {
    br.threads = threads < 0 ? 0 : threads;
    return run_one(&s, &br);
  }
  static const int64_t set[][3] = {{8, 1024, 64}, {8, 4096, 64}, {8, 4096, 128}, {1, 16384, 64}};
  int rc = 0;
  for (size_t i = 0; i < sizeof set / sizeof *set; i++)
    for (int cz = 0; cz < 2; cz++)
      for (int tpass = 0; tpass < 2; tpass++) {
        if (threads >= 0 && tpass == 1)
          break;
        tool_shape_args x = s;
        x.heads = set[i][0];
        x.seq_q = x.seq_kv = set[i][1];
        x.head_dim = set[i][2];
        bench_run xr = br;
        xr.causal = cz;
        xr.threads = threads >= 0 ? threads : tpass == 0 ? 1 : 0;
        rc |= run_one(&x, &xr);
      }
  return rc;
}
