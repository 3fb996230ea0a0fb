/*
 * main.c — attnd: configuration, the engine, the HTTP front and the loop,
 * started in that order and stopped in reverse once a drain completes (the
 * sessions handed over, then saved, before the store closes).
 */
#include "handover.h"
#include "listen.h"
#include "log.h"
#include "loop.h"
#include "routes.h"
#include "sessions.h"
#include "tls.h"

#include <malloc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Picks the backend auto requests will use and says why; -1 when the one
 * asked for cannot run here. */
static int choose_backend(attnd_server *s) {
  attn_backend_info info[ATTND_MAX_BACKENDS];
  int n = attn_engine_backends(s->engine, info, ATTND_MAX_BACKENDS);
  const attn_backend_info *cpu = NULL, *cuda = NULL;
  for (int i = 0; i < n && i < ATTND_MAX_BACKENDS; i++) {
    if (!strcmp(info[i].name, "cpu"))
      cpu = &info[i];
    if (!strcmp(info[i].name, "cuda"))
      cuda = &info[i];
  }
  const char *want = s->cfg->backend;
  if (!strcmp(want, "cuda")) {
    if (!cuda || !cuda->available) {
      fprintf(stderr, "attnd: --backend cuda: %s\n",
              cuda ? cuda->detail : "no CUDA device was found: this build has no CUDA support");
      return -1;
    }
    s->backend = "cuda";
  } else if (cuda && cuda->available && strcmp(want, "cpu")) {
    s->backend = "cuda";
  } else {
    if (!cpu || !cpu->available) {
      fprintf(stderr, "attnd: the CPU backend cannot run: %s\n", cpu ? cpu->detail : "missing");
      return -1;
    }
    if (!strcmp(want, "auto"))
      s->backend_note = cuda ? " (backend auto: no CUDA device was found, using the CPU)"
                             : " (backend auto: this build has no CUDA support, using the CPU)";
    s->backend = "cpu";
  }
  const attn_backend_info *b = !strcmp(s->backend, "cuda") ? cuda : cpu;
  snprintf(s->engine_detail, sizeof s->engine_detail, "%s (%s)", b->name, b->detail);
  return 0;
}

/*
 * Large blocks (bodies, tensors, replies) are mapped on their own and given
 * back to the system when freed. glibc maps blocks above M_MMAP_THRESHOLD,
 * but after freeing one it raises the threshold to that block's size (up to
 * 32 MiB), so later blocks of a burst come from the heap and stay in the
 * process after free: RSS only grows. A fixed threshold turns that off.
 */
#define MMAP_THRESHOLD (1 << 20)
static void return_freed_memory(void) {
#ifdef __GLIBC__
  mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD);
#endif
}

/* SIGHUP and SIGUSR1 are ignored while the loop cannot log them: before it
 * exists (the engine's start, a GPU self-check, takes seconds) and once its
 * handles are closed (libuv then puts back the default, which would end the
 * process with 129 in the middle of its exit). The loop logs them between. */
static void ignore_reload_signals(void) {
  signal(SIGHUP, SIG_IGN);
  signal(SIGUSR1, SIG_IGN);
}

/* The startup line: where, on what, and which of the optional guards are
 * on (never the key itself). */
static void say_listening(attnd_server *s) {
  const attnd_config *c = s->cfg;
  char line[800], keys[64] = "";
  if (c->keys.n)
    snprintf(keys, sizeof keys, ", API key required (%d key%s)", c->keys.n,
             c->keys.n == 1 ? "" : "s");
  snprintf(line, sizeof line,
           "attnd %s: listening on %s://%s:%d, backend %s%s, max body %llu bytes, max queue "
           "%d, %d HTTP thread%s%s%s%s",
           ATTN_VERSION, s->tls_cert_pem ? "https" : "http", c->host, s->port, s->engine_detail,
           s->backend_note, (unsigned long long)c->max_body, c->max_queue, c->http_threads,
           c->http_threads == 1 ? "" : "s", keys, *c->cors_origin ? ", CORS origin " : "",
           c->cors_origin);
  if (c->log_json)
    attnd_log_note(s, ATTND_INFO, NULL, NULL, "%s", line);
  else
    fprintf(stderr, "%s\n", line);
}

_Static_assert((int)ATTND_MAX_KEYS <= (int)ATTND_METRICS_MAX_KEYS &&
                   (int)ATTND_KEY_NAME_MAX < (int)ATTND_METRICS_KEY_CAP,
               "every key's name has its series");

/* The metrics: a series for each route, and one for each API key's name
 * (a set fixed here, so the series stay bounded). NULL after a message. */
static attnd_metrics *open_metrics(const attnd_config *c) {
  const char *labels[ATTND_METRICS_MAX_ROUTES], *names[ATTND_MAX_KEYS];
  int nlabels = attnd_route_labels(labels, ATTND_METRICS_MAX_ROUTES);
  attnd_metrics *m = attnd_metrics_new(labels, nlabels);
  for (int i = 0; i < c->keys.n; i++)
    names[i] = c->keys.k[i].name;
  if (m && attnd_metrics_keys(m, names, c->keys.n) < 0) {
    attnd_metrics_free(m);
    m = NULL;
  }
  if (!m)
    fprintf(stderr, "attnd: out of memory for the metrics\n");
  return m;
}

int main(int argc, char **argv) {
  attnd_config cfg;
  int rc = attnd_config_parse(&cfg, argc, argv);
  if (rc != 0)
    return rc > 0 ? 0 : 2;
  signal(SIGPIPE, SIG_IGN);
  ignore_reload_signals();
  return_freed_memory();
  static attnd_server s; /* lives as long as the process */
  s.cfg = &cfg;
  s.transport = &attnd_http_transport;
  s.backend_note = "";
  pthread_mutex_init(&s.log_mu, NULL);
  attnd_reqid_init(&s.ids);
  if (*cfg.tls_cert &&
      (attnd_tls_check_priorities(cfg.tls_priorities) < 0 ||
       attnd_tls_load(cfg.tls_cert, cfg.tls_key, &s.tls_cert_pem, &s.tls_key_pem) < 0))
    return 2;
  attn_config ec;
  attn_config_init(&ec);
  ec.threads = cfg.threads;
  ec.cpu_isa = cfg.isa;
  ec.cpu_tune = cfg.cpu_tune;
  ec.cuda_streams = cfg.streams;
  ec.cuda_devices = cfg.devices;
  ec.cuda_self_check_off = !cfg.gpu_self_check;
  ec.cuda_bwd_atomic_dq = !cfg.deterministic;
  ec.cuda_pinned_bytes = cfg.pinned_memory;
  attn_status st;
  if (attn_engine_open(&ec, &s.engine, &st) < 0) {
    fprintf(stderr, "attnd: cannot start the engine: %s\n", st.message);
    return 2;
  }
  s.metrics = open_metrics(&cfg);
  if (!s.metrics || choose_backend(&s) < 0 || attnd_sessions_open(&s) < 0 ||
      attnd_loop_init(&s) < 0) {
    attn_engine_close(s.engine);
    attnd_metrics_free(s.metrics);
    return 2;
  }
  if (attnd_http_start(&s) < 0) {
    attnd_loop_close(&s);
    attn_engine_close(s.engine);
    attnd_metrics_free(s.metrics);
    return 2;
  }
  say_listening(&s);
  attnd_loop_run(&s);
  if (s.running > 0) {
    /* Jobs canceled at the drain timeout may still be finishing an engine
     * work item: leave without waiting for them. */
    attnd_handover_run(&s);
    attnd_sessions_close(&s, true);
    fflush(stderr);
    _exit(0);
  }
  attnd_http_stop(&s);
  attnd_loop_close(&s);
  ignore_reload_signals();
  attnd_handover_run(&s); /* no request can reach a session now */
  attnd_sessions_close(&s, false);
  attn_engine_close(s.engine);
  attnd_metrics_free(s.metrics);
  attnd_log_note(&s, ATTND_INFO, NULL, NULL, "drained, exiting");
  pthread_mutex_destroy(&s.log_mu);
  free(s.tls_cert_pem);
  free(s.tls_key_pem);
  return 0;
}
