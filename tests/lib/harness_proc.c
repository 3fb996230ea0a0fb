/* harness_proc.c — see harness_proc.h. */
#define _GNU_SOURCE
#include "harness_proc.h"

#include "harness_http.h"
#include "harness_util.h"

#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

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

/* Once: libcurl and SIGPIPE (http_global_init), and no server outlives the
 * test process however it exits. */
static void harness_init(void) {
  if (g_init)
    return;
  g_init = true;
  http_global_init();
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
static pid_t spawn(const char *bin, const char *const *args, const char *const *env,
                   const char *out_path, const char *err_path) {
  harness_init();
  const char *argv[64];
  int n = 0;
  argv[n++] = bin;
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
    /* Nothing of the test's environment leaks into the server's flags but
     * ATTND_HTTP_THREADS: a whole suite run with several HTTP threads
     * (make test TSAN=1 with ATTND_HTTP_THREADS=4); a test's own env wins. */
    const char *ht = getenv("ATTND_HTTP_THREADS");
    char http_threads[64] = "";
    if (ht && *ht)
      snprintf(http_threads, sizeof http_threads, "%s", ht);
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
    if (*http_threads)
      setenv("ATTND_HTTP_THREADS", http_threads, 1);
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
  s->pid = spawn(s->bin ? s->bin : srv_bin(), argv, env, s->out, s->log);
  return s->pid;
}

static double start_timeout(void) {
  const char *t = getenv("ATTND_START_TIMEOUT");
  double v = t ? atof(t) : 0;
  return v > 0 ? v : 10;
}

void srv_startv(srv *s, const char *const *args, const char *const *env, bool listen) {
  const char *bin = s->bin ? s->bin : srv_bin();
  cr_assert(access(bin, X_OK) == 0, "server binary %s not found (set ATTND_BIN, ATTND_HOLD_BIN)",
            bin);
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
  const char *bin = s->bin; /* the test's choice of binary survives */
  memset(s, 0, sizeof *s);
  s->bin = bin;
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
  s.pid = spawn(srv_bin(), args, env, op, ep);
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
