/*
 * log.h — attnd's log lines on stderr: one per request, and notes (the
 * HTTP library's diagnostics, canceled jobs, the startup line).
 *
 * --log-format text writes "attnd: ..." lines for people; json writes one
 * object per line for collectors, each with "ts" (RFC 3339, UTC,
 * microseconds), "level" and, for a request, "request_id". On a server with
 * API keys a request's line also names the key it authenticated with
 * (attnd_req.tenant: text "key=NAME", JSON "key"), never the key itself.
 * Every string a client chose (method, path, id) is escaped first, so no
 * request can end a line early, forge the next one or send terminal
 * escapes. Lines are written whole under s->log_mu.
 */
#ifndef ATTND_LOG_H
#define ATTND_LOG_H

#include <stddef.h>

struct attnd_server;
struct attnd_req;

/* "info", "warn" or "error". */
typedef const char *attnd_level;
#define ATTND_INFO "info"
#define ATTND_WARN "warn"
#define ATTND_ERROR "error"

/* The time now as RFC 3339 with microseconds: 2025-01-31T12:00:00.123456Z. */
void attnd_log_time(char *out, size_t cap);
/* v with decimals digits after the point (at most 6), the text "%.*f"
 * writes, without printf except where v times 10^decimals lands on a tie
 * (or is NaN, infinite or huge): the durations of log lines and headers, one
 * per request. Writes at most cap - 1 bytes and a NUL; returns what it
 * wrote. */
size_t attnd_fmt_fixed(char *out, size_t cap, double v, int decimals);

/* A note: text "attnd: <source>: <message>", or {"ts", "level", "source",
 * "request_id" (when id is not NULL), "message"}. Bytes a client chose must
 * be escaped in the message by the caller (attn_quote). */
__attribute__((format(printf, 5, 6))) void attnd_log_note(struct attnd_server *s, attnd_level level,
                                                          const char *source, const char *id,
                                                          const char *fmt, ...);

/* The line of a request that has ended, total seconds after it arrived. */
void attnd_log_request(struct attnd_server *s, const struct attnd_req *r, double total);

/* A request that has ended: its metrics and its line. */
void attnd_log_ended(struct attnd_server *s, const struct attnd_req *r);

#endif
