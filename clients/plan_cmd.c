/*
 * plan_cmd.c — `attn plan`: the memory of standard versus flash attention
 * for a shape (seed exercise 1), as a table or as JSON.
 */
#include "args.h"
#include "cmds.h"
#include "proto.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char usage[] =
    "usage: attn plan [--batch B] [--heads H] [--heads-kv H] [--seq N]\n"
    "                 [--seq-q N] [--seq-kv N] [--head-dim D] [--dtype F32|F16|BF16]\n"
    "                 [--threads T] [--backward] [--json]\n"
    "\n"
    "Bytes of Q, K, V and O; of standard attention's S and P ([B, H, Nq, Nkv] in\n"
    "the input dtype); and of the flash path's m, l (F32 per query row) and tile\n"
    "workspace (per worker thread; T defaults to the cores). --seq sets both\n"
    "sequence lengths; --seq-q and --seq-kv set them apart (cross attention).\n"
    "--backward plans the backward pass (seed exercise 5): the gradients dO, dQ,\n"
    "dK, dV; standard backward's S, P, dP and dS; flash backward's lse and\n"
    "D = rowsum(dO*O) per query row, F32 dQ accumulators and workspace.\n"
    "Defaults: batch 1, heads 1, seq 4096, head-dim 64, F32.\n";

static void human(char *buf, size_t cap, uint64_t b) {
  static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = (double)b;
  int u = 0;
  while (v >= 1024 && u < 6) {
    v /= 1024;
    u++;
  }
  snprintf(buf, cap, u ? "%.2f %s" : "%.0f %s", v, unit[u]);
}

static void row(const char *name, uint64_t b) {
  char h[32];
  human(h, sizeof h, b);
  printf("  %-22s %22llu  %12s\n", name, (unsigned long long)b, h);
}

static void print_backward(const attn_plan *pl) {
  printf("gradients\n");
  row("dO (in)", pl->dout);
  row("dQ", pl->dq);
  row("dK", pl->dk);
  row("dV", pl->dv);
  printf("standard backward (holds S, P, dP and dS)\n");
  row("S, P", pl->s_plus_p);
  row("dP = dO*V^T", pl->dp);
  row("dS = P*(dP-rowsum)", pl->ds);
  row("total", pl->standard_total);
  printf("flash backward (recomputes S and P per tile)\n");
  row("lse (F32)", pl->lse);
  row("D = rowsum(dO*O) (F32)", pl->delta);
  row("dQ accumulators (F32)", pl->dq_accum);
  char ws[48];
  snprintf(ws, sizeof ws, "workspace (%d thr)", pl->threads);
  row(ws, pl->workspace);
  row("total", pl->flash_total);
}

static void print_forward(const attn_plan *pl) {
  printf("standard attention (materializes S and P)\n");
  row("S = scale*Q*K^T", pl->s);
  row("P = softmax(S)", pl->p);
  row("S+P", pl->s_plus_p);
  row("total", pl->standard_total);
  printf("flash attention (online softmax over tiles)\n");
  row("m (F32)", pl->m);
  row("l (F32)", pl->l);
  char ws[48];
  snprintf(ws, sizeof ws, "workspace (%d thr)", pl->threads);
  row(ws, pl->workspace);
  row("total", pl->flash_total);
}

static void print_table(const attn_plan_params *p, const attn_plan *pl) {
  printf("attention %s memory plan: batch %lld, heads %lld (kv %lld), seq_q %lld, "
         "seq_kv %lld, head_dim %lld, %s\n\n",
         p->pass == ATTN_BACKWARD ? "backward" : "forward", (long long)p->batch,
         (long long)p->heads_q, (long long)(p->heads_kv ? p->heads_kv : p->heads_q),
         (long long)p->seq_q, (long long)p->seq_kv, (long long)p->head_dim,
         attn_dtype_name(p->dtype));
  printf("  %-22s %22s  %12s\n", "buffer", "bytes", "");
  printf("inputs and output\n");
  row("Q", pl->q);
  row("K", pl->k);
  row("V", pl->v);
  row("O", pl->o);
  if (p->pass == ATTN_BACKWARD)
    print_backward(pl);
  else
    print_forward(pl);
  printf("\nQ : S = 1:%.6g   (S and P grow as seq_q*seq_kv, Q as seq*head_dim)\n", pl->s_over_q);
  printf("standard / flash memory = %.2fx\n", pl->standard_over_flash);
}

static int print_json(const attn_plan_params *p, const attn_plan *pl) {
  attn_sbuf b = {0};
  attn_proto_plan_json(&b, p, pl);
  if (b.oom) {
    fprintf(stderr, "attn plan: out of memory\n");
    return 1;
  }
  fputs(b.p, stdout);
  free(b.p);
  return 0;
}

int tool_cmd_plan(int argc, char **argv) {
  static const struct option opts[] = {TOOL_SHAPE_OPTIONS,
                                       {"threads", required_argument, 0, 'T'},
                                       {"json", no_argument, 0, 'j'},
                                       {"backward", no_argument, 0, 'w'},
                                       {"help", no_argument, 0, 'x'},
                                       {0, 0, 0, 0}};
  tool_shape_args sh = {
      .batch = 1, .heads = 1, .seq_q = 4096, .seq_kv = 4096, .head_dim = 64, .dtype = ATTN_F32};
  int threads = 0;
  bool json = false, backward = false;
  int c, bad = 0;
  optind = 1;
  while (!bad && (c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
    int r = tool_arg_shape(c, optarg, &sh);
    if (r) {
      bad = r < 0;
      continue;
    }
    switch (c) {
    case 'T': bad = tool_arg_int("--threads", optarg, 0, 1024, &threads); break;
    case 'j': json = true; break;
    case 'w': backward = true; break;
    case 'x': fputs(usage, stdout); return 0;
    default: fputs(usage, stderr); return 2;
    }
  }
  if (bad)
    return 2;
  if (optind < argc) {
    fprintf(stderr, "attn plan: unexpected argument \"%s\"\n%s", argv[optind], usage);
    return 2;
  }
  attn_plan_params p = {.batch = sh.batch,
                        .heads_q = sh.heads,
                        .heads_kv = sh.heads_kv,
                        .seq_q = sh.seq_q,
                        .seq_kv = sh.seq_kv,
                        .head_dim = sh.head_dim,
                        .dtype = sh.dtype,
                        .threads = threads,
                        .pass = backward ? ATTN_BACKWARD : ATTN_FORWARD};
  attn_plan pl;
  attn_status st;
  if (attn_plan_compute(&p, &pl, &st) < 0) {
    fprintf(stderr, "attn plan: %s\n", st.message);
    return 2;
  }
  if (json)
    return print_json(&p, &pl);
  print_table(&p, &pl);
  return 0;
}
