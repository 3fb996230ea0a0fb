/*
 * harness_util.h — the harness's clock, sleep and whole-file reads.
 */
#ifndef ATTND_TEST_HARNESS_UTIL_H
#define ATTND_TEST_HARNESS_UTIL_H

#include <stddef.h>

double now_s(void);
void sleep_s(double s);
/* Reading a file whole; NULL if it cannot be read. */
char *read_file_all(const char *path, size_t *plen);

#endif
