/*
 * tls.h — the certificate and key for HTTPS (--tls-cert, --tls-key): read
 * and checked before the server starts, so a missing file, a file that is
 * not PEM or a key that does not match the certificate is one line naming
 * the flag and the reason, not a daemon that will not start.
 */
#ifndef ATTND_TLS_H
#define ATTND_TLS_H

/* Reads cert_path and key_path (PEM) into *cert and *key (malloc'd,
 * NUL-terminated) and checks with GnuTLS, which libmicrohttpd serves with,
 * that they load as a pair. 0, or -1 after one line to stderr. */
int attnd_tls_load(const char *cert_path, const char *key_path, char **cert, char **key);

#endif
