/*
 * load_cmd.c — `attn load`: an HTTP load generator for attnd. The command
 * line: its flags and URL, the body to send (a file, or random tensors
 * encoded by proto/), the request head, and the report; the run itself is
 * the scheduler's (load_sched.h) over its connections (load_conn.h).
 */
#include "args.h"
#include "benchlib.h"
#include "cmds.h"
#include "files.h"
#include "load_report.h"
#include "load_sched.h"
#include "proto.h"
#include "session.h"
#include "url.h"

#include <errno.h>
#include <netdb.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>
#include <uv.h>

static const char usage[] =
    "usage: attn load URL [--concurrency N | --rate R] [--duration S | --requests N]\n"
    "                 [--body FILE | --shape B,H,N,D [--shape-kv B,H,N,D] [--dtype T]]\n"
    "                 [--json-body] [--path /attention] [--query \"causal=true\"]\n"
    "                 [--timeout S] [--json]\n"
    "       attn load URL --session N [--steps M] [--prefill P] [--shape 1,Hq,T,D]\n"
    "                 [--shape-kv 1,Hkv,T,D] [--dtype T] [--query Q] [--timeout S] [--json]\n"
    "\n"
    "Sends POST requests to attnd (URL http://HOST:PORT, IPv4 or a name) on keep-alive\n"
    "connections and reports requests/s, GFLOP/s served, latency percentiles and errors.\n"
    "\n"
    "  --concurrency N  closed loop: N connections, each sends when its answer is in\n"
    "                   (default 8)\n"
    "  --rate R         open loop: R requests/s at fixed intended start times over a pool\n"
    "                   of up to 1024 connections; latency counts from the intended start\n"
    "  --duration S     run S seconds (default 10); requests still out are \"in flight\"\n"
    "  --requests N     stop after N requests were sent and answered (or failed)\n"
    "  --body FILE      send FILE as the body (safetensors; JSON with --json-body)\n"
    "  --shape B,H,N,D  generate random q (and k, v) of this shape (default 1,8,512,64)\n"
    "  --shape-kv B,H,N,D  k and v shape (default: the --shape)\n"
    "  --dtype T        F32 (default), F16 or BF16\n"
    "  --json-body      send JSON (Content-Type application/json), not safetensors\n"
    "  --path P         request path (default: the URL's, else /attention)\n"
    "  --query Q        query string, e.g. causal=true (default: the URL's)\n"
    "  --timeout S      a request unanswered after S seconds is an error (default 30)\n"
    "  --json           print one JSON object instead of the text report\n"
    "\n"
    "Sessions (server-held KV caches, decoding): --session N creates N sessions, a thread\n"
    "and a connection each, and each decodes at once with the others:\n"
    "  --session N      N concurrent sessions (1 to 1024), deleted at the end\n"
    "  --steps M        decode steps per session (default 64): one call each with q and\n"
    "                   the new tokens' k, v at the position the session tracks\n"
    "  --prefill P      first append P tokens in one call (default 0; not timed)\n"
    "  --shape 1,Hq,T,D q of a step [Hq, T, D] (default 1,8,1,64): T tokens a step\n"
    "  --shape-kv 1,Hkv,T,D  k and v of a step (default: Hkv = Hq)\n"
    "It reports per-step latency percentiles (send to reply) and tokens/s over the\n"
    "decode; a session whose step fails stops (its failed steps are counted).\n"
    "\n"
    "Exit status: 0 when the run completed (HTTP errors are reported, not fatal),\n"
    "1 when no connection could be made (with --session: a session could not be\n"
    "created), 2 bad usage.\n";

/* ---- setup ---------------------------------------------------------------- */

/* The URL as attn load takes it: plain HTTP to an IPv4 address or a name. */
static int load_url(const char *s, attn_url *u) {
  attn_status st;
  if (strncasecmp(s, "http://", 7) != 0) {
    fprintf(stderr, "attn load: the URL must start with http:// (\"%s\")\n", s);
    return -1;
  }
  if (attn_url_parse(s, u, &st) < 0) {
    fprintf(stderr, "attn load: %s\n", st.message);
    return -1;
  }
  if (u->ipv6) {
    fprintf(stderr, "attn load: connects over IPv4; \"%s\" names an IPv6 address\n", s);
    return -1;
  }
  return 0;
}

static int resolve(const char *host, int port, struct sockaddr_in *out) {
  if (strcmp(host, "localhost") == 0)
    host = "127.0.0.1";
  if (uv_ip4_addr(host, port, out) == 0)
    return 0;
  struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *res;
  if (getaddrinfo(host, NULL, &hints, &res) != 0 || !res)
    return -1;
  memcpy(out, res->ai_addr, sizeof *out);
  out->sin_port = htons((uint16_t)port);
  freeaddrinfo(res);
  return 0;
}

/* FLOPs of one request as the server will see it (the body decoded with the
 * query's options), or -1 when the body cannot be decoded here. */
static double body_flops(const char *body, size_t len, bool json, const char *query, char *desc,
                         size_t cap) {
  attn_options q;
  attn_status st;
  attn_options_init(&q);
  if (query && *query && attn_options_parse_query(&q, query, &st) != 0) {
    snprintf(desc, cap, "query not understood here: %s", st.message);
    return -1;
  }
  attn_proto_req pr;
  memset(&pr, 0, sizeof pr);
  int rc = json ? attn_proto_decode_json(body, len, &q, &pr, &st)
                : attn_proto_decode_safetensors(body, len, &q, &pr, &st);
  if (rc != 0) {
    snprintf(desc, cap, "not a request body here (%s)", st.message);
    return -1;
  }
  const attn_request *r = &pr.req;
  double f = attn_request_flops(r);
  snprintf(desc, cap, "q [%lld,%lld,%lld,%lld] kv [%lld,%lld,%lld,%lld] %s%s, %.4g GFLOP a request",
           (long long)r->batch, (long long)r->heads_q, (long long)r->seq_q, (long long)r->head_dim,
           (long long)r->batch, (long long)r->heads_kv, (long long)r->seq_kv,
           (long long)r->head_dim, attn_dtype_name(r->dtype), r->causal ? " causal" : "", f * 1e-9);
  attn_proto_req_free(&pr);
  return f;
}

/* ---- the command ----------------------------------------------------------- */

typedef struct load_args {
  int concurrency;
  double rate, duration, timeout;
  int64_t nreq, shape[4], shape_kv[4];
  bool have_c, have_r, have_d, have_n, have_shape, have_kv, have_dt, json_body, json_out;
  int sessions; /* --session N; 0: not a session run */
  int64_t steps, prefill;
  bool have_steps, have_prefill;
  attn_dtype dt;
  const char *body_file, *path, *query;
  attn_url u;
} load_args;

/* The flags of a session run: 0, -1 after a message, 1 when c is not one. */
static int session_flag(int c, load_args *a) {
  switch (c) {
  case 'S': return tool_arg_int("--session", optarg, 1, TOOL_LOAD_MAX_POOL, &a->sessions);
  case 'M': a->have_steps = true; return tool_arg_i64("--steps", optarg, 1, 1 << 30, &a->steps);
  case 'P':
    a->have_prefill = true;
    return tool_arg_i64("--prefill", optarg, 1, 1 << 30, &a->prefill);
  }
  return 1;
}

/* getopt over argv into a; 0, 2 after a message, or -1 for --help. */
static int parse_flags(int argc, char **argv, load_args *a) {
  static const struct option opts[] = {{"concurrency", required_argument, 0, 'c'},
                                       {"rate", required_argument, 0, 'r'},
                                       {"duration", required_argument, 0, 'd'},
                                       {"requests", required_argument, 0, 'n'},
                                       {"body", required_argument, 0, 'b'},
                                       {"shape", required_argument, 0, 's'},
                                       {"shape-kv", required_argument, 0, 'k'},
                                       {"dtype", required_argument, 0, 't'},
                                       {"json-body", no_argument, 0, 'J'},
                                       {"path", required_argument, 0, 'p'},
                                       {"query", required_argument, 0, 'q'},
                                       {"timeout", required_argument, 0, 'T'},
                                       {"json", no_argument, 0, 'j'},
                                       {"session", required_argument, 0, 'S'},
                                       {"steps", required_argument, 0, 'M'},
                                       {"prefill", required_argument, 0, 'P'},
                                       {"help", no_argument, 0, 'h'},
                                       {0, 0, 0, 0}};
  int c, bad = 0;
  optind = 1;
  while (!bad && (c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
    switch (c) {
    case 'c':
      bad = tool_arg_int("--concurrency", optarg, 1, TOOL_LOAD_MAX_POOL, &a->concurrency);
      a->have_c = true;
      break;
    case 'r':
      bad = tool_arg_double("--rate", optarg, 1e-3, 1e7, &a->rate);
      a->have_r = true;
      break;
    case 'd':
      bad = tool_arg_double("--duration", optarg, 1e-3, 1e7, &a->duration);
      a->have_d = true;
      break;
    case 'n':
      bad = tool_arg_i64("--requests", optarg, 1, INT64_MAX / 2, &a->nreq);
      a->have_n = true;
      break;
    case 'b': a->body_file = optarg; break;
    case 's':
      bad = tool_arg_dims("--shape", optarg, a->shape);
      a->have_shape = true;
      break;
    case 'k':
      bad = tool_arg_dims("--shape-kv", optarg, a->shape_kv);
      a->have_kv = true;
      break;
    case 't':
      bad = tool_arg_dtype("--dtype", optarg, &a->dt);
      a->have_dt = true;
      break;
    case 'J': a->json_body = true; break;
    case 'p': a->path = optarg; break;
    case 'q': a->query = optarg; break;
    case 'T': bad = tool_arg_double("--timeout", optarg, 1e-3, 1e7, &a->timeout); break;
    case 'j': a->json_out = true; break;
    case 'h': fputs(usage, stdout); return -1;
    default:
      if ((bad = session_flag(c, a)) > 0) {
        fputs(usage, stderr);
        return 2;
      }
    }
  }
  return bad ? 2 : 0;
}

/* What a session run excludes or needs; NULL when all is well. */
static const char *session_conflicts(const load_args *a) {
  if (!a->sessions)
    return a->have_steps || a->have_prefill ? "--steps and --prefill need --session" : NULL;
  if (a->have_c || a->have_r || a->have_d || a->have_n || a->body_file || a->json_body || a->path)
    return "--session excludes --concurrency, --rate, --duration, --requests, --body, "
           "--json-body and --path";
  if (a->shape[0] != 1 || (a->have_kv && a->shape_kv[0] != 1))
    return "with --session, --shape and --shape-kv are 1,H,T,D (one sequence a session)";
  if (a->have_kv && (a->shape_kv[2] != a->shape[2] || a->shape_kv[3] != a->shape[3]))
    return "--shape-kv must have the T and D of --shape";
  if (a->have_kv && a->shape[1] % a->shape_kv[1] != 0)
    return "Hq (--shape) must be a multiple of Hkv (--shape-kv)";
  return NULL;
}

/* The flags and the URL together; 0, 2 after a message, or -1 for --help. */
static int parse_load_args(int argc, char **argv, load_args *a) {
  int rc = parse_flags(argc, argv, a);
  if (rc != 0)
    return rc;
  if (a->sessions && !a->have_shape)
    a->shape[2] = 1; /* a decode step: one token */
  const char *why = NULL;
  if (optind >= argc)
    why = "no URL";
  else if (optind + 1 < argc)
    why = "more than one URL";
  else if (a->have_c && a->have_r)
    why = "--concurrency and --rate exclude each other";
  else if (a->have_d && a->have_n)
    why = "--duration and --requests exclude each other";
  else if (a->body_file && (a->have_shape || a->have_kv || a->have_dt))
    why = "--body excludes --shape, --shape-kv and --dtype";
  else if (a->have_kv && (a->shape_kv[0] != a->shape[0] || a->shape_kv[3] != a->shape[3]))
    why = "--shape-kv must have the batch and head dim of --shape";
  else if (a->path && a->path[0] != '/')
    why = "--path must start with /";
  else
    why = session_conflicts(a);
  if (why) {
    fprintf(stderr, "attn load: %s\n%s", why, usage);
    return 2;
  }
  if (load_url(argv[optind], &a->u) < 0)
    return 2;
  if (!a->path)
    a->path = a->u.path[0] ? a->u.path : "/attention";
  if (!a->query)
    a->query = a->u.query;
  if (a->query[0] == '?')
    a->query++;
  return 0;
}

/* The body to send: --body's file, or random tensors encoded by proto.
 * 0, or the exit status after a message. */
static int make_body(load_args *a, char **pbody, size_t *plen) {
  if (a->body_file) {
    void *fb;
    if (tool_read_file(a->body_file, &fb, plen) < 0) {
      fprintf(stderr, "attn load: cannot read %s: %s\n", a->body_file, strerror(errno));
      return 2;
    }
    *pbody = fb;
  } else {
    if (!a->have_kv)
      memcpy(a->shape_kv, a->shape, sizeof a->shape_kv);
    tool_bench_case bc;
    if (tool_bench_case_init(&bc, a->shape[0], a->shape[1], a->shape_kv[1], a->shape[2],
                             a->shape_kv[2], a->shape[3], a->dt, false, 42) < 0) {
      fprintf(stderr, "attn load: out of memory for the inputs\n");
      return 1;
    }
    attn_status st;
    void *sb = NULL;
    int erc = a->json_body ? attn_proto_encode_request_json(&bc.req, NULL, pbody, plen, &st)
                           : attn_proto_encode_request_safetensors(&bc.req, NULL, &sb, plen, &st);
    tool_bench_case_free(&bc);
    if (erc < 0) {
      fprintf(stderr, "attn load: %s\n", st.message);
      return 1;
    }
    if (!a->json_body)
      *pbody = sb;
  }
  if (*plen > UINT32_MAX) {
    fprintf(stderr, "attn load: the body is larger than 4 GiB\n");
    return 2;
  }
  return 0;
}

/* The plan and the request head into L (head: the caller's buffer of cap
 * bytes); 0, or the exit status after a message. */
static int load_setup(tool_load *L, const load_args *a, char *head, size_t cap) {
  if (resolve(a->u.host, a->u.port, &L->wire.addr) < 0) {
    fprintf(stderr, "attn load: cannot resolve \"%s\" (IPv4)\n", a->u.host);
    return 1;
  }
  const char *q = a->query;
  bool bad_key;
  const char *key = tool_arg_api_key("attn load", &bad_key);
  if (bad_key)
    return 2;
  int hl =
      snprintf(head, cap,
               "POST %s%s%s HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: %s\r\n"
               "Content-Length: %zu\r\nConnection: keep-alive\r\n"
               "User-Agent: attn-load\r\n%s%.500s%s\r\n",
               a->path, q[0] ? "?" : "", q, a->u.host, a->u.port,
               a->json_body ? "application/json" : "application/octet-stream", L->wire.body_len,
               key ? "Authorization: Bearer " : "", key ? key : "", key ? "\r\n" : "");
  if (hl < 0 || (size_t)hl >= cap) {
    fprintf(stderr, "attn load: path or query too long\n");
    return 2;
  }
  L->wire.head = head;
  L->wire.head_len = (size_t)hl;
  L->open_loop = a->have_r;
  L->concurrency = a->concurrency;
  L->rate = a->rate;
  L->duration = a->duration;
  L->max_requests = a->have_n ? a->nreq : 0;
  L->timeout = a->timeout;
  L->max_pool = a->have_r ? TOOL_LOAD_MAX_POOL : a->concurrency;
  L->progress = isatty(STDOUT_FILENO);
  if (tool_hist_init(&L->hist) < 0) {
    fprintf(stderr, "attn load: out of memory\n");
    return 1;
  }
  return 0;
}

static void load_report(const tool_load *L, const load_args *a, const char *body_desc,
                        double flops) {
  char url[2400];
  snprintf(url, sizeof url, "http://%s:%d%s%s%s", a->u.host, a->u.port, a->path,
           a->query[0] ? "?" : "", a->query);
  if (L->progress)
    printf("\r\033[K");
  tool_load_report R = {.url = url,
                        .body_kind = a->body_file   ? a->body_file
                                     : a->json_body ? "JSON"
                                                    : "safetensors",
                        .body_desc = body_desc,
                        .body_len = L->wire.body_len,
                        .flops = flops,
                        .elapsed = (double)(L->t_end - L->t0) * 1e-9,
                        .open_loop = L->open_loop,
                        .rate = L->rate,
                        .duration = L->duration,
                        .concurrency = L->concurrency,
                        .max_pool = L->max_pool,
                        .connections = L->npool,
                        .max_requests = L->max_requests};
  if (R.elapsed <= 0)
    R.elapsed = 1e-9;
  if (a->json_out)
    tool_load_print_json(&R, &L->n, &L->hist);
  else
    tool_load_print_text(&R, &L->n, &L->hist);
  fflush(stdout);
}

/* `attn load --session N`: the plan from the flags, run by load_session.c. */
static int load_sessions(const load_args *a) {
  char url[400];
  snprintf(url, sizeof url, "http://%s:%d", a->u.host, a->u.port);
  tool_load_session_plan p = {.url = url,
                              .query = a->query,
                              .sessions = a->sessions,
                              .steps = a->steps,
                              .prefill = a->prefill,
                              .tokens = a->shape[2],
                              .heads_q = a->shape[1],
                              .heads_kv = a->have_kv ? a->shape_kv[1] : a->shape[1],
                              .head_dim = a->shape[3],
                              .dtype = a->dt,
                              .timeout = a->timeout,
                              .json = a->json_out};
  return tool_load_sessions(&p);
}

int tool_cmd_load(int argc, char **argv) {
  load_args a = {.concurrency = 8,
                 .duration = 10,
                 .timeout = 30,
                 .shape = {1, 8, 512, 64},
                 .dt = ATTN_F32,
                 .steps = 64};
  int rc = parse_load_args(argc, argv, &a);
  if (rc != 0)
    return rc < 0 ? 0 : rc;
  if (a.sessions)
    return load_sessions(&a);
  char *body = NULL;
  size_t body_len = 0;
  if ((rc = make_body(&a, &body, &body_len)) != 0) {
    free(body);
    return rc;
  }
  char body_desc[512];
  double flops = body_flops(body, body_len, a.json_body, a.query, body_desc, sizeof body_desc);
  tool_load *L = calloc(1, sizeof *L); /* 8 KiB of pool: not on the stack */
  char head[3000];
  if (!L) {
    fprintf(stderr, "attn load: out of memory\n");
    free(body);
    return 1;
  }
  L->wire.body = body;
  L->wire.body_len = body_len;
  if ((rc = load_setup(L, &a, head, sizeof head)) == 0) {
    signal(SIGPIPE, SIG_IGN);
    rc = tool_load_run(L);
    if (L->no_connect) {
      fprintf(stderr, "attn load: cannot connect to %s:%d: %s\n", a.u.host, a.u.port,
              uv_strerror(L->connect_err));
      rc = 1;
    }
    load_report(L, &a, body_desc, flops);
  }
  tool_load_free(L);
  free(L);
  free(body);
  return rc;
}
