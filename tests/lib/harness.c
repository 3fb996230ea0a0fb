/* harness.c — see harness.h. */
#define _GNU_SOURCE
#include "harness.h"

#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ---- misc ---------------------------------------------------------------- */

double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

void sleep_s(double s) {
  struct timespec t = {.tv_sec = (time_t)s, .tv_nsec = (long)((s - (double)(time_t)s) * 1e9)};
  while (nanosleep(&t, &t) < 0 && errno == EINTR)
    ;
}

char *read_file_all(const char *path, size_t *plen) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return NULL;
  size_t cap = 4096, n = 0;
  char *b = malloc(cap + 1);
  size_t r;
  while ((r = fread(b + n, 1, cap - n, f)) > 0) {
    n += r;
    if (n == cap) {
      cap *= 2;
      b = realloc(b, cap + 1);
    }
  }
  fclose(f);
  b[n] = 0;
  if (plen)
    *plen = n;
  return b;
}

/* ---- the server process ------------------------------------------------ */

#define MAX_SERVERS 64
static pid_t g_pids[MAX_SERVERS];
static int g_npids;
static bool g_init;

void srv_kill_all(void) {
  for (int i = 0; i < g_npids; i++)
    if (g_pids[i] > 0) {
      kill(g_pids[i], SIGKILL);
      waitpid(g_pids[i], NULL, 0);
      g_pids[i] = 0;
    }
}

static void forget_pid(pid_t p) {
  for (int i = 0; i < g_npids; i++)
    if (g_pids[i] == p)
      g_pids[i] = 0;
}

static void harness_init(void) {
  if (g_init)
    return;
  g_init = true;
  signal(SIGPIPE, SIG_IGN);
  curl_global_init(CURL_GLOBAL_ALL);
  atexit(srv_kill_all);
}

const char *srv_bin(void) {
  const char *b = getenv("ATTND_BIN");
  return b && *b ? b : "build/attnd";
}

int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t al = sizeof a;
  if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) < 0 ||
      getsockname(fd, (struct sockaddr *)&a, &al) < 0) {
    if (fd >= 0)
      close(fd);
    return -1;
  }
  close(fd);
  return ntohs(a.sin_port);
}

static int decode_status(int ws) {
  if (WIFEXITED(ws))
    return WEXITSTATUS(ws);
  if (WIFSIGNALED(ws))
    return 128 + WTERMSIG(ws);
  return -1;
}

/* Forks and execs the binary with args; stdout and stderr to the files. */
static pid_t spawn(const char *const *args, const char *const *env, const char *out_path,
                   const char *err_path) {
  harness_init();
  const char *argv[64];
  int n = 0;
  argv[n++] = srv_bin();
  for (int i = 0; args && args[i] && n < 63; i++)
    argv[n++] = args[i];
  argv[n] = NULL;
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0)
    return -1;
  if (pid == 0) {
    /* The server dies with the test process, whatever ends it. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)
      _exit(127);
    setpgid(0, 0);
    int o = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int e = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int z = open("/dev/null", O_RDONLY);
    if (o < 0 || e < 0 || z < 0)
      _exit(127);
    dup2(z, 0);
    dup2(o, 1);
    dup2(e, 2);
    /* Nothing of the test's environment leaks into the server's flags. */
    for (char **p = environ; *p;) {
      if (!strncmp(*p, "ATTND_", 6)) {
        char name[128];
        size_t k = strcspn(*p, "=");
        if (k >= sizeof name)
          k = sizeof name - 1;
        memcpy(name, *p, k);
        name[k] = 0;
        unsetenv(name);
        p = environ;
      } else {
        p++;
      }
    }
    for (int i = 0; env && env[i]; i++)
      putenv((char *)(uintptr_t)env[i]);
    signal(SIGPIPE, SIG_DFL);
    execv(argv[0], (char *const *)(uintptr_t)argv);
    fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
    _exit(127);
  }
  if (g_npids < MAX_SERVERS)
    g_pids[g_npids++] = pid;
  return pid;
}

pid_t srv_spawn(srv *s, const char *const *args, const char *const *env, bool listen) {
  harness_init();
  if (listen || s->port <= 0)
    s->port = free_port();
  snprintf(s->url, sizeof s->url, "http://127.0.0.1:%d", s->port);
  snprintf(s->log, sizeof s->log, "/tmp/attnd-test-%d-%d.err", (int)getpid(), s->port);
  snprintf(s->out, sizeof s->out, "/tmp/attnd-test-%d-%d.out", (int)getpid(), s->port);
  const char *argv[64];
  int n = 0;
  char listen_arg[64];
  if (listen) {
    snprintf(listen_arg, sizeof listen_arg, "127.0.0.1:%d", s->port);
    argv[n++] = "--listen";
    argv[n++] = listen_arg;
  }
  for (int i = 0; args && args[i] && n < 62; i++)
    argv[n++] = args[i];
  argv[n] = NULL;
  s->status = -1;
  s->pid = spawn(argv, env, s->out, s->log);
  return s->pid;
}

static double start_timeout(void) {
  const char *t = getenv("ATTND_START_TIMEOUT");
  double v = t ? atof(t) : 0;
  return v > 0 ? v : 10;
}

void srv_startv(srv *s, const char *const *args, const char *const *env, bool listen) {
  cr_assert(access(srv_bin(), X_OK) == 0, "server binary %s not found (set ATTND_BIN)", srv_bin());
  for (int attempt = 0; attempt < 3; attempt++) {
    cr_assert(srv_spawn(s, args, env, listen) > 0, "fork failed");
    double t0 = now_s(), limit = start_timeout();
    while (now_s() - t0 < limit) {
      if (!srv_running(s))
        break;
      http_res r;
      http_req rq = {.path = "/healthz", .timeout_ms = 1000};
      if (http_do(s, &rq, &r) == 0 && r.status == 200) {
        http_res_free(&r);
        return;
      }
      http_res_free(&r);
      sleep_s(0.02);
    }
    char *log = srv_log(s);
    bool port_race = !srv_running(s) && log && strstr(log, "in use") && listen;
    if (!port_race) {
      bool running = srv_running(s);
      srv_kill(s);
      cr_assert(false, "attnd did not become healthy within %.0f s (%s, status %d); stderr:\n%s",
                limit, running ? "still running" : "exited", s->status, log ? log : "");
    }
    free(log); /* someone took the port between free_port() and bind: retry */
  }
  cr_assert(false, "attnd could not bind a free port three times");
}

void srv_start(srv *s, ...) {
  const char *args[48];
  int n = 0;
  va_list ap;
  va_start(ap, s);
  const char *a;
  while ((a = va_arg(ap, const char *)) != NULL && n < 47)
    args[n++] = a;
  va_end(ap);
  args[n] = NULL;
  memset(s, 0, sizeof *s);
  srv_startv(s, args, NULL, true);
}

bool srv_running(srv *s) {
  if (s->pid <= 0)
    return false;
  int ws;
  pid_t r = waitpid(s->pid, &ws, WNOHANG);
  if (r == s->pid) {
    s->status = decode_status(ws);
    forget_pid(s->pid);
    s->pid = 0;
    return false;
  }
  return r == 0;
}

int srv_wait(srv *s, double timeout_s) {
  double t0 = now_s();
  while (srv_running(s)) {
    if (now_s() - t0 > timeout_s)
      return -1;
    sleep_s(0.01);
  }
  return s->status;
}

int srv_stop(srv *s, double timeout_s) {
  if (s->pid <= 0)
    return s->status;
  kill(s->pid, SIGTERM);
  int st = srv_wait(s, timeout_s);
  if (st == -1 && s->pid > 0) {
    srv_kill(s);
    return -1;
  }
  return st;
}

void srv_kill(srv *s) {
  if (s->pid > 0) {
    kill(s->pid, SIGKILL);
    int ws;
    if (waitpid(s->pid, &ws, 0) == s->pid)
      s->status = decode_status(ws);
    forget_pid(s->pid);
    s->pid = 0;
  }
}

void srv_cleanup(srv *s) {
  /* A graceful stop lets LeakSanitizer report on an instrumented server. */
  if (s->pid > 0 && srv_stop(s, 5) == -1)
    fprintf(stderr, "attnd (port %d) did not exit within 5 s of SIGTERM at teardown; killed\n",
            s->port);
  srv_kill(s);
  char *log = s->log[0] ? srv_log(s) : NULL;
  if (log && (strstr(log, "Sanitizer") || strstr(log, "runtime error:"))) {
    /* The server's stderr is not the test's: copy the report where the
     * Makefile looks for it. */
    fprintf(stderr, "attnd sanitizer report (port %d):\n%s\n", s->port, log);
    cr_expect(false, "the server reported sanitizer errors (see its stderr above)");
  }
  free(log);
  const char *keep = getenv("ATTND_KEEP_LOGS");
  if (!(keep && *keep)) {
    if (s->log[0])
      unlink(s->log);
    if (s->out[0])
      unlink(s->out);
  }
}

char *srv_log(const srv *s) { return read_file_all(s->log, NULL); }

bool srv_wait_log(const srv *s, const char *needle, double timeout_s) {
  for (double end = now_s() + timeout_s;; sleep_s(0.02)) {
    char *log = srv_log(s);
    bool found = log && strstr(log, needle);
    free(log);
    if (found || now_s() > end)
      return found;
  }
}

int run_attnd(const char *const *args, const char *const *env, double timeout_s, char **out,
              char **err) {
  char op[96], ep[96];
  static int seq;
  snprintf(op, sizeof op, "/tmp/attnd-run-%d-%d.out", (int)getpid(), seq);
  snprintf(ep, sizeof ep, "/tmp/attnd-run-%d-%d.err", (int)getpid(), seq++);
  srv s = {0};
  s.pid = spawn(args, env, op, ep);
  if (s.pid <= 0)
    return -2;
  int st = srv_wait(&s, timeout_s);
  if (st == -1)
    srv_kill(&s);
  if (out)
    *out = read_file_all(op, NULL);
  if (err)
    *err = read_file_all(ep, NULL);
  unlink(op);
  unlink(ep);
  return st;
}

/* ---- HTTP with libcurl ------------------------------------------------- */

typedef struct buf {
  char *p;
  size_t n, cap;
} buf;

static void buf_add(buf *b, const void *d, size_t n) {
  if (b->n + n + 1 > b->cap) {
    size_t c = b->cap ? b->cap : 1024;
    while (c < b->n + n + 1)
      c *= 2;
    b->p = realloc(b->p, c);
    b->cap = c;
  }
  memcpy(b->p + b->n, d, n);
  b->n += n;
  b->p[b->n] = 0;
}

static size_t on_body(char *d, size_t sz, size_t nm, void *arg) {
  buf_add(arg, d, sz * nm);
  return sz * nm;
}

static size_t on_header(char *d, size_t sz, size_t nm, void *arg) {
  buf *b = arg;
  /* A new status line (after a 100 Continue) starts a new block. */
  if (sz * nm >= 5 && !strncmp(d, "HTTP/", 5))
    b->n = 0;
  buf_add(b, d, sz * nm);
  return sz * nm;
}

typedef struct reader {
  const char *p;
  size_t left;
} reader;

static size_t on_read(char *d, size_t sz, size_t nm, void *arg) {
  reader *r = arg;
  size_t n = sz * nm;
  if (n > 65536)
    n = 65536;
  if (n > r->left)
    n = r->left;
  memcpy(d, r->p, n);
  r->p += n;
  r->left -= n;
  return n;
}

void *http_handle(void) {
  harness_init();
  return curl_easy_init();
}

void http_handle_free(void *h) { curl_easy_cleanup(h); }

int http_do_h(void *hv, const srv *s, const http_req *rq, http_res *rs) {
  CURL *h = hv;
  memset(rs, 0, sizeof *rs);
  char url[2048];
  snprintf(url, sizeof url, "%s%s", s->url, rq->path ? rq->path : "/");
  buf body = {0}, hdrs = {0};
  reader rd = {rq->body, rq->len};
  struct curl_slist *hl = NULL;
  bool has_expect = false;
  for (int i = 0; rq->headers && rq->headers[i]; i++) {
    hl = curl_slist_append(hl, rq->headers[i]);
    if (!strncasecmp(rq->headers[i], "Expect:", 7))
      has_expect = true;
  }
  if (!has_expect)
    hl = curl_slist_append(hl, "Expect:");
  if (rq->chunked)
    hl = curl_slist_append(hl, "Transfer-Encoding: chunked");
  curl_easy_reset(h);
  curl_easy_setopt(h, CURLOPT_URL, url);
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &body);
  curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(h, CURLOPT_HEADERDATA, &hdrs);
  curl_easy_setopt(h, CURLOPT_ERRORBUFFER, rs->error);
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, rq->timeout_ms > 0 ? rq->timeout_ms : 30000L);
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, 5000L);
  curl_easy_setopt(h, CURLOPT_PROXY, "");
  const char *method = rq->method ? rq->method : (rq->body ? "POST" : "GET");
  if (rq->body) {
    if (rq->chunked) {
      curl_easy_setopt(h, CURLOPT_POST, 1L);
      curl_easy_setopt(h, CURLOPT_READFUNCTION, on_read);
      curl_easy_setopt(h, CURLOPT_READDATA, &rd);
    } else {
      curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)rq->len);
      curl_easy_setopt(h, CURLOPT_POSTFIELDS, rq->body);
    }
    if (strcmp(method, "POST"))
      curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
  } else if (!strcmp(method, "HEAD")) {
    curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
  } else if (strcmp(method, "GET")) {
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
  }
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, hl);
  rs->curl_rc = curl_easy_perform(h);
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &rs->status);
  curl_easy_getinfo(h, CURLINFO_TOTAL_TIME, &rs->secs);
  curl_slist_free_all(hl);
  if (!body.p)
    buf_add(&body, "", 0);
  if (!hdrs.p)
    buf_add(&hdrs, "", 0);
  rs->body = body.p;
  rs->len = body.n;
  rs->hdrs = hdrs.p;
  rs->hlen = hdrs.n;
  if (rs->curl_rc != CURLE_OK) {
    if (!rs->error[0])
      snprintf(rs->error, sizeof rs->error, "%s", curl_easy_strerror(rs->curl_rc));
    return -1;
  }
  return 0;
}

int http_do(const srv *s, const http_req *rq, http_res *rs) {
  CURL *h = http_handle();
  int rc = http_do_h(h, s, rq, rs);
  curl_easy_cleanup(h);
  return rc;
}

int http_get(const srv *s, const char *path, http_res *rs) {
  http_req rq = {.path = path};
  return http_do(s, &rq, rs);
}

int http_post(const srv *s, const char *path, const char *ctype, const void *body, size_t len,
              http_res *rs) {
  char ct[256];
  const char *hdrs[2] = {ct, NULL};
  if (ctype)
    snprintf(ct, sizeof ct, "Content-Type: %s", ctype);
  else
    snprintf(ct, sizeof ct, "Content-Type:"); /* no Content-Type at all */
  http_req rq = {
      .method = "POST", .path = path, .headers = hdrs, .body = body ? body : "", .len = len};
  return http_do(s, &rq, rs);
}

bool http_header(const http_res *rs, const char *name, char *out, size_t cap) {
  if (!rs->hdrs)
    return false;
  size_t nl = strlen(name);
  for (const char *p = rs->hdrs; *p;) {
    const char *e = strchr(p, '\n');
    size_t ll = e ? (size_t)(e - p) : strlen(p);
    if (ll > nl && !strncasecmp(p, name, nl) && p[nl] == ':') {
      const char *v = p + nl + 1;
      while (v < p + ll && (*v == ' ' || *v == '\t'))
        v++;
      const char *ve = p + ll;
      while (ve > v && (ve[-1] == '\r' || ve[-1] == ' ' || ve[-1] == '\t'))
        ve--;
      size_t vl = (size_t)(ve - v);
      if (vl >= cap)
        vl = cap - 1;
      memcpy(out, v, vl);
      out[vl] = 0;
      return true;
    }
    if (!e)
      break;
    p = e + 1;
  }
  return false;
}

void http_res_free(http_res *rs) {
  free(rs->body);
  free(rs->hdrs);
  rs->body = rs->hdrs = NULL;
}

static const char *snip(const char *s, size_t len, char *b, size_t cap) {
  size_t n = len < cap - 4 ? len : cap - 4;
  for (size_t i = 0; i < n; i++)
    b[i] = (s[i] >= 32 && s[i] < 127) ? s[i] : '.';
  b[n] = 0;
  if (n < len)
    strcat(b, "...");
  return b;
}

bool expect_error(const http_res *rs, long status, const char *code, const char *what) {
  char sn[400], ct[128] = "";
  bool ok = true;
  const char *body = rs->body ? rs->body : "";
  snip(body, rs->len, sn, sizeof sn);
  if (rs->status != status) {
    cr_expect(false, "%s: status %ld, want %ld (%s); body: %s", what, rs->status, status,
              rs->status ? "" : rs->error, sn);
    ok = false;
  }
  if (rs->status == 0)
    return false;
  http_header(rs, "Content-Type", ct, sizeof ct);
  if (strncasecmp(ct, "application/json", 16)) {
    cr_expect(false, "%s: error Content-Type \"%s\", want application/json", what, ct);
    ok = false;
  }
  cJSON *j = cJSON_ParseWithLength(body, rs->len);
  cJSON *err = j ? cJSON_GetObjectItemCaseSensitive(j, "error") : NULL;
  cJSON *c = cJSON_GetObjectItemCaseSensitive(err, "code");
  cJSON *m = cJSON_GetObjectItemCaseSensitive(err, "message");
  if (!cJSON_IsObject(j) || !cJSON_IsObject(err) || !cJSON_IsString(c) || !cJSON_IsString(m)) {
    cr_expect(false, "%s: error body is not {\"error\":{\"code\",\"message\"}}: %s", what, sn);
    ok = false;
  } else {
    if (code && strcmp(c->valuestring, code)) {
      cr_expect(false, "%s: error code \"%s\", want \"%s\" (message: %s)", what, c->valuestring,
                code, m->valuestring);
      ok = false;
    }
    if (!m->valuestring[0]) {
      cr_expect(false, "%s: empty error message", what);
      ok = false;
    }
  }
  cJSON_Delete(j);
  return ok;
}

bool expect_healthy(const srv *s, const char *after) {
  http_res r;
  http_req rq = {.path = "/healthz", .timeout_ms = 5000};
  http_do(s, &rq, &r);
  bool ok = r.status == 200;
  cr_expect(ok, "/healthz after %s: status %ld (%s)", after, r.status, r.error);
  http_res_free(&r);
  return ok;
}

/* ---- raw sockets ------------------------------------------------------- */

int raw_connect(int port) { return raw_connect_from(port, NULL); }

int raw_connect_from(int port, const char *source) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return -1;
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  struct sockaddr_in from = {.sin_family = AF_INET};
  if ((source && (inet_pton(AF_INET, source, &from.sin_addr) != 1 ||
                  bind(fd, (struct sockaddr *)&from, sizeof from) < 0)) ||
      connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
    int e = errno;
    close(fd);
    errno = e;
    return -1;
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

int raw_send(int fd, const void *b, size_t len) {
  const char *p = b;
  while (len) {
    ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return -1;
    p += n;
    len -= (size_t)n;
  }
  return 0;
}

int raw_sends(int fd, const char *s) { return raw_send(fd, s, strlen(s)); }

/* recv with a deadline: >0 bytes, 0 closed, -1 error/reset, -2 timeout. */
static ssize_t recv_until(int fd, char *b, size_t cap, double deadline) {
  for (;;) {
    double left = deadline - now_s();
    if (left <= 0)
      return -2;
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int r = poll(&p, 1, (int)(left * 1000) + 1);
    if (r < 0 && errno == EINTR)
      continue;
    if (r == 0)
      continue;
    ssize_t n = recv(fd, b, cap, 0);
    if (n < 0 && errno == EINTR)
      continue;
    return n < 0 ? -1 : n;
  }
}

int raw_response(int fd, int timeout_ms, http_res *rs) {
  memset(rs, 0, sizeof *rs);
  double deadline = now_s() + timeout_ms / 1000.0, t0 = now_s();
  buf b = {0};
  size_t hend = 0;
  long clen = -1;
  char tmp[65536];
  for (;;) {
    if (!hend && b.p) {
      char *e = strstr(b.p, "\r\n\r\n");
      if (e) {
        hend = (size_t)(e - b.p) + 4;
        rs->hdrs = strndup(b.p, hend);
        rs->hlen = hend;
        sscanf(b.p, "HTTP/%*d.%*d %ld", &rs->status);
        char v[64];
        if (http_header(rs, "Content-Length", v, sizeof v))
          clen = atol(v);
        if (rs->status == 204 || rs->status == 304 || (rs->status >= 100 && rs->status < 200))
          clen = 0;
      }
    }
    if (hend && clen >= 0 && b.n >= hend + (size_t)clen)
      break;
    ssize_t n = recv_until(fd, tmp, sizeof tmp, deadline);
    if (n == -2) {
      snprintf(rs->error, sizeof rs->error, "timeout after %d ms", timeout_ms);
      break;
    }
    if (n <= 0) {
      snprintf(rs->error, sizeof rs->error, n == 0 ? "connection closed" : "connection reset");
      if (hend && clen < 0) /* body until close */
        clen = (long)(b.n - hend);
      break;
    }
    buf_add(&b, tmp, (size_t)n);
  }
  rs->secs = now_s() - t0;
  if (!hend) {
    free(b.p);
    free(rs->hdrs);
    rs->hdrs = strdup("");
    rs->body = strdup("");
    rs->status = 0;
    return -1;
  }
  size_t bl = clen >= 0 && b.n >= hend + (size_t)clen ? (size_t)clen : b.n - hend;
  rs->body = malloc(bl + 1);
  memcpy(rs->body, b.p + hend, bl);
  rs->body[bl] = 0;
  rs->len = bl;
  free(b.p);
  return (int)rs->status;
}

double raw_wait_close(int fd, int timeout_ms) {
  double t0 = now_s(), deadline = t0 + timeout_ms / 1000.0;
  char tmp[4096];
  for (;;) {
    ssize_t n = recv_until(fd, tmp, sizeof tmp, deadline);
    if (n == -2)
      return -1;
    if (n <= 0)
      return now_s() - t0;
  }
}

/* ---- bodies ------------------------------------------------------------ */

void shape_of(const tprob *p, bool kv, int rank, int64_t out[4]) {
  int64_t h = kv ? p->hkv : p->hq, n = kv ? p->nkv : p->nq;
  int64_t full[4] = {p->b, h, n, p->d};
  for (int i = 0; i < rank; i++)
    out[i] = full[4 - rank + i];
}

static void shape_txt(buf *b, const int64_t *s, int rank) {
  char t[32];
  buf_add(b, "[", 1);
  for (int i = 0; i < rank; i++) {
    int n = snprintf(t, sizeof t, i ? ",%lld" : "%lld", (long long)s[i]);
    buf_add(b, t, (size_t)n);
  }
  buf_add(b, "]", 1);
}

static void json_num(buf *b, double x) {
  char t[40];
  int n = snprintf(t, sizeof t, "%.9g", x);
  buf_add(b, t, (size_t)n);
}

static void json_tensor(buf *b, const char *name, const void *data, attn_dtype dt,
                        const int64_t *shape, int rank) {
  char t[64];
  int n = snprintf(t, sizeof t, "\"%s\":{\"shape\":", name);
  buf_add(b, t, (size_t)n);
  shape_txt(b, shape, rank);
  n = snprintf(t, sizeof t, ",\"dtype\":\"%s\",\"data\":[", attn_dtype_name(dt));
  buf_add(b, t, (size_t)n);
  size_t cnt = 1;
  for (int i = 0; i < rank; i++)
    cnt *= (size_t)shape[i];
  for (size_t i = 0; i < cnt; i++) {
    if (i)
      buf_add(b, ",", 1);
    json_num(b, attn_load_elem(data, dt, i));
  }
  buf_add(b, "]}", 2);
}

char *json_body(const tcase *c, int rank, const char *extra, size_t *plen) {
  buf b = {0};
  int64_t sq[4], sk[4];
  shape_of(&c->p, false, rank, sq);
  shape_of(&c->p, true, rank, sk);
  buf_add(&b, "{", 1);
  json_tensor(&b, "q", c->q, c->p.dt, sq, rank);
  buf_add(&b, ",", 1);
  json_tensor(&b, "k", c->k, c->p.dt, sk, rank);
  buf_add(&b, ",", 1);
  json_tensor(&b, "v", c->v, c->p.dt, sk, rank);
  if (extra)
    buf_add(&b, extra, strlen(extra));
  buf_add(&b, "}", 1);
  *plen = b.n;
  return b.p;
}

static void nested(buf *b, const void *data, attn_dtype dt, const int64_t *shape, int rank,
                   size_t *idx) {
  buf_add(b, "[", 1);
  for (int64_t i = 0; i < shape[0]; i++) {
    if (i)
      buf_add(b, ",", 1);
    if (rank == 1)
      json_num(b, attn_load_elem(data, dt, (*idx)++));
    else
      nested(b, data, dt, shape + 1, rank - 1, idx);
  }
  buf_add(b, "]", 1);
}

char *json_nested_body(const tcase *c, int rank, const char *extra, size_t *plen) {
  buf b = {0};
  int64_t sq[4], sk[4];
  shape_of(&c->p, false, rank, sq);
  shape_of(&c->p, true, rank, sk);
  size_t i = 0;
  buf_add(&b, "{\"q\":", 5);
  nested(&b, c->q, c->p.dt, sq, rank, &i);
  i = 0;
  buf_add(&b, ",\"k\":", 5);
  nested(&b, c->k, c->p.dt, sk, rank, &i);
  i = 0;
  buf_add(&b, ",\"v\":", 5);
  nested(&b, c->v, c->p.dt, sk, rank, &i);
  if (extra)
    buf_add(&b, extra, strlen(extra));
  buf_add(&b, "}", 1);
  *plen = b.n;
  return b.p;
}

char *st_body(const tcase *c, int rank, const char *metadata, size_t *plen) {
  const tprob *p = &c->p;
  size_t es = attn_dtype_size(p->dt);
  size_t nq = (size_t)(p->b * p->hq * p->nq * p->d) * es;
  size_t nk = (size_t)(p->b * p->hkv * p->nkv * p->d) * es;
  int64_t sq[4], sk[4];
  shape_of(p, false, rank, sq);
  shape_of(p, true, rank, sk);
  buf h = {0};
  char t[160];
  buf_add(&h, "{", 1);
  if (metadata) {
    buf_add(&h, "\"__metadata__\":", 15);
    buf_add(&h, metadata, strlen(metadata));
    buf_add(&h, ",", 1);
  }
  const char *names[3] = {"q", "k", "v"};
  size_t off[4] = {0, nq, nq + nk, nq + 2 * nk};
  for (int i = 0; i < 3; i++) {
    int n = snprintf(t, sizeof t, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":", i ? "," : "", names[i],
                     attn_dtype_name(p->dt));
    buf_add(&h, t, (size_t)n);
    shape_txt(&h, i ? sk : sq, rank);
    n = snprintf(t, sizeof t, ",\"data_offsets\":[%zu,%zu]}", off[i], off[i + 1]);
    buf_add(&h, t, (size_t)n);
  }
  buf_add(&h, "}", 1);
  size_t len = 8 + h.n + off[3];
  char *b = malloc(len);
  for (int i = 0; i < 8; i++)
    b[i] = (char)((uint64_t)h.n >> (8 * i));
  memcpy(b + 8, h.p, h.n);
  memcpy(b + 8 + h.n, c->q, nq);
  memcpy(b + 8 + h.n + nq, c->k, nk);
  memcpy(b + 8 + h.n + nq + nk, c->v, nk);
  free(h.p);
  *plen = len;
  return b;
}

char *slow_body(tcase *c, int heads, int n, size_t *plen) {
  tprob p = tprob_make(1, heads, heads, n, n, 64, ATTN_F32);
  tcase_init(c, &p, 4242);
  return st_body(c, 4, "{\"backend\":\"reference\"}", plen);
}

/* ---- replies ------------------------------------------------------------ */

static bool shape_is(const cJSON *sh, const int64_t *want, int rank) {
  if (!cJSON_IsArray(sh) || cJSON_GetArraySize(sh) != rank)
    return false;
  for (int i = 0; i < rank; i++) {
    const cJSON *d = cJSON_GetArrayItem(sh, i);
    if (!cJSON_IsNumber(d) || d->valuedouble != (double)want[i])
      return false;
  }
  return true;
}

static const char *rank_shape(const int64_t *s, int rank, char *b, size_t cap) {
  size_t o = (size_t)snprintf(b, cap, "[");
  for (int i = 0; i < rank && o < cap; i++)
    o += (size_t)snprintf(b + o, cap - o, i ? ",%lld" : "%lld", (long long)s[i]);
  if (o < cap)
    snprintf(b + o, cap - o, "]");
  return b;
}

/* The "shape" and "dtype" of a reply tensor (JSON object or safetensors
 * header entry) against what the request implies; false with err set. */
static bool check_entry(const cJSON *x, const char *name, const int64_t *sq, int r, attn_dtype dt,
                        char *err, size_t cap) {
  char sb[96];
  const cJSON *sh = cJSON_GetObjectItemCaseSensitive(x, "shape");
  const cJSON *dtj = cJSON_GetObjectItemCaseSensitive(x, "dtype");
  if (!shape_is(sh, sq, r)) {
    char *got = cJSON_PrintUnformatted(sh);
    snprintf(err, cap, "tensor \"%s\": shape %s, want %s", name, got ? got : "missing",
             rank_shape(sq, r, sb, sizeof sb));
    free(got);
    return false;
  }
  if (!cJSON_IsString(dtj) || strcmp(dtj->valuestring, attn_dtype_name(dt))) {
    snprintf(err, cap, "tensor \"%s\": dtype %s, want %s", name,
             cJSON_IsString(dtj) ? dtj->valuestring : "missing", attn_dtype_name(dt));
    return false;
  }
  return true;
}

int parse_json_reply(const char *body, size_t len, tcase *c, int rank, char *err, size_t cap) {
  cJSON *j = cJSON_ParseWithLength(body, len);
  int rc = -1;
  if (!cJSON_IsObject(j)) {
    snprintf(err, cap, "reply is not a JSON object");
    goto out;
  }
  int64_t sq[4];
  shape_of(&c->p, false, rank, sq);
  size_t rows = (size_t)(c->p.b * c->p.hq * c->p.nq);
  const char *names[4] = {"o", "m", "l", "lse"};
  for (int t = 0; t < 4; t++) {
    cJSON *x = cJSON_GetObjectItemCaseSensitive(j, names[t]);
    if (t > 0 && !c->p.stats) {
      if (x) {
        snprintf(err, cap, "reply has \"%s\" but stats were not asked for", names[t]);
        goto out;
      }
      continue;
    }
    if (!cJSON_IsObject(x)) {
      snprintf(err, cap, "reply has no object \"%s\"", names[t]);
      goto out;
    }
    int r = t ? rank - 1 : rank;
    attn_dtype dt = t ? ATTN_F32 : c->p.dt;
    cJSON *data = cJSON_GetObjectItemCaseSensitive(x, "data");
    if (!check_entry(x, names[t], sq, r, dt, err, cap))
      goto out;
    size_t want = t ? rows : rows * (size_t)c->p.d;
    if (!cJSON_IsArray(data) || (size_t)cJSON_GetArraySize(data) != want) {
      snprintf(err, cap, "\"%s\".data has %d values, want %zu", names[t],
               cJSON_IsArray(data) ? cJSON_GetArraySize(data) : -1, want);
      goto out;
    }
    size_t i = 0;
    float *stat = t == 1 ? c->m : t == 2 ? c->l : c->lse;
    for (cJSON *e = data->child; e; e = e->next, i++) {
      double v;
      if (cJSON_IsNumber(e)) {
        v = e->valuedouble;
      } else if (cJSON_IsNull(e) && (t == 1 || t == 3)) {
        v = -INFINITY; /* m and lse of a row with no visible key */
      } else {
        snprintf(err, cap, "\"%s\".data[%zu] is not a number", names[t], i);
        goto out;
      }
      if (t == 0)
        attn_store_elem(c->o, dt, i, (float)v);
      else
        stat[i] = (float)v;
    }
  }
  rc = 0;
out:
  cJSON_Delete(j);
  return rc;
}

int parse_st_reply(const void *bodyv, size_t len, tcase *c, int rank, char *err, size_t cap) {
  const unsigned char *body = bodyv;
  if (len < 8) {
    snprintf(err, cap, "safetensors reply of %zu bytes", len);
    return -1;
  }
  uint64_t n = 0;
  for (int i = 0; i < 8; i++)
    n |= (uint64_t)body[i] << (8 * i);
  if (n > len - 8) {
    snprintf(err, cap, "safetensors header length %llu past the %zu-byte reply",
             (unsigned long long)n, len);
    return -1;
  }
  if ((8 + n) % 8) {
    snprintf(err, cap, "safetensors data starts at %llu, not a multiple of 8",
             (unsigned long long)(8 + n));
    return -1;
  }
  const unsigned char *data = body + 8 + n;
  size_t dlen = len - 8 - (size_t)n;
  cJSON *j = cJSON_ParseWithLength((const char *)body + 8, (size_t)n);
  int rc = -1;
  if (!cJSON_IsObject(j)) {
    snprintf(err, cap, "safetensors reply header is not a JSON object");
    goto out;
  }
  int64_t sq[4];
  shape_of(&c->p, false, rank, sq);
  size_t rows = (size_t)(c->p.b * c->p.hq * c->p.nq);
  size_t covered = 0;
  const char *names[4] = {"o", "m", "l", "lse"};
  for (cJSON *e = j->child; e; e = e->next)
    if (strcmp(e->string, "__metadata__") && strcmp(e->string, "o") &&
        (!c->p.stats ||
         (strcmp(e->string, "m") && strcmp(e->string, "l") && strcmp(e->string, "lse")))) {
      snprintf(err, cap, "safetensors reply has an unexpected tensor \"%s\"", e->string);
      goto out;
    }
  for (int t = 0; t < 4; t++) {
    cJSON *x = cJSON_GetObjectItemCaseSensitive(j, names[t]);
    if (t > 0 && !c->p.stats)
      continue;
    if (!cJSON_IsObject(x)) {
      snprintf(err, cap, "safetensors reply has no tensor \"%s\"", names[t]);
      goto out;
    }
    int r = t ? rank - 1 : rank;
    attn_dtype dt = t ? ATTN_F32 : c->p.dt;
    cJSON *off = cJSON_GetObjectItemCaseSensitive(x, "data_offsets");
    if (!check_entry(x, names[t], sq, r, dt, err, cap))
      goto out;
    size_t es = attn_dtype_size(dt);
    size_t want = (t ? rows : rows * (size_t)c->p.d) * es;
    if (!cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2) {
      snprintf(err, cap, "tensor \"%s\" has no data_offsets pair", names[t]);
      goto out;
    }
    double b0 = cJSON_GetArrayItem(off, 0)->valuedouble,
           b1 = cJSON_GetArrayItem(off, 1)->valuedouble;
    if (b0 < 0 || b1 < b0 || b1 > (double)dlen || (size_t)(b1 - b0) != want) {
      snprintf(err, cap, "tensor \"%s\" data_offsets [%.0f, %.0f] (data %zu bytes), want %zu bytes",
               names[t], b0, b1, dlen, want);
      goto out;
    }
    covered += want;
    void *dst = t == 0 ? c->o : t == 1 ? (void *)c->m : t == 2 ? (void *)c->l : (void *)c->lse;
    memcpy(dst, data + (size_t)b0, want);
  }
  if (covered != dlen) {
    snprintf(err, cap, "safetensors reply data is %zu bytes, its tensors cover %zu", dlen, covered);
    goto out;
  }
  rc = 0;
out:
  cJSON_Delete(j);
  return rc;
}

const char *check_correct(const http_res *rs, tcase *c, int rank, bool st_reply, char *err,
                          size_t cap) {
  char ct[128] = "", sn[300], d[256];
  tdesc(&c->p, d, sizeof d);
  if (rs->status != 200) {
    snprintf(err, cap, "%s: status %ld (%s), body: %s", d, rs->status, rs->status ? "" : rs->error,
             snip(rs->body ? rs->body : "", rs->len, sn, sizeof sn));
    return err;
  }
  http_header(rs, "Content-Type", ct, sizeof ct);
  const char *want = st_reply ? "application/octet-stream" : "application/json";
  if (strncasecmp(ct, want, strlen(want))) {
    snprintf(err, cap, "%s: reply Content-Type \"%s\", want %s", d, ct, want);
    return err;
  }
  tcase_poison(c);
  char e2[400];
  int rc = st_reply ? parse_st_reply(rs->body, rs->len, c, rank, e2, sizeof e2)
                    : parse_json_reply(rs->body, rs->len, c, rank, e2, sizeof e2);
  if (rc < 0) {
    snprintf(err, cap, "%s: %s", d, e2);
    return err;
  }
  terr e = tcheck(c);
  bool ok = e.o <= ttol(c->p.dt) && e.masked_ok && (!c->p.stats || e.stats <= 1e-5);
  if (!ok) {
    snprintf(err, cap, "%s: O error %.3g (tol %.0e), stats error %.3g, masked rows %s", d, e.o,
             ttol(c->p.dt), e.stats, e.masked_ok ? "ok" : "WRONG");
    return err;
  }
  return NULL;
}

bool expect_correct(const http_res *rs, tcase *c, int rank, bool st_reply, const char *what) {
  char err[1024];
  const char *m = check_correct(rs, c, rank, st_reply, err, sizeof err);
  cr_expect(m == NULL, "%s: %s", what, m ? m : "");
  return m == NULL;
}

/* ---- Prometheus text ----------------------------------------------------- */

/* Does the label block [p, e) hold key="value"? */
static bool has_label(const char *p, const char *e, const char *kv) {
  const char *eq = strchr(kv, '=');
  size_t kl = (size_t)(eq - kv);
  const char *val = eq + 1;
  while (p < e) {
    while (p < e && (*p == ',' || *p == ' '))
      p++;
    const char *k = p;
    while (p < e && *p != '=')
      p++;
    size_t klen = (size_t)(p - k);
    if (p >= e)
      return false;
    p++; /* = */
    if (*p != '"')
      return false;
    p++;
    char v[256];
    size_t vl = 0;
    while (p < e && *p != '"') {
      if (*p == '\\' && p + 1 < e)
        p++;
      if (vl < sizeof v - 1)
        v[vl++] = *p;
      p++;
    }
    v[vl] = 0;
    p++; /* closing quote */
    if (klen == kl && !strncmp(k, kv, kl) && !strcmp(v, val))
      return true;
  }
  return false;
}

double prom_sum(const char *text, const char *name, const char *const *labels, int *pn) {
  double sum = 0;
  int n = 0;
  size_t nl = strlen(name);
  for (const char *p = text; p && *p;) {
    const char *eol = strchr(p, '\n');
    if (!eol)
      eol = p + strlen(p);
    if (*p != '#' && (size_t)(eol - p) > nl && !strncmp(p, name, nl) &&
        (p[nl] == '{' || p[nl] == ' ')) {
      const char *lb = p + nl, *le = lb, *v;
      bool ok = true;
      if (*lb == '{') {
        le = memchr(lb, '}', (size_t)(eol - lb));
        if (!le)
          ok = false;
        v = le ? le + 1 : eol;
        for (int i = 0; ok && labels && labels[i]; i++)
          ok = has_label(lb + 1, le, labels[i]);
      } else {
        v = lb;
        ok = !labels || !labels[0];
      }
      if (ok) {
        sum += strtod(v, NULL);
        n++;
      }
    }
    p = *eol ? eol + 1 : eol;
  }
  if (pn)
    *pn = n;
  return sum;
}

/* ---- waiting on /metrics ------------------------------------------------- */

double srv_metric(const srv *s, const char *name, const char *const *labels) {
  http_res r;
  http_req rq = {.path = "/metrics", .timeout_ms = 30000};
  double v = -1;
  if (http_do(s, &rq, &r) == 0 && r.status == 200)
    v = prom_sum(r.body, name, labels, NULL);
  http_res_free(&r);
  return v;
}

/* Polls rather than sleeping a guessed time: the machine may be loaded, so
 * only the event counts, and the deadline is there to turn a hang into a
 * failure. */
static bool wait_metric_cmp(const srv *s, const char *name, const char *const *labels, double want,
                            bool at_least, double timeout_s) {
  double deadline = now_s() + timeout_s;
  for (;;) {
    double v = srv_metric(s, name, labels);
    if (v >= 0 && (at_least ? v >= want : v <= want))
      return true;
    if (now_s() >= deadline)
      return false;
    sleep_s(0.02);
  }
}

bool srv_wait_metric_ge(const srv *s, const char *name, const char *const *labels, double want,
                        double timeout_s) {
  return wait_metric_cmp(s, name, labels, want, true, timeout_s);
}

bool srv_wait_metric_le(const srv *s, const char *name, const char *const *labels, double want,
                        double timeout_s) {
  return wait_metric_cmp(s, name, labels, want, false, timeout_s);
}

int srv_jobs(const srv *s) {
  double q = srv_metric(s, "attnd_queue_depth", NULL);
  double f = srv_metric(s, "attnd_inflight", NULL);
  return q < 0 || f < 0 ? -1 : (int)(q + f);
}

bool srv_wait_jobs(const srv *s, int want, bool at_least, double timeout_s) {
  double deadline = now_s() + timeout_s;
  for (;;) {
    int n = srv_jobs(s);
    if (n >= 0 && (at_least ? n >= want : n <= want))
      return true;
    if (now_s() >= deadline)
      return false;
    sleep_s(0.02);
  }
}

bool srv_wait_listener_closed(const srv *s, double timeout_s) {
  double deadline = now_s() + timeout_s;
  for (;;) {
    int fd = raw_connect(s->port);
    if (fd < 0)
      return true;
    close(fd);
    if (now_s() >= deadline)
      return false;
    sleep_s(0.02);
  }
}

void raw_reset(int fd) {
  struct linger lg = {.l_onoff = 1, .l_linger = 0};
  setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
  close(fd);
}

int raw_post(int port, const char *ctype, const void *body, size_t len) {
  int fd = raw_connect(port);
  if (fd < 0)
    return -1;
  char h[256];
  snprintf(h, sizeof h,
           "POST /attention HTTP/1.1\r\nHost: localhost\r\nContent-Type: %s\r\nContent-Length: "
           "%zu\r\n\r\n",
           ctype, len);
  if (raw_sends(fd, h) < 0 || raw_send(fd, body, len) < 0) {
    close(fd);
    return -1;
  }
  return fd;
}
