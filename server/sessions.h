/*
 * sessions.h — the session routes (sessions.c): a KV cache held by the
 * engine's session store, named by the caller's id within its API key's
 * namespace. The store knows pages and tokens; this file knows paths,
 * bodies and replies.
 *
 *   GET /v1/sessions                     the caller's sessions
 *   PUT, GET, DELETE /v1/sessions/{id}   create, describe, delete
 *   POST /v1/sessions/{id}/truncate      cut every layer to a length
 *   POST /v1/sessions/{id}/fork          a new session sharing its tokens' pages
 *   GET /v1/sessions/{id}/export         the session as one safetensors file
 *   PUT /v1/sessions/{id}/import         a session made from such a file
 *   POST /v1/sessions/{id}/attention     append, then attend (computes)
 *   POST /v1/sessions/_batch             one layer of many sessions (computes)
 *
 * The first six answer on the HTTP thread (a lock and a small JSON
 * document; an export or import copies the session's rows under the
 * store's lock, as a save does); the two that compute are kinds (kind_session.c) and go
 * through the loop as /attention does.
 */
#ifndef ATTND_SESSIONS_H
#define ATTND_SESSIONS_H

#include "request.h"

/* HTTP thread: the routes that answer there. */
void attnd_sessions_list(attnd_req *r);
void attnd_sessions_resource(attnd_req *r);
void attnd_sessions_truncate(attnd_req *r);
void attnd_sessions_fork(attnd_req *r);
void attnd_sessions_export(attnd_req *r);
void attnd_sessions_import(attnd_req *r);

/* The 404 of every session route on a server without sessions. */
#define ATTND_SESSIONS_OFF \
  "sessions are off on this server (--session-memory 0); send whole requests to POST /attention"
/* The session id in a path under /v1/sessions/ (up to its next '/'),
 * checked, into id; 0 or the check's error. */
int attnd_sessions_id(const char *path, char id[ATTN_KV_ID_MAX + 1], attn_status *st);
/* Session (tenant, id) of kv as the safetensors file GET .../export
 * answers with (proto.h's session file; malloc'd into *pbuf, *plen bytes):
 * the route's bytes and the handover's (handover.h) are one encoding. 0, or
 * the store's or the codec's error. Any thread. */
int attnd_sessions_export_file(attn_kv_store *kv, const char *tenant, const char *id, void **pbuf,
                               size_t *plen, attn_status *st);
/* Start-up: the store (none with --session-memory 0), with the sessions
 * of --session-dir loaded; -1 with a message on stderr. */
int attnd_sessions_open(attnd_server *s);
/* Shutdown, once no call runs (or, save_only, when the process leaves
 * with some still running): the sessions written to --session-dir, then
 * the store closed. */
void attnd_sessions_close(attnd_server *s, bool save_only);
/* The "sessions" member of /v1/info, and the sessions' series of /metrics. */
void attnd_sessions_info(attn_sbuf *b, const attnd_server *s);
void attnd_sessions_metrics(attn_sbuf *b, const attnd_server *s);

#endif
