/*
 * files.h — whole-file reading and atomic writing for the attn subcommands
 * that take request files and write replies.
 */
#ifndef TOOL_FILES_H
#define TOOL_FILES_H

#include <stddef.h>

/* Reads a whole file into a malloc'd buffer; -1 with errno set on failure. */
int tool_read_file(const char *path, void **pbuf, size_t *plen);

/* Writes buf to a temporary file beside path and renames it over path: a
 * failure or a kill never leaves a half-written file where a reader expects
 * a whole one. -1 with errno set on failure. */
int tool_write_file(const char *path, const void *buf, size_t len);

#endif
