/* harness_http.c — see harness_http.h. */
#define _GNU_SOURCE
#include "harness_http.h"

#include "harness_buf.h"

#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

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

void http_global_init(void) {
  static bool done;
  if (done)
    return;
  done = true;
  signal(SIGPIPE, SIG_IGN);
  curl_global_init(CURL_GLOBAL_ALL);
}

void *http_handle(void) {
  http_global_init();
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

long http_call(const srv *s, const char *method, const char *path, const char *const *headers,
               const void *body, size_t len, http_res *rs) {
  http_req rq = {.method = method, .path = path, .headers = headers, .body = body, .len = len};
  http_do(s, &rq, rs);
  return rs->status;
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

bool expect_header(const http_res *rs, const char *name, const char *want) {
  char v[512] = "";
  bool has = http_header(rs, name, v, sizeof v);
  cr_expect(has && !strcmp(v, want), "%s: \"%s\", want \"%s\"", name, has ? v : "(absent)", want);
  return has && !strcmp(v, want);
}

bool made_id(const char *v) { return strlen(v) == 32 && strspn(v, "0123456789abcdef") == 32; }

bool expect_healthy(const srv *s, const char *after) {
  http_res r;
  http_req rq = {.path = "/healthz", .timeout_ms = 5000};
  http_do(s, &rq, &r);
  bool ok = r.status == 200;
  cr_expect(ok, "/healthz after %s: status %ld (%s)", after, r.status, r.error);
  http_res_free(&r);
  return ok;
}
