/*
 * sessions.c — the session routes (sessions.h).
 */
#include "sessions.h"
#include "errors.h"
#include "log.h"
#include "prom.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PREFIX "/v1/sessions/"

/* The store, or false with r's 404 when sessions are off. */
static bool store_of(attnd_req *r, attn_kv_store **ps) {
  *ps = r->srv->kv;
  if (*ps)
    return true;
  attnd_req_fail(r, ATTND_ENOT_FOUND, ATTND_SESSIONS_OFF);
  return false;
}

int attnd_sessions_id(const char *path, char id[ATTN_KV_ID_MAX + 1], attn_status *st) {
  const char *p = path + strlen(PREFIX);
  size_t n = strcspn(p, "/");
  int rc = attn_kv_id_check(p, n, st);
  if (rc == 0) {
    memcpy(id, p, n);
    id[n] = 0;
  }
  return rc;
}

/* The id in r's path into id; false with r's 422. */
static bool path_id(attnd_req *r, char id[ATTN_KV_ID_MAX + 1]) {
  attn_status st;
  if (attnd_sessions_id(r->path, id, &st) == 0)
    return true;
  attnd_req_fail(r, st.code, st.message);
  return false;
}

/* The session as it is at now: the instant a create or truncate used, so
 * that one whose ttl_s is shorter than the reply's making still answers. */
static void reply_info(attnd_req *r, int status, attn_kv_store *kv, const char *id, double now) {
  attn_kv_info info;
  int64_t lengths[ATTN_KV_MAX_LAYERS];
  attn_status st;
  if (attn_kv_get(kv, r->tenant, id, now, &info, lengths, ATTN_KV_MAX_LAYERS, &st)) {
    attnd_req_fail(r, st.code, st.message);
    return;
  }
  attn_sbuf b = {0};
  attn_proto_session_info_json(&b, &info, lengths, now);
  attn_sbuf_puts(&b, "\n");
  attnd_req_reply_json(r, status, &b);
}

static void create(attnd_req *r, attn_kv_store *kv, const char *id) {
  attn_kv_shape sh;
  double ttl;
  attn_status st;
  bool created = false;
  double now = attn_now();
  int rc = attn_proto_session_create_decode(r->body, r->len, r->srv->cfg->session_ttl_max, &sh,
                                            &ttl, &st);
  if (rc == 0)
    rc = attn_kv_create(kv, r->tenant, id, &sh, ttl, now, &created, &st);
  if (rc)
    attnd_req_fail(r, st.code, st.message);
  else
    reply_info(r, created ? 201 : 200, kv, id, now);
}

void attnd_sessions_resource(attnd_req *r) {
  attn_kv_store *kv;
  char id[ATTN_KV_ID_MAX + 1];
  if (!store_of(r, &kv) || !path_id(r, id))
    return;
  if (!strcmp(r->method, "PUT")) {
    create(r, kv, id);
  } else if (!strcmp(r->method, "DELETE")) {
    attn_status st;
    if (attn_kv_delete(kv, r->tenant, id, attn_now(), &st))
      attnd_req_fail(r, st.code, st.message);
    else
      attnd_req_reply(r, 204, malloc(1), 0, NULL);
  } else {
    reply_info(r, 200, kv, id, attn_now());
  }
}

void attnd_sessions_truncate(attnd_req *r) {
  attn_kv_store *kv;
  char id[ATTN_KV_ID_MAX + 1];
  int64_t length;
  attn_status st;
  double now = attn_now();
  if (!store_of(r, &kv) || !path_id(r, id))
    return;
  if (attn_proto_session_truncate_decode(r->body, r->len, &length, &st) ||
      attn_kv_truncate(kv, r->tenant, id, length, now, &st))
    attnd_req_fail(r, st.code, st.message);
  else
    reply_info(r, 200, kv, id, now);
}

void attnd_sessions_fork(attnd_req *r) {
  attn_kv_store *kv;
  char id[ATTN_KV_ID_MAX + 1], new_id[ATTN_KV_ID_MAX + 1];
  int64_t length;
  double ttl, now = attn_now();
  attn_status st;
  if (!store_of(r, &kv) || !path_id(r, id))
    return;
  if (attn_proto_session_fork_decode(r->body, r->len, r->srv->cfg->session_ttl_max, new_id, &length,
                                     &ttl, &st) ||
      attn_kv_fork(kv, r->tenant, id, new_id, length, ttl, now, &st))
    attnd_req_fail(r, st.code, st.message);
  else
    reply_info(r, 201, kv, new_id, now);
}

/* An export on its way: the file's header, then the store's rows as they
 * are read out (no copy of the session). */
typedef struct export_stream {
  attn_kv_exporter *x;
  void *head;
  size_t head_len;
  uint64_t len; /* the whole file's */
} export_stream;

static void export_end(void *arg) {
  export_stream *e = arg;
  attn_kv_export_close(e->x);
  free(e->head);
  free(e);
}

/* Session (tenant, id)'s file opened for reading; 0 or the error. */
static int export_open(attn_kv_store *kv, const char *tenant, const char *id, export_stream **out,
                       attn_status *st) {
  attn_kv_info info;
  int64_t lengths[ATTN_KV_MAX_LAYERS];
  size_t data;
  export_stream *e = calloc(1, sizeof *e);
  if (!e)
    return attn_status_set(st, ATTN_ENOMEM, "out of memory exporting session '%s'", id);
  int rc = attn_kv_export_open(kv, tenant, id, attn_now(), &info, lengths, &e->x, st);
  rc = rc ? rc
          : attn_proto_session_file_head(&info.shape, info.ttl_s, lengths, &e->head, &e->head_len,
                                         &data, st);
  if (rc) {
    export_end(e);
    return rc;
  }
  e->len = e->head_len + data;
  *out = e;
  return 0;
}

/* The bytes of the file from pos (its header's, then the rows'). */
static int64_t export_read(void *arg, uint64_t pos, char *buf, size_t max) {
  export_stream *e = arg;
  attn_status st;
  if (pos >= e->head_len)
    return attn_kv_export_read(e->x, buf, max, &st);
  size_t n = e->head_len - (size_t)pos < max ? e->head_len - (size_t)pos : max;
  memcpy(buf, (char *)e->head + pos, n);
  return (int64_t)n;
}

int attnd_sessions_export_file(attn_kv_store *kv, const char *tenant, const char *id, void **pbuf,
                               size_t *plen, attn_status *st) {
  export_stream *e;
  int rc = export_open(kv, tenant, id, &e, st);
  if (rc)
    return rc;
  char *buf = malloc(e->len);
  if (!buf)
    rc = attn_status_set(st, ATTN_ENOMEM, "out of memory for session '%s''s %llu-byte file", id,
                         (unsigned long long)e->len);
  for (size_t at = 0; rc == 0 && at < e->len;) {
    int64_t n = export_read(e, at, buf + at, e->len - at);
    rc = n > 0 ? 0 : attn_status_set(st, ATTN_EDEVICE, "session '%s' could not be read out", id);
    at += n > 0 ? (size_t)n : 0;
  }
  const size_t len = e->len;
  export_end(e);
  if (rc) {
    free(buf);
    return rc;
  }
  *pbuf = buf;
  *plen = len;
  return 0;
}

void attnd_sessions_export(attnd_req *r) {
  attn_kv_store *kv;
  char id[ATTN_KV_ID_MAX + 1];
  export_stream *e;
  attn_status st;
  if (!store_of(r, &kv) || !path_id(r, id))
    return;
  if (export_open(kv, r->tenant, id, &e, &st)) {
    attnd_req_fail(r, st.code, st.message);
    return;
  }
  const attnd_stream s = {e->len, export_read, export_end, e};
  attnd_req_reply_stream(r, 200, &s, "application/octet-stream");
}

void attnd_sessions_import(attnd_req *r) {
  attn_kv_store *kv;
  char id[ATTN_KV_ID_MAX + 1];
  attn_status st;
  double now = attn_now();
  if (!store_of(r, &kv) || !path_id(r, id))
    return;
  attn_proto_session_file *f = malloc(sizeof *f);
  int rc = f ? attn_proto_session_file_decode(r->body, r->len, r->srv->cfg->session_ttl_max, f, &st)
             : attn_status_set(&st, ATTN_ENOMEM, "out of memory importing a session");
  if (rc == 0)
    rc = attn_kv_import(kv, r->tenant, id, &f->shape, f->ttl_s, now, f->lengths, f->k,
                        f->shape.v_from_k ? NULL : f->v, &st);
  if (f)
    attn_proto_session_file_free(f);
  free(f);
  if (rc)
    attnd_req_fail(r, st.code, st.message);
  else
    reply_info(r, 201, kv, id, now);
}

static void list_one(const attn_kv_info *info, const int64_t *lengths, void *arg) {
  attn_sbuf *b = arg;
  if (b->len > 1 && b->p[b->len - 1] != '[')
    attn_sbuf_puts(b, ", ");
  attn_proto_session_info_json(b, info, lengths, attn_now());
}

void attnd_sessions_list(attnd_req *r) {
  attn_kv_store *kv;
  if (!store_of(r, &kv))
    return;
  attn_kv_stats stats;
  attn_kv_stats_get(kv, &stats);
  attn_sbuf b = {0};
  attn_sbuf_puts(&b, "{\"sessions\": [");
  int64_t n = attn_kv_list(kv, r->tenant, attn_now(), list_one, &b);
  uint64_t mine = attn_kv_tenant_reserved(kv, r->tenant);
  attn_sbuf_printf(
      &b,
      "], \"count\": %lld, \"memory\": {\"pool_bytes\": %llu, \"reserved_bytes\": "
      "%llu, \"used_bytes\": %llu, \"shared_bytes\": %llu, \"saved_bytes\": %llu, "
      "\"quantized_bytes\": %llu, \"key_reserved_bytes\": %llu, \"per_key_bytes\": %llu}}\n",
      (long long)n, (unsigned long long)stats.pool_bytes, (unsigned long long)stats.reserved_bytes,
      (unsigned long long)stats.used_bytes, (unsigned long long)stats.shared_bytes,
      (unsigned long long)stats.saved_bytes, (unsigned long long)stats.quantized_bytes,
      (unsigned long long)mine, (unsigned long long)stats.tenant_cap_bytes);
  attnd_req_reply_json(r, 200, &b);
}

/* ---- the store's life ------------------------------------------------------ */

static void log_line(const char *line, void *arg) {
  attnd_log_note(arg, ATTND_WARN, NULL, NULL, "sessions: %s", line);
}

int attnd_sessions_open(attnd_server *s) {
  const attnd_config *c = s->cfg;
  attn_status st;
  if (c->session_memory == 0)
    return 0;
  /* on the GPU the server computes on, which holds the pages then, in
   * pages of the size its kernels find a page's number with */
  const char *where = strcmp(s->backend, "cuda") ? "cpu" : "auto";
  if (!strcmp(where, "auto") && c->session_page_bytes != ATTN_KV_PAGE_BYTES_MAX) {
    fprintf(stderr,
            "attnd: --session-page-bytes %lluK: sessions on the GPU this server computes on "
            "(--backend cuda, or auto with a GPU) keep pages of %zuK; leave the flag out, or "
            "serve with --backend cpu\n",
            (unsigned long long)(c->session_page_bytes >> 10), ATTN_KV_PAGE_BYTES_MAX >> 10);
    return -1;
  }
  if (attn_kv_open_paged(s->engine, c->session_memory, c->session_page_bytes, c->session_batch,
                         where, &s->kv, &st)) {
    fprintf(stderr, "attnd: cannot open the session store: %s\n", st.message);
    return -1;
  }
  attn_kv_set_tenant_cap(s->kv, c->session_memory_per_key);
  if (!*c->session_dir)
    return 0;
  int64_t n = attn_kv_load(s->kv, c->session_dir, attn_now(), c->session_ttl_max, log_line, s, &st);
  if (n < 0) {
    fprintf(stderr, "attnd: cannot load the sessions of %s: %s\n", c->session_dir, st.message);
    return -1;
  }
  attnd_log_note(s, ATTND_INFO, NULL, NULL, "sessions: loaded %lld from %s", (long long)n,
                 c->session_dir);
  return 0;
}

void attnd_sessions_close(attnd_server *s, bool save_only) {
  const attnd_config *c = s->cfg;
  attn_status st;
  if (!s->kv)
    return;
  if (*c->session_dir) {
    int64_t n = attn_kv_save(s->kv, c->session_dir, attn_now(), &st);
    if (n < 0)
      attnd_log_note(s, ATTND_ERROR, NULL, NULL, "sessions: not saved to %s: %s", c->session_dir,
                     st.message);
    else
      attnd_log_note(s, ATTND_INFO, NULL, NULL, "sessions: saved %lld to %s", (long long)n,
                     c->session_dir);
  }
  if (save_only)
    return;
  attn_kv_close(s->kv);
  s->kv = NULL;
}

/* ---- what the server says of them ------------------------------------------ */

void attnd_sessions_info(attn_sbuf *b, const attnd_server *s) {
  const attnd_config *c = s->cfg;
  attn_kv_stats st = {0};
  if (s->kv)
    attn_kv_stats_get(s->kv, &st);
  attn_sbuf_printf(
      b,
      "\"sessions\": {\"enabled\": %s, \"memory_bytes\": %llu, \"page_bytes\": "
      "%lld, \"pages_on\": \"%s\", \"persist\": %s, \"batching\": %s, "
      "\"ttl_max_s\": %g, \"count\": %lld, \"memory_per_key_bytes\": %llu, "
      "\"memory\": {\"reserved_bytes\": %llu, \"used_bytes\": %llu, "
      "\"shared_bytes\": %llu, \"saved_bytes\": %llu, \"quantized_bytes\": %llu}}",
      s->kv ? "true" : "false", (unsigned long long)st.pool_bytes, (long long)st.page_bytes,
      st.where ? st.where : "none", s->kv && *c->session_dir ? "true" : "false",
      s->kv && c->session_batch ? "true" : "false", c->session_ttl_max, (long long)st.sessions,
      (unsigned long long)st.tenant_cap_bytes, (unsigned long long)st.reserved_bytes,
      (unsigned long long)st.used_bytes, (unsigned long long)st.shared_bytes,
      (unsigned long long)st.saved_bytes, (unsigned long long)st.quantized_bytes);
}

static void counter(attn_sbuf *b, const char *name, const char *help, unsigned long long v) {
  attn_prom_counter(b, name, help, v);
}

static void gauge(attn_sbuf *b, const char *name, const char *help, unsigned long long v) {
  attn_prom_gauge(b, name, help, (int64_t)v);
}

/* attnd_session_batch_size: calls an engine job of the store computed, as a
 * histogram (bucket i: jobs of at most 2^i calls; the last, of more). */
static void batch_histogram(attn_sbuf *b, const attn_kv_stats *st) {
  char text[ATTN_KV_BATCH_BUCKETS - 1][12];
  const char *les[ATTN_KV_BATCH_BUCKETS - 1];
  for (int i = 0; i < ATTN_KV_BATCH_BUCKETS - 1; i++) {
    snprintf(text[i], sizeof text[i], "%d", 1 << i);
    les[i] = text[i];
  }
  attn_prom_hist h = {.les = les,
                      .counts = st->batch_sizes,
                      .nbounds = ATTN_KV_BATCH_BUCKETS - 1,
                      .sum = (double)st->batched_calls};
  attn_prom_family(b, "attnd_session_batch_size", "histogram",
                   "Session calls computed by one engine job.");
  attn_prom_histogram(b, "attnd_session_batch_size", NULL, 0, &h);
}

void attnd_sessions_metrics(attn_sbuf *b, const attnd_server *s) {
  if (!s->kv)
    return;
  attn_kv_stats st;
  attn_kv_stats_get(s->kv, &st);
  gauge(b, "attnd_sessions", "Sessions held (every API key's).", (unsigned long long)st.sessions);
  gauge(b, "attnd_session_memory_bytes", "Bytes of session memory (--session-memory).",
        st.pool_bytes);
  gauge(b, "attnd_session_reserved_bytes", "Bytes of session memory reserved by sessions.",
        st.reserved_bytes);
  gauge(b, "attnd_session_used_bytes", "Bytes of session memory in pages that hold tokens.",
        st.used_bytes);
  gauge(b, "attnd_session_shared_bytes",
        "Bytes of session pages that forks share, held by more than one session (each once).",
        st.shared_bytes);
  gauge(b, "attnd_session_saved_bytes",
        "Bytes of session pages that sharing saves: holds of a page past its first.",
        st.saved_bytes);
  gauge(b, "attnd_session_quantized_bytes",
        "Bytes of session memory reserved by quantized sessions (kv_dtype F8_E4M3 or I8).",
        st.quantized_bytes);
  gauge(b, "attnd_session_calls_waiting",
        "Session calls held in the store for a job on their layer, its readers or a write.",
        (unsigned long long)st.waiting);
  counter(b, "attnd_session_tokens_appended_total", "Tokens appended to sessions (per layer).",
          st.appended_tokens);
  counter(b, "attnd_session_replays_total", "Session calls whose tokens were stored already.",
          st.replays);
  counter(b, "attnd_session_conflicts_total", "Session calls refused: pos not the length.",
          st.conflicts);
  counter(b, "attnd_session_expired_total", "Sessions dropped at the end of their TTL.",
          st.expired);
  counter(b, "attnd_session_per_key_refused_total",
          "Session creates, and grow sessions' appends, refused (507) past the API key's share "
          "(--session-memory-per-key).",
          st.tenant_cap_refused);
  counter(b, "attnd_session_returned_bytes_total",
          "Bytes of free session pages given back to the operating system.", st.returned_bytes);
  batch_histogram(b, &st);
}
