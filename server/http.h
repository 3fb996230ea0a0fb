/*
 * http.h — a request's way through the HTTP front (http.c): libmicrohttpd's
 * callbacks, which listen.c registers (cls is the server). HTTP thread.
 */
#ifndef ATTND_HTTP_H
#define ATTND_HTTP_H

#include "request.h"

#include <microhttpd.h>

/* Once its request line is in, before libmicrohttpd parses the query
 * (MHD_OPTION_URI_LOG_CALLBACK): the request starts here. */
void *attnd_http_on_target(void *cls, const char *uri, struct MHD_Connection *conn);

/* libmicrohttpd's unescaper, replaced (MHD_OPTION_UNESCAPE_CALLBACK). */
size_t attnd_http_on_unescape(void *cls, struct MHD_Connection *conn, char *s);

/* Each step of a request: its head, each piece of body, its end. */
enum MHD_Result attnd_http_on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                      const char *method, const char *version, const char *upload,
                                      size_t *upload_size, void **con_cls);

/* The request has ended, answered or not (MHD_OPTION_NOTIFY_COMPLETED). */
void attnd_http_on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                             enum MHD_RequestTerminationCode why);

#endif
