/*
 * handover.c — the session handover of handover.h: the sessions' names
 * taken from the store first (a list copied under its lock), then each
 * session exported, PUT (http_put.h) and dropped or kept, one at a time,
 * so that only one session's file is in memory besides the store.
 */
#include "handover.h"
#include "http_put.h"
#include "log.h"
#include "sessions.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A request's socket waits: a target that moves no byte this long (a stuck
 * import) is given up on, leaving the rest of --handover-timeout to the
 * next sessions. An import still copying a large session answers well
 * inside it: a GiB takes seconds. */
#define HANDOVER_IDLE_S 10.0

typedef struct ho_name {
  char tenant[ATTN_KV_TENANT_MAX + 1];
  char id[ATTN_KV_ID_MAX + 1];
} ho_name;

/* One handover: what it moves, where, by when, and what came of it. */
typedef struct ho_run {
  attnd_server *s;
  ho_name *names;
  int64_t n, cap;
  bool oom;
  double start, deadline;
  int64_t moved, held, kept; /* held: the inheritor had it already (409) */
  uint64_t bytes_moved, bytes_kept;
} ho_run;

static void add_name(const attn_kv_info *info, const int64_t *lengths, void *arg) {
  ho_run *h = arg;
  (void)lengths;
  if (h->n == h->cap) {
    int64_t cap = h->cap ? 2 * h->cap : 64;
    ho_name *v = realloc(h->names, (size_t)cap * sizeof *v);
    if (!v) {
      h->oom = true;
      return;
    }
    h->names = v;
    h->cap = cap;
  }
  ho_name *nm = &h->names[h->n++];
  snprintf(nm->tenant, sizeof nm->tenant, "%s", info->tenant);
  snprintf(nm->id, sizeof nm->id, "%s", info->id);
}

/* The key of tenant (a key's name); NULL when the server has none by that
 * name (it was taken out of the key file since the session was made). */
static const char *key_of(const attnd_config *c, const char *tenant) {
  for (int i = 0; i < c->keys.n; i++)
    if (!strcmp(c->keys.k[i].name, tenant))
      return c->keys.k[i].key;
  return NULL;
}

/* " (key NAME)" under API keys, so that a line names the session whole. */
static const char *whose(const attnd_config *c, const ho_name *nm, char *buf, size_t cap) {
  if (!c->keys.n)
    return "";
  snprintf(buf, cap, " (key %s)", nm->tenant);
  return buf;
}

static void kept(ho_run *h, const ho_name *nm, size_t bytes, const char *why) {
  char w[96];
  h->kept++;
  h->bytes_kept += bytes;
  attnd_log_note(h->s, ATTND_WARN, NULL, NULL, "handover: session %s%s kept, %zu bytes: %s", nm->id,
                 whose(h->s->cfg, nm, w, sizeof w), bytes, why);
}

/* The inheritor's answer to one session's PUT: 201 and 409 drop it here. */
static void answered(ho_run *h, const ho_name *nm, size_t bytes, const attnd_put_reply *r) {
  char w[96], code[64], msg[ATTN_PROTO_MAX_MESSAGE + 1], why[ATTN_PROTO_MAX_MESSAGE + 160];
  const char *whom = whose(h->s->cfg, nm, w, sizeof w);
  if (r->status == 201 || r->status == 409) {
    attn_status st;
    attn_kv_delete(h->s->kv, nm->tenant, nm->id, attn_now(), &st);
    if (r->status == 201) {
      h->moved++;
      h->bytes_moved += bytes;
    } else {
      h->held++;
    }
    attnd_log_note(h->s, ATTND_INFO, NULL, NULL, "handover: session %s%s %s, %zu bytes", nm->id,
                   whom,
                   r->status == 201 ? "moved"
                                    : "dropped: the inheritor holds it already (409), a copy "
                                      "its client rebuilt there, which is newer",
                   bytes);
    return;
  }
  if (attn_proto_error_read(r->body, r->len, code, sizeof code, msg, sizeof msg))
    snprintf(why, sizeof why, "the inheritor answered %d %s: %s", r->status, code, msg);
  else
    snprintf(why, sizeof why, "the inheritor answered %d (not an attnd error body)", r->status);
  kept(h, nm, bytes, why);
}

/* One session: exported, PUT to the inheritor, then dropped or kept. */
static void hand_one(ho_run *h, const ho_name *nm) {
  const attnd_config *c = h->s->cfg;
  const char *key = c->keys.n ? key_of(c, nm->tenant) : NULL;
  void *buf = NULL;
  size_t len = 0;
  attn_status st;
  char why[320], path[sizeof "/v1/sessions//import" + ATTN_KV_ID_MAX];
  bool late = attn_now() >= h->deadline;
  if (late || (c->keys.n && !key)) {
    kept(h, nm, 0,
         late ? "the handover's time (--handover-timeout) is up"
              : "this server has no API key of that name to import it with");
    return;
  }
  if (attnd_sessions_export_file(h->s->kv, nm->tenant, nm->id, &buf, &len, &st)) {
    if (st.code != ATTN_ESESSION_NOT_FOUND) /* expired since it was listed: nothing to keep */
      kept(h, nm, 0, st.message);
    return;
  }
  snprintf(path, sizeof path, "/v1/sessions/%s/import", nm->id);
  attnd_put p = {.base = &c->handover_url,
                 .path = path,
                 .key = key,
                 .body = buf,
                 .len = len,
                 .idle_s = HANDOVER_IDLE_S,
                 .deadline = h->deadline};
  attnd_put_reply r;
  if (attnd_http_put(&p, &r, why, sizeof why) < 0)
    kept(h, nm, len, why);
  else
    answered(h, nm, len, &r);
  free(buf);
}

static void *run(void *arg) {
  ho_run *h = arg;
  for (int64_t i = 0; i < h->n; i++)
    hand_one(h, &h->names[i]);
  return NULL;
}

void attnd_handover_run(attnd_server *s) {
  const attnd_config *c = s->cfg;
  if (!*c->handover || !s->kv)
    return;
  ho_run h = {.s = s, .start = attn_now()};
  h.deadline = h.start + c->handover_timeout;
  attn_kv_list(s->kv, NULL, h.start, add_name, &h);
  pthread_t t;
  if (h.oom || pthread_create(&t, NULL, run, &h) != 0) {
    attnd_log_note(s, ATTND_ERROR, NULL, NULL,
                   "handover: out of memory or threads; no session handed over");
  } else {
    pthread_join(t, NULL);
    attnd_log_note(s, ATTND_INFO, NULL, NULL,
                   "handover to %s: %lld moved (%llu bytes), %lld already there, %lld kept "
                   "(%llu bytes), %.3f s",
                   c->handover, (long long)h.moved, (unsigned long long)h.bytes_moved,
                   (long long)h.held, (long long)h.kept, (unsigned long long)h.bytes_kept,
                   attn_now() - h.start);
  }
  free(h.names);
}
