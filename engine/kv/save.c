/*
 * save.c — a session store saved to a directory (kv.h, attn_kv_save):
 * every live session into its file (file.h), written to a temporary file,
 * fsynced and renamed into place, then the directory fsynced.
 *
 * Locks. attn_kv_save holds the store's lock through all its writing
 * rather than copying each session out: it runs at shutdown once every
 * call has ended, and a copy would double a session's memory.
 */
#include "file.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static void header_of(const kv_session *ks, double now, kvf_header *h) {
  snprintf(h->tenant, sizeof h->tenant, "%s", ks->tenant);
  snprintf(h->id, sizeof h->id, "%s", ks->id);
  h->shape = ks->shape;
  h->page_tokens = ks->page_tokens;
  h->ttl_s = ks->ttl_s;
  h->left_s = fmin(ks->expires - now, ks->ttl_s);
  for (int64_t l = 0; l < ks->shape.layers; l++) {
    h->length[l] = ks->layers[l].length;
    memcpy(h->absmax[l], ks->layers[l].absmax, sizeof h->absmax[l]);
  }
  h->bytes = (uint32_t)(KVF_FIXED + strlen(h->tenant) + strlen(h->id) +
                        KVF_LAYER * (size_t)ks->shape.layers);
}

static unsigned char *put(unsigned char *p, const void *v, size_t n) {
  memcpy(p, v, n);
  return p + n;
}

/* h into buf (h->bytes of it). */
static void header_encode(const kvf_header *h, unsigned char *buf) {
  uint32_t u[4] = {KVF_VERSION, h->bytes, (uint32_t)strlen(h->tenant), (uint32_t)strlen(h->id)};
  char dt[KVF_DTYPE] = {0};
  snprintf(dt, sizeof dt, "%s", attn_dtype_name(h->shape.dtype));
  int64_t i[5] = {h->shape.heads_kv, h->shape.head_dim, h->shape.layers, h->shape.max_tokens,
                  h->page_tokens};
  double d[2] = {h->ttl_s, h->left_s};
  int64_t v[4] = {attn_kv_shape_dv(&h->shape), h->shape.v_from_k, h->shape.grow, h->shape.kv_quant};
  unsigned char *p = put(buf, KVF_MAGIC, 8);
  p = put(p, u, sizeof u);
  p = put(p, dt, sizeof dt);
  p = put(p, i, sizeof i);
  p = put(p, d, sizeof d);
  p = put(p, v, sizeof v);
  p = put(p, h->tenant, u[2]);
  p = put(p, h->id, u[3]);
  for (int64_t l = 0; l < h->shape.layers; l++) {
    p = put(p, &h->length[l], 8);
    p = put(p, h->absmax[l], 8);
  }
}

typedef struct kvf_out {
  FILE *f;
  kvf_hash hash;
  bool lost; /* a page could not be read (its device failed) */
} kvf_out;

static void out_put(kvf_out *o, const void *p, size_t n) {
  fwrite(p, 1, n, o->f); /* an error sticks to f: checked once, at the end */
  attn__kvf_hash_add(&o->hash, p, n);
}

static int rows_out(void *arg, void *rows, int64_t j, int64_t n, size_t bytes, attn_status *st) {
  (void)j, (void)n, (void)st;
  out_put(arg, rows, bytes);
  return 0;
}

/* Rows [0, length) of K (t 0) or V (t 1) of head hk of L, a page at a
 * time: never the unused rest of a page, nor a device page's padding. */
static void rows_put(kvf_out *o, kvf_ctx *c, const kv_session *ks, const kv_layer *L, int t,
                     int64_t hk) {
  attn_status st;
  if (!o->lost)
    o->lost = attn__kvf_rows_out(c->s, ks, L, t, hk, L->length, c->page, rows_out, o, &st) != 0;
}

/* The whole file into fd (closed here); 0 or an errno. */
static int session_write(kvf_ctx *c, const kv_session *ks, double now, int fd) {
  kvf_out o = {fdopen(fd, "wb"), KVF_HASH_INIT, false};
  if (!o.f) {
    int err = errno;
    close(fd);
    return err;
  }
  setvbuf(o.f, c->iobuf, _IOFBF, KVF_IOBUF);
  errno = 0; /* what a failed write sets, read below */
  header_of(ks, now, &c->h);
  header_encode(&c->h, c->head);
  out_put(&o, c->head, c->h.bytes);
  for (int64_t l = 0; l < ks->shape.layers; l++)
    for (int64_t hk = 0; hk < ks->shape.heads_kv; hk++)
      for (int t = 0; t < attn__kv_tensors(&ks->shape); t++)
        rows_put(&o, c, ks, &ks->layers[l], t, hk);
  uint64_t sum = attn__kvf_hash_end(&o.hash);
  fwrite(&sum, 1, sizeof sum, o.f);
  int err = fflush(o.f) || ferror(o.f) ? (errno ? errno : EIO) : 0;
  err = err ? err : o.lost ? EIO : 0;
  if (!err && fsync(fileno(o.f)))
    err = errno;
  if (fclose(o.f) && !err)
    err = errno;
  return err;
}

/* The temporary file tmp, created anew: whatever has its name (a link
 * planted to have the save write elsewhere, a stale file) is unlinked
 * first, and the create is exclusive and follows no link, so a name
 * planted again between the two fails the save of this session rather
 * than being written through. An fd, or -1 with errno set. */
static int tmp_create(int dfd, const char *tmp) {
  if (unlinkat(dfd, tmp, 0) && errno != ENOENT)
    return -1;
  return openat(dfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
}

/* ks into its file: the temporary one written and synced, then renamed. */
static int save_one(kvf_ctx *c, const kv_session *ks, double now, attn_status *st) {
  char name[KVF_NAME_MAX], tmp[KVF_NAME_MAX + 4];
  if (!attn__kvf_tenant_ok(ks->tenant, strlen(ks->tenant)))
    return attn_status_set(st, ATTN_EINVAL,
                           "session '%s' has a tenant ('%.64s') that is not 0-%d of "
                           "[A-Za-z0-9._-], so no file name can hold it; not saved",
                           ks->id, ks->tenant, ATTN_KV_TENANT_MAX);
  attn__kvf_file_name(ks->tenant, ks->id, name, sizeof name);
  snprintf(tmp, sizeof tmp, "%s.tmp", name);
  int fd = tmp_create(c->dfd, tmp);
  int err = fd < 0 ? errno : session_write(c, ks, now, fd);
  if (!err && renameat(c->dfd, tmp, c->dfd, name))
    err = errno;
  if (!err)
    return 0;
  if (fd >= 0)
    unlinkat(c->dfd, tmp, 0); /* not left for the next start to clean */
  return attn_status_set(st, ATTN_EINVAL,
                         "cannot write session file %s/%s: %s (the session directory must be "
                         "writable and have room)",
                         c->dir, name, strerror(err));
}

int64_t attn_kv_save(attn_kv_store *s, const char *dir, double now, attn_status *st) {
  kvf_ctx *c;
  int rc = attn__kvf_ctx_open(s, dir, &c, st);
  if (rc)
    return rc;
  int64_t saved = 0, failed = 0;
  attn_status first = {0}, e;
  pthread_mutex_lock(&s->mu);
  for (int b = 0; b < KV_BUCKETS; b++)
    for (const kv_session *ks = s->buckets[b]; ks; ks = ks->next) {
      if (ks->dead || ks->expires <= now)
        continue;
      if (save_one(c, ks, now, &e) == 0)
        saved++;
      else if (failed++ == 0) /* the rest are still tried: each may fit */
        first = e;
    }
  pthread_mutex_unlock(&s->mu);
  int synced = fsync(c->dfd) ? errno : 0; /* makes the renames durable */
  attn__kvf_ctx_close(c);
  if (failed)
    return attn_status_set(st, first.code, "%lld of %lld sessions saved; %s", (long long)saved,
                           (long long)(saved + failed), first.message);
  if (synced)
    return attn_status_set(st, ATTN_EINVAL,
                           "cannot sync the session directory %s: %s (its %lld files may not "
                           "survive a crash)",
                           dir, strerror(synced), (long long)saved);
  return saved;
}
