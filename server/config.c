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
 *
 * Beside it (config_int.h): the values flags take (config_value.c), the
 * session flags (config_session.c) and the --help text (config_usage.c).
 */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include "config_int.h"
#include "engine.h"
#include "tls.h"

#include <errno.h>
#include <getopt.h>
#include <sched.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the flags: each one's value into the configuration ------------------- */

static int apply_backend(attnd_config *c, const char *what, const char *v) {
  if (strcmp(v, "auto") && strcmp(v, "cpu") && strcmp(v, "cuda"))
    return attnd__cfg_bad(what, v, "auto, cpu or cuda");
  snprintf(c->backend, sizeof c->backend, "%s", v);
  return 0;
}

/* Any name: the engine knows its kernels, and names one this CPU lacks or
 * does not have when it opens (attnd then exits 2 with its reason). */
static int apply_isa(attnd_config *c, const char *what, const char *v) {
  if (!*v || strlen(v) >= sizeof c->isa)
    return attnd__cfg_bad(what, v, "a CPU kernel: auto, amx, avx512bf16, avx512, avx2 or generic");
  snprintf(c->isa, sizeof c->isa, "%s", v);
  return 0;
}

static int apply_cpu_tune(attnd_config *c, const char *what, const char *v) {
  if (!*v || !attn_cpu_tune_known(v)) /* "" would be auto to the engine, not to a flag */
    return attnd__cfg_bad(what, v, "auto, intel or amd");
  snprintf(c->cpu_tune, sizeof c->cpu_tune, "%s", v);
  return 0;
}

static int apply_self_check(attnd_config *c, const char *what, const char *v) {
  if (strcmp(v, "on") && strcmp(v, "off"))
    return attnd__cfg_bad(what, v, "on or off");
  c->gpu_self_check = !strcmp(v, "on");
  return 0;
}
static int apply_deterministic(attnd_config *c, const char *what, const char *v) {
  if (strcmp(v, "on") && strcmp(v, "off"))
    return attnd__cfg_bad(what, v, "on or off");
  c->deterministic = !strcmp(v, "on");
  return 0;
}
static int apply_log(attnd_config *c, const char *what, const char *v) {
  if (strcmp(v, "text") && strcmp(v, "json"))
    return attnd__cfg_bad(what, v, "text or json");
  c->log_json = !strcmp(v, "json");
  return 0;
}

/* A key a header can carry (auth.h). The value is never echoed in the
 * message, even when refused. */
static int check_key(const char *what, const char *v) {
  if (attnd_key_valid(v, strlen(v)))
    return 0;
  fprintf(stderr,
          "attnd: %s expects a key of 1 to %d visible ASCII characters, no spaces (the value "
          "given is not shown)\n",
          what, ATTND_KEY_MAX);
  return -1;
}

/* One key, named "default": the name its requests log and count under. */
static int apply_api_key(attnd_config *c, const char *what, const char *v) {
  char why[256];
  int dup;
  c->keys.n = 0;
  if (!*v)
    return 0;
  if (check_key(what, v) < 0)
    return -1;
  if (attnd_keys_add(&c->keys, "default", v, strlen(v), &dup, why, sizeof why) == 0)
    return 0;
  fprintf(stderr, "attnd: %s: %s\n", what, why);
  return -1;
}

/* A key file is small (ATTND_MAX_KEYS lines and their comments); a larger
 * one is most likely not a key file at all. */
enum { KEY_FILE_MAX = 64 << 10 };

/* The file's bytes, up to KEY_FILE_MAX + 1 of them (the one more tells a
 * file too large); NULL after a message. */
static char *slurp_key_file(const char *what, const char *path, size_t *n) {
  FILE *f = fopen(path, "r");
  if (!f) {
    fprintf(stderr, "attnd: %s: cannot read \"%s\": %s\n", what, path, strerror(errno));
    return NULL;
  }
  char *buf = malloc(KEY_FILE_MAX + 1);
  *n = buf ? fread(buf, 1, KEY_FILE_MAX + 1, f) : 0;
  int e = !buf ? ENOMEM : ferror(f) ? errno : 0; /* EISDIR for a directory */
  fclose(f);
  if (!e)
    return buf;
  fprintf(stderr, "attnd: %s: cannot read \"%s\": %s\n", what, path, strerror(e));
  if (buf)
    explicit_bzero(buf, *n);
  free(buf);
  return NULL;
}

/* The keys are the file's lines (attnd_keys_parse); the copy read is wiped
 * before it is freed, since it holds every key. */
static int read_key_file(attnd_config *c, const char *what, const char *path) {
  size_t n;
  char *buf = slurp_key_file(what, path, &n), why[512];
  if (!buf)
    return -1;
  int rc = -1;
  if (n > KEY_FILE_MAX)
    snprintf(why, sizeof why, "over %d KiB: a key file holds at most %d keys, one a line",
             KEY_FILE_MAX >> 10, ATTND_MAX_KEYS);
  else
    rc = attnd_keys_parse(&c->keys, buf, n, why, sizeof why);
  if (rc < 0)
    fprintf(stderr, "attnd: %s (the file %s): %s\n", what, path, why);
  explicit_bzero(buf, n);
  free(buf);
  return rc;
}

static int apply_api_key_file(attnd_config *c, const char *what, const char *v) {
  if (strlen(v) >= sizeof c->api_key_file)
    return attnd__cfg_bad(what, v, "a shorter path");
  snprintf(c->api_key_file, sizeof c->api_key_file, "%s", v);
  return *v ? read_key_file(c, what, v) : 0;
}

static int apply_tls_cert(attnd_config *c, const char *what, const char *v) {
  return attnd__cfg_path(c->tls_cert, sizeof c->tls_cert, what, v);
}
static int apply_tls_key(attnd_config *c, const char *what, const char *v) {
  return attnd__cfg_path(c->tls_key, sizeof c->tls_key, what, v);
}
/* Parsed by GnuTLS once HTTPS is on (attnd_tls_check_priorities): a name
 * this GnuTLS lacks must not stop a plain HTTP server. */
static int apply_tls_priorities(attnd_config *c, const char *what, const char *v) {
  if (strlen(v) >= sizeof c->tls_priorities)
    return attnd__cfg_bad(what, v, "a GnuTLS priority string of at most 511 characters");
  snprintf(c->tls_priorities, sizeof c->tls_priorities, "%s", v);
  return 0;
}

/* "*" or one origin as browsers send it: scheme://host[:port], no path. */
static int apply_cors(attnd_config *c, const char *what, const char *v) {
  const char *host = strstr(v, "://");
  bool ok =
      !*v || !strcmp(v, "*") ||
      (host && host > v && host[3] && !strchr(host + 3, '/') && strlen(v) < sizeof c->cors_origin);
  for (const char *p = v; ok && *p; p++)
    ok = *p > 0x20 && *p < 0x7f && *p != ',';
  if (!ok)
    return attnd__cfg_bad(
        what, v, "* or an origin such as https://app.example.com (scheme and host, no path)");
  snprintf(c->cors_origin, sizeof c->cors_origin, "%s", v);
  return 0;
}

/* Host names, comma-separated: "*", a name, or ".suffix". */
static int apply_allowed_hosts(attnd_config *c, const char *what, const char *v) {
  bool ok = strlen(v) < sizeof c->allowed_hosts;
  for (const char *p = v; ok && *p; p++)
    ok = *p > 0x20 && *p < 0x7f && *p != '/' && *p != ':';
  if (!ok)
    return attnd__cfg_bad(what, v,
                          "host names separated by commas, such as attnd,attnd.default.svc, or *");
  snprintf(c->allowed_hosts, sizeof c->allowed_hosts, "%s", v);
  return 0;
}

static int apply_listen(attnd_config *c, const char *what, const char *v) {
  return attnd__cfg_listen(what, v, c);
}
static int apply_devices(attnd_config *c, const char *what, const char *v) {
  return attnd__cfg_devices(what, v, c);
}
static int apply_max_body(attnd_config *c, const char *what, const char *v) {
  return attnd__cfg_size(what, v, &c->max_body);
}
static int apply_threads(attnd_config *c, const char *what, const char *v) {
  return attnd__cfg_int(what, v, 0, 1024, &c->threads);
}
/* The HTTP front's polling threads: "auto" is one per two cores this
 * process may run on (its CPU affinity), at least 1. */
static int apply_http_threads(attnd_config *c, const char *what, const char *v) {
  if (strcmp(v, "auto")) {
    char *end;
    errno = 0;
    long n = strtol(v, &end, 10);
    if (!*v || *end || errno || n < 1 || n > 256)
      return attnd__cfg_bad(what, v, "auto or an integer from 1 to 256 (HTTP threads)");
    c->http_threads = (int)n;
    return 0;
  }
  cpu_set_t set;
  long n =
      sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : sysconf(_SC_NPROCESSORS_ONLN);
  c->http_threads = n >= 4 ? (int)(n / 2 < 256 ? n / 2 : 256) : 1;
  return 0;
}
static int apply_streams(attnd_config *c, const char *what, const char *v) {
  return attnd__cfg_int(what, v, 1, 64, &c->streams);
}
/* 0 lends none. */
static int apply_pinned_memory(attnd_config *c, const char *what, const char *v) {
  c->pinned_memory = 0;
  return strcmp(v, "0") ? attnd__cfg_size(what, v, &c->pinned_memory) : 0;
}
static int apply_max_queue(attnd_config *c, const char *what, const char *v) {
  return attnd__cfg_int(what, v, 0, 1000000, &c->max_queue);
}
/* "auto" is -1: the loop resolves it once it knows its running slots. */
static int apply_max_running_client(attnd_config *c, const char *what, const char *v) {
  char *end;
  errno = 0;
  long n = strtol(v, &end, 10);
  if (!strcmp(v, "auto"))
    n = -1;
  else if (!*v || *end || errno || n < 0 || n > 1000000)
    return attnd__cfg_bad(what, v, "auto or an integer from 0 (no own limit) to 1000000");
  c->max_running_per_client = (int)n;
  return 0;
}
/* A count from 0 to max into *out, or the error naming the range. */
static int parse_count(const char *what, const char *v, unsigned long long max, const char *range,
                       uint64_t *out) {
  char *end;
  errno = 0;
  unsigned long long n = strtoull(v, &end, 10);
  if (!*v || *v == '-' || *end || errno || n > max)
    return attnd__cfg_bad(what, v, range);
  *out = n;
  return 0;
}
/* Up to 2^62: far past any problem a body can carry, and no overflow in
 * the comparisons. */
static int apply_max_pairs(attnd_config *c, const char *what, const char *v) {
  return parse_count(what, v, 1ull << 62, "an integer from 0 (no cap) to 2^62", &c->max_pairs);
}
static int apply_tiny_flops(attnd_config *c, const char *what, const char *v) {
  return parse_count(what, v, 1ull << 40, "an integer from 0 (never) to 2^40", &c->tiny_flops);
}
static int apply_timeout(attnd_config *c, const char *what, const char *v) {
  return attnd__cfg_seconds(what, v, 0.001, &c->timeout);
}
static int apply_idle(attnd_config *c, const char *what, const char *v) {
  return attnd__cfg_int(what, v, 1, 86400, &c->idle_timeout);
}
static int apply_max_conn(attnd_config *c, const char *what, const char *v) {
  return attnd__cfg_int(what, v, 1, 1000000, &c->max_connections);
}
static int apply_max_conn_client(attnd_config *c, const char *what, const char *v) {
  return attnd__cfg_int(what, v, 0, 1000000, &c->max_connections_per_client);
}
static int apply_header_timeout(attnd_config *c, const char *what, const char *v) {
  return attnd__cfg_seconds(what, v, 0.1, &c->header_timeout);
}
/* A rate as a size per second ("1K"); 0 turns the minimum off. */
static int apply_min_rate(attnd_config *c, const char *what, const char *v) {
  uint64_t n = 0;
  if (strcmp(v, "0") && attnd__cfg_size(what, v, &n) < 0)
    return -1;
  c->min_upload_rate = (double)n;
  return 0;
}
static int apply_drain(attnd_config *c, const char *what, const char *v) {
  return attnd__cfg_seconds(what, v, 0, &c->drain_timeout);
}
static int apply_drain_delay(attnd_config *c, const char *what, const char *v) {
  return attnd__cfg_seconds(what, v, 0, &c->drain_delay);
}
static int apply_trusted_proxy(attnd_config *c, const char *what, const char *v) {
  char err[160];
  c->trusted_proxies.n = 0; /* the flag replaces the variable's list */
  if (attnd_proxies_parse(&c->trusted_proxies, v, err, sizeof err) == 0)
    return 0;
  fprintf(stderr, "attnd: %s: %s\n", what, err);
  return -1;
}

/* ---- the table of flags, their variables and defaults ------------------------ */

/* In the order --help lists them. */
static const attnd__flag flags[] = {
    {"listen", "HOST:PORT", "127.0.0.1:8080", "address to serve", apply_listen},
    {"backend", "NAME", "auto", "auto, cpu or cuda", apply_backend},
    {"threads", "N", "0", "CPU engine threads, 0 = one per core", apply_threads},
    {"http-threads", "N|auto", "auto",
     "HTTP threads polling the connections (libmicrohttpd's thread pool); auto = one per two "
     "cores, at least 1",
     apply_http_threads},
    {"isa", "NAME", "auto",
     "CPU kernel: auto (the best this CPU runs), amx, avx512bf16, avx512, avx2 or generic",
     apply_isa},
    {"cpu-tune", "NAME", "auto",
     "the CPU kernels' F32 products: auto (intel on Intel CPUs, amd on others), intel (for two "
     "512-bit FMA pipes) or amd; the same results either way",
     apply_cpu_tune},
    {"streams", "N", "4", "CUDA streams per device", apply_streams},
    {"devices", "LIST", "0", "CUDA devices to use, e.g. 0,1", apply_devices},
    {"gpu-self-check", "on|off", "on",
     "at start-up, run every CUDA kernel on small shapes against the float64 reference and "
     "disable those that fail (/v1/info lists them)",
     apply_self_check},
    {"deterministic", "on|off", "on",
     "CUDA backward: on computes dQ in a kernel of its own, bitwise reproducible run to run; off "
     "adds it up with atomics inside the dK/dV pass (5 matrix products per tile pair instead "
     "of 7, unmeasured), whose dQ varies in its last bits; the CPU engine is deterministic "
     "either way",
     apply_deterministic},
    {"pinned-memory", "SIZE", "2G",
     "page-locked host memory the CUDA backend lends to request bodies and replies, so their "
     "tensors cross to and from the GPU in one copy; past it (or at 0) bodies are ordinary "
     "memory, staged; suffix K, M or G; nothing is pinned without a GPU",
     apply_pinned_memory},
    {"max-body", "SIZE", "1G", "largest request body, suffix K, M or G", apply_max_body},
    {"max-queue", "N", "64", "requests admitted and not finished; more get 503, 0 = all",
     apply_max_queue},
    {"max-running-per-client", "N|auto", "auto",
     "jobs of one client address computed at once while others queue (round-robin across "
     "addresses); auto = every running slot but one (1 of the CPU backend's 2), 0 = no own "
     "limit",
     apply_max_running_client},
    {"max-pairs", "N", "0",
     "refuse (422) a request of more score pairs than N (batch x heads x Nq x Nkv, summed "
     "over the sequences of a variable-length batch), 0 = no cap",
     apply_max_pairs},
    {"tiny-flops", "N", "1048576",
     "a job of at most N FLOPs (a small request, a session's decode step) is computed on the "
     "HTTP thread that read it, without the queue's hand-offs, when the CPU computes it and no "
     "other call holds its session's layer; 0 = never",
     apply_tiny_flops},
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
    {"min-upload-rate", "SIZE", "1K",
     "a body must arrive at this many bytes per second over each 5 s, or it gets 408 and the "
     "connection closes; 0 = no minimum (--timeout also covers the upload)",
     apply_min_rate},
    {"drain-timeout", "SECONDS", "30",
     "on SIGTERM/SIGINT, finish queued work for at most this long", apply_drain},
    {"drain-delay", "SECONDS", "0",
     "on SIGTERM/SIGINT, answer /readyz 503 but keep serving this long before the drain "
     "starts, so that a load balancer's health check takes the server out of rotation "
     "first; a second signal starts the drain at once",
     apply_drain_delay},
    {"log-format", "FORMAT", "text",
     "text or json (one object per line: RFC 3339 time, level, request id...)", apply_log},
    {"api-key", "KEY", "",
     "requests need \"Authorization: Bearer KEY\" (health and readiness stay open), logged "
     "and counted as the key named default; prefer the variable or --api-key-file, which ps "
     "cannot show",
     apply_api_key},
    {"api-key-file", "FILE", "",
     "read the API keys from FILE, one a line: KEY or NAME:KEY (NAME 1-63 of A-Z a-z 0-9 . _ -; "
     "a line without one is key1, key2... in order); blank lines and lines starting with # "
     "are skipped. Logs and metrics name the key a request used",
     apply_api_key_file},
    {"tls-cert", "FILE", "", "serve HTTPS with this PEM certificate (chain); needs --tls-key",
     apply_tls_cert},
    {"tls-key", "FILE", "", "the PEM private key of --tls-cert", apply_tls_key},
    {"tls-priorities", "STRING", ATTND_TLS_PRIORITIES_DEFAULT,
     "GnuTLS priority string for HTTPS, replacing the default (TLS 1.2 and 1.3, AEAD ciphers, "
     "forward-secret key exchange), e.g. NORMAL to accept TLS 1.0 and 1.1 again",
     apply_tls_priorities},
    {"cors-origin", "ORIGIN", "",
     "answer CORS preflights and allow this origin (or *) to call the API from a browser",
     apply_cors},
    {"allowed-hosts", "LIST", "",
     "without an API key, answer only requests whose Host is an IP address, localhost or one "
     "of these names (comma-separated; .example.com for every name under it; * for any): a "
     "web page cannot reach the server through DNS rebinding",
     apply_allowed_hosts},
    {"trusted-proxy", "LIST", "",
     "addresses and networks (comma-separated, e.g. 10.0.0.0/8,::1) of proxies whose "
     "X-Forwarded-For names the client: the per-client limits and log lines use that address "
     "for their requests, and their connections are not capped per client; nobody else's "
     "X-Forwarded-For is read",
     apply_trusted_proxy},
    {"session-memory", "BYTES", "auto",
     "memory all sessions (KV caches held by the server) may reserve, suffix K, M or G; a "
     "create that does not fit gets 507; 0 = no sessions; auto = a quarter of physical memory",
     attnd__apply_session_memory},
    {"session-memory-per-key", "BYTES|N%", "auto",
     "the most session memory the sessions of one API key may reserve together, suffix K, M "
     "or G, or a percentage of --session-memory; a create past it gets 507; 0 = no cap; auto "
     "= half of --session-memory when there are two keys or more, else no cap",
     attnd__apply_session_memory_per_key},
    {"session-page-bytes", "BYTES", "64K",
     "the size of a page of the sessions' host memory: 16K, 32K or 64K. A fork shares its "
     "source's whole pages and copies the one it appends into, so smaller pages let forks share "
     "more and waste less of a short session's reservation, for a little more work per decode "
     "step; rows too wide for 16 to a page (head_dim 576 BF16 needs 32K) are refused with 422. "
     "Sessions on a GPU keep 64K pages: attnd computing on one refuses any other",
     attnd__apply_session_page_bytes},
    {"session-dir", "DIR", "",
     "save sessions to DIR (a writable directory) on a graceful shutdown and load them at "
     "start-up; without it, sessions live in memory only",
     attnd__apply_session_dir},
    {"session-batch", "on|off", "on",
     "compute session calls that arrive together for the same backend as one batch",
     attnd__apply_session_batch},
    {"session-ttl-max", "SECONDS", "86400", "the largest ttl_s a session create may ask for",
     attnd__apply_session_ttl_max},
    {"handover", "URL", "",
     "on a graceful stop, once the drain is over, PUT each session to URL/v1/sessions/{id}/import "
     "(http:// only: the proxy, which routes each id to the replica that inherits it) with its "
     "API key, and drop it once imported (201) or held there already (409); what is not moved "
     "stays, and --session-dir saves it",
     attnd__apply_handover},
    {"handover-timeout", "SECONDS", "30",
     "the most the whole handover may take (each request's socket waits included); sessions not "
     "moved by then stay",
     attnd__apply_handover_timeout},
};
enum { N_FLAGS = sizeof flags / sizeof *flags, OPT_HELP = N_FLAGS, OPT_VERSION };

/* ---- parsing: flags, then variables, then defaults ----------------------------- */

/*
 * Whether an empty value given (flag or variable) means "not set". Only
 * where unset is the closed state: no CORS (and Kubernetes manifests write
 * ATTND_CORS_ORIGIN: ""), no host names beyond addresses and localhost.
 * Elsewhere an empty value is most likely a
 * template whose variable was unset, and taking the default would serve
 * without the key or without TLS that was meant, so it is refused.
 */
static bool empty_is_unset(const attnd__flag *f) {
  return !strcmp(f->name, "cors-origin") || !strcmp(f->name, "allowed-hosts");
}

/* A value given on the command line (what: "--name") or in a variable
 * (what: "ATTND_NAME"). */
static int apply_given(attnd_config *c, const attnd__flag *f, const char *what, const char *v) {
  if (*v || empty_is_unset(f))
    return f->apply(c, what, v);
  bool var = what[0] != '-';
  fprintf(stderr, "attnd: %s is %s but empty: give it a value, or %s for the default (%s)\n", what,
          var ? "set" : "given", var ? "unset it" : "leave it out", *f->def ? f->def : "none");
  return -1;
}

/* A flag not given on the command line: its variable (set, even if
 * empty), else its default. */
static int apply_fallback(attnd_config *c, const attnd__flag *f) {
  char env[64];
  attnd__flag_env(f, env, sizeof env);
  const char *v = getenv(env);
  if (v)
    return apply_given(c, f, env, v);
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

static int flag_index(const char *name) {
  for (int i = 0; i < N_FLAGS; i++)
    if (!strcmp(flags[i].name, name))
      return i;
  return -1;
}

/* --api-key and --api-key-file are one setting: either given on the
 * command line wins over both variables. */
static bool overridden(int i, const bool *given) {
  int key = flag_index("api-key"), file = flag_index("api-key-file");
  return (i == key && given[file]) || (i == file && given[key]);
}

/* The key comes from one place: both flags, or both variables with
 * neither flag, is a mistake worth a line rather than a silent choice. */
static int check_key_sources(const bool *given) {
  int key = flag_index("api-key"), file = flag_index("api-key-file");
  const char *ek = getenv("ATTND_API_KEY"), *ef = getenv("ATTND_API_KEY_FILE");
  if (given[key] && given[file]) {
    fprintf(stderr, "attnd: give --api-key or --api-key-file, not both\n");
    return -1;
  }
  if (!given[key] && !given[file] && ek && *ek && ef && *ef) {
    fprintf(stderr, "attnd: ATTND_API_KEY and ATTND_API_KEY_FILE are both set; set one\n");
    return -1;
  }
  return 0;
}

/* Both TLS files or neither; and priorities only for HTTPS, since someone
 * who sets them expects TLS, not the plain HTTP they would get. */
static int check_tls_pair(const attnd_config *c) {
  if (!*c->tls_cert != !*c->tls_key) {
    fprintf(stderr, "attnd: %s is given without %s: HTTPS needs the certificate and its key\n",
            *c->tls_cert ? "--tls-cert" : "--tls-key", *c->tls_cert ? "--tls-key" : "--tls-cert");
    return -1;
  }
  if (!*c->tls_cert && strcmp(c->tls_priorities, ATTND_TLS_PRIORITIES_DEFAULT)) {
    fprintf(stderr, "attnd: --tls-priorities is given without --tls-cert and --tls-key: it "
                    "applies to HTTPS only\n");
    return -1;
  }
  return 0;
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
        attnd__config_usage(stdout, flags, N_FLAGS);
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
    if (apply_given(c, &flags[o], what, optarg) < 0)
      return -1;
    given[o] = true;
  }
  if (optind < argc) {
    fprintf(stderr, "attnd: unexpected argument \"%s\" (see attnd --help)\n", argv[optind]);
    return -1;
  }
  if (check_key_sources(given) < 0)
    return -1;
  for (int i = 0; i < N_FLAGS; i++)
    if (!given[i] && !overridden(i, given) && apply_fallback(c, &flags[i]) < 0)
      return -1;
  attnd__resolve_per_key(c);
  return check_tls_pair(c);
}
