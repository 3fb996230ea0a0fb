/*
 * handover.h — a stopping replica's sessions handed to the replica that
 * inherits them (--handover URL), so that a graceful stop loses none.
 *
 * main() calls it once the drain is over: the drain delay has passed (the
 * proxy routes no more calls here, and routes each session id to the
 * replica that now owns its share of the hash ring) and the calls this
 * replica accepted have ended. Each live session, of every API key, is
 * exported (the bytes of GET /v1/sessions/{id}/export) and PUT to
 * URL/v1/sessions/{id}/import with its key (the key whose name is its
 * tenant); then:
 *
 *   201  imported there: dropped here ("moved");
 *   409  the inheritor holds that id already (a client rebuilt it there
 *        from its history meanwhile, which is newer): dropped here;
 *   else kept (any other status, no reply, no key, the timeout), with the
 *        status and the inheritor's message logged; --session-dir, if set,
 *        then saves what is kept, as it would have without a handover.
 *
 * One log line per session and a summary. The whole handover ends by
 * --handover-timeout, each request's socket waits included.
 */
#ifndef ATTND_HANDOVER_H
#define ATTND_HANDOVER_H

#include "server.h"

/* Hands s's sessions over when --handover is set and sessions are on;
 * returns when it is done or its time is up. On a thread of its own (its
 * sockets block); no call may reach the store meanwhile. */
void attnd_handover_run(attnd_server *s);

#endif
