/*
 * sessions.h — the session routes (sessions.c): a KV cache held by the
 * engine's session store, named by the caller's id within its API key's
 * namespace. The store knows pages and tokens; this file knows paths,
 * bodies and replies.
 *
 *   GET /v1/sessions                     the caller's sessions
 *   PUT, GET, DELETE /v1/sessions/{id}   create, describe, delete
 *   POST /v1/sessions/{id}/truncate      cut every layer to a length
 *   POST /v1/sessions/{id}/attention     append, then attend (computes)
 *   POST /v1/sessions/_batch             one layer of many sessions (computes)
 *
 * The first three answer on the HTTP thread (a lock and a small JSON
 * document); the two that compute go through the loop as /attention does,
 * their body decoded by the forward codecs with a session's fields.
 */
#ifndef ATTND_SESSIONS_H
#define ATTND_SESSIONS_H

#include "request.h"

/* HTTP thread: the routes that answer there. */
void attnd_sessions_list(attnd_req *r);
void attnd_sessions_resource(attnd_req *r);
void attnd_sessions_truncate(attnd_req *r);

/* Threadpool: before decoding a session call's body, its fields' home
 * (r->sess) pointed to by the query options; 0 or an error. */
int attnd_sessions_prepare(attnd_req *r, attn_options *query, attn_status *st);
/* Threadpool: the decoded call to the store, done called when computed. */
int attnd_sessions_submit(attnd_req *r, attn_done_fn done, attn_status *st);
/* Threadpool, before encoding: the layer's length (or the batch's) into
 * the reply. */
void attnd_sessions_reply_fields(attnd_req *r);
/* The header X-Session-Length's value for r's reply, or NULL. */
const char *attnd_sessions_length_header(const attnd_req *r);
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
/* The loop canceled r (its flag is set): a session call waiting in the
 * store ends now, a job of several calls once all its callers cancel. */
void attnd_sessions_cancel(attnd_req *r);
/* Frees what a session call held (any thread, when r is freed). */
void attnd_sessions_free(attnd_req *r);

#endif
