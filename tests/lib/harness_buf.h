/*
 * harness_buf.h — the harness's own growable byte buffer and a printable
 * snippet of a reply for failure messages (internal to tests/lib/harness_*.c;
 * tests do not include it).
 */
#ifndef ATTND_TEST_HARNESS_BUF_H
#define ATTND_TEST_HARNESS_BUF_H

#include <stddef.h>

typedef struct buf {
  char *p;
  size_t n, cap;
} buf;

/* Appends n bytes and keeps b->p NUL-terminated (grows by doubling). */
void buf_add(buf *b, const void *d, size_t n);
/* The first bytes of s[0, len) into b (non-printable bytes as '.', "..."
 * when cut); returns b. */
const char *snip(const char *s, size_t len, char *b, size_t cap);

#endif
