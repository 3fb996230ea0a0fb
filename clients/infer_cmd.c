/*
 * infer_cmd.c — `attn infer URL [IN.safetensors]`: one forward pass over HTTP
 * against a running attnd, the way a user's client would make it, with the
 * numbers an operator wants: the status, where the time went (connect,
 * upload and server, download), bytes and throughput, GFLOP/s of attention
 * served and, with --check, the reply against float64 standard attention.
 *
 * Tensors come from a safetensors request file, sent byte for byte, or are
 * generated at random for a shape. Options go in the query string after the
 * same option parser the server uses has accepted each one, so a typo is
 * caught here (exit 2) while a combination only the server can judge (e.g.
 * causal with window_right 5) is still sent and answered by the server. The
 * request is also decoded here with the server's codec: that gives the
 * FLOP count, the shapes the reply must have, and the inputs of --check.
 *
 * With --backward the same goes to POST /attention/backward: q, k, v, o,
 * do [, lse] out, dq, dk, dv back, checked against the float64 reference
 * backward.
 *
 * Exit status: 0 success (and --check passed), 1 an error reply, no reply,
 * a malformed reply or a failed check, 2 bad usage or an unreadable IN.
 */
#include "args.h"
#include "benchlib.h"
#include "cmds.h"
#include "files.h"
#include "infer.h"
#include "url.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const char usage[] =
    "usage: attn infer URL [IN.safetensors] [--shape B,H,N,D] [--shape-kv B,H,N,D]\n"
    "                  [--head-dim-v DV]\n"
    "       attn infer --shards URL1,URL2,... [IN.safetensors] [flags as above]\n"
    "                  [--dtype F32|F16|BF16] [--seed N] [--json] [--causal] [--scale X]\n"
    "                  [--window-left N] [--window-right N] [--diag-offset N] [--stats]\n"
    "                  [--softcap X] [--alibi-slopes S1,S2,...|FILE.safetensors]\n"
    "                  [--sinks S1,S2,...|FILE.safetensors]\n"
    "                  [--cu-seqlens-q a,b,... --cu-seqlens-kv a,b,...]\n"
    "                  [--backend auto|cpu|cuda|reference] [--check] [--out FILE]\n"
    "                  [--timeout SECONDS] [--quiet] [--backward]\n"
    "\n"
    "Sends one attention request to the attnd at URL (e.g. http://127.0.0.1:8080;\n"
    "the request goes to URL/attention) and prints the status, the time spent\n"
    "connecting, uploading plus computing (until the first byte of the reply) and\n"
    "downloading, bytes and MB/s each way, and GFLOP/s served (4*D per visible\n"
    "query-key pair over the total time).\n"
    "\n"
    "  IN              a safetensors request (q, k, v), sent as is\n"
    "  --shape         without IN: random q of this shape (default 1,1,128,64)\n"
    "  --shape-kv      k and v (default: --shape; B and D must match it)\n"
    "  --head-dim-v    v's last dimension Dv, the value head dim (default D; DeepSeek's\n"
    "                  MLA prefill: D 192, Dv 128): v and o (a backward's do, dv) end\n"
    "                  in Dv, q and k in D; the default scale stays 1/sqrt(D)\n"
    "  --dtype, --seed the random tensors' dtype (default F32) and seed (default 1)\n"
    "  --json          send a JSON body instead of safetensors\n"
    "  --causal, --scale, --window-left, --window-right, --diag-offset, --stats,\n"
    "  --backend, --softcap\n"
    "                  options, checked here, sent in the query string (IN's\n"
    "                  __metadata__ wins over them, as always over HTTP)\n"
    "  --alibi-slopes  without IN: ALiBi slopes sent as the F32 tensor alibi_slopes,\n"
    "                  a comma list of Hq numbers ([Hq]) or B*Hq ([B, Hq]), or a\n"
    "                  NAME.safetensors file holding alibi_slopes (F32 [Hq] or [B, Hq]);\n"
    "                  with IN, IN's own tensor alibi_slopes is used\n"
    "  --sinks         without IN: attention sinks (gpt-oss) sent as the F32 tensor\n"
    "                  sinks [Hq], one logit a query head: a comma list of Hq numbers\n"
    "                  or a NAME.safetensors file holding sinks; with IN, IN's own\n"
    "                  tensor sinks is used. A backward reply then has dsinks too\n"
    "  --cu-seqlens-q, --cu-seqlens-kv\n"
    "                  without IN: a variable-length batch, B+1 offsets each (sent as I64\n"
    "                  tensors cu_seqlens_q/kv); q is [Hq, total_q, D], k and v [Hkv,\n"
    "                  total_kv, D]. B and the totals come from the offsets (count - 1,\n"
    "                  last value), Hq, Hkv and D from --shape/--shape-kv, whose B and N,\n"
    "                  when given, must agree.\n"
    "  --check         compare the reply with float64 standard attention (a varlen\n"
    "                  batch one sequence at a time, forward only): normalized\n"
    "                  error of o within 1e-5 (F32), 1e-3 (F16), 8e-3 (BF16); m, l,\n"
    "                  lse within 1e-5 relative to max(1, |ref|)\n"
    "  --out FILE      write the reply as a safetensors file (atomically)\n"
    "  --backward      the backward pass: POST URL/attention/backward with q, k, v,\n"
    "                  o, do [, lse] (IN must hold them; without IN, o and lse come\n"
    "                  from a forward pass run here and do is random); the reply is\n"
    "                  dq, dk, dv (and dsinks with sinks), and --check compares them\n"
    "                  with the float64 reference backward (same tolerances as o)\n"
    "  --shards URLS   exact attention with K/V split along Nkv across these servers\n"
    "                  (comma-separated base URLs, no URL argument): shard [a, b) goes\n"
    "                  to one server with diag_offset = off - a and stats, all in\n"
    "                  parallel, and the answers are merged by lse (forward only)\n"
    "  --timeout S     give up after S seconds (default 300; 0: never)\n"
    "  --quiet         print only errors\n"
    "\n"
    "Exit status: 0 success, 1 an error reply, no reply or a failed check, 2 bad\n"
    "usage or an unreadable IN.\n";

#define ME TOOL_INFER_ME

/* Query-string text of a validated option value: everything but RFC 3986's
 * unreserved characters percent-encoded ('+' would otherwise read as a
 * space in "scale=+0.5"). */
static void query_add(attn_sbuf *q, const char *name, const char *value) {
  attn_sbuf_printf(q, "%c%s=", q->len ? '&' : '?', name);
  for (const unsigned char *p = (const unsigned char *)value; *p; p++) {
    if ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
        strchr("-._~", *p))
      attn_sbuf_put(q, (const char *)p, 1);
    else
      attn_sbuf_printf(q, "%%%02X", *p);
  }
}

/* One flag of attn infer's own (not an API option); 0, or 2 after a
 * message. */
static int infer_flag(int c, tool_infer_args *a) {
  switch (c) {
  case 'p': a->have_shape = true; return tool_arg_dims("--shape", optarg, a->shape) < 0 ? 2 : 0;
  case 'v':
    return tool_arg_i64("--head-dim-v", optarg, 1, ATTN_MAX_HEAD_DIM_V, &a->head_dim_v) < 0 ? 2 : 0;
  case 'P':
    a->have_shape_kv = true;
    return tool_arg_dims("--shape-kv", optarg, a->shape_kv) < 0 ? 2 : 0;
  case 't': a->have_dtype = true; return tool_arg_dtype("--dtype", optarg, &a->dtype) < 0 ? 2 : 0;
  case 'r': {
    int64_t v;
    if (tool_arg_i64("--seed", optarg, 0, INT64_MAX, &v) < 0)
      return 2;
    a->seed = (uint64_t)v;
    a->have_seed = true;
    return 0;
  }
  case 'j': a->json = true; return 0;
  case 'k': a->check = true; return 0;
  case 'Q': a->quiet = true; return 0;
  case 'W': a->pass = ATTN_BACKWARD; return 0;
  case 'o': a->out = optarg; return 0;
  case 'A': return tool_infer_parse_slopes(optarg, a);
  case 'G': return tool_infer_parse_sinks(ME, optarg, &a->sinks, &a->nsinks);
  case 'U': return tool_infer_parse_offsets("--cu-seqlens-q", optarg, &a->cu_q, &a->ncu_q);
  case 'V': return tool_infer_parse_offsets("--cu-seqlens-kv", optarg, &a->cu_kv, &a->ncu_kv);
  case 'D': a->shards = optarg; return 0;
  case 'T': return tool_arg_double("--timeout", optarg, 0, 1e6, &a->timeout) < 0 ? 2 : 0;
  default: fputs(usage, stderr); return 2;
  }
}

/* getopt over argv; 0, 2 after a message, or -1 for --help (printed). */
static int parse_flags(int argc, char **argv, tool_infer_args *a) {
  static const struct option lopts[] = {{"shape", required_argument, 0, 'p'},
                                        {"shape-kv", required_argument, 0, 'P'},
                                        {"head-dim-v", required_argument, 0, 'v'},
                                        {"dtype", required_argument, 0, 't'},
                                        {"seed", required_argument, 0, 'r'},
                                        {"json", no_argument, 0, 'j'},
                                        TOOL_API_OPTIONS,
                                        {"check", no_argument, 0, 'k'},
                                        {"out", required_argument, 0, 'o'},
                                        {"timeout", required_argument, 0, 'T'},
                                        {"quiet", no_argument, 0, 'Q'},
                                        {"backward", no_argument, 0, 'W'},
                                        {"alibi-slopes", required_argument, 0, 'A'},
                                        {"sinks", required_argument, 0, 'G'},
                                        {"shards", required_argument, 0, 'D'},
                                        {"cu-seqlens-q", required_argument, 0, 'U'},
                                        {"cu-seqlens-kv", required_argument, 0, 'V'},
                                        {"help", no_argument, 0, 'x'},
                                        {0, 0, 0, 0}};
  int c;
  optind = 1;
  opterr = 1;
  while ((c = getopt_long(argc, argv, "", lopts, NULL)) != -1) {
    const char *name, *value;
    /* The server's parser judges each value now; what only the server can
     * judge (combinations) is left to it. */
    int rc = tool_arg_api_option(c, optarg, ME, &a->opts, &name, &value);
    if (rc < 0)
      return 2;
    if (rc > 0) {
      query_add(&a->query, name, value);
      continue;
    }
    if (c == 'x') {
      fputs(usage, stdout);
      return -1;
    }
    if ((rc = infer_flag(c, a)) != 0)
      return rc;
  }
  return 0;
}

/* Parses argv into a; returns 0, or 2 after one line on stderr, or -1 for
 * --help (printed). */
static int parse_args(int argc, char **argv, tool_infer_args *a) {
  int rc = parse_flags(argc, argv, a);
  if (rc != 0)
    return rc;
  int npos = argc - optind, nurl = a->shards ? 0 : 1;
  if (npos < nurl || npos > nurl + 1) {
    fprintf(stderr, ME ": expected %s\n%s",
            a->shards ? "at most one IN file with --shards" : "URL and at most one IN file", usage);
    return 2;
  }
  if (a->shards && (a->pass == ATTN_BACKWARD || a->out)) {
    fprintf(stderr, ME ": --shards runs the forward pass and has no single reply to write; "
                       "leave out --backward and --out\n");
    return 2;
  }
  a->url = a->shards ? "http://shards" : argv[optind];
  a->in = npos > nurl ? argv[optind + nurl] : NULL;
  if (a->in && (a->alibi || a->sinks)) {
    const char *f = a->alibi ? "--alibi-slopes" : "--sinks",
               *t = a->alibi ? "alibi_slopes" : "sinks";
    fprintf(stderr,
            ME ": %s goes with random tensors; with IN, IN's own tensor %s is used: put "
               "it there\n",
            f, t);
    return 2;
  }
  attn_status st;
  if (attn_url_base(a->url, &st) < 0) {
    fprintf(stderr, ME ": %s\n", st.message);
    return 2;
  }
  if (a->in && (a->have_shape || a->have_shape_kv || a->have_dtype || a->have_seed || a->json ||
                a->head_dim_v)) {
    fprintf(stderr, ME ": --shape, --shape-kv, --head-dim-v, --dtype, --seed and --json make "
                       "random tensors; IN is sent as it is (its v gives Dv)\n");
    return 2;
  }
  if (tool_infer_varlen_shapes(a) != 0)
    return 2;
  if (!a->have_shape_kv && !a->cu_q)
    memcpy(a->shape_kv, a->shape, sizeof a->shape);
  if (a->shape_kv[0] != a->shape[0] || a->shape_kv[3] != a->shape[3]) {
    fprintf(stderr,
            ME ": --shape-kv %lld,%lld,%lld,%lld must have --shape's batch (%lld) and "
               "head dim (%lld)\n",
            (long long)a->shape_kv[0], (long long)a->shape_kv[1], (long long)a->shape_kv[2],
            (long long)a->shape_kv[3], (long long)a->shape[0], (long long)a->shape[3]);
    return 2;
  }
  if (a->query.oom) {
    fprintf(stderr, ME ": out of memory\n");
    return 2;
  }
  return 0;
}

/* Elements of a tensor, or 0 when the count overflows (or passes 2^40:
 * nobody sends a terabyte, and random generation must not wrap). */
static size_t elems(const int64_t s[4]) {
  uint64_t n = 1;
  for (int i = 0; i < 4; i++)
    if (__builtin_mul_overflow(n, (uint64_t)s[i], &n) || n > (uint64_t)1 << 40)
      return 0;
  return (size_t)n;
}

/* The random tensors of a request: q, k, v (and o) in bc; a backward
 * request's do and lse beside them. */
typedef struct infer_bufs {
  tool_bench_case bc;
  void *dout;
  float *lse;
} infer_bufs;

static void infer_bufs_free(infer_bufs *b) {
  tool_bench_case_free(&b->bc);
  free(b->dout);
  free(b->lse);
}

/* A backward request's own inputs for b's q, k, v: o and lse from a forward
 * pass run here with the flags' options (as a training step has them), do
 * random from the seed. A forward the options make impossible leaves o zero
 * and lse out: the server then says what is wrong. Returns 0, or the exit
 * status after a message. */
static int backward_inputs(const tool_infer_args *a, infer_bufs *b) {
  attn_request *r = &b->bc.req;
  const int64_t nb = r->cu_seqlens_q ? 1 : r->batch; /* varlen: [Hq, total, Dv] */
  size_t nq = (size_t)(nb * r->heads_q * r->seq_q * attn_request_dv(r)); /* o's, do's */
  size_t rows = (size_t)(nb * r->heads_q * r->seq_q);
  b->dout = malloc(nq * attn_dtype_size(r->dtype));
  b->lse = malloc(rows * sizeof *b->lse);
  if (!b->dout || !b->lse) {
    fprintf(stderr, ME ": out of memory for the random tensors\n");
    return 1;
  }
  uint64_t seed = a->seed ^ 0x9e3779b97f4a7c15u;
  for (size_t i = 0; i < nq; i++)
    attn_store_elem(b->dout, r->dtype, i,
                    (float)((double)(seed = seed * 6364136223846793005u + 1) / 0x1p64 * 2 - 1));
  attn_request f = *r;
  f.scale = a->opts.scale;
  f.causal = a->opts.causal;
  f.window_left = a->opts.window_left;
  f.window_right = a->opts.window_right;
  f.softcap = a->opts.softcap;
  f.diag_offset = a->opts.diag_offset;
  f.lse = b->lse;
  attn_status st;
  attn_engine *e = tool_bench_open(0, NULL, NULL, &st);
  bool ok = e && attn_engine_run(e, &f, NULL, &st) == 0;
  attn_engine_close(e);
  if (!ok && !a->quiet)
    fprintf(stderr, ME ": no local forward pass for o (%s); sending o = 0\n", st.message);
  if (!ok)
    memset(r->o, 0, nq * attn_dtype_size(r->dtype));
  r->pass = ATTN_BACKWARD;
  r->dout = b->dout;
  r->lse_in = ok ? b->lse : NULL;
  return 0;
}

/* r's tensors as a codec would hand them to attn_proto_build_pass(): [B, H,
 * N, D] (v, o, do: Dv), or for a variable-length batch [H, total, D] and the
 * offsets. */
static void tensor_table(const attn_request *r, attn_proto_tensor t[ATTN_PROTO_MAX_TENSORS]) {
  const int drop = r->cu_seqlens_q ? 1 : 0; /* no B dimension */
  const int64_t sq[4] = {r->batch, r->heads_q, r->seq_q, r->head_dim};
  const int64_t skv[4] = {r->batch, r->heads_kv, r->seq_kv, r->head_dim};
  const int64_t so[4] = {r->batch, r->heads_q, r->seq_q, attn_request_dv(r)};
  const int64_t sv[4] = {r->batch, r->heads_kv, r->seq_kv, attn_request_dv(r)};
  const int64_t *shapes[ATTN_PROTO_T_ALIBI] = {sq, skv, sv, so, so, sq};
  const void *data[ATTN_PROTO_T_ALIBI] = {r->q, r->k, r->v, r->o, r->dout, r->lse_in};
  memset(t, 0, ATTN_PROTO_MAX_TENSORS * sizeof *t);
  for (int i = 0; i < ATTN_PROTO_T_ALIBI; i++) {
    bool lse = i == ATTN_PROTO_T_LSE;
    t[i] = (attn_proto_tensor){
        attn_proto_tensor_name(i), lse ? ATTN_F32 : r->dtype, (lse ? 3 : 4) - drop, {0}, data[i]};
    memcpy(t[i].shape, shapes[i] + drop, (size_t)t[i].rank * sizeof *t[i].shape);
  }
  t[ATTN_PROTO_T_ALIBI] =
      (attn_proto_tensor){"alibi_slopes",
                          ATTN_F32,
                          r->alibi_stride_b ? 2 : 1,
                          {r->alibi_stride_b ? r->batch : r->heads_q, r->heads_q},
                          r->alibi_slopes};
  for (int i = 0; i < 2; i++)
    t[ATTN_PROTO_T_CU_Q + i] = (attn_proto_tensor){attn_proto_tensor_name(ATTN_PROTO_T_CU_Q + i),
                                                   ATTN_F32,
                                                   1,
                                                   {r->batch + 1},
                                                   i ? r->cu_seqlens_kv : r->cu_seqlens_q};
  t[ATTN_PROTO_T_SINKS] = (attn_proto_tensor){"sinks", ATTN_F32, 1, {r->heads_q}, r->sinks};
}

/* bc's v and o made Dv wide: v random from seed, o zero, q and k kept (the
 * case was made with one head dim). 0, or 1 after a message. */
static int widen_v(tool_bench_case *bc, int64_t dv, uint64_t seed) {
  attn_request *r = &bc->req;
  const size_t es = attn_dtype_size(r->dtype);
  const size_t nq = (size_t)(r->batch * r->heads_q * r->seq_q * r->head_dim),
               nk = (size_t)(r->batch * r->heads_kv * r->seq_kv * r->head_dim),
               nv = (size_t)(r->batch * r->heads_kv * r->seq_kv * dv),
               no = (size_t)(r->batch * r->heads_q * r->seq_q * dv);
  char *m = malloc((nq + nk + nv + no) * es);
  if (!m) {
    fprintf(stderr, ME ": out of memory for the random tensors\n");
    return 1;
  }
  memcpy(m, r->q, nq * es);
  memcpy(m + nq * es, r->k, nk * es);
  seed ^= 0x5851f42d4c957f2du; /* v's own stream, not k's again */
  for (size_t i = 0; i < nv; i++)
    attn_store_elem(m + (nq + nk) * es, r->dtype, i,
                    (float)((double)(seed = seed * 6364136223846793005u + 1) / 0x1p64 * 2 - 1));
  memset(m + (nq + nk + nv) * es, 0, no * es);
  free(bc->mem);
  bc->mem = m;
  r->q = m, r->k = m + nq * es, r->v = m + (nq + nk) * es, r->o = m + (nq + nk + nv) * es;
  r->head_dim_v = dv;
  return 0;
}

/*
 * Random tensors for the shapes: the body to send in *pbody, and pr built
 * from the same tensors with the flags' options (the checks a codec makes;
 * *local_err gets the message when they refuse, and the server is asked
 * anyway). Returns 0, or the exit status after a message.
 */
static int make_random(tool_infer_args *a, infer_bufs *ib, char **pbody, size_t *plen,
                       attn_proto_req *pr, bool *local_ok, char *local_err, size_t cap) {
  tool_bench_case *bc = &ib->bc;
  if (!elems(a->shape) || !elems(a->shape_kv)) {
    fprintf(stderr, ME ": --shape/--shape-kv: too many elements to generate\n");
    return 2;
  }
  /* A variable-length batch is one [H, total, D] problem in memory. */
  if (tool_bench_case_init(bc, a->cu_q ? 1 : a->shape[0], a->shape[1], a->shape_kv[1], a->shape[2],
                           a->shape_kv[2], a->shape[3], a->dtype, false, a->seed) < 0) {
    fprintf(stderr, ME ": out of memory for the random tensors\n");
    return 1;
  }
  int rc;
  if (a->head_dim_v && a->head_dim_v != a->shape[3] && (rc = widen_v(bc, a->head_dim_v, a->seed)))
    return rc;
  if (a->cu_q) { /* one [H, total, D] tensor each, sequences concatenated */
    bc->req.batch = a->shape[0];
    bc->req.cu_seqlens_q = a->cu_q;
    bc->req.cu_seqlens_kv = a->cu_kv;
  }
  if (a->alibi) { /* [Hq] or [B, Hq]: the encoder reads that many */
    if (tool_infer_alibi_shape(a, &bc->req.alibi_stride_b) != 0)
      return 2;
    bc->req.alibi_slopes = a->alibi;
  }
  if (a->sinks && a->nsinks != a->shape[1]) {
    fprintf(stderr, ME ": --sinks has %lld numbers; give Hq = %lld, one a query head\n",
            (long long)a->nsinks, (long long)a->shape[1]);
    return 2;
  }
  bc->req.sinks = a->sinks;
  if (a->pass == ATTN_BACKWARD && (rc = backward_inputs(a, ib)) != 0)
    return rc;
  const attn_request *r = &bc->req;
  attn_proto_tensor t[ATTN_PROTO_MAX_TENSORS];
  tensor_table(r, t);
  attn_status st;
  *local_ok = attn_proto_build_pass(pr, a->pass, t, &a->opts, &st) == 0;
  if (!*local_ok)
    snprintf(local_err, cap, "%s", st.message);
  void *b = NULL;
  if ((a->json ? attn_proto_encode_request_json(r, NULL, pbody, plen, &st)
               : attn_proto_encode_request_safetensors(r, NULL, &b, plen, &st)) < 0) {
    fprintf(stderr, ME ": %s\n", st.message);
    return 1;
  }
  if (!a->json)
    *pbody = b;
  return 0;
}

/* The request body and pr (the request as this client's codec reads it:
 * the reply's expected shapes, the FLOPs, --check's inputs); a body the
 * codec refuses is still sent, with *local_ok false and the reason in
 * local_err. 0, or the exit status after a message. */
static int make_request(tool_infer_args *a, infer_bufs *ib, char **pbody, size_t *plen,
                        attn_proto_req *pr, bool *local_ok, char *local_err, size_t cap) {
  if (!a->in)
    return make_random(a, ib, pbody, plen, pr, local_ok, local_err, cap);
  void *body;
  if (tool_read_file(a->in, &body, plen) < 0) {
    fprintf(stderr, ME ": cannot read %s: %s\n", a->in, strerror(errno));
    return 2;
  }
  *pbody = body;
  /* With the flags as query options, so IN's __metadata__ wins here as on
   * the server. A file the codec refuses is still sent: the server's
   * answer to it may be the point. */
  attn_status st;
  *local_ok = attn_proto_decode_safetensors_pass(body, *plen, a->pass, &a->opts, pr, &st) == 0;
  if (!*local_ok)
    snprintf(local_err, cap, "%s: %s", a->in, st.message);
  return 0;
}

/* A 2xx reply: decoded against pr (by its Content-Type, not by what was
 * asked: a server that answers otherwise is caught), written to --out,
 * reported and checked. The exit status. */
static int handle_reply(const tool_infer_args *a, attn_proto_req *pr, const tool_infer_reply *r,
                        const char *url, size_t up) {
  bool st_reply = !strncasecmp(r->ctype, "application/octet-stream", 24);
  char backend[32] = "";
  attn_status st;
  if ((st_reply ? attn_proto_decode_reply_safetensors(r->body.p, r->body.len, pr, &st)
                : attn_proto_decode_reply_json(r->body.p, r->body.len, pr, backend, sizeof backend,
                                               &st)) < 0) {
    fprintf(stderr, ME ": HTTP %ld with a malformed %s reply: %s\n", r->http,
            st_reply ? "safetensors" : "JSON", st.message);
    return 1;
  }
  int status = 0;
  if (a->out && !st_reply) {
    fprintf(stderr, ME ": the reply is %s, not safetensors; %s not written\n",
            *r->ctype ? r->ctype : "untyped", a->out);
    status = 1;
  } else if (a->out && tool_write_file(a->out, r->body.p, r->body.len) < 0) {
    fprintf(stderr, ME ": cannot write %s: %s\n", a->out, strerror(errno));
    status = 1;
  }
  if (!a->quiet)
    tool_infer_print_report(a, pr, r, url, st_reply, backend, up, a->out && status == 0);
  if (a->check && tool_infer_check(a, pr) != 0)
    status = 1;
  return status;
}

/* Sends the request and judges the reply; the exit status. */
static int exchange(const tool_infer_args *a, attn_proto_req *pr, const char *body, size_t len,
                    bool local_ok, const char *local_err) {
  attn_sbuf url = {0};
  tool_infer_url(a, &url);
  tool_infer_reply r = {0};
  int status;
  if (url.oom) {
    fprintf(stderr, ME ": cannot initialize libcurl\n");
    status = 1;
  } else if ((status = tool_infer_send(a, url.p, body, len, &r)) != 0) {
  } else if (r.http < 200 || r.http > 299) {
    tool_infer_print_error(&r);
    status = 1;
  } else if (!local_ok) {
    /* The server computed what this client's codec refuses: one of them is
     * wrong, and the reply cannot be read against expected shapes. */
    fprintf(stderr, ME ": HTTP %ld for a request this client's codec refuses (%s)\n", r.http,
            local_err);
    status = 1;
  } else {
    status = handle_reply(a, pr, &r, url.p, len);
  }
  tool_infer_reply_free(&r);
  free(url.p);
  return status;
}

int tool_cmd_infer(int argc, char **argv) {
  tool_infer_args a = {.shape = {1, 1, 128, 64}, .dtype = ATTN_F32, .seed = 1, .timeout = 300};
  attn_options_init(&a.opts);
  int status = parse_args(argc, argv, &a);
  if (status != 0) {
    free(a.query.p);
    free(a.alibi);
    free(a.sinks);
    free(a.cu_q);
    free(a.cu_kv);
    return status < 0 ? 0 : status;
  }
  char *body = NULL;
  size_t body_len = 0;
  infer_bufs ib = {0};
  attn_proto_req pr;
  memset(&pr, 0, sizeof pr);
  bool local_ok = false;
  char local_err[ATTN_MSG_MAX + 64] = "";
  status = make_request(&a, &ib, &body, &body_len, &pr, &local_ok, local_err, sizeof local_err);
  if (status == 0 && a.shards && !local_ok) {
    fprintf(stderr, ME ": --shards: %s\n", local_err);
    status = 1;
  } else if (status == 0 && a.shards && pr.req.sinks) {
    /* each shard's softmax would hold the sink once more than the whole's */
    fprintf(stderr, ME ": --shards does not merge sinks yet; send a request with sinks to one "
                       "server\n");
    status = 2;
  } else if (status == 0 && a.shards) {
    status = tool_infer_sharded(&a, &pr);
  } else if (status == 0) {
    status = exchange(&a, &pr, body, body_len, local_ok, local_err);
  }
  attn_proto_req_free(&pr);
  infer_bufs_free(&ib);
  free(body);
  free(a.query.p);
  free(a.alibi);
  free(a.sinks);
  free(a.cu_q);
  free(a.cu_kv);
  return status;
}
