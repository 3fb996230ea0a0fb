/*
 * harness_util.h — the harness's clock, sleep, whole-file reads and the
 * scratch files a test writes.
 */
#ifndef ATTND_TEST_HARNESS_UTIL_H
#define ATTND_TEST_HARNESS_UTIL_H

#include <stddef.h>

double now_s(void);
void sleep_s(double s);
/* Reading a file whole; NULL if it cannot be read. */
char *read_file_all(const char *path, size_t *plen);

/* A fresh directory /tmp/attnd-files-XXXXXX (cr_assert), made on the first
 * call and the same after, for the keys and certificates a test hands attnd. */
char *make_tmpdir(void);
/* Removes make_tmpdir's directory, if made, and all in it: a suite's .fini,
 * so a failed test leaves no files behind. */
void remove_tmpdir(void);
/* Writes text to path (cr_assert), for key files and bad certificates. */
void write_file(const char *path, const char *text);

#endif
