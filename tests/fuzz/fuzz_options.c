/*
 * fuzz_options.c — libFuzzer target for the option parser: the input is a
 * URL query string; then each '\n'-separated "name=value" line of it is fed
 * to attn_options_set() directly, as __metadata__ and JSON fields are.
 */
#include "proto.h"
#include "../lib/strict_json.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Whatever the input, the error body the server would send is strict JSON. */
static void check_error_body(const attn_status *st) {
  size_t len = 0;
  char *b = attn_proto_error_body(attn_proto_code_name(st->code), st->message, &len);
  if (b && !strict_error_body(b, len, NULL, 0))
    abort();
  free(b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *s = malloc(size + 1);
  if (!s)
    return 0;
  memcpy(s, data, size);
  s[size] = 0;
  attn_options o, p;
  attn_status st;
  attn_options_init(&o);
  if (attn_options_parse_query(&o, s, &st) < 0)
    check_error_body(&st);
  attn_options_init(&p);
  const char *line = (const char *)data, *end = line + size;
  while (line < end) {
    const char *nl = memchr(line, '\n', (size_t)(end - line));
    size_t len = nl ? (size_t)(nl - line) : (size_t)(end - line);
    const char *eq = memchr(line, '=', len);
    if (eq)
      if (attn_options_set(&p, line, (size_t)(eq - line), eq + 1, len - (size_t)(eq - line) - 1,
                           "fuzz", &st) < 0)
        check_error_body(&st);
    line += len + 1;
  }
  attn_options_merge(&o, &p);
  free(s);
  return 0;
}
