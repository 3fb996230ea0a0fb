/*
 * http.c — a request's way through the HTTP front on libmicrohttpd
 * (http.h).
 *
 * Runs on libmicrohttpd's polling threads (--http-threads; a request
 * stays on its connection's) and never computes. The first
 * callback of a request checks its head (parse.h), routes it (routes.h) and
 * decides what it can at once: the GET endpoints (all cheap) and 404/405
 * are answered when the request is complete, which keeps the connection
 * alive; what a computing request's head refuses is answered before its
 * body (body.h). On the body's last byte the connection is suspended and
 * the request handed to the loop, which resumes it with the reply set.
 * Every request ends in attnd_http_on_completed(): one log line, the
 * metrics, and freeing its state.
 */
#include "http.h"
#include "auth.h"
#include "body.h"
#include "log.h"
#include "loop.h"
#include "mhd_shim.h"
#include "parse.h"
#include "reply.h"
#include "routes.h"
#include "tiny.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

_Static_assert(ATTND_CONN_ID_MAX >= ATTND_REQID_MAX, "an upload's record must hold its request id");

/* ---- request parsing ---------------------------------------------------- */

/* The query string again, percent-encoded, from libmicrohttpd's decoded
 * arguments: the proto parsers read query strings. */
static enum MHD_Result add_arg(void *cls, enum MHD_ValueKind kind, const char *key,
                               const char *value) {
  (void)kind;
  attn_sbuf *b = cls;
  const char *parts[2] = {key, value};
  if (b->len)
    attn_sbuf_put(b, "&", 1);
  for (int i = 0; i < 2 && parts[i]; i++) {
    if (i)
      attn_sbuf_put(b, "=", 1);
    for (const unsigned char *p = (const unsigned char *)parts[i]; *p; p++) {
      if ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
          *p == '-' || *p == '_' || *p == '.' || *p == '~')
        attn_sbuf_put(b, (const char *)p, 1);
      else
        attn_sbuf_printf(b, "%%%02X", *p);
    }
  }
  return MHD_YES;
}

static attnd_req *new_req(attnd_server *s, struct MHD_Connection *conn) {
  attnd_req *r = attnd_req_new(s);
  if (!r)
    return NULL;
  r->conn = conn;
  const union MHD_ConnectionInfo *ci =
      MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
  r->link = ci ? ci->socket_context : NULL;
  if (r->link)
    r->link->req = r;
  return r;
}

static void target_refused(attnd_req *r, const char *why) {
  if (r->bad_target)
    return;
  r->bad_target = why;
  r->bad_target_code = ATTND_EBAD_REQUEST;
}

/*
 * libmicrohttpd's unescaper, replaced (MHD_OPTION_UNESCAPE_CALLBACK): it
 * runs on each query key and value, then on the path, in place. "%00"
 * would end the string there for attnd and not for others, and "%2F" in
 * the path would become a separator that a proxy routing by path never
 * saw: the first is refused, the second left as it is.
 */
size_t attnd_http_on_unescape(void *cls, struct MHD_Connection *conn, char *s) {
  (void)cls;
  const union MHD_ConnectionInfo *ci =
      MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
  attnd_conn *k = ci ? ci->socket_context : NULL;
  attnd_req *r = k ? k->req : NULL;
  bool nul = false;
  /* the path is the string that starts where the target did */
  size_t n = attnd_parse_unescape(s, r && s == r->target, &nul);
  if (nul && r)
    target_refused(r, "the request target holds %00 (a NUL byte)");
  return n;
}

/*
 * libmicrohttpd's first look at a request, once its request line is in and
 * before it parses the query: the request starts here, so that a request
 * libmicrohttpd refuses later is still logged. A target past the limits has
 * its query cut before libmicrohttpd stores it, and is refused with 414 once
 * the headers are in.
 */
void *attnd_http_on_target(void *cls, const char *uri, struct MHD_Connection *conn) {
  attnd_req *r = new_req(cls, conn);
  if (!r)
    return NULL;
  attnd_copy_str(r->path, sizeof r->path, uri);
  r->target = uri;
  r->target_end = uri + strlen(uri);
  r->path_escaped = memchr(uri, '%', strcspn(uri, "?")) != NULL;
  r->bad_target = attnd_parse_target(uri, &r->bad_target_code);
  char *q = strchr(uri, '?');
  if (r->bad_target && q)
    q[1] = 0;
  return r;
}

/* The walk over a request's headers: parse.h's rules, and whether a value
 * holds a NUL byte, which C strings hide. */
typedef struct head_walk {
  attnd_head h;
  const char *last; /* the previous header's value */
  bool nul;
} head_walk;

/*
 * Whether a value ends where its line did. libmicrohttpd 0.9.75 keeps each
 * header line where it was read, its colon and line end overwritten with
 * NULs, one line after the other: a value's string ends one (LF) or two
 * (CRLF) bytes before the next header's name, and the last one's is
 * followed by NULs (its line end, then the blank line's). A NUL inside a
 * value ends its string early; a folded line (obs-fold) is moved elsewhere.
 * Both are refused (RFC 9112 §5.2 allows 400 for obs-fold).
 */
static bool value_whole(const char *value, const char *next_name) {
  const char *end = value + strlen(value);
  return next_name ? next_name == end + 1 || next_name == end + 2 : end[1] == 0;
}

static enum MHD_Result walk_header(void *cls, enum MHD_ValueKind kind, const char *key,
                                   const char *value) {
  (void)kind;
  head_walk *w = cls;
  if (w->last && !value_whole(w->last, key))
    w->nul = true;
  attnd_head_add(&w->h, key, value);
  w->last = value ? value : "";
  return MHD_YES;
}

/*
 * Refuses heads that two HTTP parsers could read differently (a proxy in
 * front and libmicrohttpd here), which is how a second request is
 * smuggled: answered at once, the connection is closed and no byte after
 * the headers is read. false when r has its reply.
 */
static bool check_head(attnd_req *r, const char *version) {
  head_walk w = {0};
  attnd_head_line(&w.h, r->method, r->target_end ? (size_t)(r->target_end - r->target) : 0,
                  version);
  MHD_get_connection_values(r->conn, MHD_HEADER_KIND, walk_header, &w);
  if (w.last && !value_whole(w.last, NULL))
    w.nul = true;
  char msg[300];
  int code = attnd_head_check(&w.h, version, msg, sizeof msg);
  if (!code && w.nul) {
    code = ATTND_EBAD_REQUEST;
    snprintf(msg, sizeof msg,
             "a header value holds a NUL byte, or a header is folded over two lines; send each "
             "header on one line, without NUL");
  }
  if (code) {
    attnd_req_fail(r, code, msg);
    return false;
  }
  r->has_body = attnd_head_has_body(&w.h);
  r->host = w.h.host;
  return true;
}

static void route_of(attnd_req *r, const char *url, const char *method) {
  attnd_copy_str(r->method, sizeof r->method, method);
  attnd_copy_str(r->path, sizeof r->path, attnd_parse_origin_path(url));
  attnd_route_of(r);
  attn_sbuf q = {0};
  MHD_get_connection_values(r->conn, MHD_GET_ARGUMENT_KIND, add_arg, &q);
  r->query = q.oom ? NULL : q.p;
}

/* A CORS preflight (OPTIONS, with --cors-origin): answered 204 on any
 * path, before the key check, since browsers send preflights without
 * credentials. true when r has its reply. */
static bool preflight(attnd_req *r) {
  if (!*r->srv->cfg->cors_origin || strcmp(r->method, MHD_HTTP_METHOD_OPTIONS))
    return false;
  /* an empty body, but not NULL: queue_reply reads NULL as out of memory */
  attnd_req_reply(r, MHD_HTTP_NO_CONTENT, malloc(1), 0, NULL);
  return true;
}

_Static_assert(sizeof((attnd_req *)0)->tenant > ATTND_KEY_NAME_MAX, "a key's name fits tenant");

/* The API key check (--api-key, --api-key-file): true when r may go on,
 * r->tenant naming the key it carried; else r has its 401. Routes open in
 * the table (probes, the console) need no key, and have no tenant. */
static bool authorized(attnd_req *r) {
  const attnd_keys *keys = &r->srv->cfg->keys;
  if (!keys->n || (r->route && r->route->open))
    return true;
  const char *h =
      MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
  int k = attnd_auth_match(h, keys);
  if (k >= 0) {
    attnd_copy_str(r->tenant, sizeof r->tenant, keys->k[k].name);
    return true;
  }
  attnd_req_fail(r, ATTND_EUNAUTHORIZED,
                 h ? "the API key in the Authorization header is not this server's"
                   : "this server needs an API key: send the header \"Authorization: Bearer "
                     "<key>\"");
  return false;
}

/* Whether a keyless server serves r: its Host is one the server is reached
 * by (a DNS-rebinding page sends its own name), and a page of another
 * origin computes nothing (/v2 reads bodies without a Content-Type, which
 * browsers send without asking first). false when r has its 403. */
static bool keyless_ok(attnd_req *r, bool post) {
  const attnd_config *c = r->srv->cfg;
  char msg[400], q[128];
  if (c->keys.n)
    return true;
  if (!attnd_parse_host_allowed(r->host, c->allowed_hosts)) {
    attn_quote(q, sizeof q, r->host, strlen(r->host));
    snprintf(msg, sizeof msg,
             "this server has no API key and answers only to IP addresses, localhost and "
             "--allowed-hosts; Host \"%s\" is none of them: add it to --allowed-hosts, or "
             "set an API key",
             q);
  } else {
    if (!post) /* no Origin to look up */
      return true;
    const char *origin = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "Origin");
    if (attnd_parse_origin_allowed(origin, r->host, c->cors_origin))
      return true;
    attn_quote(q, sizeof q, origin, strlen(origin));
    snprintf(msg, sizeof msg,
             "a page of origin \"%s\" may not call this server (it has no API key); allow "
             "the origin with --cors-origin",
             q);
  }
  attnd_req_fail(r, ATTND_EFORBIDDEN, msg);
  return false;
}

/* What r's head alone refuses: its target, its headers, and what a keyless
 * server answers. A target that libmicrohttpd read past a NUL byte has its
 * string end before the HTTP version that followed it on the line. false
 * when r has its reply, which then closes the connection. */
static bool head_ok(attnd_req *r, const char *version, bool post) {
  if (r->target_end && version != r->target_end + 1)
    target_refused(r, "the request target holds a NUL byte");
  if (r->bad_target)
    attnd_req_fail(r, r->bad_target_code, r->bad_target);
  else if (check_head(r, version) && keyless_ok(r, post))
    return true;
  r->close = true;
  return false;
}

/* X-Forwarded-For's values in the order they came: the last few, since a
 * proxy appends (and the right end is what a trusted one wrote). */
typedef struct xff_values {
  const char *v[8];
  int n;
} xff_values;

static enum MHD_Result collect_xff(void *cls, enum MHD_ValueKind kind, const char *key,
                                   const char *value) {
  (void)kind;
  xff_values *x = cls;
  if (!value || strcasecmp(key, "X-Forwarded-For"))
    return MHD_YES;
  if (x->n == (int)(sizeof x->v / sizeof *x->v))
    memmove(x->v, x->v + 1, sizeof x->v - sizeof *x->v), x->n--;
  x->v[x->n++] = value;
  return MHD_YES;
}

/* r's client, the key of its fair share of the running slots (loop.c) and
 * of its log line: its connection's address, or through a trusted proxy
 * the address X-Forwarded-For names (proxy.h). */
static void client_of(attnd_req *r) {
  const attnd_proxies *p = &r->srv->cfg->trusted_proxies;
  if (!attnd_proxies_trusts(p, r->link->client)) {
    attnd_copy_str(r->client, sizeof r->client, r->link->client);
    return;
  }
  xff_values x = {{0}, 0};
  MHD_get_connection_values(r->conn, MHD_HEADER_KIND, collect_xff, &x);
  attnd_proxies_client(p, r->link->client, x.v, x.n, r->client);
}

/* The first callback, once the headers are in: route, and decide what can
 * be decided before the body. */
static enum MHD_Result first_call(attnd_req *r, const char *url, const char *method,
                                  const char *version) {
  attnd_server *s = r->srv;
  r->started = true;
  if (r->link) {
    attnd_conns_set(&s->conns, r->link, ATTND_CONN_BUSY, attn_now());
    client_of(r);
  }
  route_of(r, url, method);
  const char *id = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, ATTND_REQID_HEADER);
  if (attnd_reqid_valid(id))
    attnd_copy_str(r->id, sizeof r->id, id);
  bool post = !strcmp(method, MHD_HTTP_METHOD_POST);
  if (!head_ok(r, version, post))
    return attnd_reply_queue(r);
  if (r->has_body && r->link)
    attnd_conns_upload(&s->conns, r->link, r->id, r->t_received + s->cfg->timeout, attn_now());
  if (preflight(r) || !authorized(r))
    return post ? attnd_reply_queue(r) : MHD_YES;
  if (!r->route) {
    attnd_route_not_found(r);
  } else if (attnd_route_escaped(r)) {
    /* r has its 422 */
  } else if (!attnd_route_allows(r->route, method)) {
    attnd_route_not_allowed(r);
  } else if (r->route->answer && !attnd_route_body_first(r->route, method)) {
    r->route->answer(r);
  } else if (!attnd_body_begin(r)) {
    /* Refused before the body: reply now, and libmicrohttpd closes the
     * connection rather than read a body nobody wants. */
    return attnd_reply_queue(r);
  }
  /* Other replies go out once the request is complete, which keeps the
   * connection alive for the next one. */
  return MHD_YES;
}

enum MHD_Result attnd_http_on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                      const char *method, const char *version, const char *upload,
                                      size_t *upload_size, void **con_cls) {
  attnd_server *s = cls;
  attnd_req *r = *con_cls;
  if (!r && !(r = *con_cls = new_req(s, conn)))
    return MHD_NO;
  if (!r->started)
    return first_call(r, url, method, version);
  if (r->queued) {
    *upload_size = 0;
    return MHD_YES;
  }
  if (*upload_size) {
    size_t n = *upload_size;
    *upload_size = 0;
    return attnd_body_add(r, upload, n) ? MHD_YES : MHD_NO;
  }
  attnd_body_done(r);
  if (r->gone) /* the client left before its reply: close, send nothing */
    return MHD_NO;
  if (r->status)
    return attnd_reply_queue(r);
  if (!r->submitted) {
    if (r->route->after_body || attnd_tiny_run(r)) { /* answered here: r has its reply */
      if (r->route->after_body)
        r->route->after_body(r);
      attnd_upload_end(r);
      return attnd_reply_queue(r);
    }
    r->submitted = true;
    atomic_fetch_add(&s->replying, 1);
    MHD_suspend_connection(conn);
    attnd_loop_submit(s, r);
    attnd_upload_end(r); /* after the handoff: a drain sees one or the other */
  }
  return MHD_YES;
}

void attnd_http_on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                             enum MHD_RequestTerminationCode why) {
  (void)conn;
  attnd_server *s = cls;
  attnd_req *r = *con_cls;
  if (!r)
    return;
  if (!r->queued) /* the client left before a reply */
    attnd_mhd_unanswered(s, r, why);
  /* idle before the log line, which tests wait for */
  attnd_conn *link = r->link;
  if (link) {
    link->req = NULL;
    attnd_conns_set(&s->conns, link, ATTND_CONN_IDLE, attn_now());
  }
  attnd_log_ended(s, r);
  r->link = NULL;
  attnd_upload_end(r);
  if (r->submitted)
    atomic_fetch_sub(&s->replying, 1);
  /* A job answered early may still be in the engine: the last reference
   * frees r. */
  attnd_req_unref(r);
  *con_cls = NULL;
}
