/*
 * tls.h — the certificate and key for HTTPS (--tls-cert, --tls-key): read
 * and checked before the server starts, so a missing file, a file that is
 * not PEM or a key that does not match the certificate is one line naming
 * the flag and the reason, not a daemon that will not start.
 */
#ifndef ATTND_TLS_H
#define ATTND_TLS_H

/*
 * What HTTPS offers unless --tls-priorities replaces it (a GnuTLS priority
 * string): TLS 1.3 and 1.2 only, AEAD ciphers only (AES-GCM,
 * ChaCha20-Poly1305, AES-CCM; no CBC, no SHA-1 MAC) and forward-secret key
 * exchange only (no static RSA), as Mozilla's "intermediate" profile that
 * nginx and envoy configurations follow. TLS 1.0 and 1.1 (RFC 8996) and
 * the CBC suites they bring are what libmicrohttpd's own default, NORMAL,
 * still accepts.
 */
#define ATTND_TLS_PRIORITIES_DEFAULT                                                  \
  "NORMAL:-VERS-ALL:+VERS-TLS1.3:+VERS-TLS1.2:-CIPHER-ALL:+AES-128-GCM:+AES-256-GCM:" \
  "+CHACHA20-POLY1305:+AES-128-CCM:+AES-256-CCM:-MAC-ALL:+AEAD:-RSA"

/* Whether GnuTLS takes prio as a priority string (what libmicrohttpd would
 * be given). 0, or -1 after one line to stderr quoting where GnuTLS stops
 * and why. */
int attnd_tls_check_priorities(const char *prio);

/* Reads cert_path and key_path (PEM) into *cert and *key (malloc'd,
 * NUL-terminated) and checks with GnuTLS, which libmicrohttpd serves with,
 * that they load as a pair. 0, or -1 after one line to stderr. */
int attnd_tls_load(const char *cert_path, const char *key_path, char **cert, char **key);

#endif
