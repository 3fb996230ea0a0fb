/*
 * listen.c — the HTTP front's daemon (listen.h): the listening socket, the
 * open-file limit it needs, libmicrohttpd's options and HTTPS priorities,
 * the connections it accepts into the registry, and the transport the
 * loop reaches them through.
 */
#include "listen.h"
#include "body.h"
#include "http.h"
#include "mhd_shim.h"

#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

/* libmicrohttpd's per-connection memory: the request line and headers,
 * their index (some 56 bytes a field), the reply's headers, and the buffer
 * a body is read through (the pool's free part). It holds a head at
 * parse.h's limits (16 KiB in 100 fields) with room to spare, as nginx's
 * 4 x 8 KiB header buffers do; libmicrohttpd 0.9.75 zeroes all of it
 * before each request (MHD_pool_reset), so it is no bigger: 64 KiB cost
 * some 100,000 instructions a request, most of a small request's. */
#define CONNECTION_MEMORY ((size_t)32 * 1024)

/* Connections the kernel queues before attnd accepts them. */
#define LISTEN_BACKLOG 1024

static void client_text(const struct sockaddr *a, char *out, size_t cap) {
  if (a && a->sa_family == AF_INET)
    inet_ntop(AF_INET, &((const struct sockaddr_in *)(const void *)a)->sin_addr, out,
              (socklen_t)cap);
  else if (a && a->sa_family == AF_INET6)
    inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)(const void *)a)->sin6_addr, out,
              (socklen_t)cap);
  else
    snprintf(out, cap, "?");
}

/* Before accepting: room is made by closing the oldest idle connections. */
static enum MHD_Result on_accept(void *cls, const struct sockaddr *addr, socklen_t len) {
  (void)len;
  attnd_server *s = cls;
  char client[48];
  client_text(addr, client, sizeof client);
  return attnd_conns_admit(&s->conns, client, attn_now()) ? MHD_YES : MHD_NO;
}

static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_ctx,
                          enum MHD_ConnectionNotificationCode code) {
  attnd_server *s = cls;
  if (code == MHD_CONNECTION_NOTIFY_STARTED) {
    attnd_metrics_gauge_add(s->metrics, ATTND_GAUGE_CONNECTIONS, 1);
    const union MHD_ConnectionInfo *fd =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    const union MHD_ConnectionInfo *addr =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    char client[48];
    client_text(addr ? addr->client_addr : NULL, client, sizeof client);
    attnd_conn *k = fd ? attnd_conns_open(&s->conns, fd->connect_fd, client, attn_now()) : NULL;
    if (k)
      k->owner = s;
    *socket_ctx = k;
    return;
  }
  attnd_metrics_gauge_add(s->metrics, ATTND_GAUGE_CONNECTIONS, -1);
  if (*socket_ctx) {
    attnd_mhd_unparsed(s, *socket_ctx);
    attnd_conns_close(&s->conns, *socket_ctx);
  }
  *socket_ctx = NULL;
}

/* Binds the socket ourselves: a port in use is reported with its reason,
 * and port 0 picks a free one whose number we can log. */
static int bind_listen(attnd_server *s) {
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)s->cfg->port)};
  const char *host = s->cfg->host;
  if (!strcmp(host, "localhost"))
    host = "127.0.0.1";
  if (inet_pton(AF_INET, host, &a.sin_addr) != 1) {
    fprintf(stderr, "attnd: --listen: \"%s\" is not an IPv4 address\n", s->cfg->host);
    return -1;
  }
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0 ||
      bind(fd, (struct sockaddr *)&a, sizeof a) < 0 || listen(fd, LISTEN_BACKLOG) < 0) {
    fprintf(stderr, "attnd: cannot listen on %s:%d: %s\n", s->cfg->host, s->cfg->port,
            strerror(errno));
    if (fd >= 0)
      close(fd);
    return -1;
  }
  socklen_t len = sizeof a;
  getsockname(fd, (struct sockaddr *)&a, &len);
  s->port = ntohs(a.sin_port);
  s->listen_fd = fd;
  return 0;
}

/* Descriptors attnd needs besides its connections: stdio, the listening
 * socket, epoll, libuv's and the engine's wake-ups, a GPU driver's; and
 * each polling thread of a pool its epoll and its wake-up (an eventfd). */
#define RESERVED_FDS 32
static int pool_fds(const attnd_config *c) { return c->http_threads > 1 ? 2 * c->http_threads : 0; }

/* Connections the registry has shut down and libmicrohttpd has not yet
 * closed still count against libmicrohttpd's own limit: it is set this much
 * above --max-connections, so eviction always finds room. */
static int eviction_slack(int max) { return max / 8 > 8 ? max / 8 : 8; }

/*
 * Raises the open-file limit to what --max-connections needs; where the
 * hard limit does not allow it, lowers the connections served to fit and
 * says so, rather than let accept() fail and park clients in the backlog.
 */
static void fit_open_files(attnd_server *s) {
  int max = s->cfg->max_connections;
  rlim_t need = (rlim_t)max + (rlim_t)eviction_slack(max) + RESERVED_FDS + pool_fds(s->cfg);
  struct rlimit rl;
  s->max_connections = max;
  if (getrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_cur >= need)
    return;
  struct rlimit want = {need, rl.rlim_max >= need ? rl.rlim_max : need};
  if (setrlimit(RLIMIT_NOFILE, &want) == 0)
    return;
  want.rlim_max = rl.rlim_max;
  want.rlim_cur = rl.rlim_max;
  setrlimit(RLIMIT_NOFILE, &want);
  getrlimit(RLIMIT_NOFILE, &rl);
  long room = (long)rl.rlim_cur - RESERVED_FDS - pool_fds(s->cfg);
  int fit = room > 9 ? (int)(room * 8 / 9) : 1;
  if (fit < max)
    s->max_connections = fit;
  fprintf(stderr,
          "attnd: the open-file limit is %llu (ulimit -n) and cannot be raised to %llu: "
          "serving at most %d connections instead of %d\n",
          (unsigned long long)rl.rlim_cur, (unsigned long long)need, s->max_connections, max);
}

int attnd_http_start(attnd_server *s) {
  if (bind_listen(s) < 0)
    return -1;
  const attnd_config *c = s->cfg;
  fit_open_files(s);
  int per_client = c->max_connections_per_client;
  attnd_conns_init(&s->conns, s->max_connections, per_client, c->header_timeout, c->idle_timeout);
  s->conns.uncapped = &c->trusted_proxies;
  attnd_conns_uploads(&s->conns, c->min_upload_rate, attnd_body_cut, s);
  unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME |
                   MHD_USE_ERROR_LOG;
  struct MHD_OptionItem tls[4] = {{MHD_OPTION_END, 0, NULL}};
  if (s->tls_cert_pem) {
    if (MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES) {
      fprintf(stderr, "attnd: --tls-cert: this libmicrohttpd was built without TLS (GnuTLS)\n");
      close(s->listen_fd);
      return -1;
    }
    flags |= MHD_USE_TLS;
    tls[0] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_CERT, 0, s->tls_cert_pem};
    tls[1] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_KEY, 0, s->tls_key_pem};
    /* checked at start (attnd_tls_check_priorities); libmicrohttpd's own
     * default, NORMAL, would accept TLS 1.0 and 1.1 and CBC suites */
    tls[2] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_PRIORITIES, 0,
                                     (void *)(uintptr_t)c->tls_priorities};
    tls[3] = (struct MHD_OptionItem){MHD_OPTION_END, 0, NULL};
  }
  unsigned limit = (unsigned)(s->max_connections + eviction_slack(s->max_connections));
  /* --http-threads above 1: libmicrohttpd's thread pool, each thread with
   * its own epoll, accepting in turn and polling the connections it
   * accepted; the registry and the rest of the front are shared and lock
   * themselves. With 1, one polling thread. The pool divides the limit
   * among its threads, and a thread at its share would close what it
   * accepts unseen by the registry, whose admission (and eviction) is the
   * real limit: each thread gets all of it, as far as the open-file limit
   * allows (libmicrohttpd's limit keeps connections the registry shut down,
   * not yet closed, from running out of descriptors). */
  struct MHD_OptionItem pool[2] = {{MHD_OPTION_END, 0, NULL}, {MHD_OPTION_END, 0, NULL}};
  if (c->http_threads > 1) {
    pool[0] = (struct MHD_OptionItem){MHD_OPTION_THREAD_POOL_SIZE, c->http_threads, NULL};
    struct rlimit rl;
    unsigned fds = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < (rlim_t)UINT_MAX
                       ? (unsigned)rl.rlim_cur
                       : UINT_MAX;
    unsigned room =
        fds > RESERVED_FDS + (unsigned)pool_fds(c) ? fds - RESERVED_FDS - (unsigned)pool_fds(c) : 0;
    unsigned all = limit * (unsigned)c->http_threads;
    limit = all < room ? all : room > limit ? room : limit;
  }
  /* The logger must come first, or libmicrohttpd prints its first notes
   * itself. */
  s->mhd = MHD_start_daemon(
      flags, 0, on_accept, s, attnd_http_on_request, s, MHD_OPTION_EXTERNAL_LOGGER, attnd_mhd_log,
      s, MHD_OPTION_LISTEN_SOCKET, s->listen_fd, MHD_OPTION_NOTIFY_COMPLETED,
      attnd_http_on_completed, s, MHD_OPTION_NOTIFY_CONNECTION, on_connection, s,
      MHD_OPTION_URI_LOG_CALLBACK, attnd_http_on_target, s, MHD_OPTION_UNESCAPE_CALLBACK,
      attnd_http_on_unescape, s, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)c->idle_timeout,
      MHD_OPTION_CONNECTION_LIMIT, limit, MHD_OPTION_CONNECTION_MEMORY_LIMIT, CONNECTION_MEMORY,
      MHD_OPTION_ARRAY, tls, MHD_OPTION_ARRAY, pool, MHD_OPTION_END);
  if (!s->mhd) {
    fprintf(stderr, "attnd: cannot start the HTTP%s daemon on %s:%d\n", s->tls_cert_pem ? "S" : "",
            c->host, s->port);
    attnd_conns_destroy(&s->conns);
    close(s->listen_fd);
    return -1;
  }
  return 0;
}

/*
 * A drain stops accepting. libmicrohttpd hands the listening socket back,
 * but its polling threads may still be using it (an accept or an epoll_ctl
 * under way): it must stay open until MHD_stop_daemon has joined them, or
 * its number could be reused by a connection meanwhile. shutdown() stops
 * the listener at once: new connections are refused, and those in the
 * backlog are reset.
 */
static void quiesce(attnd_server *s) {
  MHD_socket fd = MHD_quiesce_daemon(s->mhd);
  if (fd == MHD_INVALID_SOCKET)
    return;
  shutdown(fd, SHUT_RDWR);
  s->quiesced = true;
}

void attnd_http_stop(attnd_server *s) {
  if (!s->mhd)
    return;
  atomic_store(&s->stopping, true);
  MHD_stop_daemon(s->mhd);
  s->mhd = NULL;
  if (s->quiesced) /* handed back by the drain: ours to close */
    close(s->listen_fd);
  attnd_conns_destroy(&s->conns);
}

static void resume(attnd_req *r) { MHD_resume_connection(r->conn); }

static bool client_gone(attnd_req *r) {
  const union MHD_ConnectionInfo *ci =
      MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
  /* Data is a pipelining client. End-of-file is a client that closed, or
   * half-closed, before its reply: TCP cannot tell the two apart, and as
   * nginx does for proxied requests, attnd takes both as the client
   * abandoning the job, so that nobody's slot is spent on it. */
  return ci && attnd_peek(ci->connect_fd) <= 0;
}

static const char *header(attnd_req *r, const char *name) {
  return MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, name);
}

const attnd_transport attnd_http_transport = {
    .resume = resume,
    .client_gone = client_gone,
    .quiesce = quiesce,
    .header = header,
};
