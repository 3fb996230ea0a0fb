/*
 * mhd_shim.h — libmicrohttpd's own refusals and notes, answered and logged
 * the way attnd's are (mhd_shim.c). HTTP thread.
 */
#ifndef ATTND_MHD_SHIM_H
#define ATTND_MHD_SHIM_H

#include "request.h"

#include <microhttpd.h>
#include <stdarg.h>

/* The status a request that got no reply of its own is logged with: what
 * the registry answered when it cut the upload (0 there: a client that was
 * gone), 408 for libmicrohttpd's idle timeout, else 499. */
void attnd_mhd_unanswered(attnd_server *s, attnd_req *r, enum MHD_RequestTerminationCode why);

/*
 * libmicrohttpd 0.9.75 closes a connection whose request line has no space
 * without calling or telling attnd, and after shutting its sending side,
 * so no reply can be written; it is logged as the 400 it is. Seen here as
 * a connection k closed before its first request started, after its
 * client sent bytes, and before any deadline.
 */
void attnd_mhd_unparsed(attnd_server *s, attnd_conn *k);

/* libmicrohttpd's diagnostics (MHD_OPTION_EXTERNAL_LOGGER; cls the
 * server), one escaped line each. */
__attribute__((format(printf, 2, 0))) void attnd_mhd_log(void *cls, const char *fmt, va_list ap);

#endif
