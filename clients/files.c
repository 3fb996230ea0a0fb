/* files.c — see files.h. */
#include "files.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int tool_read_file(const char *path, void **pbuf, size_t *plen) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return -1;
  size_t cap = 1 << 20, len = 0;
  char *buf = malloc(cap);
  while (buf) {
    len += fread(buf + len, 1, cap - len, f);
    if (len < cap)
      break;
    char *nb = realloc(buf, cap *= 2);
    if (!nb)
      free(buf);
    buf = nb;
  }
  int err = ferror(f);
  fclose(f);
  if (!buf || err) {
    free(buf);
    errno = err ? EIO : ENOMEM;
    return -1;
  }
  *pbuf = buf;
  *plen = len;
  return 0;
}

int tool_write_file(const char *path, const void *buf, size_t len) {
  size_t n = strlen(path) + 32;
  char *tmp = malloc(n);
  if (!tmp)
    return -1;
  snprintf(tmp, n, "%s.tmp%ld", path, (long)getpid());
  FILE *f = fopen(tmp, "wb");
  int ok = f && fwrite(buf, 1, len, f) == len;
  if (f && fclose(f) != 0)
    ok = 0;
  if (ok && rename(tmp, path) != 0)
    ok = 0;
  if (!ok) {
    int e = errno;
    unlink(tmp);
    errno = e;
  }
  free(tmp);
  return ok ? 0 : -1;
}
