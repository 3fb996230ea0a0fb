/*
 * test_json_memory.c — a JSON request costs memory in proportion to its
 * body and gives it back: decoding holds no more than a few times the body
 * at its peak, whether the request succeeds or fails, the server's RSS
 * returns to where it idled once big requests are done (large bodies'
 * buffers stay mapped ATTND_BODYBUF_IDLE for the next body: RSS is waited
 * for, up to a bound, never timed), and a decode that would not fit in the
 * memory budget is refused before it starts.
 *
 * RSS and its high-water mark come from /proc/PID/status. Under
 * AddressSanitizer (SAN=1) the allocator keeps freed memory in quarantine
 * and shadows every byte, so the RSS bounds are skipped there (the requests
 * and their replies are still checked); so does ThreadSanitizer (TSAN=1, a
 * sanitized attnd under a plain driver: ATTND_TEST_SANITIZER=thread).
 */
#include "harness.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#define ATTND_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ATTND_TEST_ASAN 1
#endif
#endif

#define MiB (1024.0 * 1024.0)
/* What RSS may differ by for reasons other than the requests: thread
 * stacks touched, the allocator's own small caches. */
#define SLACK (16 * MiB)

static srv S;
static void teardown(void) { srv_cleanup(&S); }
TestSuite(json_memory, .fini = teardown, .timeout = 240);

/* A field of /proc/PID/status ("VmRSS", "VmHWM") in bytes. */
static double proc_bytes(pid_t pid, const char *field) {
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
  FILE *f = fopen(path, "r");
  cr_assert(f, "cannot read %s", path);
  double v = -1;
  size_t n = strlen(field);
  while (fgets(line, sizeof line, f))
    if (!strncmp(line, field, n) && line[n] == ':')
      v = strtod(line + n + 1, NULL) * 1024.0; /* the kernel writes kB */
  fclose(f);
  cr_assert_geq(v, 0, "%s has no %s", path, field);
  return v;
}

static bool rss_checked(void) {
#ifdef ATTND_TEST_ASAN
  static bool said;
  if (!said)
    printf("json_memory: skipped: the RSS bounds (ASan inflates RSS and "
           "quarantines freed memory)\n");
  said = true;
  return false;
#else
  const char *san = getenv("ATTND_TEST_SANITIZER");
  if (san && *san) {
    static bool said;
    if (!said)
      printf("json_memory: skipped: the RSS bounds (attnd runs under %s sanitizer, which "
             "shadows its memory)\n",
             san);
    said = true;
    return false;
  }
  return true;
#endif
}

/* Appends "0,0,...,0" (n zeros) at p; returns the end. */
static char *zeros(char *p, size_t n) {
  for (size_t i = 0; i < n; i++) {
    p[2 * i] = '0';
    p[2 * i + 1] = ',';
  }
  return p + 2 * n - (n > 0); /* no comma after the last */
}

/* {"q": T, "k": T, "v": V <extra>} where T is {"shape": [rows, 64], "data":
 * [rows * 64 zeros]} and V the same with v_rows, or with a single zero when
 * v_rows is 0 (too few values: 422 once q and k are decoded). */
static char *zeros_body(size_t rows, size_t v_rows, const char *extra, size_t *plen) {
  size_t cap = 2 * 64 * (2 * rows + v_rows) + 512;
  char *b = malloc(cap), *p = b;
  cr_assert(b);
  for (int t = 0; t < 3; t++) {
    size_t r = t < 2 ? rows : v_rows ? v_rows : rows;
    p += sprintf(p, "%s\"%c\": {\"shape\": [%zu, 64], \"data\": [", t ? ", " : "{", "qkv"[t], r);
    p = t < 2 || v_rows ? zeros(p, r * 64) : zeros(p, 1);
    p += sprintf(p, "]}");
  }
  p += sprintf(p, "%s}", extra ? extra : "");
  *plen = (size_t)(p - b);
  return b;
}

/* Waits until the server holds no request: no upload, no job, no
 * connection but the /metrics one asking. What a request held is freed by
 * then, so RSS can be read without guessing a settling time. */
static void wait_idle(void) {
  cr_expect(srv_wait_metric_le(&S, "attnd_uploads", NULL, 0, 60), "uploads never ended");
  cr_expect(srv_wait_jobs(&S, 0, false, 60), "jobs never left the server");
  cr_expect(srv_wait_metric_le(&S, "attnd_connections", NULL, 1, 60), "connections never closed");
}

/* RSS once it has come down to at most want, or as it is after 60 s: the
 * last large body's buffer is unmapped ATTND_BODYBUF_IDLE after it was
 * given back (server/bodybuf.c). */
static double settled_rss(double want) {
  double rss = proc_bytes(S.pid, "VmRSS");
  for (int i = 0; i < 1200 && rss > want; i++) {
    usleep(50000);
    rss = proc_bytes(S.pid, "VmRSS");
  }
  return rss;
}

/* Starts the server and measures its idle RSS after one small request (the
 * first request touches the engine's threads and pools). */
static double start_warm(void) {
  srv_start(&S, NULL);
  const char *warm = "{\"q\": [[1, 0]], \"k\": [[1, 0]], \"v\": [[1, 2]]}";
  http_res r;
  cr_assert_eq(http_post(&S, "/attention", "application/json", warm, strlen(warm), &r), 0, "%s",
               r.error);
  cr_assert_eq(r.status, 200, "warm-up: %s", r.body);
  http_res_free(&r);
  wait_idle();
  return proc_bytes(S.pid, "VmRSS");
}

/* q and k of [131070, 64] zeros (33.5 MB of text) and a v with one value:
 * 422 after q and k are decoded. Four in a row must not leave memory
 * behind (a tree decoder held 1.3 GB after each). */
Test(json_memory, failed_decodes_give_memory_back) {
  size_t len;
  char *body = zeros_body(131070, 0, NULL, &len);
  double idle = start_warm();
  for (int i = 0; i < 4; i++) {
    http_res r;
    http_post(&S, "/attention", "application/json", body, len, &r);
    cr_expect(expect_error(&r, 422, "invalid_tensor", "33.5 MB of zeros, v too short"));
    cr_expect(r.body && strstr(r.body, "tensor \\\"v\\\""), "%.200s", r.body);
    http_res_free(&r);
  }
  wait_idle();
  double allowed = idle * 0.1 > SLACK ? idle * 0.1 : SLACK;
  double rss = settled_rss(idle + allowed), hwm = proc_bytes(S.pid, "VmHWM");
  printf("json_memory: body %.1f MiB, idle RSS %.1f MiB, after 4 requests %.1f MiB, "
         "peak %.1f MiB (%.2fx the body over idle)\n",
         (double)len / MiB, idle / MiB, rss / MiB, hwm / MiB, (hwm - idle) / (double)len);
  if (rss_checked()) {
    cr_expect_leq(rss - idle, allowed, "RSS %.1f MiB after the burst, %.1f MiB idle", rss / MiB,
                  idle / MiB);
    cr_expect_leq(hwm - idle, 4.0 * (double)len + SLACK,
                  "peak %.1f MiB for a %.1f MiB body (idle %.1f MiB)", hwm / MiB, (double)len / MiB,
                  idle / MiB);
  }
  cr_expect(expect_healthy(&S, "the burst"));
  free(body);
}

/* 10^7 numbers in about 20 MB, all three tensors decoded, then refused by
 * the options (causal with window_right 1): the peak holds the body and
 * every tensor. */
Test(json_memory, decode_peak_is_bounded_by_the_body) {
  size_t len;
  char *body = zeros_body(52083, 52083, ", \"causal\": true, \"window_right\": 1", &len);
  double idle = start_warm();
  http_res r;
  http_post(&S, "/attention", "application/json", body, len, &r);
  cr_expect(expect_error(&r, 422, "invalid_window", "10^7 numbers, causal window_right 1"));
  http_res_free(&r);
  double hwm = proc_bytes(S.pid, "VmHWM");
  printf("json_memory: body %.1f MiB (%d numbers), peak %.1f MiB over idle (%.2fx)\n",
         (double)len / MiB, 3 * 52083 * 64, (hwm - idle) / MiB, (hwm - idle) / (double)len);
  if (rss_checked())
    cr_expect_leq(hwm - idle, 4.0 * (double)len + SLACK,
                  "peak %.1f MiB for a %.1f MiB body (idle %.1f MiB)", hwm / MiB, (double)len / MiB,
                  idle / MiB);
  free(body);
}

typedef struct poster {
  const char *body;
  size_t len;
  long status;
} poster;

static void *post_one(void *arg) {
  poster *p = arg;
  http_res r;
  const char *hdrs[] = {"Content-Type: application/json", NULL};
  /* a generous bound: eight decodes of up to 23 MB at once, maybe sanitized */
  http_req rq = {.method = "POST",
                 .path = "/attention",
                 .headers = hdrs,
                 .body = p->body,
                 .len = p->len,
                 .timeout_ms = 180000};
  http_do(&S, &rq, &r);
  p->status = r.status;
  http_res_free(&r);
  return NULL;
}

/* Bursts of concurrent bodies of mixed sizes (1 to 23 MB), all refused
 * after decoding. With glibc's dynamic mmap threshold, buffers of a burst
 * came from the heaps of the threadpool's arenas and stayed there (RSS 140
 * MiB over idle after three bursts); they must all go back. */
Test(json_memory, concurrent_bursts_give_memory_back, .timeout = 600) {
  static const size_t rows[] = {3000, 9000, 20000, 40000, 60000, 5000, 15000, 30000};
  enum { N = sizeof rows / sizeof *rows };
  poster p[N];
  char *bodies[N];
  for (int i = 0; i < N; i++) {
    bodies[i] = zeros_body(rows[i], rows[i], ", \"causal\": true, \"window_right\": 1", &p[i].len);
    p[i].body = bodies[i];
  }
  double idle = start_warm();
  for (int round = 0; round < 3; round++) {
    pthread_t th[N];
    for (int i = 0; i < N; i++)
      cr_assert_eq(pthread_create(&th[i], NULL, post_one, &p[i]), 0);
    for (int i = 0; i < N; i++) {
      pthread_join(th[i], NULL);
      cr_expect_eq(p[i].status, 422, "round %d, body %d: status %ld", round, i, p[i].status);
    }
  }
  wait_idle();
  double allowed = idle * 0.1 > SLACK ? idle * 0.1 : SLACK;
  double rss = settled_rss(idle + allowed);
  printf("json_memory: idle RSS %.1f MiB, after 3 bursts of %d concurrent bodies %.1f MiB\n",
         idle / MiB, N, rss / MiB);
  if (rss_checked()) {
    cr_expect_leq(rss - idle, allowed, "RSS %.1f MiB after the bursts, %.1f MiB idle", rss / MiB,
                  idle / MiB);
  }
  for (int i = 0; i < N; i++)
    free(bodies[i]);
}

/* The tensors a JSON decode allocates (up to twice the body) count against
 * --max-queue x --max-body: with 1 x 1 MiB, a 300 KB body fits with its
 * tensors; a 600 KB one never can, and gets 413 (a retry would not help)
 * before it is decoded. */
Test(json_memory, decode_counts_against_the_budget) {
  srv_start(&S, "--max-queue", "1", "--max-body", "1M", NULL);
  size_t len;
  char *small = zeros_body(800, 800, NULL, &len);
  http_res r;
  http_post(&S, "/attention", "application/json", small, len, &r);
  cr_expect_eq(r.status, 200, "%zu-byte body: %.200s", len, r.body);
  http_res_free(&r);
  free(small);
  char *big = zeros_body(1600, 1600, NULL, &len);
  http_post(&S, "/attention", "application/json", big, len, &r);
  cr_expect(expect_error(&r, 413, "too_large", "a JSON body whose tensors exceed the budget"));
  cr_expect(r.body && strstr(r.body, "memory budget") && strstr(r.body, "safetensors"), "%.200s",
            r.body);
  http_res_free(&r);
  free(big);
  cr_expect_eq(srv_stop(&S, 10), 0);
}

/* A decode that would fit in an idle server but not beside an upload in
 * progress gets 503 queue_full: retrying later helps. */
Test(json_memory, decode_waits_for_room_with_503) {
  srv_start(&S, "--max-queue", "2", "--max-body", "1M", NULL);
  int a = raw_connect(S.port);
  cr_assert_geq(a, 0);
  raw_sends(
      a, "POST /attention HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/octet-stream\r\n"
         "Content-Length: 716800\r\n\r\n");
  char *part = calloc(1, 716799);
  raw_send(a, part, 716799);
  free(part);
  /* wait until the server holds the upload's 700 KiB, which arrived */
  cr_assert(srv_wait_metric_ge(&S, "attnd_body_bytes", NULL, 716799, 60),
            "the upload's bytes never showed in attnd_body_bytes");
  size_t len;
  char *body = zeros_body(1300, 1300, NULL, &len); /* about 450 KB, 900 KB decoded */
  http_res r;
  http_post(&S, "/attention", "application/json", body, len, &r);
  cr_expect(expect_error(&r, 503, "queue_full", "a decode beside an upload"));
  cr_expect(r.body && strstr(r.body, "retry"), "%.200s", r.body);
  http_res_free(&r);
  close(a);
  /* the upload gone, the same body fits: retrying helped. Its bytes are
   * released in the callback that drops the gauge, on the one HTTP thread
   * that also answers /metrics, so a gauge of 0 means they are free. */
  cr_assert(srv_wait_metric_le(&S, "attnd_uploads", NULL, 0, 60),
            "the abandoned upload never left attnd_uploads");
  http_post(&S, "/attention", "application/json", body, len, &r);
  cr_expect_eq(r.status, 200, "the body did not fit after the upload left: %.200s", r.body);
  http_res_free(&r);
  free(body);
  cr_expect_eq(srv_stop(&S, 10), 0);
}
