/*
 * bodybuf.h — the buffers large request bodies are read into (bodybuf.c):
 * one mapping sized from Content-Length, kept warm a few seconds for the
 * next body.
 *
 * A fresh mapping costs a page fault and a zeroed page per 4 KiB touched:
 * for a 256 MiB body that was more time than reading it from the socket. A
 * decode loop that sends a body of the same size again and again finds its
 * last buffer already mapped and touched.
 * Idle buffers are unmapped once ATTND_BODYBUF_IDLE passes, so a burst
 * leaves no resident memory behind. Where the engine lends page-locked
 * memory (a CUDA device serves: attn_engine_host_alloc), a body is read
 * into that instead, so its tensors go to the device in one copy from
 * where they lie; the engine's pool keeps those warm itself. Locks itself:
 * any thread.
 */
#ifndef ATTND_BODYBUF_H
#define ATTND_BODYBUF_H

#include "engine.h"

#include <pthread.h>
#include <stddef.h>

/* Bodies this large (declared by Content-Length) get a mapping of their
 * own; smaller ones grow on the heap. */
#define ATTND_BODYBUF_MIN ((size_t)1 << 20)
/* Idle buffers kept at most, and for how long (seconds): long enough for
 * the next of a run of session imports of a second or two each. */
#define ATTND_BODYBUF_KEEP 2
#define ATTND_BODYBUF_IDLE 5.0

typedef struct attnd_bodybuf_idle {
  void *base; /* the mapping, NULL when the slot is free */
  size_t len; /* its length */
  double since;
} attnd_bodybuf_idle;

typedef struct attnd_bodybufs {
  pthread_mutex_t mu;
  attnd_bodybuf_idle idle[ATTND_BODYBUF_KEEP];
  attn_engine *engine; /* lends page-locked buffers first; NULL: never asked */
} attnd_bodybufs;

/* engine: asked first for each buffer (NULL: mappings only). */
void attnd_bodybufs_init(attnd_bodybufs *c, attn_engine *engine);
/* Unmaps every idle buffer. */
void attnd_bodybufs_close(attnd_bodybufs *c);

/* A buffer of at least n bytes, 64-byte aligned; NULL when out of memory.
 * Its pages are the kernel's to fill on first touch unless it was kept. */
char *attnd_bodybuf_get(attnd_bodybufs *c, size_t n);
/* p (from attnd_bodybuf_get, or NULL) given back, kept idle or unmapped. */
void attnd_bodybuf_put(attnd_bodybufs *c, char *p);
/* n bytes from src into a buffer of attnd_bodybuf_get at dst, with
 * streaming stores where the CPU has them: the buffer is far larger than
 * the caches, and ordinary stores read every line before they write it,
 * which made this copy take twice as long as the socket read before it.
 * The bytes are visible to other threads once it returns. */
void attnd_bodybuf_copy(char *dst, const char *src, size_t n);
/* n bytes from src at offset at of buffer p (attnd_bodybuf_get's), its
 * pages faulted in a few MiB ahead of them in one call rather than one
 * fault per page; then as attnd_bodybuf_copy. */
void attnd_bodybuf_fill(char *p, size_t at, const char *src, size_t n);
/* Idle buffers older than ATTND_BODYBUF_IDLE at now unmapped. */
void attnd_bodybufs_trim(attnd_bodybufs *c, double now);

#endif
