/*
 * server_bench.c — `make bench-server`: attnd under wrk, against the engine
 * alone on the same tensors, in the same run.
 *
 * For each size a safetensors request body is written to a file; the engine
 * runs it in this process (median of runs: the engine-only time); then a
 * fresh attnd serves it to wrk with clients/wrk/post.lua, first on one
 * connection (each request's latency is the server's whole time for it:
 * receive, decode, queue, compute, encode, send) and then on 4 connections
 * (throughput). The overhead is the one-connection mean latency over the
 * engine-only time. Then /healthz requests/s on 32 connections. Last, the
 * load generator against wrk: `attn load` and wrk on the same closed loop
 * (4 connections, a [1, 2, 64, 64] F32 body) and their request rates' ratio, printed
 * and not asserted (a shared machine moves both).
 */
#include "benchlib.h"
#include "proto.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

static int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof a;
  if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) < 0 ||
      getsockname(fd, (struct sockaddr *)&a, &len) < 0)
    return -1;
  close(fd);
  return ntohs(a.sin_port);
}

static pid_t start_attnd(const char *bin, int port) {
  char listen[64];
  snprintf(listen, sizeof listen, "127.0.0.1:%d", port);
  pid_t pid = fork();
  if (pid == 0) {
    /* the per-request log would cost the server time wrk measures */
    if (!freopen("/dev/null", "w", stderr))
      _exit(127);
    execl(bin, bin, "--listen", listen, "--max-body", "1G", (char *)NULL);
    _exit(127);
  }
  for (int i = 0; i < 100; i++) { /* wait for /healthz */
    char cmd[160];
    snprintf(cmd, sizeof cmd, "curl -sf -o /dev/null http://127.0.0.1:%d/healthz", port);
    if (system(cmd) == 0)
      return pid;
    usleep(50000);
  }
  kill(pid, SIGKILL);
  return -1;
}

static void stop_attnd(pid_t pid) {
  int status;
  kill(pid, SIGTERM);
  waitpid(pid, &status, 0);
}

typedef struct wrk_result {
  double rps, p50_ms, p99_ms, mean_ms;
  long requests, errors;
} wrk_result;

static int run_wrk(const char *args, const char *body, wrk_result *w) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "ATTND_BODY=%s wrk %s 2>&1", body ? body : "", args);
  FILE *f = popen(cmd, "r");
  if (!f)
    return -1;
  char line[512];
  int got = 0;
  memset(w, 0, sizeof *w);
  while (fgets(line, sizeof line, f)) {
    long req, dur, err, p50, p99;
    double mean, rps;
    if (sscanf(line,
               "RESULT requests=%ld duration_us=%ld errors=%ld p50_us=%ld p99_us=%ld "
               "mean_us=%lf",
               &req, &dur, &err, &p50, &p99, &mean) == 6) {
      w->requests = req;
      w->errors = err;
      w->rps = (double)req / ((double)dur * 1e-6);
      w->p50_ms = (double)p50 * 1e-3;
      w->p99_ms = (double)p99 * 1e-3;
      w->mean_ms = mean * 1e-3;
      got = 1;
    } else if (sscanf(line, "Requests/sec: %lf", &rps) == 1 && !got) {
      w->rps = rps;
      got = 2;
    }
  }
  int rc = pclose(f);
  return got && rc == 0 ? 0 : -1;
}

/* attn load's requests_per_s from its --json output; -1 when absent. */
static double attn_load_rate(const char *attn, const char *body, int port, int seconds) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd,
           "%s load http://127.0.0.1:%d --concurrency 4 --duration %d --body %s --json", attn, port,
           seconds, body);
  FILE *f = popen(cmd, "r");
  if (!f)
    return -1;
  char out[8192];
  size_t n = fread(out, 1, sizeof out - 1, f);
  out[n] = 0;
  int rc = pclose(f);
  const char *k = strstr(out, "\"requests_per_s\":");
  double v = -1;
  if (rc == 0 && k)
    v = strtod(k + strlen("\"requests_per_s\":"), NULL);
  return v;
}

/* wrk and attn load, one after the other, on one fresh attnd: the ratio
 * says whether attn load's numbers can be compared with wrk's (it was
 * within 20% here). */
static void load_vs_wrk(const char *attnd, const char *attn, const char *body, int seconds) {
  int port = free_port();
  pid_t pid = port > 0 ? start_attnd(attnd, port) : -1;
  if (pid < 0) {
    fprintf(stderr, "bench-server: attnd did not start for attn load vs wrk\n");
    return;
  }
  char args[512];
  wrk_result w;
  snprintf(args, sizeof args, "-t1 -c4 -d%ds -s clients/wrk/post.lua http://127.0.0.1:%d/attention",
           seconds, port);
  int rw = run_wrk(args, body, &w);
  double ours = attn_load_rate(attn, body, port, seconds);
  stop_attnd(pid);
  if (rw < 0 || ours <= 0 || w.rps <= 0) {
    fprintf(stderr, "bench-server: attn load vs wrk failed (wrk %.1f, attn load %.1f)\n", w.rps,
            ours);
    return;
  }
  printf("\nclosed loop, 4 connections, [1,2,64,64] F32: wrk %.1f requests/s, attn load %.1f "
         "(ratio %.3f)\n",
         w.rps, ours, ours / w.rps);
}

/* Writes c's request as a safetensors body to path, its length into *plen;
 * -1 when it cannot. */
static int save_body(const tool_bench_case *c, const char *path, size_t *plen) {
  size_t len = 0;
  void *body = NULL;
  attn_status st;
  if (attn_proto_encode_request_safetensors(&c->req, NULL, &body, &len, &st) < 0)
    return -1;
  FILE *f = fopen(path, "wb");
  int ok = f && fwrite(body, 1, len, f) == len;
  if (f)
    ok = fclose(f) == 0 && ok;
  free(body);
  *plen = len;
  return ok ? 0 : -1;
}

int main(int argc, char **argv) {
  const char *attnd = argc > 1 ? argv[1] : "build/attnd";
  const char *dir = argc > 2 ? argv[2] : "build/bench";
  const char *attn = argc > 3 ? argv[3] : "build/attn";
  const int seconds = 5;
  static const struct {
    const char *name;
    int64_t heads, seq, dim;
    attn_dtype dt;
  } sizes[] = {{"tiny", 1, 16, 64, ATTN_F32},
               {"medium", 8, 512, 64, ATTN_F32},
               {"large", 16, 2048, 128, ATTN_F16}};
  char cmd[256];
  snprintf(cmd, sizeof cmd, "mkdir -p %s", dir);
  if (system(cmd) != 0)
    return 1;
  printf("attnd under wrk (%d s per run, safetensors bodies, clients/wrk/post.lua)\n", seconds);
  printf("%-7s %-22s %9s | %9s %9s %9s %9s | %9s | %9s\n", "size", "shape", "body MB", "engine ms",
         "c=1 mean", "c=1 p50", "c=1 p99", "overhead", "c=4 req/s");
  int rc = 0;
  for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
    tool_bench_case c;
    if (tool_bench_case_init(&c, 1, sizes[i].heads, sizes[i].heads, sizes[i].seq, sizes[i].seq,
                             sizes[i].dim, sizes[i].dt, false, 5) < 0)
      return 1;
    char path[256];
    snprintf(path, sizeof path, "%s/%s.safetensors", dir, sizes[i].name);
    size_t len;
    if (save_body(&c, path, &len) < 0) {
      fprintf(stderr, "bench-server: cannot write %s\n", path);
      return 1;
    }
    /* the engine alone, with the server's threads (one per core) */
    attn_status st;
    attn_engine *e = tool_bench_open(0, NULL, NULL, &st);
    double te = e ? tool_bench_engine(e, &c.req, 20, &st) : -1;
    attn_engine_close(e);
    int port = free_port();
    pid_t pid = port > 0 ? start_attnd(attnd, port) : -1;
    if (te < 0 || pid < 0) {
      fprintf(stderr, "bench-server: %s\n", te < 0 ? st.message : "attnd did not start");
      return 1;
    }
    char args[512];
    wrk_result one, four;
    snprintf(args, sizeof args,
             "-t1 -c1 -d%ds -s clients/wrk/post.lua http://127.0.0.1:%d/attention", seconds, port);
    int r1 = run_wrk(args, path, &one);
    snprintf(args, sizeof args,
             "-t2 -c4 -d%ds -s clients/wrk/post.lua http://127.0.0.1:%d/attention", seconds, port);
    int r4 = run_wrk(args, path, &four);
    stop_attnd(pid);
    char shape[40];
    snprintf(shape, sizeof shape, "H=%lld N=%lld D=%lld %s", (long long)sizes[i].heads,
             (long long)sizes[i].seq, (long long)sizes[i].dim, attn_dtype_name(sizes[i].dt));
    if (r1 < 0 || r4 < 0 || one.errors || four.errors) {
      fprintf(stderr, "bench-server: wrk failed for %s (errors %ld, %ld)\n", sizes[i].name,
              one.errors, four.errors);
      rc = 1;
    }
    printf("%-7s %-22s %9.2f | %9.3f %9.3f %9.3f %9.3f | %9.2f | %9.1f\n", sizes[i].name, shape,
           (double)len * 1e-6, te * 1e3, one.mean_ms, one.p50_ms, one.p99_ms,
           one.mean_ms / (te * 1e3), four.rps);
    fflush(stdout);
    tool_bench_case_free(&c);
  }
  int port = free_port();
  pid_t pid = start_attnd(attnd, port);
  if (pid > 0) {
    char args[256];
    wrk_result h;
    snprintf(args, sizeof args, "-t2 -c32 -d%ds http://127.0.0.1:%d/healthz", seconds, port);
    if (run_wrk(args, NULL, &h) == 0)
      printf("\n/healthz: %.0f requests/s (wrk -t2 -c32)\n", h.rps);
    stop_attnd(pid);
  }
  /* The body the old make test comparison used: [1, 2, 64, 64] F32. */
  tool_bench_case lc;
  char lpath[256];
  snprintf(lpath, sizeof lpath, "%s/load.safetensors", dir);
  if (tool_bench_case_init(&lc, 1, 2, 2, 64, 64, 64, ATTN_F32, false, 7) == 0) {
    size_t len;
    if (save_body(&lc, lpath, &len) == 0)
      load_vs_wrk(attnd, attn, lpath, seconds);
    tool_bench_case_free(&lc);
  }
  printf("overhead: mean latency on one connection over the engine-only time (median of 20).\n");
  return rc;
}
