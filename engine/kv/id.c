/*
 * id.c — a session id against the contract (kv.h, attn_kv_id_check):
 * apart from the store, so that the codecs that read ids (proto/session.c)
 * need nothing else of it.
 */
#include "kv.h"

int attn_kv_id_check(const char *id, size_t len, attn_status *st) {
  if (len == 0 || len > ATTN_KV_ID_MAX)
    return attn_status_set(st, ATTN_EINVAL, "a session id has 1 to %d characters, not %zu",
                           ATTN_KV_ID_MAX, len);
  if (id[0] == '_' || id[0] == '.')
    return attn_status_set(st, ATTN_EINVAL,
                           "a session id may not start with '%c' (ids starting with '_' or '.' "
                           "are the server's)",
                           id[0]);
  for (size_t i = 0; i < len; i++) {
    unsigned char c = (unsigned char)id[i];
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-';
    if (!ok)
      return attn_status_set(st, ATTN_EINVAL,
                             "a session id holds only A-Z, a-z, 0-9, '.', '_' and '-'; "
                             "character %zu is not one of them",
                             i + 1);
  }
  return 0;
}
