/*
 * infer_send.c — the HTTP exchange of `attn infer`: one POST with libcurl,
 * the way a user's client would make it, timed by curl's clock plus ours
 * for the first byte of the reply. Nothing of curl outlives the call: the
 * reply's status, type, bytes and timings are copied out.
 */
#include "args.h"
#include "benchlib.h"
#include "infer.h"

#include <curl/curl.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static size_t on_body(char *data, size_t size, size_t nmemb, void *arg) {
  tool_infer_reply *b = arg;
  size_t n = size * nmemb;
  attn_sbuf_put(&b->body, data, n); /* NUL-terminated: JSON replies are parsed as text */
  return b->body.oom ? 0 : n;       /* 0: curl aborts the transfer with CURLE_WRITE_ERROR */
}

/* The first byte of the reply, on our clock. Debian 12's libcurl (7.88)
 * stamps CURLINFO_STARTTRANSFER_TIME of a POST a microsecond after
 * PRETRANSFER (seen on a 2-second job), which would count the upload and
 * the server's work as download time. */
static size_t on_header(char *data, size_t size, size_t nmemb, void *arg) {
  (void)data;
  double *first = arg;
  if (*first == 0)
    *first = tool_bench_now();
  return size * nmemb;
}

static size_t base_len(const char *url) {
  size_t ul = strlen(url);
  while (ul > 0 && url[ul - 1] == '/')
    ul--;
  return ul;
}

static bool ends_with(const char *s, size_t n, const char *suffix) {
  size_t k = strlen(suffix);
  return n >= k && !memcmp(s + n - k, suffix, k);
}

void tool_infer_url(const tool_infer_args *a, attn_sbuf *url) {
  size_t ul = base_len(a->url);
  attn_sbuf_put(url, a->url, ul);
  bool bwd = a->pass == ATTN_BACKWARD;
  /* a full endpoint URL works too */
  if (bwd && ends_with(a->url, ul, "/attention"))
    attn_sbuf_puts(url, "/backward");
  else if (!ends_with(a->url, ul, bwd ? "/attention/backward" : "/attention"))
    attn_sbuf_puts(url, bwd ? "/attention/backward" : "/attention");
  if (a->query.p)
    attn_sbuf_puts(url, a->query.p);
}

static double us(CURL *h, CURLINFO what) {
  curl_off_t t = 0;
  curl_easy_getinfo(h, what, &t);
  return (double)t * 1e-6;
}

/* One line for a transfer that failed; the exit status. */
static int transfer_error(const tool_infer_args *a, CURL *h, CURLcode cc, const char *url,
                          const char *curl_err, const tool_infer_reply *r) {
  long oserr = 0;
  curl_easy_getinfo(h, CURLINFO_OS_ERRNO, &oserr);
  if (r->body.oom)
    fprintf(stderr, TOOL_INFER_ME ": out of memory for the reply from %s\n", url);
  else if (cc == CURLE_COULDNT_CONNECT)
    fprintf(stderr, TOOL_INFER_ME ": cannot connect to %.*s: %s\n", (int)base_len(a->url), a->url,
            oserr       ? strerror((int)oserr)
            : *curl_err ? curl_err
                        : curl_easy_strerror(cc));
  else if (cc == CURLE_OPERATION_TIMEDOUT)
    fprintf(stderr, TOOL_INFER_ME ": no complete reply from %s within %g s (--timeout)\n", url,
            a->timeout);
  else
    fprintf(stderr, TOOL_INFER_ME ": %s: %s\n", url, *curl_err ? curl_err : curl_easy_strerror(cc));
  /* a URL curl cannot use is a usage error; everything else happened at
   * run time */
  return cc == CURLE_URL_MALFORMAT || cc == CURLE_UNSUPPORTED_PROTOCOL ? 2 : 1;
}

/* The reply's status, type and timings, copied out of the handle. */
static void collect(CURL *h, double first, tool_infer_reply *r) {
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &r->http);
  const char *ctype = NULL;
  curl_easy_getinfo(h, CURLINFO_CONTENT_TYPE, &ctype);
  snprintf(r->ctype, sizeof r->ctype, "%s", ctype ? ctype : "");
  r->connect = us(h, CURLINFO_CONNECT_TIME_T);
  r->pre = us(h, CURLINFO_PRETRANSFER_TIME_T);
  r->total = us(h, CURLINFO_TOTAL_TIME_T);
  r->first = first;
  curl_off_t upb = 0, downb = 0;
  curl_easy_getinfo(h, CURLINFO_SIZE_UPLOAD_T, &upb);
  curl_easy_getinfo(h, CURLINFO_SIZE_DOWNLOAD_T, &downb);
  r->up = (long long)upb;
  r->down = (long long)downb;
}

/* The request's headers: its type, the API key when ATTND_API_KEY is set,
 * and no "Expect: 100-continue" round trip (curl adds it to large bodies),
 * so the upload timing measures the upload, not a wait for a 100. */
static struct curl_slist *request_headers(const tool_infer_args *a, const char *key) {
  struct curl_slist *hdrs = curl_slist_append(
      NULL, a->json ? "Content-Type: application/json" : "Content-Type: application/octet-stream");
  if (hdrs && key) {
    char auth[600];
    snprintf(auth, sizeof auth, "Authorization: Bearer %.500s", key);
    hdrs = curl_slist_append(hdrs, auth);
  }
  /* A JSON request's reply is JSON unless asked otherwise; --out wants a
   * safetensors file, so ask for the binary form rather than convert. */
  if (hdrs && a->json && a->out)
    hdrs = curl_slist_append(hdrs, "Accept: application/octet-stream");
  return hdrs ? curl_slist_append(hdrs, "Expect:") : NULL;
}

static int perform(const tool_infer_args *a, CURL *h, const char *url, const void *body, size_t len,
                   struct curl_slist *hdrs, tool_infer_reply *r) {
  char curl_err[CURL_ERROR_SIZE] = "";
  double t_first = 0;
  curl_easy_setopt(h, CURLOPT_URL, url);
  curl_easy_setopt(h, CURLOPT_POST, 1L);
  curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
  curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, r);
  curl_easy_setopt(h, CURLOPT_ERRORBUFFER, curl_err);
  curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(h, CURLOPT_HEADERDATA, &t_first);
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_USERAGENT, "attn-infer/" ATTN_VERSION);
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)(a->timeout * 1e3));
  double t_start = tool_bench_now();
  CURLcode cc = curl_easy_perform(h);
  if (cc != CURLE_OK)
    return transfer_error(a, h, cc, url, curl_err, r);
  collect(h, t_first - t_start, r);
  return 0;
}

int tool_infer_send(const tool_infer_args *a, const char *url, const void *body, size_t len,
                    tool_infer_reply *r) {
  signal(SIGPIPE, SIG_IGN); /* a server closing mid-upload is an error, not a kill */
  if (curl_global_init(CURL_GLOBAL_DEFAULT) != 0) {
    fprintf(stderr, TOOL_INFER_ME ": cannot initialize libcurl\n");
    return 1;
  }
  CURL *h = curl_easy_init();
  struct curl_slist *hdrs = NULL;
  int status;
  bool bad_key;
  const char *key = tool_arg_api_key(TOOL_INFER_ME, &bad_key);
  if (bad_key) {
    status = 2;
  } else if (!h) {
    fprintf(stderr, TOOL_INFER_ME ": cannot initialize libcurl\n");
    status = 1;
  } else if (!(hdrs = request_headers(a, key))) {
    fprintf(stderr, TOOL_INFER_ME ": out of memory\n");
    status = 1;
  } else {
    status = perform(a, h, url, body, len, hdrs, r);
  }
  if (h)
    curl_easy_cleanup(h);
  curl_slist_free_all(hdrs);
  curl_global_cleanup();
  return status;
}

void tool_infer_reply_free(tool_infer_reply *r) {
  free(r->body.p);
  r->body = (attn_sbuf){0};
}
