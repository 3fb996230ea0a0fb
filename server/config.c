/*
 * config.c — flags, environment fallbacks and defaults for attnd.
 *
 * A flag wins over its ATTND_* variable, which wins over the default; every
 * value is checked before the server starts, and a bad one is a single line
 * naming the flag (or the variable) and what it takes.
 *
 * One table (flags[]) lists every flag once: its name, argument, default,
 * help and how its value is applied. The usage text, getopt's options, the
 * environment names (ATTND_ and the name in capitals, '-' as '_') and the
 * defaults are all made from it, so a new flag is one row.
 */
#include "config.h"
#include "engine.h"

#include <errno.h>
#include <getopt.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int bad(const char *what, const char *value, const char *expect) {
  fprintf(stderr, "attnd: %s expects %s (got \"%s\")\n", what, expect, value);
  return -1;
}

static int parse_int(const char *what, const char *s, long lo, long hi, int *out) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (!*s || *end || errno || v < lo || v > hi) {
    char expect[64];
    snprintf(expect, sizeof expect, "an integer from %ld to %ld", lo, hi);
    return bad(what, s, expect);
  }
  *out = (int)v;
  return 0;
}

static int parse_seconds(const char *what, const char *s, double lo, double *out) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (!*s || *end || errno || !(v >= lo) || v > 1e6)
    return bad(what, s, "a number of seconds");
  *out = v;
  return 0;
}

static int parse_size(const char *what, const char *s, uint64_t *out) {
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  uint64_t mul = 1;
  if (*end == 'K' || *end == 'k')
    mul = 1ull << 10;
  else if (*end == 'M' || *end == 'm')
    mul = 1ull << 20;
  else if (*end == 'G' || *end == 'g')
    mul = 1ull << 30;
  if (mul > 1)
    end++;
  if (!*s || *s == '-' || *end || errno || v == 0 || v > (1ull << 40) / mul)
    return bad(what, s, "a size such as 1048576, 512K, 64M or 1G (at most 1024G)");
  *out = v * mul;
  return 0;
}

static int parse_listen(const char *what, const char *s, attnd_config *c) {
  const char *colon = strrchr(s, ':');
  int port;
  if (!colon || colon == s || (size_t)(colon - s) >= sizeof c->host)
    return bad(what, s, "HOST:PORT, e.g. 127.0.0.1:8080");
  if (parse_int(what, colon + 1, 0, 65535, &port) < 0)
    return -1;
  memcpy(c->host, s, (size_t)(colon - s));
  c->host[colon - s] = 0;
  c->port = port;
  return 0;
}

/* A comma-separated list of device numbers, each listed once (the engine's
 * parser; whether they exist is known once the engine opens). */
static int parse_devices(const char *what, const char *s, attnd_config *c) {
  int ord[ATTN_MAX_CUDA_DEVICES];
  attn_status st;
  int n = attn_cuda_devices_parse(s, ord, ATTN_MAX_CUDA_DEVICES, &st);
  if (!*s || n < 0 || strlen(s) >= sizeof c->devices) {
    fprintf(stderr, "attnd: %s: %s\n", what,
            !*s     ? "expected device numbers such as 0 or 0,1"
            : n < 0 ? st.message
                    : "list too long");
    return -1;
  }
  c->ndevices = n;
  snprintf(c->devices, sizeof c->devices, "%s", s);
  return 0;
}

static int apply_backend(attnd_config *c, const char *what, const char *v) {
  if (strcmp(v, "auto") && strcmp(v, "cpu") && strcmp(v, "cuda"))
    return bad(what, v, "auto, cpu or cuda");
  snprintf(c->backend, sizeof c->backend, "%s", v);
  return 0;
}

/* Any name: the engine knows its kernels, and names one this CPU lacks or
 * does not have when it opens (attnd then exits 2 with its reason). */
static int apply_isa(attnd_config *c, const char *what, const char *v) {
  if (!*v || strlen(v) >= sizeof c->isa)
    return bad(what, v, "a CPU kernel: auto, amx, avx512bf16, avx512, avx2 or generic");
  snprintf(c->isa, sizeof c->isa, "%s", v);
  return 0;
}

static int apply_log(attnd_config *c, const char *what, const char *v) {
  if (strcmp(v, "text") && strcmp(v, "json"))
    return bad(what, v, "text or json");
  c->log_json = !strcmp(v, "json");
  return 0;
}

static int apply_listen(attnd_config *c, const char *what, const char *v) {
  return parse_listen(what, v, c);
}
static int apply_devices(attnd_config *c, const char *what, const char *v) {
  return parse_devices(what, v, c);
}
static int apply_max_body(attnd_config *c, const char *what, const char *v) {
  return parse_size(what, v, &c->max_body);
}
static int apply_threads(attnd_config *c, const char *what, const char *v) {
  return parse_int(what, v, 0, 1024, &c->threads);
}
static int apply_streams(attnd_config *c, const char *what, const char *v) {
  return parse_int(what, v, 1, 64, &c->streams);
}
static int apply_max_queue(attnd_config *c, const char *what, const char *v) {
  return parse_int(what, v, 0, 1000000, &c->max_queue);
}
static int apply_timeout(attnd_config *c, const char *what, const char *v) {
  return parse_seconds(what, v, 0.001, &c->timeout);
}
static int apply_idle(attnd_config *c, const char *what, const char *v) {
  return parse_int(what, v, 1, 86400, &c->idle_timeout);
}
static int apply_max_conn(attnd_config *c, const char *what, const char *v) {
  return parse_int(what, v, 1, 1000000, &c->max_connections);
}
static int apply_max_conn_client(attnd_config *c, const char *what, const char *v) {
  return parse_int(what, v, 0, 1000000, &c->max_connections_per_client);
}
static int apply_header_timeout(attnd_config *c, const char *what, const char *v) {
  return parse_seconds(what, v, 0.1, &c->header_timeout);
}
static int apply_drain(attnd_config *c, const char *what, const char *v) {
  return parse_seconds(what, v, 0, &c->drain_timeout);
}

typedef struct flag {
  const char *name; /* --name; its variable is ATTND_NAME */
  const char *arg;  /* what the usage calls its value */
  const char *def;  /* the default, applied like any value */
  const char *help; /* the usage text, before "(default) [variable]" */
  int (*apply)(attnd_config *c, const char *what, const char *value);
} flag;

/* In the order --help lists them. */
static const flag flags[] = {
    {"listen", "HOST:PORT", "127.0.0.1:8080", "address to serve", apply_listen},
    {"backend", "NAME", "auto", "auto, cpu or cuda", apply_backend},
    {"threads", "N", "0", "CPU engine threads, 0 = one per core", apply_threads},
    {"isa", "NAME", "auto",
     "CPU kernel: auto (the best this CPU runs), amx, avx512bf16, avx512, avx2 or generic",
     apply_isa},
    {"streams", "N", "4", "CUDA streams per device", apply_streams},
    {"devices", "LIST", "0", "CUDA devices to use, e.g. 0,1", apply_devices},
    {"max-body", "SIZE", "1G", "largest request body, suffix K, M or G", apply_max_body},
    {"max-queue", "N", "64", "requests admitted and not finished; more get 503, 0 = all",
     apply_max_queue},
    {"timeout", "SECONDS", "60",
     "a request not answered this long after its headers gets 504 and its job is canceled",
     apply_timeout},
    {"idle-timeout", "SECONDS", "30", "idle keep-alive connections are closed", apply_idle},
    {"max-connections", "N", "1024",
     "open connections at most; when full, a new one closes the oldest idle one", apply_max_conn},
    {"max-connections-per-client", "N", "256",
     "open connections of one client address, 0 = no own limit", apply_max_conn_client},
    {"header-timeout", "SECONDS", "10", "a request's headers must arrive whole within this",
     apply_header_timeout},
    {"drain-timeout", "SECONDS", "30",
     "on SIGTERM/SIGINT, finish queued work for at most this long", apply_drain},
    {"log-format", "FORMAT", "text", "text or json, one line per request", apply_log},
};
enum { N_FLAGS = sizeof flags / sizeof *flags, OPT_HELP = N_FLAGS, OPT_VERSION };

/* The usage's layout: a flag and its argument in the first column, the
 * help wrapped in the second. */
enum { USAGE_INDENT = 2, USAGE_COLUMN = 25, USAGE_WIDTH = 86 };

static void env_name(const flag *f, char *out, size_t cap) {
  size_t n = (size_t)snprintf(out, cap, "ATTND_%s", f->name);
  for (size_t i = 0; i < n && i < cap; i++)
    out[i] = out[i] == '-' ? '_' : (char)toupper((unsigned char)out[i]);
}

/* Prints text from column `at`, wrapped at USAGE_WIDTH onto lines that
 * start at USAGE_COLUMN. */
static void print_wrapped(FILE *out, const char *text, int at) {
  bool first = true;
  while (*text) {
    size_t w = strcspn(text, " ");
    if (!first && at + 1 + (int)w > USAGE_WIDTH) {
      fprintf(out, "\n%*s", USAGE_COLUMN, "");
      at = USAGE_COLUMN;
    } else if (!first) {
      fputc(' ', out);
      at++;
    }
    first = false;
    fwrite(text, 1, w, out);
    at += (int)w;
    text += w;
    text += *text == ' ';
  }
  fputc('\n', out);
}

static void print_flag(FILE *out, const flag *f) {
  char head[64], env[64], text[256];
  int n = snprintf(head, sizeof head, "--%s %s", f->name, f->arg);
  env_name(f, env, sizeof env);
  snprintf(text, sizeof text, "%s (%s) [%s]", f->help, f->def, env);
  /* A head one column too wide still fits when the help starts a column
   * later; a longer one gets a line of its own. */
  int at = USAGE_COLUMN;
  if (n <= USAGE_COLUMN - USAGE_INDENT) {
    fprintf(out, "%*s%-*s ", USAGE_INDENT, "", USAGE_COLUMN - USAGE_INDENT - 1, head);
    at = USAGE_INDENT +
         (n > USAGE_COLUMN - USAGE_INDENT - 1 ? n : USAGE_COLUMN - USAGE_INDENT - 1) + 1;
  } else {
    fprintf(out, "%*s%s\n%*s", USAGE_INDENT, "", head, USAGE_COLUMN, "");
  }
  print_wrapped(out, text, at);
}

static void print_usage(FILE *out) {
  fputs("usage: attnd [options]\n"
        "\n"
        "Serves exact attention (FlashAttention) over HTTP: POST /attention with q, k, v\n"
        "as JSON or safetensors; POST /attention/backward with q, k, v, o, do [, lse] for\n"
        "dq, dk, dv; GET /attention/plan, /healthz, /readyz, /metrics, /v1/info.\n"
        "\n"
        "options (environment fallback in brackets):\n",
        out);
  for (int i = 0; i < N_FLAGS; i++)
    print_flag(out, &flags[i]);
  fputs("  --help, --version\n"
        "\n"
        "Memory is bounded by max-queue x max-body for request bodies, plus the replies.\n",
        out);
}

/* A flag not given on the command line: its variable, else its default. */
static int apply_fallback(attnd_config *c, const flag *f) {
  char env[64];
  env_name(f, env, sizeof env);
  const char *v = getenv(env);
  if (v && *v)
    return f->apply(c, env, v);
  return f->apply(c, "the default", f->def);
}

/* getopt_long's table, from flags[]: each returns its index. */
static void make_options(struct option *opts) {
  for (int i = 0; i < N_FLAGS; i++)
    opts[i] = (struct option){flags[i].name, required_argument, 0, i};
  opts[OPT_HELP] = (struct option){"help", no_argument, 0, OPT_HELP};
  opts[OPT_VERSION] = (struct option){"version", no_argument, 0, OPT_VERSION};
  opts[OPT_VERSION + 1] = (struct option){0, 0, 0, 0};
}

int attnd_config_parse(attnd_config *c, int argc, char **argv) {
  memset(c, 0, sizeof *c);
  struct option opts[N_FLAGS + 3];
  bool given[N_FLAGS] = {0};
  make_options(opts);
  int o;
  optind = 1;
  opterr = 0;
  while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
    if (o == OPT_HELP || o == OPT_VERSION) {
      if (o == OPT_HELP)
        print_usage(stdout);
      else
        printf("attnd %s\n", ATTN_VERSION);
      return 1;
    }
    if (o < 0 || o >= N_FLAGS) {
      fprintf(stderr, "attnd: unknown option or missing value: %s (see attnd --help)\n",
              argv[optind - 1]);
      return -1;
    }
    char what[40];
    snprintf(what, sizeof what, "--%s", flags[o].name);
    if (flags[o].apply(c, what, optarg) < 0)
      return -1;
    given[o] = true;
  }
  if (optind < argc) {
    fprintf(stderr, "attnd: unexpected argument \"%s\" (see attnd --help)\n", argv[optind]);
    return -1;
  }
  for (int i = 0; i < N_FLAGS; i++)
    if (!given[i] && apply_fallback(c, &flags[i]) < 0)
      return -1;
  return 0;
}
