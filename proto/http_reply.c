/*
 * http_reply.c — see http_reply.h. A state machine over bytes: the head is
 * gathered (up to ATTN_HTTP_MAX_HEAD) until its blank line and parsed
 * whole; bodies are counted through. Nothing is allocated after init.
 */
#include "http_reply.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

enum { P_IDLE, P_HEAD, P_CL, P_CHUNK_SIZE, P_CHUNK_DATA, P_CHUNK_CRLF, P_TRAILER, P_EOF };

int attn_http_reply_init(attn_http_reply *p) {
  memset(p, 0, sizeof *p);
  p->head = malloc(ATTN_HTTP_MAX_HEAD);
  return p->head ? 0 : -1;
}

void attn_http_reply_free(attn_http_reply *p) {
  free(p->head);
  p->head = NULL;
}

void attn_http_reply_start(attn_http_reply *p) {
  p->state = P_HEAD;
  p->head_len = 0;
  p->close_after = false;
  p->kept = 0;
}

void attn_http_reply_reset(attn_http_reply *p) { p->state = P_IDLE; }
bool attn_http_reply_idle(const attn_http_reply *p) { return p->state == P_IDLE; }
bool attn_http_reply_until_close(const attn_http_reply *p) { return p->state == P_EOF; }

/* ---- the head ------------------------------------------------------------- */

static bool header_is(const char *name, size_t nlen, const char *want) {
  return nlen == strlen(want) && strncasecmp(name, want, nlen) == 0;
}

static bool value_has(const char *v, size_t vlen, const char *tok) {
  size_t tl = strlen(tok);
  for (size_t i = 0; i + tl <= vlen; i++)
    if (strncasecmp(v + i, tok, tl) == 0)
      return true;
  return false;
}

/* What the headers say about the body and the connection. */
typedef struct head_info {
  bool chunked, have_cl, keep_alive, close;
  uint64_t cl;
} head_info;

/* Content-Length digits (up to a space or tab); -1 when not a number. */
static int content_length(const char *v, size_t vlen, head_info *hi) {
  hi->cl = 0;
  hi->have_cl = vlen > 0;
  for (size_t i = 0; i < vlen; i++) {
    if (v[i] == ' ' || v[i] == '\t')
      break;
    if (v[i] < '0' || v[i] > '9' || hi->cl > UINT64_MAX / 10 - 10)
      return -1;
    hi->cl = hi->cl * 10 + (uint64_t)(v[i] - '0');
  }
  return 0;
}

/* One header line p[0..le) (without CR LF); lines without a colon are
 * ignored. */
static int header_line(const char *p, const char *le, head_info *hi) {
  const char *colon = memchr(p, ':', (size_t)(le - p));
  if (!colon)
    return 0;
  size_t nlen = (size_t)(colon - p);
  const char *v = colon + 1;
  while (v < le && (*v == ' ' || *v == '\t'))
    v++;
  size_t vlen = (size_t)(le - v);
  if (header_is(p, nlen, "content-length"))
    return content_length(v, vlen, hi);
  if (header_is(p, nlen, "transfer-encoding")) {
    hi->chunked = value_has(v, vlen, "chunked");
  } else if (header_is(p, nlen, "connection")) {
    hi->close |= value_has(v, vlen, "close");
    hi->keep_alive |= value_has(v, vlen, "keep-alive");
  }
  return 0;
}

/* "HTTP/1.x NNN ..." of h[0..eol): the status, and whether it is 1.0. */
static int status_line(const char *h, const char *eol, int *status, bool *http10) {
  if (eol - h < 12 || strncmp(h, "HTTP/1.", 7) != 0 || h[8] != ' ')
    return -1;
  *http10 = h[7] == '0';
  int st = 0;
  for (int i = 9; i < 12; i++) {
    if (h[i] < '0' || h[i] > '9')
      return -1;
    st = st * 10 + (h[i] - '0');
  }
  *status = st;
  return 0;
}

/* Parses head[0..len) (status line and headers, without the blank line)
 * and picks the body mode; ATTN_HTTP_DONE when the reply has no body. */
static int parse_head(attn_http_reply *p, size_t len) {
  const char *h = p->head, *end = h + len;
  const char *eol = memchr(h, '\n', len);
  if (!eol)
    eol = end;
  bool http10;
  if (status_line(h, eol, &p->status, &http10) < 0)
    return ATTN_HTTP_ERROR;
  head_info hi = {0};
  for (const char *s = eol < end ? eol + 1 : end; s < end;) {
    const char *e = memchr(s, '\n', (size_t)(end - s));
    if (!e)
      e = end;
    const char *le = e > s && e[-1] == '\r' ? e - 1 : e;
    if (header_line(s, le, &hi) < 0)
      return ATTN_HTTP_ERROR;
    s = e < end ? e + 1 : end;
  }
  p->close_after = hi.close || (http10 && !hi.keep_alive);
  int st = p->status;
  if (st >= 100 && st < 200) {
    p->state = P_HEAD; /* an interim reply: the real one follows */
    return ATTN_HTTP_MORE;
  }
  if (st == 204 || st == 304)
    return ATTN_HTTP_DONE;
  if (hi.chunked) {
    p->state = P_CHUNK_SIZE;
    p->line_len = 0;
  } else if (hi.have_cl) {
    p->remaining = hi.cl;
    p->state = P_CL;
    if (hi.cl == 0)
      return ATTN_HTTP_DONE;
  } else {
    p->state = P_EOF;
    p->close_after = true;
  }
  return ATTN_HTTP_MORE;
}

/* Gathers head bytes until the blank line; *used counts those of d. */
static int feed_head(attn_http_reply *p, const char *d, size_t n, size_t *used) {
  size_t old = p->head_len, take = n;
  if (old + take > ATTN_HTTP_MAX_HEAD)
    take = ATTN_HTTP_MAX_HEAD - old;
  memcpy(p->head + old, d, take);
  p->head_len += take;
  size_t from = old >= 3 ? old - 3 : 0; /* "\r\n\r\n" may straddle two reads */
  for (size_t i = from; i + 4 <= p->head_len; i++)
    if (memcmp(p->head + i, "\r\n\r\n", 4) == 0) {
      *used = i + 4 - old;
      p->head_len = 0;
      return parse_head(p, i + 2);
    }
  *used = take;
  return p->head_len >= ATTN_HTTP_MAX_HEAD ? ATTN_HTTP_ERROR : ATTN_HTTP_MORE;
}

/* ---- the body ------------------------------------------------------------- */

/* Appends d[0..n) to the line buffer up to a LF; *used bytes taken; true
 * when the line (without CR LF, NUL-terminated) is complete. Long trailer
 * lines are skipped; a long chunk-size line is an error. */
static int line_bytes(attn_http_reply *p, const char *d, size_t n, size_t *used, bool *done) {
  *done = false;
  size_t i = 0;
  while (i < n && !*done) {
    char ch = d[i++];
    if (ch == '\n') {
      if (p->line_len && p->line[p->line_len - 1] == '\r')
        p->line_len--;
      p->line[p->line_len] = 0;
      *done = true;
    } else if (p->line_len + 1 < sizeof p->line) {
      p->line[p->line_len++] = ch;
    } else if (p->state != P_TRAILER) {
      return ATTN_HTTP_ERROR;
    }
  }
  *used = i;
  return 0;
}

/* A chunk-size or trailer line; DONE after the blank line ending a
 * chunked body. */
static int feed_line(attn_http_reply *p, const char *d, size_t n, size_t *used) {
  bool done;
  if (line_bytes(p, d, n, used, &done) < 0)
    return ATTN_HTTP_ERROR;
  if (!done)
    return ATTN_HTTP_MORE;
  if (p->state == P_TRAILER) {
    bool end = p->line_len == 0;
    p->line_len = 0;
    return end ? ATTN_HTTP_DONE : ATTN_HTTP_MORE;
  }
  char *q;
  errno = 0;
  unsigned long long sz = strtoull(p->line, &q, 16);
  if (q == p->line || errno || (*q && *q != ';' && *q != ' '))
    return ATTN_HTTP_ERROR;
  p->line_len = 0;
  p->remaining = sz;
  p->state = sz ? P_CHUNK_DATA : P_TRAILER;
  return ATTN_HTTP_MORE;
}

/* What fits of body bytes d[0..n) into the caller's keep buffer. */
static void keep_body(attn_http_reply *p, const char *d, size_t n) {
  size_t room = p->keep_cap - p->kept;
  if (n > room)
    n = room;
  if (n)
    memcpy(p->keep + p->kept, d, n);
  p->kept += n;
}

/* Counts through a Content-Length body or a chunk's data. */
static int feed_counted(attn_http_reply *p, const char *d, size_t n, size_t *used) {
  size_t take = n < p->remaining ? n : (size_t)p->remaining;
  keep_body(p, d, take);
  p->remaining -= take;
  *used = take;
  if (p->remaining > 0)
    return ATTN_HTTP_MORE;
  if (p->state == P_CL)
    return ATTN_HTTP_DONE;
  p->state = P_CHUNK_CRLF;
  p->line_len = 0;
  return ATTN_HTTP_MORE;
}

/* The CR LF after a chunk's data. */
static int feed_crlf(attn_http_reply *p, const char *d, size_t n, size_t *used) {
  size_t i = 0;
  while (i < n && p->state == P_CHUNK_CRLF) {
    if (d[i] == '\n')
      p->state = P_CHUNK_SIZE;
    else if (d[i] != '\r')
      return ATTN_HTTP_ERROR;
    i++;
  }
  *used = i;
  return ATTN_HTTP_MORE;
}

static int feed_step(attn_http_reply *p, const char *d, size_t n, size_t *used) {
  switch (p->state) {
  case P_HEAD: return feed_head(p, d, n, used);
  case P_CL:
  case P_CHUNK_DATA: return feed_counted(p, d, n, used);
  case P_CHUNK_SIZE:
  case P_TRAILER: return feed_line(p, d, n, used);
  case P_CHUNK_CRLF: return feed_crlf(p, d, n, used);
  case P_EOF: /* the body runs to the close */
    keep_body(p, d, n);
    *used = n;
    return ATTN_HTTP_MORE;
  default: return ATTN_HTTP_ERROR; /* idle: bytes nobody asked for */
  }
}

int attn_http_reply_feed(attn_http_reply *p, const char *data, size_t n, size_t *used) {
  size_t off = 0;
  while (off < n) {
    size_t u = 0;
    int rc = feed_step(p, data + off, n - off, &u);
    off += u;
    if (rc == ATTN_HTTP_ERROR)
      return rc;
    if (rc == ATTN_HTTP_DONE) {
      p->state = P_IDLE;
      *used = off;
      return rc;
    }
  }
  *used = off;
  return ATTN_HTTP_MORE;
}
