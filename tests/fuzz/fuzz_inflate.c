/*
 * fuzz_inflate.c — libFuzzer target for the bounded gzip/deflate decoder
 * (server/inflate.c). The first byte picks the coding and the limit, the
 * second how much the memory budget grants; the rest is the body. Whatever
 * the input: no crash, a success decodes to at most the limit, a failure
 * returns nothing and says why, and the budget is never asked for more than
 * the limit plus one byte.
 */
#include "errors.h"
#include "inflate.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct budget {
  size_t left, asked;
} budget;

static bool take(void *ctx, size_t more) {
  budget *b = ctx;
  b->asked += more;
  if (more > b->left)
    return false;
  b->left -= more;
  return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 2)
    return 0;
  attnd_encoding enc = data[0] & 1 ? ATTND_ENC_GZIP : ATTND_ENC_DEFLATE;
  size_t max = (size_t)1 << ((data[0] >> 1) % 21); /* 1 B to 1 MiB */
  budget b = {data[1] == 0xff ? SIZE_MAX : (size_t)data[1] << 12, 0};
  char *out = NULL, msg[256];
  size_t n = 0;
  int e = attnd_inflate(enc, (const char *)data + 2, size - 2, max, take, &b, &out, &n, msg,
                        sizeof msg);
  if (e == 0 && (n > max || (!out && n)))
    abort();
  if (e && (out || n || !msg[0]))
    abort();
  if (e && e != ATTND_ETOO_LARGE && e != ATTND_EBAD_REQUEST && e != ATTND_EQUEUE_FULL &&
      e != ATTND_EOUT_OF_MEMORY)
    abort();
  if (b.asked > max + 1)
    abort();
  free(out);
  return 0;
}
