/*
 * fuzz_parse.c — libFuzzer target for the request head's rules
 * (server/parse.c). The input is lines: "name: value" headers fed in
 * order, then the verdict; each line is also a Host and an Origin to
 * judge, is unescaped as a path and as a query part, and is read as a
 * request target, a media type, an Accept list and a framing number.
 * Whatever the input: no crash, a verdict is 0 or an error with a message,
 * the unescaper never lengthens a string nor leaves a NUL byte in it, an
 * origin path lies inside its target, and a byte count one reader takes
 * the other reads the same.
 */
#include "errors.h"
#include "parse.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void unescape_checked(const char *line, bool path) {
  size_t n = strlen(line);
  char *s = malloc(n + 1);
  memcpy(s, line, n + 1);
  bool nul = false;
  size_t m = attnd_parse_unescape(s, path, &nul);
  if (m > n || strlen(s) != m)
    abort();
  free(s);
}

/* The readings of a line that keep no state. */
static void read_checked(const char *line) {
  int code = 0;
  if (attnd_parse_target(line, &code) && code != ATTND_EURI_TOO_LONG && code != ATTND_EBAD_REQUEST)
    abort();
  const char *path = attnd_parse_origin_path(line);
  size_t n = strlen(line);
  if (strcmp(path, "/") && (path < line || path > line + n))
    abort();
  attnd_parse_media_is(line, "application/json");
  attnd_parse_accepts_binary(line);
  size_t len = 0;
  if (attnd_parse_json_length(line, &len) && attnd_parse_content_length(line) != len)
    abort();
}

static void judge_line(attnd_head *h, char *line) {
  read_checked(line);
  attnd_parse_host_allowed(line, "attnd,.svc.example");
  attnd_parse_origin_allowed(line, "127.0.0.1:8080", "https://app.example");
  unescape_checked(line, true);
  unescape_checked(line, false);
  char *colon = strchr(line, ':');
  if (!colon)
    return;
  *colon = 0;
  attnd_head_add(h, line, colon + 1);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *text = malloc(size + 1);
  memcpy(text, data, size);
  text[size] = 0;
  attnd_head h = {0};
  /* the header strings must outlive the head, which keeps pointers */
  for (char *line = text, *next; line; line = next) {
    next = strchr(line, '\n');
    if (next)
      *next++ = 0;
    judge_line(&h, line);
  }
  char msg[300];
  int code = attnd_head_check(&h, size & 1 ? "HTTP/1.1" : "HTTP/1.0", msg, sizeof msg);
  if (code && (code != ATTND_EBAD_REQUEST && code != ATTND_ENOT_IMPLEMENTED))
    abort();
  if (code && !msg[0])
    abort();
  attnd_head_has_body(&h);
  free(text);
  return 0;
}
