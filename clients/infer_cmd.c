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
 * Exit status: 0 success (and --check passed), 1 an error reply, no reply,
 * a malformed reply or a failed check, 2 bad usage or an unreadable IN.
 */
#include "args.h"
#include "benchlib.h"
#include "cmds.h"
#include "files.h"
#include "proto.h"
#include "reference.h"

#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

static const char usage[] =
    "usage: attn infer URL [IN.safetensors] [--shape B,H,N,D] [--shape-kv B,H,N,D]\n"
    "                  [--dtype F32|F16|BF16] [--seed N] [--json] [--causal] [--scale X]\n"
    "                  [--window-left N] [--window-right N] [--stats]\n"
    "                  [--backend auto|cpu|cuda|reference] [--check] [--out FILE]\n"
    "                  [--timeout SECONDS] [--quiet]\n"
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
    "  --dtype, --seed the random tensors' dtype (default F32) and seed (default 1)\n"
    "  --json          send a JSON body instead of safetensors\n"
    "  --causal, --scale, --window-left, --window-right, --stats, --backend\n"
    "                  options, checked here, sent in the query string (IN's\n"
    "                  __metadata__ wins over them, as always over HTTP)\n"
    "  --check         compare the reply with float64 standard attention: normalized\n"
    "                  error of o within 1e-5 (F32), 1e-3 (F16), 8e-3 (BF16); m, l,\n"
    "                  lse within 1e-5 relative to max(1, |ref|)\n"
    "  --out FILE      write the reply as a safetensors file (atomically)\n"
    "  --timeout S     give up after S seconds (default 300; 0: never)\n"
    "  --quiet         print only errors\n"
    "\n"
    "Exit status: 0 success, 1 an error reply, no reply or a failed check, 2 bad\n"
    "usage or an unreadable IN.\n";

#define ME "attn infer"

/* ---- the reply ---------------------------------------------------------- */

typedef struct growbuf {
  char *p;
  size_t len, cap;
  bool oom;
} growbuf;

static size_t on_body(char *data, size_t size, size_t nmemb, void *arg) {
  growbuf *b = arg;
  size_t n = size * nmemb;
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 1 << 16;
    while (cap < b->len + n + 1)
      cap *= 2;
    char *np = realloc(b->p, cap);
    if (!np) {
      b->oom = true;
      return 0; /* curl aborts the transfer with CURLE_WRITE_ERROR */
    }
    b->p = np;
    b->cap = cap;
  }
  memcpy(b->p + b->len, data, n);
  b->len += n;
  b->p[b->len] = 0; /* JSON replies are parsed as text */
  return n;
}

/* The first byte of the reply, on our clock. Debian 12's libcurl (7.88)
 * stamps CURLINFO_STARTTRANSFER_TIME of a POST a microsecond after
 * PRETRANSFER (seen on a 2-second job), which would count the upload and
 * the server's work as download time. */
static size_t on_header(char *data, size_t size, size_t nmemb, void *arg) {
  (void)data;
  double *first = arg;
  if (*first == 0)
    *first = attn_bench_now();
  return size * nmemb;
}

static int fail(char *err, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(char *err, size_t cap, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, cap, fmt, ap);
  va_end(ap);
  return -1;
}

/* Element count of reply tensor i. */
static size_t tensor_count(const attn_proto_req *pr, int i) {
  const attn_request *r = &pr->req;
  size_t rows = (size_t)(r->batch * r->heads_q * r->seq_q);
  return i == 0 ? rows * (size_t)r->head_dim : rows;
}

/* ---- --check ------------------------------------------------------------ */

static double rel_err(double x, double ref) {
  if (isinf(ref) || isinf(x) || isnan(x))
    return x == ref ? 0 : INFINITY;
  return fabs(x - ref) / fmax(1.0, fabs(ref));
}

static double tolerance(attn_dtype dt) {
  return dt == ATTN_F32 ? 1e-5 : dt == ATTN_F16 ? 1e-3 : 8e-3;
}

/*
 * Errors of the reply (in pr's output buffers) against float64 standard
 * attention on the same inputs: e[0] the normalized error of o, e[1..3] the
 * largest error of m, l, lse relative to max(1, |ref|). Returns 0, or -1
 * with the reason in err.
 */
static int check_reply(const attn_proto_req *pr, double e[4], char *err, size_t cap) {
  const attn_request *r = &pr->req;
  size_t rows = tensor_count(pr, 1), n = tensor_count(pr, 0);
  double *o = malloc(n * sizeof *o), *st = malloc(3 * rows * sizeof *st);
  attn_status s;
  int rc = 0;
  if (!o || !st) {
    rc = fail(err, cap, "out of memory for the float64 reference");
  } else if (attn_reference(r, o, st, st + rows, st + 2 * rows, &s) < 0) {
    rc = fail(err, cap, "the float64 reference failed: %s", s.message);
  } else {
    double num = 0, den = 0;
    bool nan = false;
    for (size_t i = 0; i < n; i++) {
      double x = attn_load_elem(r->o, r->dtype, i), d = x - o[i];
      nan |= x != x;
      num += d * d;
      den += o[i] * o[i];
    }
    e[0] = nan ? INFINITY : den > 0 ? sqrt(num / den) : sqrt(num);
    const float *got[3] = {r->m, r->l, r->lse};
    for (int k = 0; k < 3; k++) {
      e[1 + k] = 0;
      for (size_t i = 0; pr->opts.stats && i < rows; i++)
        e[1 + k] = fmax(e[1 + k], rel_err(got[k][i], st[k * rows + i]));
    }
  }
  free(o);
  free(st);
  return rc;
}

/* ---- the request -------------------------------------------------------- */

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

static bool ends_with(const char *s, size_t n, const char *suffix) {
  size_t k = strlen(suffix);
  return n >= k && !memcmp(s + n - k, suffix, k);
}

static double us(CURL *h, CURLINFO what) {
  curl_off_t t = 0;
  curl_easy_getinfo(h, what, &t);
  return (double)t * 1e-6;
}

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

typedef struct infer_args {
  const char *url, *in, *out;
  int64_t shape[4], shape_kv[4];
  bool have_shape, have_shape_kv, have_dtype, have_seed;
  attn_dtype dtype;
  uint64_t seed;
  bool json, check, quiet;
  double timeout;
  attn_options opts; /* the flags, validated by the server's own parser */
  attn_sbuf query;   /* the same flags as a query string */
} infer_args;

/* Parses argv into a; returns 0, or 2 after one line on stderr, or -1 for
 * --help (printed). */
static int parse_args(int argc, char **argv, infer_args *a) {
  static const struct option lopts[] = {
      {"shape", required_argument, 0, 'p'},      {"shape-kv", required_argument, 0, 'P'},
      {"dtype", required_argument, 0, 't'},      {"seed", required_argument, 0, 'r'},
      {"json", no_argument, 0, 'j'},             {"causal", no_argument, 0, 'c'},
      {"scale", required_argument, 0, 's'},      {"window-left", required_argument, 0, 'L'},
      {"window-right", required_argument, 0, 'R'}, {"stats", no_argument, 0, 'S'},
      {"backend", required_argument, 0, 'B'},    {"check", no_argument, 0, 'k'},
      {"out", required_argument, 0, 'o'},        {"timeout", required_argument, 0, 'T'},
      {"quiet", no_argument, 0, 'Q'},            {"help", no_argument, 0, 'x'},
      {0, 0, 0, 0}};
  /* The option names as the query string spells them. */
  static const char *const names[128] = {['c'] = "causal",       ['s'] = "scale",
                                         ['L'] = "window_left",  ['R'] = "window_right",
                                         ['S'] = "stats",        ['B'] = "backend"};
  attn_status st;
  int c;
  optind = 1;
  opterr = 1;
  while ((c = getopt_long(argc, argv, "", lopts, NULL)) != -1) {
    switch (c) {
    case 'p':
      if (attn_arg_dims("--shape", optarg, a->shape) < 0)
        return 2;
      a->have_shape = true;
      break;
    case 'P':
      if (attn_arg_dims("--shape-kv", optarg, a->shape_kv) < 0)
        return 2;
      a->have_shape_kv = true;
      break;
    case 't':
      if (attn_arg_dtype("--dtype", optarg, &a->dtype) < 0)
        return 2;
      a->have_dtype = true;
      break;
    case 'r': {
      int64_t v;
      if (attn_arg_i64("--seed", optarg, 0, INT64_MAX, &v) < 0)
        return 2;
      a->seed = (uint64_t)v;
      a->have_seed = true;
      break;
    }
    case 'j': a->json = true; break;
    case 'k': a->check = true; break;
    case 'Q': a->quiet = true; break;
    case 'o': a->out = optarg; break;
    case 'T': {
      char *end;
      errno = 0;
      double v = strtod(optarg, &end);
      if (!*optarg || *end || errno || !(v >= 0 && v <= 1e6)) {
        fprintf(stderr, ME ": --timeout expects seconds from 0 to 1e6 (got \"%s\")\n", optarg);
        return 2;
      }
      a->timeout = v;
      break;
    }
    case 'c':
    case 'S':
    case 's':
    case 'L':
    case 'R':
    case 'B': {
      /* The server's parser judges each value now; what only the server can
       * judge (combinations) is left to it. */
      const char *v = c == 'c' || c == 'S' ? "true" : optarg;
      if (attn_options_set(&a->opts, names[c], strlen(names[c]), v, strlen(v), "flag",
                           &st) < 0) {
        fprintf(stderr, ME ": %s\n", st.message);
        return 2;
      }
      query_add(&a->query, names[c], v);
      break;
    }
    case 'x': fputs(usage, stdout); return -1;
    default: fputs(usage, stderr); return 2;
    }
  }
  int npos = argc - optind;
  if (npos < 1 || npos > 2) {
    fprintf(stderr, ME ": expected URL and at most one IN file\n%s", usage);
    return 2;
  }
  a->url = argv[optind];
  a->in = npos == 2 ? argv[optind + 1] : NULL;
  if (!*a->url || strpbrk(a->url, "?# \t\r\n")) {
    fprintf(stderr, ME ": URL \"%s\" must be the server's base, like http://127.0.0.1:8080 "
            "(options are flags)\n", a->url);
    return 2;
  }
  if (a->in && (a->have_shape || a->have_shape_kv || a->have_dtype || a->have_seed || a->json)) {
    fprintf(stderr, ME ": --shape, --shape-kv, --dtype, --seed and --json make random "
            "tensors; IN is sent as it is\n");
    return 2;
  }
  if (!a->have_shape_kv)
    memcpy(a->shape_kv, a->shape, sizeof a->shape);
  if (a->shape_kv[0] != a->shape[0] || a->shape_kv[3] != a->shape[3]) {
    fprintf(stderr, ME ": --shape-kv %lld,%lld,%lld,%lld must have --shape's batch (%lld) and "
            "head dim (%lld)\n", (long long)a->shape_kv[0], (long long)a->shape_kv[1],
            (long long)a->shape_kv[2], (long long)a->shape_kv[3], (long long)a->shape[0],
            (long long)a->shape[3]);
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

/*
 * Random tensors for the shapes: the body to send in *pbody, and pr built
 * from the same tensors with the flags' options (the checks a codec makes;
 * *local_err gets the message when they refuse, and the server is asked
 * anyway). Returns 0, or the exit status after a message.
 */
static int make_random(infer_args *a, attn_bench_case *bc, char **pbody, size_t *plen,
                       attn_proto_req *pr, bool *local_ok, char *local_err, size_t cap) {
  if (!elems(a->shape) || !elems(a->shape_kv)) {
    fprintf(stderr, ME ": --shape/--shape-kv: too many elements to generate\n");
    return 2;
  }
  if (attn_bench_case_init(bc, a->shape[0], a->shape[1], a->shape_kv[1], a->shape[2],
                           a->shape_kv[2], a->shape[3], a->dtype, false, a->seed) < 0) {
    fprintf(stderr, ME ": out of memory for the random tensors\n");
    return 1;
  }
  const attn_request *r = &bc->req;
  attn_proto_tensor t[3] = {
      {"q", r->dtype, 4, {r->batch, r->heads_q, r->seq_q, r->head_dim}, r->q},
      {"k", r->dtype, 4, {r->batch, r->heads_kv, r->seq_kv, r->head_dim}, r->k},
      {"v", r->dtype, 4, {r->batch, r->heads_kv, r->seq_kv, r->head_dim}, r->v}};
  attn_status st;
  *local_ok = attn_proto_build(pr, t, &a->opts, &st) == 0;
  if (!*local_ok)
    snprintf(local_err, cap, "%s", st.message);
  void *b;
  if ((a->json ? attn_proto_encode_request_json(r, NULL, pbody, plen, &st)
               : attn_proto_encode_request_safetensors(r, NULL, &b, plen, &st)) < 0) {
    fprintf(stderr, ME ": %s\n", st.message);
    return 1;
  }
  if (!a->json)
    *pbody = b;
  return 0;
}

static void print_problem(const infer_args *a, const attn_proto_req *pr, const char *fmt_name,
                          size_t up) {
  const attn_request *r = &pr->req;
  char hb[32];
  printf("problem   B=%lld Hq=%lld Hkv=%lld Nq=%lld Nkv=%lld D=%lld %s", (long long)r->batch,
         (long long)r->heads_q, (long long)r->heads_kv, (long long)r->seq_q,
         (long long)r->seq_kv, (long long)r->head_dim, attn_dtype_name(r->dtype));
  if (r->causal)
    printf(" causal");
  if (r->window_left >= 0 || (!r->causal && r->window_right >= 0))
    printf(" window=(%lld,%lld)", (long long)r->window_left, (long long)r->window_right);
  if (!isnan(r->scale))
    printf(" scale=%g", r->scale);
  if (pr->opts.stats)
    printf(" stats");
  printf(", %s body of %s%s\n", fmt_name, human_bytes((double)up, hb, sizeof hb),
         a->in ? " from IN" : "");
}

/* The error reply as one line: status, code and message of its body. */
static void print_error_reply(long status, const growbuf *b) {
  cJSON *j = b->p ? cJSON_ParseWithLength(b->p, b->len) : NULL;
  const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "error");
  const cJSON *code = cJSON_GetObjectItemCaseSensitive(e, "code");
  const cJSON *msg = cJSON_GetObjectItemCaseSensitive(e, "message");
  if (cJSON_IsString(code) && cJSON_IsString(msg)) {
    fprintf(stderr, "attnd: HTTP %ld %s: %s\n", status, code->valuestring, msg->valuestring);
  } else {
    /* not attnd's error body: show its start, on one line */
    int n = b->len > 200 ? 200 : (int)b->len;
    char *t = b->p ? strndup(b->p, (size_t)n) : NULL;
    for (char *p = t; p && *p; p++)
      if (*p == '\n' || *p == '\r')
        *p = ' ';
    fprintf(stderr, "attnd: HTTP %ld (no attnd error body)%s%s\n", status, t && *t ? ": " : "",
            t ? t : "");
    free(t);
  }
  cJSON_Delete(j);
}

int attn_cmd_infer(int argc, char **argv) {
  infer_args a = {.shape = {1, 1, 128, 64}, .dtype = ATTN_F32, .seed = 1, .timeout = 300};
  attn_options_init(&a.opts);
  int rc = parse_args(argc, argv, &a);
  if (rc != 0) {
    free(a.query.p);
    return rc < 0 ? 0 : rc;
  }

  void *body = NULL;
  size_t body_len = 0;
  attn_bench_case bc = {0};
  attn_proto_req pr;
  memset(&pr, 0, sizeof pr);
  bool local_ok = false;
  char local_err[ATTN_MSG_MAX + 64] = "", err[512];
  growbuf reply = {0};
  CURL *h = NULL;
  struct curl_slist *hdrs = NULL;
  attn_sbuf url = {0};
  int status = 0;
  bool curl_up = false;

  if (a.in) {
    if (attn_read_file(a.in, &body, &body_len) < 0) {
      fprintf(stderr, ME ": cannot read %s: %s\n", a.in, strerror(errno));
      status = 2;
      goto out;
    }
    /* With the flags as query options, so IN's __metadata__ wins here as on
     * the server. A file the codec refuses is still sent: the server's
     * answer to it may be the point. */
    attn_status st;
    local_ok = attn_proto_decode_safetensors(body, body_len, &a.opts, &pr, &st) == 0;
    if (!local_ok)
      snprintf(local_err, sizeof local_err, "%s: %s", a.in, st.message);
  } else {
    char *b;
    if ((status = make_random(&a, &bc, &b, &body_len, &pr, &local_ok, local_err,
                              sizeof local_err)) != 0)
      goto out;
    body = b;
  }

  size_t ul = strlen(a.url);
  while (ul > 0 && a.url[ul - 1] == '/')
    ul--;
  attn_sbuf_put(&url, a.url, ul);
  if (!ends_with(a.url, ul, "/attention")) /* a full endpoint URL works too */
    attn_sbuf_puts(&url, "/attention");
  if (a.query.p)
    attn_sbuf_puts(&url, a.query.p);

  signal(SIGPIPE, SIG_IGN); /* a server closing mid-upload is an error, not a kill */
  curl_up = curl_global_init(CURL_GLOBAL_DEFAULT) == 0;
  if (!curl_up || !(h = curl_easy_init()) || url.oom) {
    fprintf(stderr, ME ": cannot initialize libcurl\n");
    status = 1;
    goto out;
  }
  hdrs = curl_slist_append(hdrs, a.json ? "Content-Type: application/json"
                                        : "Content-Type: application/octet-stream");
  /* A JSON request's reply is JSON unless asked otherwise; --out wants a
   * safetensors file, so ask for the binary form rather than convert. */
  if (a.json && a.out)
    hdrs = curl_slist_append(hdrs, "Accept: application/octet-stream");
  /* No "Expect: 100-continue" round trip (curl adds it to large bodies):
   * the upload timing then measures the upload, not a wait for a 100. */
  hdrs = curl_slist_append(hdrs, "Expect:");
  char curl_err[CURL_ERROR_SIZE] = "";
  curl_easy_setopt(h, CURLOPT_URL, url.p);
  curl_easy_setopt(h, CURLOPT_POST, 1L);
  curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
  curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)body_len);
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &reply);
  curl_easy_setopt(h, CURLOPT_ERRORBUFFER, curl_err);
  double t_first = 0;
  curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(h, CURLOPT_HEADERDATA, &t_first);
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_USERAGENT, "attn-infer/" ATTN_VERSION);
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)(a.timeout * 1e3));
  if (!hdrs) {
    fprintf(stderr, ME ": out of memory\n");
    status = 1;
    goto out;
  }

  double t_start = attn_bench_now();
  CURLcode cc = curl_easy_perform(h);
  if (cc != CURLE_OK) {
    long oserr = 0;
    curl_easy_getinfo(h, CURLINFO_OS_ERRNO, &oserr);
    if (reply.oom)
      fprintf(stderr, ME ": out of memory for the reply from %s\n", url.p);
    else if (cc == CURLE_COULDNT_CONNECT)
      fprintf(stderr, ME ": cannot connect to %.*s: %s\n", (int)ul, a.url,
              oserr ? strerror((int)oserr) : *curl_err ? curl_err : curl_easy_strerror(cc));
    else if (cc == CURLE_OPERATION_TIMEDOUT)
      fprintf(stderr, ME ": no complete reply from %s within %g s (--timeout)\n", url.p,
              a.timeout);
    else
      fprintf(stderr, ME ": %s: %s\n", url.p, *curl_err ? curl_err : curl_easy_strerror(cc));
    /* a URL curl cannot use is a usage error; everything else happened at
     * run time */
    status = cc == CURLE_URL_MALFORMAT || cc == CURLE_UNSUPPORTED_PROTOCOL ? 2 : 1;
    goto out;
  }

  long http = 0;
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &http);
  if (http < 200 || http > 299) {
    print_error_reply(http, &reply);
    status = 1;
    goto out;
  }

  /* The reply's codec comes from its Content-Type, not from what was
   * asked: a server that answers otherwise is caught below. */
  const char *ctype = NULL;
  curl_easy_getinfo(h, CURLINFO_CONTENT_TYPE, &ctype);
  bool st_reply = ctype && !strncasecmp(ctype, "application/octet-stream", 24);
  char backend[32] = "";
  if (!local_ok) {
    /* The server computed what this client's codec refuses: one of them is
     * wrong, and the reply cannot be read against expected shapes. */
    fprintf(stderr, ME ": HTTP %ld for a request this client's codec refuses (%s)\n", http,
            local_err);
    status = 1;
    goto out;
  }
  attn_status rst;
  if ((st_reply ? attn_proto_decode_reply_safetensors(reply.p, reply.len, &pr, &rst)
                : attn_proto_decode_reply_json(reply.p, reply.len, &pr, backend, sizeof backend,
                                               &rst)) < 0) {
    fprintf(stderr, ME ": HTTP %ld with a malformed %s reply: %s\n", http,
            st_reply ? "safetensors" : "JSON", rst.message);
    status = 1;
    goto out;
  }
  if (a.out) {
    if (!st_reply) {
      fprintf(stderr, ME ": the reply is %s, not safetensors; %s not written\n",
              ctype ? ctype : "untyped", a.out);
      status = 1;
    } else if (attn_write_file(a.out, reply.p, reply.len) < 0) {
      fprintf(stderr, ME ": cannot write %s: %s\n", a.out, strerror(errno));
      status = 1;
    }
  }

  if (!a.quiet) {
    double connect = us(h, CURLINFO_CONNECT_TIME_T), pre = us(h, CURLINFO_PRETRANSFER_TIME_T),
           total = us(h, CURLINFO_TOTAL_TIME_T);
    /* curl's clock starts inside curl_easy_perform(), ours just before it:
     * microseconds apart, so clamp rather than print a negative span */
    double first = fmin(fmax(t_first - t_start, pre), total);
    curl_off_t upb = 0, downb = 0;
    curl_easy_getinfo(h, CURLINFO_SIZE_UPLOAD_T, &upb);
    curl_easy_getinfo(h, CURLINFO_SIZE_DOWNLOAD_T, &downb);
    char hb1[32], hb2[32];
    printf("HTTP %ld from %s, %s reply%s%s%s\n", http, url.p, st_reply ? "safetensors" : "JSON",
           *backend ? " (backend " : "", backend, *backend ? ")" : "");
    print_problem(&a, &pr, a.json ? "JSON" : "safetensors", body_len);
    /* curl's clock: the upload and the server's queueing and compute are
     * not separable from outside, so they are reported as one span */
    printf("time      connect %.3f ms, upload+server %.3f ms (until the first byte), download "
           "%.3f ms, total %.3f ms\n",
           connect * 1e3, (first - pre) * 1e3, (total - first) * 1e3, total * 1e3);
    printf("bytes     up %s (%lld B, %.1f MB/s over upload+server), down %s (%lld B, %.1f MB/s "
           "over download)\n",
           human_bytes((double)upb, hb1, sizeof hb1), (long long)upb,
           first > pre ? (double)upb / (first - pre) * 1e-6 : 0.0,
           human_bytes((double)downb, hb2, sizeof hb2), (long long)downb,
           total > first ? (double)downb / (total - first) * 1e-6 : 0.0);
    double flops = attn_request_flops(&pr.req);
    printf("served    %.4g GFLOP in %.3f ms: %.2f GFLOP/s (4*D per visible pair over the "
           "total time)\n",
           flops * 1e-9, total * 1e3, total > 0 ? flops / total * 1e-9 : 0.0);
    if (a.out && status == 0)
      printf("out       %s (%zu bytes)\n", a.out, reply.len);
    fflush(stdout);
  }

  if (a.check) {
    double e[4];
    double tol = tolerance(pr.req.dtype), stol = 1e-5;
    if (check_reply(&pr, e, err, sizeof err) < 0) {
      fprintf(stderr, ME ": --check: %s\n", err);
      status = 1;
      goto out;
    }
    bool pass = e[0] <= tol;
    for (int k = 1; k < 4; k++)
      pass = pass && e[k] <= stol;
    FILE *f = pass ? stdout : stderr;
    if (!pass || !a.quiet) {
      fprintf(f, "check     o %.2e", e[0]);
      if (pr.opts.stats)
        fprintf(f, ", m %.2e, l %.2e, lse %.2e", e[1], e[2], e[3]);
      fprintf(f, " (tolerance %s %g%s) against float64: %s\n", attn_dtype_name(pr.req.dtype),
              tol, pr.opts.stats ? ", statistics 1e-05" : "", pass ? "PASS" : "FAIL");
    }
    if (!pass)
      status = 1;
  }

out:
  if (h)
    curl_easy_cleanup(h);
  curl_slist_free_all(hdrs);
  if (curl_up)
    curl_global_cleanup();
  free(reply.p);
  free(url.p);
  attn_proto_req_free(&pr);
  attn_bench_case_free(&bc);
  free(body);
  free(a.query.p);
  return status;
}
