/*
 * session_cmd.c — `attn session SUB URL ID`, SUB one of create, get,
 * delete, truncate, fork, attend, export, import, move:
 * attnd's server-held KV caches from the command line, one call each
 * (session.h). attend sends q and the new k, v from a safetensors file or
 * random ones shaped by the session's GET, and prints the layer's length
 * after the call with a summary of o; export, import and move carry a
 * session's file (GET .../export, PUT .../import) between servers.
 */
#include "args.h"
#include "cmds.h"
#include "files.h"
#include "infer.h"
#include "session.h"

#include <curl/curl.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ME "attn session"

static const char usage[] =
    "usage: attn session create   URL ID --heads-kv H --head-dim D --max-tokens N\n"
    "                             [--dtype F32|F16|BF16] [--layers L] [--ttl S]\n"
    "                             [--head-dim-v DV | --v-from-k DV] [--reserve whole|grow]\n"
    "                             [--kv-dtype F8_E4M3|I8]\n"
    "       attn session get      URL ID [--json]\n"
    "       attn session delete   URL ID\n"
    "       attn session truncate URL ID --length N\n"
    "       attn session fork     URL ID NEW [--length N] [--ttl S]\n"
    "       attn session attend   URL ID [--in FILE.safetensors | [--heads-q H] [--seq-q N]\n"
    "                             [--new N] [--seed S]] [--layer L] [--pos P] [--out FILE]\n"
    "                             [--no-causal] [--scale S] [--window-left N] [--window-right N]\n"
    "                             [--softcap C] [--stats] [--backend B]\n"
    "                             [--sinks S1,S2,...|FILE.safetensors]\n"
    "       attn session export   URL ID [--out FILE]\n"
    "       attn session import   URL ID --in FILE\n"
    "       attn session move     URL ID --to URL2\n"
    "\n"
    "A session is a KV cache the attnd at URL (http://HOST:PORT) holds for its client, named\n"
    "by ID (1-128 of [A-Za-z0-9._-], not starting with '_' or '.'): each call sends only q\n"
    "and the new tokens' k and v (the /v1/sessions/ routes; docs/clients.md).\n"
    "\n"
    "  create    PUT /v1/sessions/ID: layers (default 1) of max_tokens tokens of heads_kv x\n"
    "            head_dim in dtype (default F32), reserved at once; dropped --ttl seconds\n"
    "            (default 600) after its last use. An existing one with the same\n"
    "            parameters is found, not remade. --head-dim-v DV: values of a head dim\n"
    "            of their own (1-512; default head_dim). --v-from-k DV: a latent session\n"
    "            (MLA's absorbed decode): it keeps k alone, in half the memory, and reads v\n"
    "            as the first DV columns of each k row (DV <= head_dim); its calls send\n"
    "            q and k only. --reserve grow: its memory is taken as tokens arrive\n"
    "            instead of at once, and an append the server's memory cannot hold is\n"
    "            refused (507, nothing appended); whole (the default) never refuses one.\n"
    "            --kv-dtype F8_E4M3|I8: each appended row stored quantized, a byte an\n"
    "            element and a scale a row (about half BF16's memory); calls still send\n"
    "            dtype and attend over the stored rows.\n"
    "  get       its parameters, each layer's length, bytes reserved, seconds left\n"
    "            (--json: the server's JSON as it is)\n"
    "  delete    DELETE /v1/sessions/ID: its memory is free at once\n"
    "  truncate  every layer longer than --length N is cut to N\n"
    "  fork      POST /v1/sessions/ID/fork: session NEW, holding ID's first --length N\n"
    "            tokens of every layer (default: each layer's own length), with its\n"
    "            parameters and ttl (or --ttl S); the two then change on their own, the\n"
    "            memory of the tokens they share stored once (beam search, sampling)\n"
    "  attend    append k, v to --layer (default 0) at --pos (default: the layer's length),\n"
    "            then attend q over the layer's keys [0, pos + new); prints the length after\n"
    "            the call and a summary of o. --in FILE: a safetensors file holding q\n"
    "            [Hq, Nq, D] and optionally k [Hkv, Nnew, D] and v [Hkv, Nnew, DV] (a\n"
    "            latent session's: k alone), sent as it is; else random q [--heads-q\n"
    "            (default heads_kv), --seq-q (default --new), D], k [heads_kv, --new\n"
    "            (default 1; 0: none), D] and, unless the session is latent, v [heads_kv,\n"
    "            --new, DV] in the session's dtype from --seed (default 1). Causal\n"
    "            (bottom-right) unless --no-causal; the other options are /attention's.\n"
    "            --sinks (without --in): attention sinks (gpt-oss), one logit a query\n"
    "            head, as a comma list or a file holding the F32 tensor sinks [Hq].\n"
    "            --out FILE writes the reply (o [Hq, Nq, DV] [, m, l, lse]).\n"
    "  export    GET /v1/sessions/ID/export: the session as one safetensors file (its\n"
    "            parameters, lengths, and k.L, v.L per layer) into --out FILE (default:\n"
    "            standard output)\n"
    "  import    PUT /v1/sessions/ID/import of such a --in FILE: the session made on\n"
    "            this server (an existing ID is refused, 409)\n"
    "  move      export from URL, import into --to URL2, then delete from URL (only once\n"
    "            the import answered 201: a failed move leaves the session where it was)\n"
    "\n"
    "  --timeout S  a call unanswered after S seconds fails (default 30)\n"
    "ATTND_API_KEY, when set, is sent as the bearer key.\n"
    "Exit status: 0 done, 1 the server refused (its error on stderr) or could not be\n"
    "reached, 2 bad usage.\n";

typedef struct sess_args {
  char sub; /* 'c'reate, 'g'et, 'd'elete, 't'runcate, 'f'ork, 'a'ttend, 'e'xport, 'i'mport,
              'm'ove */
  const char *url, *id, *new_id, *in, *out, *to;
  int64_t heads_kv, head_dim, layers, max_tokens, length;
  int64_t head_dim_v, v_from_k; /* 0: not given */
  const char *reserve;          /* --reserve, or NULL: not sent (whole) */
  const char *kv_dtype;         /* --kv-dtype, or NULL: not sent (the dtype) */
  float *sinks;                 /* --sinks (malloc'd), or NULL */
  int64_t nsinks;
  int64_t heads_q, seq_q, n_new, layer, pos;
  bool have_heads_kv, have_head_dim, have_max_tokens, have_length, have_pos;
  bool have_heads_q, have_seq_q, have_ttl, json;
  double ttl, timeout;
  attn_dtype dtype;
  uint64_t seed;
  attn_options opts;
  attn_sbuf query; /* the attention options as a query string, "&name=value"... */
} sess_args;

/* Which subcommands each flag belongs to (their initials). */
static const char *const scope[128] = {
    ['H'] = "c", ['D'] = "c",         ['t'] = "c",  ['l'] = "c",  ['m'] = "c", ['T'] = "cf",
    ['j'] = "g", ['n'] = "tf",        ['i'] = "ai", ['o'] = "ae", ['q'] = "a", ['Q'] = "a",
    ['k'] = "a", ['y'] = "a",         ['p'] = "a",  ['e'] = "a",  ['N'] = "a", ['c'] = "a",
    ['s'] = "a", ['L'] = "a",         ['R'] = "a",  ['S'] = "a",  ['B'] = "a", ['C'] = "a",
    ['O'] = "a", ['w'] = "cgdtfaeim", ['V'] = "c",  ['K'] = "c",  ['G'] = "a", ['u'] = "m",
    ['r'] = "c", ['Z'] = "c"};

static const struct option opts[] = {TOOL_API_OPTIONS,
                                     {"heads-kv", required_argument, 0, 'H'},
                                     {"head-dim", required_argument, 0, 'D'},
                                     {"head-dim-v", required_argument, 0, 'V'},
                                     {"v-from-k", required_argument, 0, 'K'},
                                     {"reserve", required_argument, 0, 'r'},
                                     {"kv-dtype", required_argument, 0, 'Z'},
                                     {"dtype", required_argument, 0, 't'},
                                     {"layers", required_argument, 0, 'l'},
                                     {"max-tokens", required_argument, 0, 'm'},
                                     {"ttl", required_argument, 0, 'T'},
                                     {"json", no_argument, 0, 'j'},
                                     {"length", required_argument, 0, 'n'},
                                     {"in", required_argument, 0, 'i'},
                                     {"out", required_argument, 0, 'o'},
                                     {"heads-q", required_argument, 0, 'q'},
                                     {"seq-q", required_argument, 0, 'Q'},
                                     {"new", required_argument, 0, 'k'},
                                     {"layer", required_argument, 0, 'y'},
                                     {"pos", required_argument, 0, 'p'},
                                     {"seed", required_argument, 0, 'e'},
                                     {"no-causal", no_argument, 0, 'N'},
                                     {"sinks", required_argument, 0, 'G'},
                                     {"timeout", required_argument, 0, 'w'},
                                     {"to", required_argument, 0, 'u'},
                                     {"help", no_argument, 0, 'h'},
                                     {0, 0, 0, 0}};

static const char *flag_name(int c) {
  for (const struct option *o = opts; o->name; o++)
    if (o->val == c)
      return o->name;
  return "?";
}

/* The shape and create flags; -1 after a message, 0 when c is not one. */
static int create_flag(int c, sess_args *a) {
  const int64_t big = ATTN_MAX_DIM;
  switch (c) {
  case 'H':
    a->have_heads_kv = true;
    return tool_arg_i64("--heads-kv", optarg, 1, big, &a->heads_kv);
  case 'D':
    a->have_head_dim = true;
    return tool_arg_i64("--head-dim", optarg, 1, big, &a->head_dim);
  case 't': return tool_arg_dtype("--dtype", optarg, &a->dtype);
  case 'l': return tool_arg_i64("--layers", optarg, 1, ATTN_KV_MAX_LAYERS, &a->layers);
  case 'm':
    a->have_max_tokens = true;
    return tool_arg_i64("--max-tokens", optarg, 1, big, &a->max_tokens);
  case 'T': a->have_ttl = true; return tool_arg_double("--ttl", optarg, 1e-3, 1e9, &a->ttl);
  case 'V': return tool_arg_i64("--head-dim-v", optarg, 1, ATTN_MAX_HEAD_DIM_V, &a->head_dim_v);
  case 'K': return tool_arg_i64("--v-from-k", optarg, 1, ATTN_MAX_HEAD_DIM_V, &a->v_from_k);
  case 'n': a->have_length = true; return tool_arg_i64("--length", optarg, 0, big, &a->length);
  case 'r':
    if (strcmp(optarg, "whole") && strcmp(optarg, "grow")) {
      fprintf(stderr, ME ": --reserve is whole or grow, not \"%s\"\n", optarg);
      return -1;
    }
    a->reserve = optarg;
    return 0;
  case 'Z': {
    attn_kv_quant q;
    attn_dtype dt;
    if (attn_kv_quant_parse(optarg, &q) && attn_dtype_parse(optarg, &dt)) {
      fprintf(stderr, ME ": --kv-dtype is F8_E4M3, I8 or the --dtype, not \"%s\"\n", optarg);
      return -1;
    }
    a->kv_dtype = optarg;
    return 0;
  }
  }
  return 1;
}

/* The attend and common flags; -1 after a message. */
static int attend_flag(int c, sess_args *a) {
  const int64_t big = ATTN_MAX_DIM;
  int64_t seed;
  switch (c) {
  case 'i': a->in = optarg; return 0;
  case 'o': a->out = optarg; return 0;
  case 'q': a->have_heads_q = true; return tool_arg_i64("--heads-q", optarg, 1, big, &a->heads_q);
  case 'Q': a->have_seq_q = true; return tool_arg_i64("--seq-q", optarg, 1, big, &a->seq_q);
  case 'k': return tool_arg_i64("--new", optarg, 0, big, &a->n_new);
  case 'y': return tool_arg_i64("--layer", optarg, 0, ATTN_KV_MAX_LAYERS - 1, &a->layer);
  case 'p': a->have_pos = true; return tool_arg_i64("--pos", optarg, 0, big, &a->pos);
  case 'e':
    if (tool_arg_i64("--seed", optarg, 0, INT64_MAX, &seed) < 0)
      return -1;
    a->seed = (uint64_t)seed;
    return 0;
  case 'N': attn_sbuf_puts(&a->query, "&causal=false"); return 0;
  case 'G': return tool_infer_parse_sinks(ME, optarg, &a->sinks, &a->nsinks) ? -1 : 0;
  case 'j': a->json = true; return 0;
  case 'u': a->to = optarg; return 0;
  case 'w': return tool_arg_double("--timeout", optarg, 1e-3, 1e7, &a->timeout);
  }
  return create_flag(c, a);
}

/* One flag; 0, 2 after a message, -1 for --help. */
static int one_flag(int c, sess_args *a) {
  if (c == 'h') {
    fputs(usage, stdout);
    return -1;
  }
  if (c < 0 || c >= 128 || !scope[c]) {
    fputs(usage, stderr);
    return 2;
  }
  if (!strchr(scope[c], a->sub)) {
    fprintf(stderr, ME ": --%s does not apply to this subcommand\n", flag_name(c));
    return 2;
  }
  const char *name, *value;
  int rc = tool_arg_api_option(c, optarg, ME, &a->opts, &name, &value);
  if (rc > 0)
    attn_sbuf_printf(&a->query, "&%s=%s", name, value);
  else if (rc == 0)
    rc = attend_flag(c, a) < 0 ? -1 : 0;
  return rc < 0 ? 2 : 0;
}

static char sub_initial(const char *s) {
  static const char *const subs[] = {"create", "get",    "delete", "truncate", "fork",
                                     "attend", "export", "import", "move"};
  for (size_t i = 0; i < sizeof subs / sizeof subs[0]; i++)
    if (strcmp(s, subs[i]) == 0)
      return s[0];
  return 0;
}

/* The positional arguments and what each subcommand requires. */
static const char *check_args(int argc, char **argv, sess_args *a) {
  const int npos = a->sub == 'f' ? 3 : 2; /* fork: URL ID NEW */
  if (optind + npos > argc)
    return a->sub == 'f' ? "give URL, ID and NEW" : "give URL and ID";
  if (optind + npos < argc)
    return "too many arguments";
  a->url = argv[optind];
  a->id = argv[optind + 1];
  a->new_id = a->sub == 'f' ? argv[optind + 2] : NULL;
  if (!tool_sess_id_ok(a->id) || (a->new_id && !tool_sess_id_ok(a->new_id)))
    return "ID is 1-128 of [A-Za-z0-9._-], not starting with '_' or '.'";
  if (a->sub == 'c' && !(a->have_heads_kv && a->have_head_dim && a->have_max_tokens))
    return "create needs --heads-kv, --head-dim and --max-tokens";
  if (a->sub == 't' && !a->have_length)
    return "truncate needs --length";
  if (a->sub == 'i' && !a->in)
    return "import needs --in FILE (a file export wrote)";
  if (a->sub == 'm' && !a->to)
    return "move needs --to URL2 (the server to move the session to)";
  if (a->in && (a->have_heads_q || a->have_seq_q || a->n_new != 1 || a->sinks))
    return "--in excludes --heads-q, --seq-q, --new and --sinks (the file holds its tensors)";
  if (a->head_dim_v && a->v_from_k && a->head_dim_v != a->v_from_k)
    return "--head-dim-v and --v-from-k differ: a latent session's values are --v-from-k wide";
  if (!a->in && a->n_new == 0 && a->have_pos)
    return "--pos says where new tokens go; --new 0 sends none";
  return NULL;
}

/* argv after "session": the subcommand, then flags and URL ID in any order.
 * 0, 2 after a message, or -1 for --help. */
static int parse(int argc, char **argv, sess_args *a) {
  if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
    fputs(usage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : -1;
  }
  if (!(a->sub = sub_initial(argv[1]))) {
    fprintf(stderr, ME ": unknown subcommand \"%s\"\n%s", argv[1], usage);
    return 2;
  }
  attn_options_init(&a->opts);
  int c, rc = 0;
  optind = 1;
  argc--, argv++;
  while (rc == 0 && (c = getopt_long(argc, argv, "", opts, NULL)) != -1)
    rc = one_flag(c, a);
  if (rc != 0)
    return rc;
  const char *why = check_args(argc, argv, a);
  if (why) {
    fprintf(stderr, ME " %s: %s\n%s", argv[0], why, usage);
    return 2;
  }
  return a->query.oom ? 1 : 0;
}

/* ---- the subcommands ------------------------------------------------------ */

/* method on /v1/sessions/ID + tail; 0 with a 2xx reply in *r, else 1 after
 * a message (r freed). */
static int call(tool_sess_http *h, const sess_args *a, const char *method, const char *tail,
                const void *body, size_t len, bool binary, tool_sess_reply *r) {
  char path[512];
  snprintf(path, sizeof path, "/v1/sessions/%s%s", a->id, tail);
  if (tool_sess_call(h, method, path, body, len, binary, r) != 0)
    return 1;
  if (r->status >= 200 && r->status < 300)
    return 0;
  tool_sess_print_error(ME, r);
  tool_sess_reply_free(r);
  return 1;
}

/* What the values are beside k's head_dim: ", values DV wide", ", latent:
 * v the first DV columns of k", or nothing when Dv is head_dim. */
static const char *values_text(int64_t d, int64_t dv, bool latent, char *buf, size_t cap) {
  if (latent)
    snprintf(buf, cap, ", latent: v the first %lld columns of k", (long long)dv);
  else if (dv && dv != d)
    snprintf(buf, cap, ", values %lld wide", (long long)dv);
  else
    buf[0] = 0;
  return buf;
}

static void print_info(const sess_args *a, const tool_sess_info *in) {
  char values[64];
  printf("session %s: %lld layer%s of %lld tokens, %lld kv heads x %lld%s, %s%s%s\n", a->id,
         (long long)in->layers, in->layers == 1 ? "" : "s", (long long)in->max_tokens,
         (long long)in->heads_kv, (long long)in->head_dim,
         values_text(in->head_dim, in->head_dim_v, in->v_from_k, values, sizeof values),
         attn_dtype_name(in->dtype), in->kv_quant ? ", stored " : "",
         in->kv_quant ? attn_kv_quant_name(in->kv_quant) : "");
  printf("lengths ");
  for (int64_t i = 0; i < in->layers; i++)
    printf("%s%lld", i ? "," : "", (long long)in->lengths[i]);
  printf("\nreserved %lld bytes%s, %lld shared with its forks; ttl %g s, expires in %g s\n",
         (long long)in->reserved_bytes, in->grow ? " (reserve grow: as tokens arrive)" : "",
         (long long)in->shared_bytes, in->ttl_s, in->expires_in_s);
}

static int cmd_create(tool_sess_http *h, const sess_args *a) {
  char body[512], values[64];
  int n = snprintf(body, sizeof body,
                   "{\"heads_kv\":%lld,\"head_dim\":%lld,\"dtype\":\"%s\",\"layers\":%lld,"
                   "\"max_tokens\":%lld,\"ttl_s\":%.17g",
                   (long long)a->heads_kv, (long long)a->head_dim, attn_dtype_name(a->dtype),
                   (long long)a->layers, (long long)a->max_tokens, a->ttl);
  if (a->head_dim_v)
    n += snprintf(body + n, sizeof body - (size_t)n, ",\"head_dim_v\":%lld",
                  (long long)a->head_dim_v);
  if (a->v_from_k)
    n += snprintf(body + n, sizeof body - (size_t)n, ",\"v_from_k\":%lld", (long long)a->v_from_k);
  if (a->reserve)
    n += snprintf(body + n, sizeof body - (size_t)n, ",\"reserve\":\"%s\"", a->reserve);
  if (a->kv_dtype)
    n += snprintf(body + n, sizeof body - (size_t)n, ",\"kv_dtype\":\"%s\"", a->kv_dtype);
  snprintf(body + n, sizeof body - (size_t)n, "}");
  tool_sess_reply r;
  if (call(h, a, "PUT", "", body, strlen(body), false, &r) != 0)
    return 1;
  int64_t dv = a->v_from_k ? a->v_from_k : a->head_dim_v;
  printf("session %s %s (HTTP %ld): %lld layer%s of %lld tokens, %lld kv heads x %lld%s, %s\n",
         a->id, r.status == 201 ? "created" : "exists, same parameters", r.status,
         (long long)a->layers, a->layers == 1 ? "" : "s", (long long)a->max_tokens,
         (long long)a->heads_kv, (long long)a->head_dim,
         values_text(a->head_dim, dv, a->v_from_k > 0, values, sizeof values),
         attn_dtype_name(a->dtype));
  tool_sess_reply_free(&r);
  return 0;
}

static int cmd_get(tool_sess_http *h, const sess_args *a) {
  tool_sess_reply r;
  if (call(h, a, "GET", "", NULL, 0, false, &r) != 0)
    return 1;
  tool_sess_info in = {0};
  int rc = 0;
  if (a->json) {
    printf("%s\n", r.body.p ? r.body.p : "");
  } else if (tool_sess_info_parse(r.body.p, r.body.len, &in) == 0) {
    print_info(a, &in);
  } else {
    fprintf(stderr, ME ": the reply is not a session's JSON\n");
    rc = 1;
  }
  tool_sess_info_free(&in);
  tool_sess_reply_free(&r);
  return rc;
}

static int cmd_delete(tool_sess_http *h, const sess_args *a) {
  tool_sess_reply r;
  if (call(h, a, "DELETE", "", NULL, 0, false, &r) != 0)
    return 1;
  printf("session %s deleted (HTTP %ld)\n", a->id, r.status);
  tool_sess_reply_free(&r);
  return 0;
}

static int cmd_truncate(tool_sess_http *h, const sess_args *a) {
  char body[64];
  snprintf(body, sizeof body, "{\"length\":%lld}", (long long)a->length);
  tool_sess_reply r;
  if (call(h, a, "POST", "/truncate", body, strlen(body), false, &r) != 0)
    return 1;
  printf("session %s truncated to %lld (HTTP %ld)\n", a->id, (long long)a->length, r.status);
  tool_sess_reply_free(&r);
  return 0;
}

static int cmd_fork(tool_sess_http *h, const sess_args *a) {
  char body[256];
  int n = snprintf(body, sizeof body, "{\"id\":\"%s\"", a->new_id);
  if (a->have_length)
    n += snprintf(body + n, sizeof body - (size_t)n, ",\"length\":%lld", (long long)a->length);
  if (a->have_ttl)
    n += snprintf(body + n, sizeof body - (size_t)n, ",\"ttl_s\":%.17g", a->ttl);
  snprintf(body + n, sizeof body - (size_t)n, "}");
  tool_sess_reply r;
  if (call(h, a, "POST", "/fork", body, strlen(body), false, &r) != 0)
    return 1;
  tool_sess_info in = {0};
  int rc = tool_sess_info_parse(r.body.p, r.body.len, &in);
  int64_t tokens = 0;
  for (int64_t l = 0; rc == 0 && l < in.layers; l++)
    tokens += in.lengths[l];
  if (rc == 0)
    printf("session %s forked from %s (HTTP %ld): %lld tokens, reserved %lld bytes, %lld "
           "shared\n",
           a->new_id, a->id, r.status, (long long)tokens, (long long)in.reserved_bytes,
           (long long)in.shared_bytes);
  else
    fprintf(stderr, ME ": the reply is not a session's JSON\n");
  tool_sess_info_free(&in);
  tool_sess_reply_free(&r);
  return rc ? 1 : 0;
}

/* ---- moving a session ------------------------------------------------------ */

/* GET .../export into *r (its body the file). */
static int export_to(tool_sess_http *h, const sess_args *a, tool_sess_reply *r) {
  return call(h, a, "GET", "/export", NULL, 0, true, r);
}

static int import_from(tool_sess_http *h, const sess_args *a, const void *file, size_t len) {
  tool_sess_reply r;
  if (call(h, a, "PUT", "/import", file, len, true, &r) != 0)
    return 1;
  tool_sess_reply_free(&r);
  return 0;
}

static int cmd_export(tool_sess_http *h, const sess_args *a) {
  tool_sess_reply r;
  if (export_to(h, a, &r) != 0)
    return 1;
  int rc = 0;
  if (a->out ? tool_write_file(a->out, r.body.p, r.body.len) != 0
             : fwrite(r.body.p, 1, r.body.len, stdout) != r.body.len || fflush(stdout) != 0) {
    fprintf(stderr, ME ": cannot write %s: %s\n", a->out ? a->out : "standard output",
            strerror(errno));
    rc = 1;
  } else if (a->out) {
    printf("session %s exported to %s (%zu bytes)\n", a->id, a->out, r.body.len);
  }
  tool_sess_reply_free(&r);
  return rc;
}

static int cmd_import(tool_sess_http *h, const sess_args *a) {
  void *file;
  size_t len;
  if (tool_read_file(a->in, &file, &len) != 0) {
    fprintf(stderr, ME ": cannot read %s: %s\n", a->in, strerror(errno));
    return 1;
  }
  int rc = import_from(h, a, file, len);
  if (rc == 0)
    printf("session %s imported from %s (%zu bytes)\n", a->id, a->in, len);
  free(file);
  return rc;
}

/* Export, import into --to, and only after its 201 the delete here: a
 * move that fails anywhere leaves the session where it was. */
static int cmd_move(tool_sess_http *h, const sess_args *a) {
  tool_sess_http to;
  tool_sess_reply r;
  int rc = tool_sess_http_init(&to, a->to, a->timeout, ME);
  if (rc != 0)
    return rc;
  if ((rc = export_to(h, a, &r)) == 0) {
    rc = import_from(&to, a, r.body.p, r.body.len);
    if (rc == 0)
      rc = cmd_delete(h, a);
    if (rc == 0)
      printf("session %s moved to %s (%zu bytes)\n", a->id, a->to, r.body.len);
    tool_sess_reply_free(&r);
  }
  tool_sess_http_free(&to);
  return rc;
}

/* ---- attend ---------------------------------------------------------------- */

/* The session as GET has it; 0, or 1 after a message. */
static int get_info(tool_sess_http *h, const sess_args *a, tool_sess_info *in) {
  tool_sess_reply r;
  memset(in, 0, sizeof *in);
  if (call(h, a, "GET", "", NULL, 0, false, &r) != 0)
    return 1;
  int rc = tool_sess_info_parse(r.body.p, r.body.len, in);
  tool_sess_reply_free(&r);
  if (rc != 0) {
    fprintf(stderr, ME ": the reply to GET is not a session's JSON\n");
    return 1;
  }
  if (a->layer >= in->layers) {
    fprintf(stderr, ME ": --layer %lld of a session of %lld layers\n", (long long)a->layer,
            (long long)in->layers);
    return 2;
  }
  return 0;
}

/* Random q, k and (unless the session is latent) v for the session, with
 * --sinks, into a safetensors body; 0, -1 out of memory, or 2 after a
 * message. */
static int random_body(const sess_args *a, const tool_sess_info *in, void **pbody, size_t *plen) {
  int64_t hq = a->have_heads_q ? a->heads_q : in->heads_kv;
  int64_t nq = a->have_seq_q ? a->seq_q : (a->n_new ? a->n_new : 1), d = in->head_dim;
  int64_t dv = in->head_dim_v, hkv = in->heads_kv, nk = a->n_new;
  if (a->sinks && a->nsinks != hq) {
    fprintf(stderr, ME ": --sinks has %lld numbers; give Hq = %lld, one a query head\n",
            (long long)a->nsinks, (long long)hq);
    return 2;
  }
  size_t es = attn_dtype_size(in->dtype);
  size_t nqe = (size_t)(hq * nq * d), nke = (size_t)(hkv * nk * d);
  size_t nve = in->v_from_k ? 0 : (size_t)(hkv * nk * dv);
  char *mem = malloc((nqe + nke + nve) * es + 1);
  if (!mem)
    return -1;
  uint64_t seed = a->seed;
  tool_sess_random(mem, (int64_t)(nqe + nke + nve), in->dtype, &seed);
  tool_sess_tensor t[4] = {{"q", in->dtype, {hq, nq, d}, mem, 3}};
  int n = 1;
  if (nk)
    t[n++] = (tool_sess_tensor){"k", in->dtype, {hkv, nk, d}, mem + nqe * es, 3};
  if (nk && nve)
    t[n++] = (tool_sess_tensor){"v", in->dtype, {hkv, nk, dv}, mem + (nqe + nke) * es, 3};
  if (a->sinks)
    t[n++] = (tool_sess_tensor){"sinks", ATTN_F32, {hq, 0, 0}, a->sinks, 1};
  int rc = tool_sess_encode(t, n, pbody, plen);
  free(mem);
  return rc;
}

/* The new tokens a file holds (its k's N; 0 without k), or -1 after a
 * message. */
static int64_t file_new(const void *body, size_t len, const char *path) {
  attn_proto_tensor t;
  void *copy = NULL;
  attn_status st;
  if (attn_proto_safetensors_tensor(body, len, ATTN_PROTO_T_K, &t, &copy, &st) != 0) {
    fprintf(stderr, ME ": %s: %s\n", path, st.message);
    return -1;
  }
  free(copy);
  return t.data ? t.shape[t.rank - 2] : 0;
}

/* The body: --in's file or random inputs; *n_new its new tokens. 0, or the
 * exit status after a message. */
static int attend_body(const sess_args *a, const tool_sess_info *in, void **pbody, size_t *plen,
                       int64_t *n_new) {
  if (!a->in) {
    *n_new = a->n_new;
    int rc = random_body(a, in, pbody, plen);
    if (rc < 0)
      fprintf(stderr, ME ": out of memory for the inputs\n");
    return rc < 0 ? 1 : rc;
  }
  if (tool_read_file(a->in, pbody, plen) < 0) {
    fprintf(stderr, ME ": cannot read %s: %s\n", a->in, strerror(errno));
    return 2;
  }
  *n_new = file_new(*pbody, *plen, a->in);
  return *n_new < 0 ? 2 : 0;
}

static void print_attend(const sess_args *a, const tool_sess_reply *r, int64_t pos, int64_t n_new,
                         const tool_sess_out *o) {
  int64_t length = r->length >= 0 ? r->length : o->length;
  if (n_new)
    printf("session %s layer %lld: %lld new at pos %lld -> length %lld (HTTP %ld, %.3f ms)\n",
           a->id, (long long)a->layer, (long long)n_new, (long long)pos, (long long)length,
           r->status, r->seconds * 1e3);
  else
    printf("session %s layer %lld: no new tokens -> length %lld (HTTP %ld, %.3f ms)\n", a->id,
           (long long)a->layer, (long long)length, r->status, r->seconds * 1e3);
  printf("o [");
  for (int i = 0; i < o->rank; i++)
    printf("%s%lld", i ? "," : "", (long long)o->shape[i]);
  printf("] %s, |o| max %.6g mean %.6g%s\n", attn_dtype_name(o->dtype), o->absmax, o->absmean,
         o->stats ? ", with m, l, lse" : "");
}

/* The reply: the summary, and the file --out names. */
static int attend_reply(const sess_args *a, const tool_sess_reply *r, int64_t pos, int64_t n_new) {
  tool_sess_out o;
  char why[128];
  if (tool_sess_reply_out(r->body.p, r->body.len, &o, why, sizeof why) != 0) {
    fprintf(stderr, ME ": %s\n", why);
    return 1;
  }
  print_attend(a, r, pos, n_new, &o);
  if (a->out && tool_write_file(a->out, r->body.p, r->body.len) < 0) {
    fprintf(stderr, ME ": cannot write %s: %s\n", a->out, strerror(errno));
    return 1;
  }
  if (a->out)
    printf("wrote %s (%zu bytes)\n", a->out, r->body.len);
  return 0;
}

static int cmd_attend(tool_sess_http *h, const sess_args *a) {
  tool_sess_info in;
  int rc = get_info(h, a, &in);
  void *body = NULL;
  size_t len = 0;
  int64_t n_new = 0;
  if (rc == 0)
    rc = attend_body(a, &in, &body, &len, &n_new);
  if (rc == 0) {
    int64_t pos = a->have_pos ? a->pos : in.lengths[a->layer];
    char tail[4096];
    int n = snprintf(tail, sizeof tail, "/attention?layer=%lld", (long long)a->layer);
    if (n_new)
      n += snprintf(tail + n, sizeof tail - (size_t)n, "&pos=%lld", (long long)pos);
    snprintf(tail + n, sizeof tail - (size_t)n, "%s", a->query.p ? a->query.p : "");
    tool_sess_reply r;
    rc = call(h, a, "POST", tail, body, len, true, &r);
    if (rc == 0) {
      rc = attend_reply(a, &r, pos, n_new);
      tool_sess_reply_free(&r);
    }
  }
  free(body);
  tool_sess_info_free(&in);
  return rc;
}

int tool_cmd_session(int argc, char **argv) {
  sess_args a = {.layers = 1, .ttl = 600, .timeout = 30, .n_new = 1, .seed = 1, .dtype = ATTN_F32};
  int rc = parse(argc, argv, &a);
  if (rc != 0) {
    free(a.query.p);
    free(a.sinks);
    return rc < 0 ? 0 : rc;
  }
  if (curl_global_init(CURL_GLOBAL_DEFAULT) != 0) {
    fprintf(stderr, ME ": cannot initialize libcurl\n");
    return 1;
  }
  tool_sess_http h;
  if ((rc = tool_sess_http_init(&h, a.url, a.timeout, ME)) == 0) {
    int (*const fn[])(tool_sess_http *, const sess_args *) = {
        ['c'] = cmd_create,   ['g'] = cmd_get,    ['d'] = cmd_delete,
        ['t'] = cmd_truncate, ['f'] = cmd_fork,   ['a'] = cmd_attend,
        ['e'] = cmd_export,   ['i'] = cmd_import, ['m'] = cmd_move};
    rc = fn[(unsigned char)a.sub](&h, &a);
    tool_sess_http_free(&h);
  }
  curl_global_cleanup();
  free(a.query.p);
  free(a.sinks);
  return rc;
}
