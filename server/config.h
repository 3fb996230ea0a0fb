/*
 * config.h — attnd's configuration: flags, their environment fallbacks
 * (ATTND_<FLAG>, e.g. ATTND_LISTEN), defaults and validation. The one
 * process-wide configuration; everything else is passed explicitly.
 */
#ifndef ATTND_CONFIG_H
#define ATTND_CONFIG_H

#include "auth.h"
#include "proxy.h"
#include "url.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct attnd_config {
  char host[64];
  int port;
  char backend[16];       /* auto, cpu, cuda */
  int threads;            /* 0: one per core */
  int http_threads;       /* libmicrohttpd's polling threads (its thread pool when > 1) */
  char isa[16];           /* CPU kernel: auto, amx, avx512bf16, avx512, avx2, generic */
  char cpu_tune[8];       /* the F32 products' tuning: auto, intel, amd */
  int streams;            /* CUDA streams per device */
  char devices[128];      /* CUDA device numbers, "0,1" */
  int ndevices;           /* how many devices lists */
  bool gpu_self_check;    /* run the CUDA kernels' start-up self-check */
  bool deterministic;     /* the CUDA backward's bitwise-reproducible two-kernel dQ */
  uint64_t pinned_memory; /* page-locked bytes the CUDA backend may lend to bodies */
  uint64_t max_body;      /* bytes */
  int max_queue;          /* jobs admitted and not finished */
  double timeout;         /* seconds a job may wait before it starts */
  int idle_timeout;       /* seconds */
  int max_connections;
  int max_connections_per_client; /* of one client address; 0: no own limit */
  double header_timeout;          /* seconds to send a request's headers whole */
  double drain_timeout;           /* seconds */
  double drain_delay;             /* seconds between SIGTERM (/readyz 503) and the drain's start */
  double min_upload_rate;         /* body bytes per second at least; 0: no minimum */
  bool log_json;
  /* Jobs of one client address running at once (loop.c): -1 auto (every
   * running slot but one), 0 no own limit. */
  int max_running_per_client;
  uint64_t max_pairs;  /* score pairs one request may ask for (loop.c); 0: no cap */
  uint64_t tiny_flops; /* work a job computed on the HTTP thread may have (tiny.h); 0: none */
  /* The bearer tokens a request but the open routes needs one of, each
   * with its name (auth.h); keys.n == 0: none. --api-key gives one, named
   * "default"; --api-key-file one a line. Never printed: not in logs,
   * errors or /v1/info (the names may be). */
  attnd_keys keys;
  char api_key_file[1024]; /* where the keys were read from, "" when given inline */
  char tls_cert[1024];     /* PEM files; both or neither ("" for plain HTTP) */
  char tls_key[1024];
  char tls_priorities[512]; /* GnuTLS priority string for HTTPS */
  char cors_origin[256];    /* "" off, "*" or one origin */
  char allowed_hosts[512];  /* Host names a keyless server answers to besides addresses */
  /* Whose X-Forwarded-For names the client (proxy.h); n == 0: nobody's. */
  attnd_proxies trusted_proxies;
  /* Sessions (the KV cache the server holds, /v1/sessions/...). */
  uint64_t session_memory;     /* bytes all sessions may reserve; 0: sessions off */
  char session_dir[1024];      /* a writable directory sessions are saved to across restarts; "" */
  uint64_t session_page_bytes; /* a page of the sessions' host memory (attn_kv_open_paged) */
  bool session_batch;          /* session calls that arrive together may be computed as one batch */
  double session_ttl_max;      /* seconds: the largest ttl_s a create may ask for */
  /* Bytes one API key's sessions may reserve together; 0: no cap. */
  uint64_t session_memory_per_key;
  int session_per_key_pct; /* as given: -1 auto, 1-100 a percentage, 0 a size (or 0) */
  /* Where a graceful stop hands its sessions over (handover.h): the URL as
   * given, "" for nowhere, and as read (http, its path without a trailing
   * '/'); the most seconds the whole handover may take. */
  char handover[1024];
  attn_url handover_url;
  double handover_timeout;
} attnd_config;

/*
 * Fills c from argv, then the environment for flags not given, then the
 * defaults. Returns 0 to run, 1 when --help or --version was printed (exit
 * 0), or -1 after printing one line to stderr (exit 2).
 */
int attnd_config_parse(attnd_config *c, int argc, char **argv);

#endif
