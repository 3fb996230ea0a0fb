/*
 * listen.h — the HTTP front's daemon on libmicrohttpd (listen.c), and the
 * transport the rest of the server reaches its connections through.
 */
#ifndef ATTND_LISTEN_H
#define ATTND_LISTEN_H

#include "server.h"

extern const attnd_transport attnd_http_transport;
/* Binds --listen and starts the daemon: 0, or -1 after one line. */
int attnd_http_start(attnd_server *s);
/* Closes every connection and the daemon (after the loop stopped). */
void attnd_http_stop(attnd_server *s);

#endif
