/*
 * tls.c — loading and checking the HTTPS certificate and key (tls.h).
 */
#define _GNU_SOURCE
#include "tls.h"

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <gnutls/gnutls.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* PEM files larger than this are not certificates or keys. */
#define MAX_PEM ((long)1 << 20)

static char *read_pem(const char *flag, const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "attnd: %s: cannot read \"%s\": %s\n", flag, path, strerror(errno));
    return NULL;
  }
  char *buf = malloc((size_t)MAX_PEM + 1);
  size_t n = buf ? fread(buf, 1, (size_t)MAX_PEM + 1, f) : 0;
  bool err = ferror(f);
  fclose(f);
  const char *why = !buf                                 ? "out of memory"
                    : err                                ? "read error"
                    : n > (size_t)MAX_PEM                ? "larger than 1 MiB"
                    : !memmem(buf, n, "-----BEGIN ", 11) ? "not a PEM file (no -----BEGIN line)"
                                                         : NULL;
  if (why) {
    fprintf(stderr, "attnd: %s: \"%s\": %s\n", flag, path, why);
    free(buf);
    return NULL;
  }
  buf[n] = 0;
  return buf;
}

/* Whether GnuTLS takes the pair; the reason in its words when not. */
static int check_pair(const char *cert_path, const char *key_path, const char *cert,
                      const char *key) {
  gnutls_certificate_credentials_t cred;
  if (gnutls_certificate_allocate_credentials(&cred) < 0) {
    fprintf(stderr, "attnd: out of memory checking the TLS certificate\n");
    return -1;
  }
  gnutls_datum_t c = {(unsigned char *)(uintptr_t)cert, (unsigned)strlen(cert)};
  gnutls_datum_t k = {(unsigned char *)(uintptr_t)key, (unsigned)strlen(key)};
  int rc = gnutls_certificate_set_x509_key_mem(cred, &c, &k, GNUTLS_X509_FMT_PEM);
  gnutls_certificate_free_credentials(cred);
  if (rc < 0) {
    fprintf(stderr,
            "attnd: --tls-cert \"%s\" with --tls-key \"%s\": %s (a PEM certificate and the "
            "unencrypted PEM private key that matches it are needed)\n",
            cert_path, key_path, gnutls_strerror(rc));
    return -1;
  }
  return 0;
}

int attnd_tls_check_priorities(const char *prio) {
  gnutls_priority_t p;
  const char *at = NULL;
  int rc = gnutls_priority_init(&p, prio, &at);
  if (rc >= 0) {
    gnutls_priority_deinit(p);
    return 0;
  }
  /* GnuTLS points at the element it could not use, or at the start when
   * the string as a whole leaves nothing to negotiate. */
  if (rc != GNUTLS_E_NO_PRIORITIES_WERE_SET && at && at >= prio && at <= prio + strlen(prio))
    fprintf(stderr, "attnd: --tls-priorities \"%s\": GnuTLS stops at \"%.*s\" (character %d): %s\n",
            prio, (int)strcspn(at, ":"), at, (int)(at - prio) + 1, gnutls_strerror(rc));
  else
    fprintf(stderr, "attnd: --tls-priorities \"%s\": GnuTLS cannot use it: %s\n", prio,
            gnutls_strerror(rc));
  return -1;
}

int attnd_tls_load(const char *cert_path, const char *key_path, char **cert, char **key) {
  *cert = *key = NULL;
  char *c = read_pem("--tls-cert", cert_path);
  char *k = c ? read_pem("--tls-key", key_path) : NULL;
  if (!c || !k || check_pair(cert_path, key_path, c, k) < 0) {
    free(c);
    free(k);
    return -1;
  }
  *cert = c;
  *key = k;
  return 0;
}
