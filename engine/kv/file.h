/*
 * file.h — a session file's format, shared by the files that save and load
 * them (internal to engine/kv/: file.c, save.c, load.c). A session store
 * is saved to a directory one file per session, written whole to a
 * temporary file, fsynced and renamed into place, so that a crash leaves
 * the old file or the new one and never part of one; read back with every
 * size checked against the file's length and a checksum over all of it.
 *
 * Names. Session (tenant, id) is "<tenant>@<id>.kv" ("@<id>.kv" for the
 * tenant ""). '@' is in neither alphabet ([A-Za-z0-9._-]), so the name and
 * the pair determine each other, and "" cannot meet a tenant named "_".
 * The temporary file is the name + ".tmp"; a file that does not load is
 * moved to the name + ".bad". Only the session files end in ".kv".
 * Whatever else can write in the directory may plant a name there: a
 * hard link or a symbolic link at a temporary file's name is removed and
 * the file created anew (O_EXCL, O_NOFOLLOW), never written through; the
 * log lines escape the names they quote (load.c, say).
 *
 * Format, version 4, little-endian (the host's order: see the #error):
 *     0  "ATTNKV1\n"
 *     8  u32 version (4), u32 header bytes H
 *    16  u32 tenant bytes T, u32 id bytes I
 *    24  char[8] the dtype's name, NUL-padded ("F32", "F16", "BF16")
 *    32  i64 heads_kv, head_dim, layers, max_tokens, page_tokens
 *    72  f64 ttl_s, f64 the seconds of it left when saved
 *    88  i64 head_dim_v (Dv, set), i64 v_from_k (0 or 1)
 *   104  i64 reserve: 0 whole, 1 grow (pages taken as tokens arrive)
 *   112  i64 kv_dtype: 0 the dtype, 1 F8_E4M3, 2 I8 (attn_kv_quant)
 *   120  the tenant (T bytes), then the id (I bytes), no NULs
 *        per layer: i64 length, f32 largest |k|, f32 largest |v|
 *     H  per layer, per KV head: K rows [0, length), head_dim elements of
 *        the dtype each, then V rows [0, length), Dv elements each (none
 *        for a latent session, v_from_k 1: its v is within its k); a
 *        quantized session's rows are each its codes (a byte an element)
 *        and then its F32 scale
 *        u64 checksum of every byte before it
 * Version 3 (written before sessions could be quantized) is version 4
 * without the 8 bytes at 112: kv_dtype the dtype.
 * Version 2 (written before sessions could grow) is version 3 without the
 * 8 bytes at 104: reserve whole. Version 1 (written before sessions had a
 * value head dim of their own) is version 2 without the 16 bytes at 88:
 * Dv is head_dim, v_from_k 0. Both still load. page_tokens is the saver's, for a reader's
 * information: rows are stored without their pages, so a store of another page size loads the file.
 *
 * The checksum takes FNV-1a's 64-bit constants a word at a time (several
 * times faster than FNV-1a's byte at a time, which would slow a shutdown
 * holding gigabytes): h = (h ^ w) * P, h ^= h >> 32 for each 8-byte
 * little-endian word, the last 1-7 bytes zero-padded into one more word,
 * then the byte count mixed in the same way. Each step is a bijection of
 * h, so a change to any one word always shows.
 */
#ifndef ATTN_KV_FILE_H
#define ATTN_KV_FILE_H

#include "kv_int.h"

#include <stdio.h>

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "a session file holds rows and fields in the host's byte order; the format is little-endian"
#endif

#define KVF_MAGIC "ATTNKV1\n"
#define KVF_VERSION 4u
#define KVF_FIXED 120    /* bytes before the tenant */
#define KVF_FIXED_V3 112 /* in a file of version 3 */
#define KVF_FIXED_V2 104 /* in a file of version 2 */
#define KVF_FIXED_V1 88  /* in a file of version 1 */
#define KVF_LAYER 16     /* bytes of one layer's entry */
#define KVF_DTYPE 8      /* bytes of the dtype's name */
#define KVF_TRAILER 8    /* the checksum */
#define KVF_HEADER_MAX \
  (KVF_FIXED + ATTN_KV_TENANT_MAX + ATTN_KV_ID_MAX + KVF_LAYER * ATTN_KV_MAX_LAYERS)
/* "<tenant>@<id>.kv" and a NUL */
#define KVF_NAME_MAX (ATTN_KV_TENANT_MAX + 1 + ATTN_KV_ID_MAX + 3 + 1)
#define KVF_IOBUF ((size_t)1 << 20)
#define KVF_WHY 200

/* The checksum as it goes. */
typedef struct kvf_hash {
  uint64_t h, n; /* n: bytes added */
  unsigned char tail[8];
} kvf_hash;
#define KVF_HASH_INIT ((kvf_hash){0xcbf29ce484222325ull, 0, {0}})
void attn__kvf_hash_add(kvf_hash *x, const void *p, size_t n);
uint64_t attn__kvf_hash_end(const kvf_hash *x);

typedef struct kvf_header {
  char tenant[ATTN_KV_TENANT_MAX + 1];
  char id[ATTN_KV_ID_MAX + 1];
  attn_kv_shape shape;
  int64_t page_tokens;
  double ttl_s, left_s;
  uint32_t bytes; /* H */
  int64_t length[ATTN_KV_MAX_LAYERS];
  float absmax[ATTN_KV_MAX_LAYERS][2];
} kvf_header;

/* What one call works with: the directory, a header, stdio's buffer. */
typedef struct kvf_ctx {
  int dfd;
  const char *dir;
  double ttl_max; /* loading: the server's --session-ttl-max */
  const attn_kv_store *s;
  kvf_header h;
  unsigned char head[KVF_HEADER_MAX];
  char iobuf[KVF_IOBUF];
  char page[ATTN_KV_PAGE_BYTES]; /* one page's rows on their way (pages may be a device's) */
} kvf_ctx;

/* Whether t (n bytes) can name a file: 0-ATTN_KV_TENANT_MAX of
 * [A-Za-z0-9._-]. Session (tenant, id)'s file name into buf. */
bool attn__kvf_tenant_ok(const char *t, size_t n);
void attn__kvf_file_name(const char *tenant, const char *id, char *buf, size_t cap);
/* The directory opened for one save or load of s (0, or st set), and
 * closed. */
int attn__kvf_ctx_open(const attn_kv_store *s, const char *dir, kvf_ctx **pc, attn_status *st);
void attn__kvf_ctx_close(kvf_ctx *c);

/* Rows [0, end) of KV head hk of L's K (t 0) or V (t 1), one page's span
 * at a time through page (ATTN_KV_PAGE_BYTES): read out of the pages and
 * handed to fn (attn__kvf_rows_out), or filled by fn and stored
 * (attn__kvf_rows_in); fn gets the span's first row j, its rows n and
 * their bytes, packed. Saving, loading, export and import all move a
 * session's rows this way. 0, the pages' error (st set), or fn's nonzero
 * (fn sets st). */
typedef int (*kvf_rows_fn)(void *arg, void *rows, int64_t j, int64_t n, size_t bytes,
                           attn_status *st);
int attn__kvf_rows_out(const attn_kv_store *s, const kv_session *ks, const kv_layer *L, int t,
                       int64_t hk, int64_t end, void *page, kvf_rows_fn fn, void *arg,
                       attn_status *st);
int attn__kvf_rows_in(const attn_kv_store *s, const kv_session *ks, const kv_layer *L, int t,
                      int64_t hk, int64_t end, void *page, kvf_rows_fn fn, void *arg,
                      attn_status *st);
/* Session h (its tenant, id, shape, lengths and largest |k| and |v|) made
 * in the store with ttl, expiring at now + min(left_s, ttl): its id
 * taken and its layers grown to their lengths under the store's lock,
 * then fill stores their rows without it (calls on other sessions go on;
 * calls on this one wait, its lengths stay 0, and a delete or an expiry
 * leaves its pages until fill returns), then the lengths are published
 * (a layer truncated meanwhile keeps the truncate's), so nothing sees it
 * half made. ESESSION_EXISTS when the store has a session of that
 * name, the tenant cap's refusal (capped: a create's, not a load's,
 * which was made under the cap of then), attn__kv_insert's refusal, or
 * fill's nonzero (fill sets st); the session is gone again on any
 * error. */
typedef int (*kvf_fill_fn)(attn_kv_store *s, kv_session *ks, void *arg, attn_status *st);
int attn__kvf_install(attn_kv_store *s, const kvf_header *h, double ttl, double now, bool capped,
                      kvf_fill_fn fill, void *arg, attn_status *st);

#endif
