/*
 * peers_attn.c — attnd's side of `make bench-peers` (tests/bench/peers.py).
 *
 *   bench-peers-attn FILE.safetensors [--threads T] [--isa NAME] [--reps N]
 *                    [--causal] [--out O.safetensors] [--backward DO.bin]
 *
 * Reads q, k, v from a safetensors file that peers.py wrote (the same bytes
 * torch and numpy then run on), decodes it with proto's safetensors decoder
 * exactly as the server would (options in __metadata__ apply: causal, scale),
 * runs the CPU backend once to warm up and then N times, and prints one JSON
 * object on stdout: median seconds, GFLOP/s (4·D per visible pair), and the
 * kernel the engine chose ("avx512 kernel, 2 threads"), which peers.py needs
 * to pick the matching peak. --out writes O so peers.py can check that the
 * three implementations agree on the same input.
 *
 * --backward DO.bin times the backward pass instead: dO is DO.bin's raw
 * little-endian elements (O's shape and q's dtype, as numpy's tofile writes
 * them); O and the lse come from one untimed forward run, and each timed
 * run is the backward given that lse (what torch's autograd does with the
 * lse its forward saved). GFLOP/s uses attn_request_flops (2.5 times the
 * forward's), and --out then writes dq, dk and dv raw, one after another.
 */
#include "benchlib.h"
#include "proto.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct peers_args {
  const char *in, *out, *isa, *dout;
  int threads, reps;
  bool causal;
} peers_args;

static int usage(void) {
  fprintf(stderr, "usage: bench-peers-attn FILE.safetensors [--threads T] [--isa "
                  "auto|avx512|avx2|generic|...] [--reps N] [--causal] [--out FILE] "
                  "[--backward DO.bin]\n");
  return 2;
}

static int parse_args(int argc, char **argv, peers_args *a) {
  static const struct option opts[] = {{"threads", required_argument, 0, 't'},
                                       {"isa", required_argument, 0, 'i'},
                                       {"reps", required_argument, 0, 'r'},
                                       {"causal", no_argument, 0, 'c'},
                                       {"out", required_argument, 0, 'o'},
                                       {"backward", required_argument, 0, 'b'},
                                       {0, 0, 0, 0}};
  *a = (peers_args){.isa = "auto", .threads = 0, .reps = 5};
  int c;
  while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
    switch (c) {
    case 't': a->threads = atoi(optarg); break;
    case 'i': a->isa = optarg; break;
    case 'r': a->reps = atoi(optarg); break;
    case 'c': a->causal = true; break;
    case 'o': a->out = optarg; break;
    case 'b': a->dout = optarg; break;
    default: return -1;
    }
  }
  if (optind != argc - 1 || a->threads < 0 || a->reps < 1 || a->reps > 64)
    return -1;
  a->in = argv[optind];
  return 0;
}

/* The whole file in one malloc'd buffer (malloc's alignment is what the
 * decoder needs to read the tensors in place, as the server does). */
static char *slurp(const char *path, size_t *plen) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    perror(path);
    return NULL;
  }
  char *buf = NULL;
  long n = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
  if (n > 0 && fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)n)) &&
      fread(buf, 1, (size_t)n, f) != (size_t)n) {
    free(buf);
    buf = NULL;
  }
  if (!buf)
    fprintf(stderr, "bench-peers-attn: cannot read %s\n", path);
  fclose(f);
  *plen = (size_t)n;
  return buf;
}

static int write_file(const char *path, const void *p, size_t n) {
  FILE *f = fopen(path, "wb");
  int ok = f && fwrite(p, 1, n, f) == n;
  if (f && fclose(f) != 0)
    ok = 0;
  if (!ok)
    perror(path);
  return ok ? 0 : -1;
}

/* The cpu backend's description, the one line that names the kernel. */
static void cpu_detail(const attn_engine *e, char *buf, size_t cap) {
  attn_backend_info info[8];
  int n = attn_engine_backends(e, info, 8);
  snprintf(buf, cap, "?");
  for (int i = 0; i < n && i < 8; i++)
    if (strcmp(info[i].name, "cpu") == 0)
      snprintf(buf, cap, "%s", info[i].detail);
}

static void print_json(const peers_args *a, const attn_request *r, const attn_engine *e,
                       double sec) {
  char detail[128];
  cpu_detail(e, detail, sizeof detail);
  double flops = attn_request_flops(r);
  printf("{\"seconds\": %.9g, \"gflops\": %.6g, \"flops\": %.17g, \"threads\": %d, "
         "\"isa\": \"%s\", \"detail\": \"%s\", \"dtype\": \"%s\", \"causal\": %s, "
         "\"reps\": %d, \"shape\": [%lld, %lld, %lld, %lld, %lld, %lld]}\n",
         sec, flops / sec * 1e-9, flops, attn_engine_threads(e), a->isa, detail,
         attn_dtype_name(r->dtype), r->causal ? "true" : "false", a->reps, (long long)r->batch,
         (long long)r->heads_q, (long long)r->heads_kv, (long long)r->seq_q, (long long)r->seq_kv,
         (long long)r->head_dim);
}

/* Bytes of the backward's tensors: q (dq), k (dk), v (dv) and O (dO), v
 * and O with the values' head dim. */
typedef struct bwd_sizes {
  size_t q, k, v, o;
} bwd_sizes;

static bwd_sizes sizes_of(const attn_request *r) {
  size_t es = attn_dtype_size(r->dtype), dv = (size_t)attn_request_dv(r);
  size_t rq = (size_t)(r->batch * r->heads_q * r->seq_q),
         rk = (size_t)(r->batch * r->heads_kv * r->seq_kv);
  return (bwd_sizes){.q = rq * (size_t)r->head_dim * es,
                     .k = rk * (size_t)r->head_dim * es,
                     .v = rk * dv * es,
                     .o = rq * dv * es};
}

/* The backward's buffers: dO from the file, dq, dk, dv and the lse, and O
 * and the lse from one forward run on e. Returns the allocation or NULL. */
static char *setup_backward(const peers_args *a, attn_engine *e, attn_request *r, char **pdout) {
  bwd_sizes z = sizes_of(r);
  size_t rows = (size_t)(r->batch * r->heads_q * r->seq_q), len = 0;
  char *dout = slurp(a->dout, &len);
  char *m = dout && len == z.o ? malloc(z.q + z.k + z.v + rows * sizeof(float)) : NULL;
  attn_status st = {0};
  if (m) {
    r->lse = (float *)(void *)(m + z.q + z.k + z.v);
    if (attn_engine_run(e, r, NULL, &st) < 0) {
      fprintf(stderr, "bench-peers-attn: forward: %s\n", st.message);
      free(m);
      m = NULL;
    }
  } else if (dout) {
    fprintf(stderr, "bench-peers-attn: %s holds %zu bytes, O's shape needs %zu\n", a->dout, len,
            z.o);
  }
  if (!m) {
    free(dout);
    return NULL;
  }
  r->pass = ATTN_BACKWARD;
  r->lse_in = r->lse;
  r->lse = NULL;
  r->dout = *pdout = dout;
  r->dq = m;
  r->dk = m + z.q;
  r->dv = m + z.q + z.k;
  r->m = r->l = NULL;
  return m;
}

static int write_grads(const peers_args *a, const attn_request *r) {
  bwd_sizes z = sizes_of(r);
  return write_file(a->out, r->dq, z.q + z.k + z.v); /* dq, dk, dv are adjacent */
}

static int run(const peers_args *a, attn_proto_req *pr) {
  attn_status st = {0};
  attn_engine *e = tool_bench_open(a->threads, a->isa, NULL, &st);
  if (!e) {
    fprintf(stderr, "bench-peers-attn: %s\n", st.message);
    return 1;
  }
  /* The CPU kernel, never the reference: a named ISA the CPU lacks must
   * fail here rather than silently time something else. */
  pr->req.backend = "cpu";
  if (a->causal)
    pr->req.causal = true;
  char *dout = NULL, *grads = a->dout ? setup_backward(a, e, &pr->req, &dout) : NULL;
  if (a->dout && !grads) {
    attn_engine_close(e);
    return 1;
  }
  double sec = tool_bench_engine(e, &pr->req, a->reps, &st);
  int rc = 0;
  if (sec < 0) {
    fprintf(stderr, "bench-peers-attn: %s\n", st.message);
    rc = 1;
  } else {
    print_json(a, &pr->req, e, sec);
  }
  attn_engine_close(e);
  if (grads) {
    rc = rc || (a->out && write_grads(a, &pr->req) < 0);
    free(dout);
    free(grads);
    return rc;
  }
  if (rc == 0 && a->out) {
    void *buf;
    size_t len;
    if (attn_proto_encode_safetensors(pr, &buf, &len, &st) < 0) {
      fprintf(stderr, "bench-peers-attn: %s\n", st.message);
      return 1;
    }
    rc = write_file(a->out, buf, len) < 0;
    free(buf);
  }
  return rc;
}

int main(int argc, char **argv) {
  peers_args a;
  if (parse_args(argc, argv, &a) < 0)
    return usage();
  size_t len;
  char *body = slurp(a.in, &len);
  if (!body)
    return 1;
  attn_proto_req pr;
  attn_status st = {0};
  if (attn_proto_decode_safetensors(body, len, NULL, &pr, &st) < 0) {
    fprintf(stderr, "bench-peers-attn: %s: %s\n", a.in, st.message);
    free(body);
    return 1;
  }
  int rc = run(&a, &pr);
  attn_proto_req_free(&pr);
  free(body);
  return rc;
}
