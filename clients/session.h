/*
 * session.h — what `attn session` and `attn load --session` share: HTTP
 * calls to attnd's session routes (/v1/sessions/...) on one keep-alive
 * libcurl handle, a session's parameters as GET returns them,
 * and the safetensors bodies of a call (q [Hq, Nq, D] and the new k, v
 * [Hkv, Nnew, D], random or from a file) and of its reply (o, and the
 * layer's length in X-Session-Length or the reply's __metadata__).
 *
 * One tool_sess_http belongs to one thread; each call reuses its connection.
 */
#ifndef TOOL_SESSION_H
#define TOOL_SESSION_H

#include "engine.h"
#include "proto.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct tool_sess_http {
  void *curl;       /* CURL * */
  void *hdr_json;   /* struct curl_slist *: JSON bodies */
  void *hdr_binary; /* safetensors bodies */
  char base[1280];  /* the server's URL without a trailing '/' */
  double timeout;   /* seconds a call may take */
  const char *me;   /* the command, for messages */
} tool_sess_http;

typedef struct tool_sess_reply {
  long status;    /* HTTP status; 0 when no reply came */
  attn_sbuf body; /* NUL-terminated (body.p, malloc'd; NULL when empty) */
  int64_t length; /* X-Session-Length; -1 when the reply had none */
  double seconds; /* the exchange, curl's clock */
} tool_sess_reply;

/* url: http://HOST:PORT (a base, no query). 0, or the exit status after a
 * message on stderr starting with me (2 for a bad URL or API key). */
int tool_sess_http_init(tool_sess_http *c, const char *url, double timeout, const char *me);
void tool_sess_http_free(tool_sess_http *c);

/* METHOD base + path (with its query) and the body (NULL: none; binary:
 * safetensors, else JSON). 0 when an HTTP reply came (any status, in *r),
 * else 1 after a message. */
int tool_sess_call(tool_sess_http *c, const char *method, const char *path, const void *body,
                   size_t len, bool binary, tool_sess_reply *r);
void tool_sess_reply_free(tool_sess_reply *r);
/* An error reply as one line on stderr: "me: HTTP 409 session_conflict: ...". */
void tool_sess_print_error(const char *me, const tool_sess_reply *r);

/* Whether id is a session id the contract allows: 1-128 of [A-Za-z0-9._-],
 * not starting with '_' or '.'. */
bool tool_sess_id_ok(const char *id);

/* A session's parameters and its lengths (as GET /v1/sessions/{id} says). */
typedef struct tool_sess_info {
  int64_t heads_kv, head_dim, layers, max_tokens;
  int64_t head_dim_v; /* the values' head dim (head_dim when GET gives none) */
  bool v_from_k;      /* a latent session: k alone, v its first head_dim_v columns */
  bool grow;          /* reserve grow: reserved_bytes is what it holds now */
  attn_dtype dtype;
  attn_kv_quant kv_quant; /* its rows stored quantized (GET's kv_dtype), or NONE */
  double ttl_s, expires_in_s;
  int64_t reserved_bytes;
  int64_t shared_bytes; /* of pages its forks (or its source) hold too */
  int64_t *lengths;     /* layers of them (malloc'd) */
} tool_sess_info;

/* Reads a GET reply's JSON; 0, or -1 when it is not a session's. */
int tool_sess_info_parse(const char *json, size_t len, tool_sess_info *info);
void tool_sess_info_free(tool_sess_info *info);

/* One tensor of a call: name, dtype, [h, n, d] (the first rank of them:
 * rank 1 is sinks' [Hq]; 0 means 3) and its elements. */
typedef struct tool_sess_tensor {
  const char *name;
  attn_dtype dtype;
  int64_t shape[3];
  const void *data;
  int rank;
} tool_sess_tensor;

/* A safetensors body of tensors t[0..n) (header padded to 8 bytes), in
 * *pbuf (malloc'd); 0, or -1 when out of memory. */
int tool_sess_encode(const tool_sess_tensor *t, int n, void **pbuf, size_t *plen);
/* count elements of dt uniform in [-1, 1) into buf, from the state *seed. */
void tool_sess_random(void *buf, int64_t count, attn_dtype dt, uint64_t *seed);

/* What a safetensors reply holds: o's dtype, rank and shape, its largest
 * |value| and mean |value|, whether m, l, lse came, and the __metadata__
 * "length" (-1 when absent). */
typedef struct tool_sess_out {
  attn_dtype dtype;
  int rank;
  int64_t shape[4];
  double absmax, absmean;
  bool stats;
  int64_t length;
} tool_sess_out;

/* 0, or -1 with a reason in why (cap bytes) when it is not such a reply. */
int tool_sess_reply_out(const void *body, size_t len, tool_sess_out *o, char *why, size_t cap);

/* `attn load --session N --steps M` (load_session.c): N sessions, each
 * created with max_tokens prefill + steps * tokens, prefilled with prefill
 * tokens (0: none), then steps calls of `tokens` new q, k, v tokens each
 * at the position it tracks; query: more options for every call ("" or
 * "scale=0.1&..."). */
typedef struct tool_load_session_plan {
  const char *url, *query;
  int sessions;
  int64_t steps, prefill, tokens, heads_q, heads_kv, head_dim;
  attn_dtype dtype;
  double timeout;
  bool json;
} tool_load_session_plan;

/* Runs the plan and prints its report (text, or one JSON object); the exit
 * status: 0 when every session was created (failed steps are counted in
 * the report), 1 otherwise, after a message. */
int tool_load_sessions(const tool_load_session_plan *p);

#endif
