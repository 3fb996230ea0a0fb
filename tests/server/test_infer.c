/*
 * test_infer.c — `attn infer` end to end: the real attnd on a free port and
 * the CLI as a child process ($ATTN_BIN, default build/attn), judged by its
 * exit status and what it prints (stdout and stderr together).
 *
 * --check against the server in every dtype, GQA, masks with fully masked
 * rows, statistics, both codecs; a safetensors IN file whose __metadata__
 * beats the flags; --out files decoded here and compared with the float64
 * reference; a server that is down, 4xx and 503 replies (one line each, exit
 * 1); a fake server whose wrong or foreign replies must fail; bad flags
 * (exit 2 before anything is sent). No run may print a sanitizer report.
 */
#define _GNU_SOURCE
#include "benchlib.h"
#include "harness.h"
#include "proto.h"

#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

static srv S;
static void teardown(void) { srv_cleanup(&S); }
TestSuite(infer, .fini = teardown, .timeout = 120);

/* ---- running the CLI ------------------------------------------------------ */

static const char *attn_bin(void) {
  const char *b = getenv("ATTN_BIN");
  return b && *b ? b : "build/attn";
}

/*
 * Runs `$ATTN_BIN infer ARGS...` (NULL-terminated) to completion, at most 60
 * s. Returns its exit status (128 + signal; -1 when it had to be killed) and
 * its stdout and stderr, interleaved as written, in *out (malloc'd).
 */
static int infer(char **out, ...) {
  const char *argv[64];
  int n = 0;
  argv[n++] = attn_bin();
  argv[n++] = "infer";
  va_list ap;
  va_start(ap, out);
  const char *a;
  while ((a = va_arg(ap, const char *)) != NULL && n < 63)
    argv[n++] = a;
  va_end(ap);
  argv[n] = NULL;
  cr_assert(access(argv[0], X_OK) == 0, "%s not found (set ATTN_BIN)", argv[0]);
  int p[2];
  cr_assert(pipe2(p, O_CLOEXEC) == 0);
  pid_t pid = fork();
  cr_assert(pid >= 0, "fork failed");
  if (pid == 0) {
    int z = open("/dev/null", O_RDONLY);
    dup2(z, 0);
    dup2(p[1], 1);
    dup2(p[1], 2);
    signal(SIGPIPE, SIG_DFL);
    execv(argv[0], (char *const *)(uintptr_t)argv);
    fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
    _exit(127);
  }
  close(p[1]);
  size_t len = 0, cap = 4096;
  char *b = malloc(cap);
  double t0 = now_s();
  bool killed = false;
  for (;;) {
    struct pollfd pf = {.fd = p[0], .events = POLLIN};
    int left = (int)((60 - (now_s() - t0)) * 1000);
    if (left <= 0 || poll(&pf, 1, left) == 0) {
      kill(pid, SIGKILL);
      killed = true;
      break;
    }
    if (len + 1024 > cap)
      b = realloc(b, cap *= 2);
    ssize_t r = read(p[0], b + len, cap - len - 1);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      break;
    len += (size_t)r;
  }
  b[len] = 0;
  close(p[0]);
  int ws = 0;
  while (waitpid(pid, &ws, 0) < 0 && errno == EINTR)
    ;
  *out = b;
  /* An instrumented CLI reports on its stderr, which is this output. */
  cr_expect(!strstr(b, "Sanitizer") && !strstr(b, "runtime error:"),
            "attn infer printed a sanitizer report:\n%s", b);
  if (killed)
    return -1;
  return WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
}

static int lines(const char *s) {
  int n = 0;
  for (; *s; s++)
    n += *s == '\n';
  return n;
}

/* A successful checked run: status 0, the report's lines, PASS. */
static void expect_pass(int rc, const char *out, const char *what) {
  cr_expect_eq(rc, 0, "%s: exit status %d, output:\n%s", what, rc, out);
  cr_expect(strstr(out, "HTTP 200") != NULL, "%s: no HTTP 200 in:\n%s", what, out);
  cr_expect(strstr(out, "connect ") && strstr(out, "upload+server ") && strstr(out, "download ") &&
                strstr(out, "total "),
            "%s: no timings in:\n%s", what, out);
  cr_expect(strstr(out, "MB/s") && strstr(out, "GFLOP/s"), "%s: no rates in:\n%s", what, out);
  cr_expect(strstr(out, ": PASS") != NULL, "%s: no PASS in:\n%s", what, out);
  cr_expect(strstr(out, "FAIL") == NULL, "%s: FAIL in:\n%s", what, out);
}

/* A URL where nobody listens, for runs that must stop before sending. */
static const char *dead_url(char *buf, size_t cap) {
  snprintf(buf, cap, "http://127.0.0.1:%d", free_port());
  return buf;
}

static char *tmp_path(const char *what, char *buf, size_t cap) {
  static int seq;
  snprintf(buf, cap, "/tmp/attn-infer-test-%d-%d-%s", (int)getpid(), seq++, what);
  return buf;
}

static void write_all(const char *path, const void *b, size_t len) {
  FILE *f = fopen(path, "wb");
  cr_assert(f, "cannot create %s", path);
  cr_assert_eq(fwrite(b, 1, len, f), len);
  cr_assert_eq(fclose(f), 0);
}

/* ---- --check against the server --------------------------------------------- */

Test(infer, check_f32_f16_bf16) {
  srv_start(&S, "--threads", "2", NULL);
  static const char *const dts[] = {"F32", "F16", "BF16"};
  for (int i = 0; i < 3; i++) {
    char *out;
    int rc = infer(&out, S.url, "--check", "--dtype", dts[i], "--shape", "1,2,100,64", NULL);
    char what[64];
    snprintf(what, sizeof what, "--dtype %s", dts[i]);
    expect_pass(rc, out, what);
    cr_expect(strstr(out, dts[i]) != NULL, "%s: dtype not named in:\n%s", what, out);
    free(out);
  }
}

Test(infer, default_shape) {
  srv_start(&S, NULL);
  char *out;
  int rc = infer(&out, S.url, "--check", NULL);
  expect_pass(rc, out, "defaults");
  cr_expect(strstr(out, "Nq=128") && strstr(out, "D=64"), "default shape not 1,1,128,64:\n%s", out);
  free(out);
}

Test(infer, gqa) {
  srv_start(&S, NULL);
  char *out;
  int rc = infer(&out, S.url, "--shape", "1,8,64,64", "--shape-kv", "1,2,100,64", "--check", NULL);
  expect_pass(rc, out, "GQA 8 query heads on 2 KV heads");
  cr_expect(strstr(out, "Hq=8 Hkv=2 Nq=64 Nkv=100") != NULL, "shape not reported:\n%s", out);
  free(out);
}

/* --head-dim-v: v and o of their own width, both passes and both codecs,
 * checked against the float64 reference (which takes Dv). */
Test(infer, value_head_dim_of_its_own) {
  srv_start(&S, "--threads", "2", NULL);
  static const char *const extra[4][2] = {
      {"--causal", NULL}, {"--json", NULL}, {"--backward", NULL}, {"--backward", "--json"}};
  static const char *const dims[2][2] = {{"1,4,40,192", "128"}, {"2,2,33,32", "64"}};
  for (int d = 0; d < 2; d++)
    for (int i = 0; i < 4; i++) {
      char *out;
      int rc = infer(&out, S.url, "--shape", dims[d][0], "--head-dim-v", dims[d][1], "--check",
                     extra[i][0], extra[i][1], NULL);
      char what[96], dv[32];
      snprintf(what, sizeof what, "--shape %s --head-dim-v %s %s %s", dims[d][0], dims[d][1],
               extra[i][0], extra[i][1] ? extra[i][1] : "");
      expect_pass(rc, out, what);
      snprintf(dv, sizeof dv, "Dv=%s", dims[d][1]);
      cr_expect(strstr(out, dv) != NULL, "%s: Dv not reported:\n%s", what, out);
      free(out);
    }
  /* K/V split along Nkv: each shard's v keeps Dv, and the merge is Dv wide */
  char urls[256], *out;
  snprintf(urls, sizeof urls, "%s,%s", S.url, S.url);
  int rc = infer(&out, "--shards", urls, "--shape", "1,4,30,192", "--shape-kv", "1,2,70,192",
                 "--head-dim-v", "128", "--causal", "--stats", "--check", NULL);
  cr_expect(rc == 0 && strstr(out, "PASS"), "--shards with --head-dim-v: %d\n%s", rc, out);
  free(out);
}

Test(infer, causal_and_windows) {
  srv_start(&S, NULL);
  char *out;
  int rc = infer(&out, S.url, "--shape", "2,2,70,32", "--shape-kv", "2,1,90,32", "--causal",
                 "--check", "--seed", "5", NULL);
  expect_pass(rc, out, "causal, Nq < Nkv");
  cr_expect(strstr(out, "causal=true") != NULL, "causal not in the query:\n%s", out);
  free(out);
  rc = infer(&out, S.url, "--shape", "1,2,90,32", "--shape-kv", "1,2,70,32", "--window-left", "7",
             "--window-right", "3", "--scale", "+0.25", "--check", NULL);
  expect_pass(rc, out, "sliding window, explicit scale with a '+'");
  cr_expect(strstr(out, "scale=%2B0.25") != NULL, "'+' not percent-encoded:\n%s", out);
  free(out);
}

Test(infer, stats_with_fully_masked_rows) {
  srv_start(&S, NULL);
  /* causal with Nq > Nkv: the top rows see no key, so m and lse are -inf
   * (null in JSON) and must still compare equal to the reference */
  static const char *const fmt[] = {NULL, "--json"};
  for (int i = 0; i < 2; i++) {
    char *out;
    int rc = infer(&out, S.url, "--shape", "1,2,40,16", "--shape-kv", "1,2,9,16", "--causal",
                   "--stats", "--check", fmt[i], NULL);
    const char *what = fmt[i] ? "stats, masked rows, JSON" : "stats, masked rows, safetensors";
    expect_pass(rc, out, what);
    cr_expect(strstr(out, "m ") && strstr(out, "l ") && strstr(out, "lse "),
              "%s: statistics' errors not printed:\n%s", what, out);
    free(out);
  }
}

Test(infer, json_body) {
  srv_start(&S, NULL);
  static const char *const dts[] = {"F32", "BF16"};
  for (int i = 0; i < 2; i++) {
    char *out;
    int rc = infer(&out, S.url, "--json", "--dtype", dts[i], "--shape", "1,3,50,40", "--stats",
                   "--check", NULL);
    expect_pass(rc, out, "--json");
    cr_expect(strstr(out, "JSON reply") && strstr(out, "JSON body"),
              "--json: not a JSON exchange:\n%s", out);
    cr_expect(strstr(out, "backend cpu") != NULL, "--json: backend not reported:\n%s", out);
    free(out);
  }
}

Test(infer, quiet) {
  srv_start(&S, NULL);
  char *out;
  int rc = infer(&out, S.url, "--check", "--quiet", "--stats", NULL);
  cr_expect_eq(rc, 0, "--quiet: status %d:\n%s", rc, out);
  cr_expect_str_eq(out, "", "--quiet printed something");
  free(out);
}

/* ---- files ------------------------------------------------------------------- */

Test(infer, in_file_metadata_and_out) {
  srv_start(&S, NULL);
  /* rank 3 [H, N, D], F16, GQA; the file says not causal and stats, the flag
   * says causal: the file wins, here and on the server */
  tprob p = tprob_make(1, 4, 2, 33, 47, 24, ATTN_F16);
  p.stats = true;
  tcase c;
  tcase_init(&c, &p, 99);
  size_t len;
  char *body = st_body(&c, 3, "{\"causal\":\"false\",\"stats\":\"true\"}", &len);
  char in[128], outp[128];
  tmp_path("in.safetensors", in, sizeof in);
  tmp_path("out.safetensors", outp, sizeof outp);
  write_all(in, body, len);
  char *out;
  int rc = infer(&out, S.url, in, "--causal", "--check", "--out", outp, NULL);
  expect_pass(rc, out, "IN file");
  cr_expect(strstr(out, "from IN") != NULL, "IN not reported:\n%s", out);
  free(out);
  size_t rlen = 0;
  char *reply = read_file_all(outp, &rlen);
  cr_assert(reply, "--out did not write %s", outp);
  char err[256];
  int prc = parse_st_reply(reply, rlen, &c, 3, err, sizeof err);
  cr_expect_eq(prc, 0, "--out file: %s", err);
  if (prc == 0) {
    terr e = tcheck(&c);
    cr_expect_leq(e.o, ttol(ATTN_F16), "--out file: o error %g", e.o);
    cr_expect_leq(e.stats, 1e-5, "--out file: statistics error %g", e.stats);
  }
  /* no temporary file left beside it */
  char pat[160];
  snprintf(pat, sizeof pat, "%s.tmp*", outp);
  glob_t g;
  cr_expect_eq(glob(pat, 0, NULL, &g), GLOB_NOMATCH, "a temporary file is left: %s",
               g.gl_pathc ? g.gl_pathv[0] : "?");
  globfree(&g);
  free(reply);
  unlink(outp);
  unlink(in);
  free(body);
  tcase_free(&c);
}

Test(infer, json_with_out_asks_for_safetensors) {
  srv_start(&S, NULL);
  /* the same random tensors as the CLI's --seed 7 */
  tprob p = tprob_make(1, 2, 2, 40, 40, 16, ATTN_BF16);
  tcase c;
  tcase_init(&c, &p, 1);
  tool_bench_case bc;
  cr_assert_eq(tool_bench_case_init(&bc, 1, 2, 2, 40, 40, 16, ATTN_BF16, false, 7), 0);
  size_t nb = 2 * 40 * 16 * 2;
  memcpy(c.q, bc.req.q, nb);
  memcpy(c.k, bc.req.k, nb);
  memcpy(c.v, bc.req.v, nb);
  tool_bench_case_free(&bc);
  char outp[128];
  tmp_path("json-out.safetensors", outp, sizeof outp);
  char *out;
  int rc = infer(&out, S.url, "--json", "--shape", "1,2,40,16", "--dtype", "BF16", "--seed", "7",
                 "--out", outp, "--check", NULL);
  expect_pass(rc, out, "--json --out");
  cr_expect(strstr(out, "safetensors reply") != NULL, "--json --out: reply not binary:\n%s", out);
  free(out);
  size_t rlen = 0;
  char *reply = read_file_all(outp, &rlen);
  cr_assert(reply, "--out did not write %s", outp);
  char err[256];
  int prc = parse_st_reply(reply, rlen, &c, 4, err, sizeof err);
  cr_expect_eq(prc, 0, "--out file: %s", err);
  if (prc == 0) {
    terr e = tcheck(&c);
    cr_expect_leq(e.o, ttol(ATTN_BF16), "--out file: o error %g", e.o);
  }
  free(reply);
  unlink(outp);
  tcase_free(&c);
}

Test(infer, out_unwritable) {
  srv_start(&S, NULL);
  char *out;
  int rc = infer(&out, S.url, "--out", "/nonexistent-dir/reply.safetensors", NULL);
  cr_expect_eq(rc, 1, "unwritable --out: status %d:\n%s", rc, out);
  cr_expect(strstr(out, "cannot write /nonexistent-dir/reply.safetensors") != NULL,
            "unwritable --out:\n%s", out);
  free(out);
}

/* ---- failures ------------------------------------------------------------------ */

Test(infer, server_down) {
  char url[64], want[160];
  dead_url(url, sizeof url);
  char *out;
  int rc = infer(&out, url, "--check", NULL);
  cr_expect_eq(rc, 1, "server down: status %d:\n%s", rc, out);
  snprintf(want, sizeof want, "attn infer: cannot connect to %s: Connection refused\n", url);
  cr_expect_str_eq(out, want, "server down");
  free(out);
}

Test(infer, error_replies_4xx) {
  srv_start(&S, NULL);
  static const struct {
    const char *args[8];
    const char *line; /* the start of the one line printed */
  } cases[] = {
      {{"--window-right", "5", "--causal", NULL}, "attnd: HTTP 422 invalid_window: "},
      {{"--backend", "reference", "--shape", "1,1,4100,8", "--check", NULL},
       "attnd: HTTP 413 too_large_for_backend: "},
      {{"--shape", "1,3,10,8", "--shape-kv", "1,2,10,8", NULL}, "attnd: HTTP 422 shape_mismatch: "},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    const char *const *x = cases[i].args;
    char *out;
    int rc = infer(&out, S.url, x[0], x[1], x[2], x[3], x[4], x[5], x[6], x[7]);
    cr_expect_eq(rc, 1, "[%zu] status %d:\n%s", i, rc, out);
    cr_expect(!strncmp(out, cases[i].line, strlen(cases[i].line)),
              "[%zu] expected \"%s...\", got:\n%s", i, cases[i].line, out);
    cr_expect_eq(lines(out), 1, "[%zu] not one line:\n%s", i, out);
    cr_expect_gt(strlen(out), strlen(cases[i].line) + 2, "[%zu] no message:\n%s", i, out);
    free(out);
  }
  /* a file the server refuses is still sent: its answer is the point */
  char in[128];
  tmp_path("bad.safetensors", in, sizeof in);
  write_all(in, "\x10\0\0\0\0\0\0\0{\"q\": 1}        ", 24);
  char *out;
  int rc = infer(&out, S.url, in, NULL);
  cr_expect_eq(rc, 1, "malformed IN: status %d:\n%s", rc, out);
  cr_expect(!strncmp(out, "attnd: HTTP 4", 13), "malformed IN:\n%s", out);
  free(out);
  unlink(in);
}

typedef struct bg_job {
  const srv *s;
  char *body;
  size_t len;
  http_res r;
} bg_job;

static void *bg_run(void *arg) {
  bg_job *j = arg;
  const char *hdrs[] = {"Content-Type: application/octet-stream", NULL};
  http_req rq = {.method = "POST",
                 .path = "/attention",
                 .headers = hdrs,
                 .body = j->body,
                 .len = j->len,
                 .timeout_ms = 120000};
  http_do(j->s, &rq, &j->r);
  return NULL;
}

/* A job held by build/tests/attnd-hold (tests/lib/hold_backend.c) fills
 * --max-queue 1 until the test releases it, however fast the machine. */
Test(infer, queue_full_503) {
  hold_gate gate;
  const char *args[] = {"--max-queue", "1", "--threads", "1", NULL};
  srv_start_gated(&S, &gate, args);
  tcase c;
  bg_job j = {.s = &S};
  j.body = held_body(&c, &j.len);
  pthread_t th;
  pthread_create(&th, NULL, bg_run, &j);
  cr_expect(srv_wait_jobs(&S, 1, true, 60), "the held job never showed in the metrics");
  char *out;
  int rc = infer(&out, S.url, "--check", NULL);
  cr_expect_eq(rc, 1, "503: status %d:\n%s", rc, out);
  cr_expect(!strncmp(out, "attnd: HTTP 503 queue_full: ", 28), "503:\n%s", out);
  cr_expect_eq(lines(out), 1, "503: not one line:\n%s", out);
  free(out);
  hold_release(&gate);
  pthread_join(th, NULL);
  cr_expect_eq(j.r.status, 200, "the held job once released: %ld", j.r.status);
  http_res_free(&j.r);
  free(j.body);
  tcase_free(&c);
  hold_gate_free(&gate);
  /* and once the queue is free, the same command succeeds */
  rc = infer(&out, S.url, "--check", NULL);
  expect_pass(rc, out, "after the 503");
  free(out);
}

/* ---- a fake server: replies attnd would never give ---------------------------- */

typedef struct fake {
  int lfd, port;
  const char *reply; /* the whole HTTP response */
  size_t len;
} fake;

static void *fake_serve(void *arg) {
  fake *f = arg;
  int fd = accept(f->lfd, NULL, NULL);
  if (fd < 0)
    return NULL;
  /* read the head, then Content-Length bytes, then answer */
  char buf[65536];
  size_t got = 0, need = (size_t)-1;
  while (got < need) {
    ssize_t r = recv(fd, buf + (got < sizeof buf / 2 ? got : 0), sizeof buf / 2, 0);
    if (r <= 0)
      break;
    if (got < sizeof buf / 2) {
      buf[got + (size_t)r < sizeof buf ? got + (size_t)r : sizeof buf - 1] = 0;
      char *e = strstr(buf, "\r\n\r\n"), *cl = strcasestr(buf, "Content-Length:");
      if (e && cl && need == (size_t)-1)
        need = (size_t)(e + 4 - buf) + (size_t)strtoull(cl + 15, NULL, 10);
    }
    got += (size_t)r;
  }
  send(fd, f->reply, f->len, MSG_NOSIGNAL);
  shutdown(fd, SHUT_WR);
  close(fd);
  return NULL;
}

static void fake_start(fake *f, pthread_t *th, const char *reply, size_t len) {
  f->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in a = {.sin_family = AF_INET};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t al = sizeof a;
  cr_assert(f->lfd >= 0 && bind(f->lfd, (struct sockaddr *)&a, sizeof a) == 0 &&
            listen(f->lfd, 4) == 0 && getsockname(f->lfd, (struct sockaddr *)&a, &al) == 0);
  f->port = ntohs(a.sin_port);
  f->reply = reply;
  f->len = len;
  pthread_create(th, NULL, fake_serve, f);
}

static void fake_stop(fake *f, pthread_t th) {
  pthread_join(th, NULL);
  close(f->lfd);
}

/* A fake server whose 200 reply is a well-formed safetensors file of header
 * hdr and data_len zero bytes, its URL in url; returns the reply buffer,
 * for the caller to free after fake_stop(). */
static char *serve_zeros(const char *hdr, size_t data_len, fake *f, pthread_t *th, char *url,
                         size_t cap) {
  size_t hn = strlen(hdr), body_len = 8 + hn + data_len;
  char *reply = calloc(1, 256 + body_len);
  int n = snprintf(reply, 256,
                   "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
                   "Content-Length: %zu\r\nConnection: close\r\n\r\n",
                   body_len);
  for (int i = 0; i < 8; i++)
    reply[n + i] = (char)((uint64_t)hn >> (8 * i));
  memcpy(reply + n + 8, hdr, hn);
  fake_start(f, th, reply, (size_t)n + body_len);
  snprintf(url, cap, "http://127.0.0.1:%d", f->port);
  return reply;
}

/* attn infer --check [--backward] against serve_zeros(): wrong values,
 * which --check must fail. */
static void expect_check_fails(const char *hdr, size_t data_len, bool backward) {
  fake f;
  pthread_t th;
  char url[64];
  char *reply = serve_zeros(hdr, data_len, &f, &th, url, sizeof url);
  char *out;
  int rc = infer(&out, url, "--shape", "1,1,4,8", "--check", backward ? "--backward" : NULL, NULL);
  fake_stop(&f, th);
  cr_expect_eq(rc, 1, "wrong reply: status %d:\n%s", rc, out);
  cr_expect(strstr(out, ": FAIL") != NULL, "wrong reply: no FAIL:\n%s", out);
  free(out);
  free(reply);
}

Test(infer, check_fails_on_a_wrong_reply) {
  /* o all zeros for a [1, 1, 4, 8] F32 problem: a well-formed, wrong reply */
  expect_check_fails("{\"o\":{\"dtype\":\"F32\",\"shape\":[1,1,4,8],\"data_offsets\":[0,128]}}",
                     128, false);
}

Test(infer, foreign_and_malformed_replies) {
  static const char *const replies[] = {
      "HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/plain\r\nContent-Length: 11\r\n"
      "Connection: close\r\n\r\nbad gateway",
      "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 8\r\n"
      "Connection: close\r\n\r\n{\"o\": 1}",
  };
  static const char *const want[] = {"attnd: HTTP 502 (no attnd error body): bad gateway\n",
                                     "attn infer: HTTP 200 with a malformed JSON reply: "};
  for (int i = 0; i < 2; i++) {
    fake f;
    pthread_t th;
    fake_start(&f, &th, replies[i], strlen(replies[i]));
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", f.port);
    char *out;
    int rc = infer(&out, url, "--json", "--shape", "1,1,4,8", NULL);
    fake_stop(&f, th);
    cr_expect_eq(rc, 1, "[%d] status %d:\n%s", i, rc, out);
    cr_expect(!strncmp(out, want[i], strlen(want[i])), "[%d] expected \"%s\", got:\n%s", i, want[i],
              out);
    cr_expect_eq(lines(out), 1, "[%d] not one line:\n%s", i, out);
    free(out);
  }
}

/* ---- usage ---------------------------------------------------------------------- */

Test(infer, bad_usage_exits_2_before_sending) {
  char url[64], in[128];
  dead_url(url, sizeof url); /* sending anything would be exit 1, not 2 */
  tmp_path("in.safetensors", in, sizeof in);
  write_all(in, "x", 1);
  static const struct {
    const char *args[4];
    const char *says; /* in the one line printed */
  } cases[] = {
      {{"--scale", "abc", NULL}, "scale"},
      {{"--scale", "inf", NULL}, "scale"},
      {{"--window-left", "-2", NULL}, "window_left"},
      {{"--window-right", "x", NULL}, "window_right"},
      {{"--backend", "gpu", NULL}, "backend"},
      {{"--shape", "1,2,3", NULL}, "--shape"},
      {{"--shape", "1,0,3,4", NULL}, "--shape"},
      {{"--shape-kv", "2,1,128,64", NULL}, "--shape-kv"},
      {{"--shape-kv", "1,1,128,32", NULL}, "--shape-kv"},
      {{"--dtype", "F64", NULL}, "--dtype"},
      {{"--seed", "-1", NULL}, "--seed"},
      {{"--timeout", "soon", NULL}, "--timeout"},
      {{"/nonexistent/in.safetensors", NULL}, "cannot read /nonexistent/in.safetensors"},
      {{"IN", "--json", NULL}, "IN is sent as it is"},
      {{"IN", "--shape", "1,1,8,8", NULL}, "IN is sent as it is"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    const char *x[4];
    for (int k = 0; k < 4; k++)
      x[k] = cases[i].args[k] && !strcmp(cases[i].args[k], "IN") ? in : cases[i].args[k];
    char *out;
    int rc = infer(&out, url, x[0], x[1], x[2], x[3], NULL);
    cr_expect_eq(rc, 2, "[%zu] %s: status %d:\n%s", i, x[0], rc, out);
    cr_expect(strstr(out, cases[i].says) != NULL, "[%zu] %s: \"%s\" not in:\n%s", i, x[0],
              cases[i].says, out);
    cr_expect_eq(lines(out), 1, "[%zu] %s: not one line:\n%s", i, x[0], out);
    free(out);
  }
  unlink(in);
  /* no URL, an unknown flag, a URL with a query, two files: usage */
  char *out;
  int rc = infer(&out, NULL);
  cr_expect_eq(rc, 2, "no URL: %d", rc);
  cr_expect(strstr(out, "usage: attn infer") != NULL, "no URL:\n%s", out);
  free(out);
  rc = infer(&out, url, "--bogus", NULL);
  cr_expect_eq(rc, 2, "--bogus: %d", rc);
  cr_expect(strstr(out, "bogus") && strstr(out, "usage: attn infer"), "--bogus:\n%s", out);
  free(out);
  rc = infer(&out, "http://127.0.0.1:1/?causal=true", NULL);
  cr_expect_eq(rc, 2, "URL with a query: %d", rc);
  free(out);
  rc = infer(&out, url, "a", "b", NULL);
  cr_expect_eq(rc, 2, "two files: %d", rc);
  free(out);
  rc = infer(&out, "--help", NULL);
  cr_expect_eq(rc, 0, "--help: %d", rc);
  cr_expect(strstr(out, "usage: attn infer") != NULL, "--help:\n%s", out);
  free(out);
}

/* --backward: POST /attention/backward, dq, dk, dv checked against the
 * float64 reference backward; backend=reference until the CPU backward
 * kernel lands (the default backend answers 422 unsupported until then). */
Test(infer, backward_check) {
  srv_start(&S, "--threads", "2", NULL);
  const char *const cases[][8] = {
      {"--dtype", "F32", "--shape", "1,4,40,32", "--shape-kv", "1,2,56,32", NULL},
      {"--dtype", "BF16", "--shape", "2,2,30,16", "--causal", "--json", NULL},
      {"--dtype", "F16", "--shape", "1,2,24,64", "--window-left", "3", "--window-right", "1"}};
  for (int i = 0; i < 3; i++) {
    const char *const *c = cases[i];
    char *out;
    int rc = infer(&out, S.url, "--backward", "--check", "--backend", "reference", c[0], c[1], c[2],
                   c[3], c[4], c[5], c[6], c[7], NULL);
    expect_pass(rc, out, c[1]);
    cr_expect(strstr(out, "/attention/backward") && strstr(out, "dq ") && strstr(out, "dv "),
              "%s: no backward check line in:\n%s", c[1], out);
    free(out);
  }
  char *out;
  int rc = infer(&out, S.url, "--backward", "--stats", "--backend", "reference", NULL);
  cr_expect_eq(rc, 1, "--backward --stats: status %d:\n%s", rc, out);
  cr_expect(strstr(out, "invalid_option") != NULL, "--backward --stats:\n%s", out);
  free(out);
}

Test(infer, backward_check_fails_on_a_wrong_reply) {
  /* dq, dk, dv all zeros for a [1, 1, 4, 8] F32 problem: well-formed, wrong */
  expect_check_fails("{\"dq\":{\"dtype\":\"F32\",\"shape\":[1,1,4,8],\"data_offsets\":[0,128]},"
                     "\"dk\":{\"dtype\":\"F32\",\"shape\":[1,1,4,8],\"data_offsets\":[128,256]},"
                     "\"dv\":{\"dtype\":\"F32\",\"shape\":[1,1,4,8],\"data_offsets\":[256,384]}}",
                     384, true);
}

/* A server started with --api-key: attn infer sends ATTND_API_KEY (the
 * variable the server reads too) as a Bearer token, and says 401 without. */
Test(infer, api_key_from_the_environment) {
  srv_start(&S, "--api-key", "infer-key-123", NULL);
  char *out;
  unsetenv("ATTND_API_KEY");
  int rc = infer(&out, S.url, "--shape", "1,2,16,8", "--check", NULL);
  cr_expect_eq(rc, 1, "without the key: exit %d\n%s", rc, out);
  cr_expect(strstr(out, "401"), "%s", out);
  free(out);
  setenv("ATTND_API_KEY", "infer-key-123", 1);
  rc = infer(&out, S.url, "--shape", "1,2,16,8", "--check", NULL);
  cr_expect_eq(rc, 0, "with the key: exit %d\n%s", rc, out);
  cr_expect(strstr(out, "PASS"), "%s", out);
  free(out);
  setenv("ATTND_API_KEY", "two words", 1);
  rc = infer(&out, S.url, "--shape", "1,2,16,8", NULL);
  cr_expect_eq(rc, 2, "a key with a space: exit %d\n%s", rc, out);
  cr_expect(strstr(out, "ATTND_API_KEY"), "%s", out);
  free(out);
  unsetenv("ATTND_API_KEY");
}

/* ---- variable-length batches and ALiBi files (issue 17) ------------------------ */

/* --cu-seqlens-q/kv with random tensors, checked against float64 one
 * sequence at a time: both codecs, causal with Nq != Nkv per sequence, a
 * sequence with no query and one with no key, GQA, statistics, BF16. */
Test(infer, varlen_check) {
  srv_start(&S, NULL);
  static const struct {
    const char *a[8];
  } runs[] = {
      {{"--shape", "4,4,12,16", "--shape-kv", "4,2,15,16", "--causal", "--stats", NULL}},
      {{"--json", "--causal", "--stats", "--dtype", "BF16", NULL}},
      {{"--window-left", "2", "--alibi-slopes", "0.5,0.25,0.125,1", "--shape", "4,1,12,8", NULL}},
  };
  for (size_t i = 0; i < sizeof runs / sizeof *runs; i++) {
    const char *const *x = runs[i].a;
    char *out;
    /* sequence 1 has no query, sequence 2 no key */
    int rc = infer(&out, S.url, "--cu-seqlens-q", "0,5,5,9,12", "--cu-seqlens-kv", "0,3,10,10,15",
                   "--check", x[0], x[1], x[2], x[3], x[4], x[5], x[6], x[7], NULL);
    char what[64];
    snprintf(what, sizeof what, "varlen run %zu", i);
    expect_pass(rc, out, what);
    cr_expect(strstr(out, "B=4") != NULL, "%s: 4 sequences not reported:\n%s", what, out);
    free(out);
  }
}

/* A safetensors IN file holding cu_seqlens (and ALiBi slopes [B, Hq]) is
 * checked the same way. */
Test(infer, varlen_in_file_check) {
  srv_start(&S, NULL);
  static const int64_t cq[4] = {0, 7, 7, 20}, ck[4] = {0, 4, 9, 9};
  static const float slopes[6] = {0.5f, 0.25f, 1, 2, 0.125f, 4};
  tool_bench_case bc;
  cr_assert_eq(tool_bench_case_init(&bc, 1, 2, 1, 20, 9, 24, ATTN_F16, false, 3), 0);
  bc.req.batch = 3;
  bc.req.cu_seqlens_q = cq;
  bc.req.cu_seqlens_kv = ck;
  bc.req.alibi_slopes = slopes;
  bc.req.alibi_stride_b = 2;
  attn_options o;
  attn_options_init(&o);
  attn_status st;
  cr_assert_eq(attn_options_parse_query(&o, "causal=true&stats=true", &st), 0);
  void *body;
  size_t len;
  cr_assert_eq(attn_proto_encode_request_safetensors(&bc.req, &o, &body, &len, &st), 0, "%s",
               st.message);
  char in[128];
  tmp_path("varlen.safetensors", in, sizeof in);
  write_all(in, body, len);
  char *out;
  int rc = infer(&out, S.url, in, "--check", NULL);
  expect_pass(rc, out, "varlen IN file");
  cr_expect(strstr(out, "lse ") != NULL, "varlen IN: statistics not checked:\n%s", out);
  free(out);
  unlink(in);
  free(body);
  bc.req.batch = 1;
  tool_bench_case_free(&bc);
}

/* A well-formed but wrong reply to a varlen request (o all zeros) fails
 * --check. */
Test(infer, varlen_check_fails_on_a_wrong_reply) {
  fake f;
  pthread_t th;
  char url[64];
  char *reply =
      serve_zeros("{\"o\":{\"dtype\":\"F32\",\"shape\":[1,4,8],\"data_offsets\":[0,128]}}", 128, &f,
                  &th, url, sizeof url);
  char *out;
  int rc = infer(&out, url, "--shape", "2,1,4,8", "--cu-seqlens-q", "0,1,4", "--cu-seqlens-kv",
                 "0,3,5", "--check", NULL);
  fake_stop(&f, th);
  cr_expect_eq(rc, 1, "wrong varlen reply: status %d:\n%s", rc, out);
  cr_expect(strstr(out, ": FAIL") != NULL, "wrong varlen reply: no FAIL:\n%s", out);
  free(out);
  free(reply);
}

/* The shapes the offsets imply: contradictions are refused before sending
 * (exit 2, one line); offsets only the server judges get its 422. */
Test(infer, varlen_refusals) {
  char url[64], in[128];
  dead_url(url, sizeof url);
  tmp_path("in.safetensors", in, sizeof in);
  write_all(in, "x", 1);
  static const struct {
    const char *args[8];
    const char *says;
  } cases[] = {
      {{"--cu-seqlens-q", "0,3", NULL}, "give both --cu-seqlens-q and --cu-seqlens-kv"},
      {{"--cu-seqlens-kv", "0,3", NULL}, "give both"},
      {{"--cu-seqlens-q", "0,3", "--cu-seqlens-kv", "0,3,4", NULL}, "the same number of offsets"},
      {{"--cu-seqlens-q", "0,3", "--cu-seqlens-kv", "0,x", NULL}, "--cu-seqlens-kv expects"},
      {{"--cu-seqlens-q", "5", "--cu-seqlens-kv", "5", NULL}, "B+1 offsets (B >= 1)"},
      {{"--cu-seqlens-q", "0,-1", "--cu-seqlens-kv", "0,3", NULL}, "--cu-seqlens-q expects"},
      {{"--cu-seqlens-q", "0,0", "--cu-seqlens-kv", "0,3", NULL}, "at least 1"},
      {{"--cu-seqlens-q", "0,2,6", "--cu-seqlens-kv", "0,3,4", "--shape", "3,1,6,8", NULL},
       "--shape 3,1,6,8 contradicts the offsets"},
      {{"--cu-seqlens-q", "0,2,6", "--cu-seqlens-kv", "0,3,4", "--shape", "2,1,5,8", NULL},
       "its N their total (the last offset, 6)"},
      {{"--cu-seqlens-q", "0,2,6", "--cu-seqlens-kv", "0,3,4", "--shape-kv", "2,1,6,64", NULL},
       "--shape-kv 2,1,6,64 contradicts"},
      {{"--cu-seqlens-q", "0,2,6", "--cu-seqlens-kv", "0,3,4", "--alibi-slopes", "1,2,3", NULL},
       "give Hq = 1 or B*Hq = 2"},
      {{"IN", "--cu-seqlens-q", "0,2", "--cu-seqlens-kv", "0,3", NULL}, "put the tensors"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    const char *x[8];
    for (int k = 0; k < 8; k++)
      x[k] = cases[i].args[k] && !strcmp(cases[i].args[k], "IN") ? in : cases[i].args[k];
    char *out;
    int rc = infer(&out, url, x[0], x[1], x[2], x[3], x[4], x[5], x[6], x[7], NULL);
    cr_expect_eq(rc, 2, "[%zu] status %d:\n%s", i, rc, out);
    cr_expect(strstr(out, cases[i].says) != NULL, "[%zu] \"%s\" not in:\n%s", i, cases[i].says,
              out);
    cr_expect_eq(lines(out), 1, "[%zu] not one line:\n%s", i, out);
    free(out);
  }
  char *out;
  int rc = infer(&out, "--shards", "http://127.0.0.1:1,http://127.0.0.1:2", "--cu-seqlens-q", "0,2",
                 "--cu-seqlens-kv", "0,3", NULL);
  cr_expect_eq(rc, 2, "--shards with varlen: status %d:\n%s", rc, out);
  cr_expect(strstr(out, "--shards does not split a variable-length batch") != NULL, "%s", out);
  free(out);
  unlink(in);
  srv_start(&S, NULL); /* decreasing offsets: the server's 422 */
  rc = infer(&out, S.url, "--cu-seqlens-q", "0,5,3", "--cu-seqlens-kv", "0,2,4", NULL);
  cr_expect_eq(rc, 1, "decreasing offsets: status %d:\n%s", rc, out);
  cr_expect(strstr(out, "HTTP 422") && strstr(out, "must not decrease"), "%s", out);
  free(out);
}

/* A safetensors file of F32 floats named alibi_slopes with this shape. */
static void write_slopes(const char *path, const char *name, const char *dtype, const char *shape,
                         const float *v, size_t n) {
  char h[256];
  int hn =
      snprintf(h, sizeof h, "{\"%s\":{\"dtype\":\"%s\",\"shape\":%s,\"data_offsets\":[0,%zu]}}",
               name, dtype, shape, n * 4);
  char *b = malloc(8 + (size_t)hn + n * 4);
  for (int i = 0; i < 8; i++)
    b[i] = (char)((uint64_t)hn >> (8 * i));
  memcpy(b + 8, h, (size_t)hn);
  memcpy(b + 8 + hn, v, n * 4);
  write_all(path, b, 8 + (size_t)hn + n * 4);
  free(b);
}

/* --alibi-slopes FILE.safetensors: [Hq] and [B, Hq] files checked against
 * float64 (also with a varlen batch); files that do not fit refused. */
Test(infer, alibi_slopes_file) {
  srv_start(&S, NULL);
  static const float v[6] = {0.5f, 0.25f, 0.125f, 1, 2, 0.0625f};
  char f1[128], f2[128], bad[128];
  tmp_path("a1.safetensors", f1, sizeof f1);
  tmp_path("a2.safetensors", f2, sizeof f2);
  tmp_path("bad.safetensors", bad, sizeof bad);
  write_slopes(f1, "alibi_slopes", "F32", "[3]", v, 3);
  write_slopes(f2, "alibi_slopes", "F32", "[2,3]", v, 6);
  char *out;
  int rc = infer(&out, S.url, "--shape", "2,3,20,16", "--shape-kv", "2,1,30,16", "--causal",
                 "--alibi-slopes", f1, "--stats", "--check", NULL);
  expect_pass(rc, out, "alibi [Hq] file");
  free(out);
  rc = infer(&out, S.url, "--shape", "2,3,20,16", "--alibi-slopes", f2, "--json", "--check", NULL);
  expect_pass(rc, out, "alibi [B, Hq] file");
  free(out);
  rc = infer(&out, S.url, "--shape", "2,3,9,16", "--cu-seqlens-q", "0,4,9", "--cu-seqlens-kv",
             "0,6,8", "--alibi-slopes", f2, "--causal", "--check", NULL);
  expect_pass(rc, out, "alibi [B, Hq] file, varlen");
  free(out);
  static const struct {
    const char *name, *dtype, *shape;
    size_t n;
    const char *args[2], *says;
  } cases[] = {
      {"alibi_slopes", "F32", "[2,3]", 6, {"--shape", "3,3,8,8"}, "give [Hq] = [3] or [B, Hq]"},
      {"alibi_slopes", "F32", "[3]", 3, {"--shape", "1,2,8,8"}, "alibi_slopes is [3]; give"},
      {"alibi_slopes", "F16", "[4]", 2, {"--shape", "1,4,8,8"}, "is not F32"},
      {"q", "F32", "[3]", 3, {"--shape", "1,3,8,8"}, "holds no tensor alibi_slopes"},
      {"zz", "F32", "[3]", 3, {"--shape", "1,3,8,8"}, "unknown tensor"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    write_slopes(bad, cases[i].name, cases[i].dtype, cases[i].shape, v, cases[i].n);
    rc = infer(&out, S.url, "--alibi-slopes", bad, cases[i].args[0], cases[i].args[1], NULL);
    cr_expect_eq(rc, 2, "[%zu] status %d:\n%s", i, rc, out);
    cr_expect(strstr(out, cases[i].says) != NULL, "[%zu] \"%s\" not in:\n%s", i, cases[i].says,
              out);
    free(out);
  }
  rc = infer(&out, S.url, "--alibi-slopes", "/nonexistent/a.safetensors", NULL);
  cr_expect(rc == 2 && strstr(out, "cannot read /nonexistent/a.safetensors"), "%d %s", rc, out);
  free(out);
  unlink(f1);
  unlink(f2);
  unlink(bad);
}

/* --sinks as a list or a FILE.safetensors: forward (o and the statistics)
 * and backward (dq, dk, dv and dsinks) checked against float64, on the
 * default backend and the reference one; lists and files that do not fit
 * refused before sending. */
Test(infer, sinks_check) {
  srv_start(&S, "--threads", "2", NULL);
  static const float v[4] = {0.5f, -1, 2, 0.25f};
  char f[128], bad[128], dead[64];
  tmp_path("sinks.safetensors", f, sizeof f);
  tmp_path("bad-sinks.safetensors", bad, sizeof bad);
  write_slopes(f, "sinks", "F32", "[4]", v, 4);
  const char *const backends[2] = {"auto", "reference"};
  char *out;
  int rc;
  for (int b = 0; b < 2; b++) {
    rc = infer(&out, S.url, "--shape", "2,4,20,16", "--shape-kv", "2,2,30,16", "--causal",
               "--sinks", "0.5,-1,2,0.25", "--stats", "--check", "--backend", backends[b], NULL);
    expect_pass(rc, out, backends[b]);
    free(out);
    rc = infer(&out, S.url, "--shape", "1,4,12,8", "--sinks", f, "--json", "--check", "--backend",
               backends[b], NULL);
    expect_pass(rc, out, "sinks file");
    free(out);
    rc = infer(&out, S.url, "--backward", "--shape", "1,4,24,16", "--shape-kv", "1,2,24,16",
               "--causal", "--sinks", f, "--check", "--backend", backends[b], NULL);
    expect_pass(rc, out, "backward with sinks");
    cr_expect(strstr(out, "dsinks "), "no dsinks in the check line:\n%s", out);
    free(out);
  }
  write_slopes(bad, "sinks", "F16", "[4]", v, 2);
  const char *const refused[][4] = {
      {"--sinks", "1,2,3", "give Hq = 4", NULL},
      {"--sinks", "1,x", "finite numbers", NULL},
      {"--sinks", bad, "its sinks is not F32", NULL},
  };
  for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
    rc = infer(&out, dead_url(dead, sizeof dead), "--shape", "1,4,8,8", refused[i][0],
               refused[i][1], NULL);
    cr_expect_eq(rc, 2, "[%zu] status %d:\n%s", i, rc, out);
    cr_expect(strstr(out, refused[i][2]) != NULL, "[%zu] \"%s\" not in:\n%s", i, refused[i][2],
              out);
    free(out);
  }
  rc = infer(&out, "--shards", S.url, "--shape", "1,4,8,8", "--sinks", f, NULL);
  cr_expect(rc == 2 && strstr(out, "--shards does not merge sinks"), "%d %s", rc, out);
  free(out);
  unlink(f);
  unlink(bad);
}
