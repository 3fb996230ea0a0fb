/*
 * config.c — flags, environment fallbacks and defaults for attnd.
 *
 * A flag wins over its ATTND_* variable, which wins over the default; every
 * value is checked before the server starts, and a bad one is a single line
 * naming the flag (or the variable) and what it takes.
 */
#include "config.h"
#include "engine.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char usage[] =
    "usage: attnd [options]\n"
    "\n"
    "Serves exact attention (FlashAttention) over HTTP: POST /attention with q, k, v\n"
    "as JSON or safetensors; GET /attention/plan, /healthz, /readyz, /metrics, /v1/info.\n"
    "\n"
    "options (environment fallback in brackets):\n"
    "  --listen HOST:PORT     address to serve (127.0.0.1:8080) [ATTND_LISTEN]\n"
    "  --backend NAME         auto, cpu or cuda (auto) [ATTND_BACKEND]\n"
    "  --threads N            CPU engine threads, 0 = one per core (0) [ATTND_THREADS]\n"
    "  --streams N            CUDA streams per device (4) [ATTND_STREAMS]\n"
    "  --devices LIST         CUDA devices to use, e.g. 0,1 (0) [ATTND_DEVICES]\n"
    "  --max-body SIZE        largest request body, suffix K, M or G (1G) [ATTND_MAX_BODY]\n"
    "  --max-queue N          requests admitted and not finished; more get 503, 0 = all (64)\n"
    "                         [ATTND_MAX_QUEUE]\n"
    "  --timeout SECONDS      a request not answered this long after its headers gets 504\n"
    "                         and its job is canceled (60) [ATTND_TIMEOUT]\n"
    "  --idle-timeout SECONDS idle keep-alive connections are closed (30)\n"
    "                         [ATTND_IDLE_TIMEOUT]\n"
    "  --max-connections N    open connections at most; when full, a new one closes the\n"
    "                         oldest idle one (1024) [ATTND_MAX_CONNECTIONS]\n"
    "  --max-connections-per-client N\n"
    "                         open connections of one client address, 0 = no own limit\n"
    "                         (256) [ATTND_MAX_CONNECTIONS_PER_CLIENT]\n"
    "  --header-timeout SECONDS\n"
    "                         a request's headers must arrive whole within this (10)\n"
    "                         [ATTND_HEADER_TIMEOUT]\n"
    "  --drain-timeout SECONDS on SIGTERM/SIGINT, finish queued work for at most this long\n"
    "                         (30) [ATTND_DRAIN_TIMEOUT]\n"
    "  --log-format FORMAT    text or json, one line per request (text) [ATTND_LOG_FORMAT]\n"
    "  --help, --version\n"
    "\n"
    "Memory is bounded by max-queue x max-body for request bodies, plus the replies.\n";

enum { O_LISTEN, O_BACKEND, O_THREADS, O_STREAMS, O_DEVICES, O_MAX_BODY, O_MAX_QUEUE, O_TIMEOUT,
       O_IDLE, O_MAX_CONN, O_DRAIN, O_LOG, O_HEADER_TIMEOUT, O_MAX_CONN_CLIENT, O_COUNT };

static const struct option opts[] = {
    {"listen", required_argument, 0, O_LISTEN},
    {"backend", required_argument, 0, O_BACKEND},
    {"threads", required_argument, 0, O_THREADS},
    {"streams", required_argument, 0, O_STREAMS},
    {"devices", required_argument, 0, O_DEVICES},
    {"max-body", required_argument, 0, O_MAX_BODY},
    {"max-queue", required_argument, 0, O_MAX_QUEUE},
    {"timeout", required_argument, 0, O_TIMEOUT},
    {"idle-timeout", required_argument, 0, O_IDLE},
    {"max-connections", required_argument, 0, O_MAX_CONN},
    {"drain-timeout", required_argument, 0, O_DRAIN},
    {"log-format", required_argument, 0, O_LOG},
    {"header-timeout", required_argument, 0, O_HEADER_TIMEOUT},
    {"max-connections-per-client", required_argument, 0, O_MAX_CONN_CLIENT},
    {"help", no_argument, 0, 'h'},
    {"version", no_argument, 0, 'V'},
    {0, 0, 0, 0}};

static const char *const env_names[O_COUNT] = {
    "ATTND_LISTEN",       "ATTND_BACKEND",      "ATTND_THREADS",         "ATTND_STREAMS",
    "ATTND_DEVICES",
    "ATTND_MAX_BODY",     "ATTND_MAX_QUEUE",    "ATTND_TIMEOUT",         "ATTND_IDLE_TIMEOUT",
    "ATTND_MAX_CONNECTIONS", "ATTND_DRAIN_TIMEOUT", "ATTND_LOG_FORMAT",
    "ATTND_HEADER_TIMEOUT", "ATTND_MAX_CONNECTIONS_PER_CLIENT"};

static const char *const defaults[O_COUNT] = {
    "127.0.0.1:8080", "auto", "0", "4", "0", "1G", "64", "60", "30", "1024", "30", "text", "10", "256"};

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
            !*s ? "expected device numbers such as 0 or 0,1" : n < 0 ? st.message : "list too long");
    return -1;
  }
  c->ndevices = n;
  snprintf(c->devices, sizeof c->devices, "%s", s);
  return 0;
}

/* Applies one option's value; `what` names its source in messages. */
static int apply(attnd_config *c, int o, const char *v, const char *what) {
  switch (o) {
  case O_LISTEN: return parse_listen(what, v, c);
  case O_BACKEND:
    if (strcmp(v, "auto") && strcmp(v, "cpu") && strcmp(v, "cuda"))
      return bad(what, v, "auto, cpu or cuda");
    snprintf(c->backend, sizeof c->backend, "%s", v);
    return 0;
  case O_THREADS: return parse_int(what, v, 0, 1024, &c->threads);
  case O_STREAMS: return parse_int(what, v, 1, 64, &c->streams);
  case O_DEVICES: return parse_devices(what, v, c);
  case O_MAX_BODY: return parse_size(what, v, &c->max_body);
  case O_MAX_QUEUE: return parse_int(what, v, 0, 1000000, &c->max_queue);
  case O_TIMEOUT: return parse_seconds(what, v, 0.001, &c->timeout);
  case O_IDLE: return parse_int(what, v, 1, 86400, &c->idle_timeout);
  case O_MAX_CONN: return parse_int(what, v, 1, 1000000, &c->max_connections);
  case O_DRAIN: return parse_seconds(what, v, 0, &c->drain_timeout);
  case O_HEADER_TIMEOUT: return parse_seconds(what, v, 0.1, &c->header_timeout);
  case O_MAX_CONN_CLIENT: return parse_int(what, v, 0, 1000000, &c->max_connections_per_client);
  case O_LOG:
    if (strcmp(v, "text") && strcmp(v, "json"))
      return bad(what, v, "text or json");
    c->log_json = !strcmp(v, "json");
    return 0;
  default: return -1;
  }
}

int attnd_config_parse(attnd_config *c, int argc, char **argv) {
  memset(c, 0, sizeof *c);
  bool given[O_COUNT] = {0};
  int o;
  optind = 1;
  opterr = 0;
  while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
    if (o == 'h') {
      fputs(usage, stdout);
      return 1;
    }
    if (o == 'V') {
      printf("attnd %s\n", ATTN_VERSION);
      return 1;
    }
    if (o == '?' || o == ':') {
      fprintf(stderr, "attnd: unknown option or missing value: %s (see attnd --help)\n",
              argv[optind - 1]);
      return -1;
    }
    char what[40];
    snprintf(what, sizeof what, "--%s", opts[o].name);
    if (apply(c, o, optarg, what) < 0)
      return -1;
    given[o] = true;
  }
  if (optind < argc) {
    fprintf(stderr, "attnd: unexpected argument \"%s\" (see attnd --help)\n", argv[optind]);
    return -1;
  }
  for (int i = 0; i < O_COUNT; i++) {
    if (given[i])
      continue;
    const char *env = getenv(env_names[i]);
    if (env && *env) {
      if (apply(c, i, env, env_names[i]) < 0)
        return -1;
    } else if (apply(c, i, defaults[i], "the default") < 0) {
      return -1;
    }
  }
  return 0;
}
