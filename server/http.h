/*
 * http.h — what only libmicrohttpd's side of attnd shares (http.c and
 * mhd_shim.c); the rest of server/ knows no HTTP library.
 */
#ifndef ATTND_HTTP_H
#define ATTND_HTTP_H

#include "server.h"

#include <microhttpd.h>

/* libmicrohttpd's own refusal of a malformed request (an error page it built,
 * without Content-Type): answered here with the JSON error instead, and the
 * connection closed. */
enum MHD_Result attnd_http_refuse(struct MHD_Connection *conn, unsigned status);

#endif
