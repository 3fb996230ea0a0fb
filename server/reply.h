/*
 * reply.h — an answer's way out to libmicrohttpd (reply.c). HTTP thread.
 */
#ifndef ATTND_REPLY_H
#define ATTND_REPLY_H

#include "request.h"

#include <microhttpd.h>

/* Hands r's reply (attnd_req_reply, attnd_req_fail) to libmicrohttpd with
 * its headers; an unset reply is the 500 of a server out of memory. */
enum MHD_Result attnd_reply_queue(attnd_req *r);

#endif
