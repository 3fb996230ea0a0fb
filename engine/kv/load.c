/*
 * load.c — a session store loaded from a directory (kv.h, attn_kv_load):
 * each session file (file.h) read, checked as a create and a call would
 * check its fields and rows, and its session put in the store; a file that
 * does not load is moved aside and logged.
 *
 * A file is held to what a create and a call would be: every header field
 * in the range a create takes (page_tokens one a store could have, the
 * dtype's name NUL-padded), every row finite and within its layer's
 * recorded largest |k| or |v| (which the kernels rely on, as they scan
 * only q), or the file is refused as a damaged one is. A checksum only
 * shows damage; whoever can write the directory can make a file whose
 * checksum matches. A ttl_s past the server's --session-ttl-max is cut to
 * it (and the time left with it): a lower limit after a restart applies
 * to the sessions loaded, and they are not lost for it.
 *
 * A file loaded is then removed: the files are one shutdown's sessions,
 * read once. A session deleted after the start must not come back at the
 * next one, and a start after a crash (no save) must not serve tokens
 * older than the ones acknowledged since.
 *
 * Locks. attn_kv_load makes each file's session as an import does
 * (file.c, attn__kvf_install): its rows read in without the store's lock,
 * its layers marked as being written until they are, so nothing sees a
 * session half loaded.
 */
#include "check.h"
#include "file.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Bytes of the rows the header's lengths say the file holds. */
static uint64_t data_bytes(const kvf_header *h) {
  uint64_t n = 0;
  for (int64_t l = 0; l < h->shape.layers; l++)
    for (int t = 0; t < attn__kv_tensors(&h->shape); t++)
      n += (uint64_t)h->shape.heads_kv * (uint64_t)h->length[l] * attn__kv_xrow(&h->shape, t);
  return n;
}

typedef struct kvf_in {
  FILE *f;
  kvf_hash hash;
} kvf_in;

typedef struct kvf_log {
  void (*fn)(const char *line, void *arg);
  void *arg;
} kvf_log;

/* raw into out (cap bytes, NUL-terminated) with control bytes, DEL, bytes
 * past ASCII and the backslash as \xNN: a line names files of the
 * directory and quotes bytes of them, which anyone who can write there
 * chose, and a newline or a terminal escape must not end the line, forge
 * the next one or reach an operator's terminal. Cut at a whole escape. */
static void escape(const char *raw, char *out, size_t cap) {
  static const char hex[] = "0123456789abcdef";
  size_t n = 0;
  for (const unsigned char *p = (const unsigned char *)raw; *p; p++) {
    bool plain = *p >= 0x20 && *p < 0x7f && *p != '\\';
    if (n + (plain ? 1 : 4) >= cap)
      break;
    if (plain) {
      out[n++] = (char)*p;
      continue;
    }
    out[n++] = '\\';
    out[n++] = 'x';
    out[n++] = hex[*p >> 4];
    out[n++] = hex[*p & 15];
  }
  out[n] = 0;
}

static void say(const kvf_log *lg, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(const kvf_log *lg, const char *fmt, ...) {
  char raw[1024], line[4 * sizeof raw];
  va_list ap;
  if (!lg->fn)
    return;
  va_start(ap, fmt);
  vsnprintf(raw, sizeof raw, fmt, ap);
  va_end(ap);
  escape(raw, line, sizeof line);
  lg->fn(line, lg->arg);
}

/* why (KVF_WHY bytes) says why a file does not load; returns -1. */
static int why_set(char *why, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int why_set(char *why, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, KVF_WHY, fmt, ap);
  va_end(ap);
  return -1;
}

static bool in_get(kvf_in *in, void *p, size_t n) {
  if (fread(p, 1, n, in->f) != n)
    return false;
  attn__kvf_hash_add(&in->hash, p, n);
  return true;
}

static int ends_early(const kvf_in *in, char *why) {
  return why_set(why, "it ends early: %s",
                 ferror(in->f) ? strerror(errno) : "it shrank while it was read");
}

static uint32_t get32(const unsigned char *p) {
  uint32_t v;
  memcpy(&v, p, sizeof v);
  return v;
}

static int64_t get64(const unsigned char *p) {
  int64_t v;
  memcpy(&v, p, sizeof v);
  return v;
}

static double getd(const unsigned char *p) {
  double v;
  memcpy(&v, p, sizeof v);
  return v;
}

/* The limits attn_kv_create holds a shape to (shape.c), a ttl, and a
 * page size a store could have had. */
static int shape_ok(const kvf_header *h, char *why) {
  const attn_kv_shape *sh = &h->shape;
  attn_status e;
  if (attn__kv_shape_check(sh, &e))
    return why_set(why, "its shape is not one a session can have: %.150s", e.message);
  if (!(h->ttl_s > 0 && h->ttl_s <= 1e9) || !(h->left_s > 0 && h->left_s <= h->ttl_s))
    return why_set(why, "its ttl_s (%g) or the seconds left of it (%g) are out of range", h->ttl_s,
                   h->left_s);
  /* a store of any page size reads a file, but a page holds a multiple of
   * ATTN_PAGE_MIN_TOKENS rows, at most the largest host page's (a device
   * pads rows; a store's pages may be smaller: attn_kv_open_paged) */
  const int64_t host = attn__kv_tokens_fit(
      ATTN_KV_PAGE_BYTES, sh->kv_quant ? attn__kv_width(sh) + (int64_t)sizeof(float)
                                       : attn__kv_width(sh) * (int64_t)attn_dtype_size(sh->dtype));
  if (h->page_tokens < ATTN_PAGE_MIN_TOKENS || h->page_tokens > host ||
      h->page_tokens % ATTN_PAGE_MIN_TOKENS)
    return why_set(why, "its page_tokens (%lld) is not one a store can have for its shape",
                   (long long)h->page_tokens);
  return 0;
}

/* The dtype's name and NULs after it, none of them past the name. */
static bool dtype_padded(const unsigned char *b) {
  size_t n = strnlen((const char *)b, KVF_DTYPE);
  for (size_t i = n; i < KVF_DTYPE; i++)
    if (b[i])
      return false;
  return true;
}

/* The bytes before the tenant in a file of version v (1 to 4). */
static uint32_t fixed_bytes(uint32_t v) {
  return v == 1 ? KVF_FIXED_V1 : v == 2 ? KVF_FIXED_V2 : v == 3 ? KVF_FIXED_V3 : KVF_FIXED;
}

/* The header's first fixed_bytes: the format, the sizes, the shape (a
 * file of version 1 holds sessions whose v is as wide as k; of version 1
 * or 2, sessions of reserve whole; of versions 1 to 3, unquantized ones). */
static int fixed_parse(const unsigned char *b, kvf_header *h, uint32_t *tl, uint32_t *il,
                       char *why) {
  const uint32_t v = get32(b + 8);
  h->bytes = get32(b + 12);
  *tl = get32(b + 16);
  *il = get32(b + 20);
  char dt[KVF_DTYPE + 1] = {0};
  memcpy(dt, b + 24, KVF_DTYPE);
  if (attn_dtype_parse(dt, &h->shape.dtype) || !dtype_padded(b + 24))
    return why_set(why, "its dtype ('%.8s') is not F32, F16 or BF16, NUL-padded", dt);
  h->shape.heads_kv = get64(b + 32);
  h->shape.head_dim = get64(b + 40);
  h->shape.layers = get64(b + 48);
  h->shape.max_tokens = get64(b + 56);
  h->page_tokens = get64(b + 64);
  h->ttl_s = getd(b + 72);
  h->left_s = getd(b + 80);
  h->shape.head_dim_v = v == 1 ? h->shape.head_dim : get64(b + 88);
  const int64_t from_k = v == 1 ? 0 : get64(b + 96);
  if (from_k != 0 && from_k != 1)
    return why_set(why, "its v_from_k (%lld) is not 0 or 1", (long long)from_k);
  h->shape.v_from_k = from_k == 1;
  const int64_t grow = v < 3 ? 0 : get64(b + 104);
  if (grow != 0 && grow != 1)
    return why_set(why, "its reserve (%lld) is not 0 (whole) or 1 (grow)", (long long)grow);
  h->shape.grow = grow == 1;
  const int64_t quant = v < 4 ? 0 : get64(b + 112);
  if (quant < 0 || quant >= ATTN_KVQ_COUNT)
    return why_set(why, "its kv_dtype (%lld) is not 0 (the dtype), 1 (F8_E4M3) or 2 (I8)",
                   (long long)quant);
  h->shape.kv_quant = (attn_kv_quant)quant;
  if (*tl > ATTN_KV_TENANT_MAX || *il < 1 || *il > ATTN_KV_ID_MAX)
    return why_set(why, "its tenant (%u bytes) or id (%u bytes) is too long", *tl, *il);
  if (shape_ok(h, why))
    return -1;
  if (h->bytes != fixed_bytes(v) + *tl + *il + KVF_LAYER * (uint32_t)h->shape.layers)
    return why_set(why, "its header's size (%u bytes) is not that of its fields", h->bytes);
  return 0;
}

/* The rest of the header: who the session is, and its layers. */
static int names_parse(const unsigned char *b, uint32_t tl, uint32_t il, kvf_header *h,
                       const char *name, char *why) {
  attn_status e;
  char want[KVF_NAME_MAX];
  memcpy(h->tenant, b, tl);
  h->tenant[tl] = 0;
  memcpy(h->id, b + tl, il);
  h->id[il] = 0;
  if (!attn__kvf_tenant_ok(h->tenant, tl))
    return why_set(why, "its tenant is not 0-%d of [A-Za-z0-9._-]", ATTN_KV_TENANT_MAX);
  if (attn_kv_id_check(h->id, il, &e))
    return why_set(why, "its id: %.150s", e.message);
  attn__kvf_file_name(h->tenant, h->id, want, sizeof want);
  if (strcmp(want, name))
    return why_set(why, "it holds the session of file %.150s (renamed by hand?)", want);
  return 0;
}

static int layers_parse(const unsigned char *b, kvf_header *h, char *why) {
  for (int64_t l = 0; l < h->shape.layers; l++, b += KVF_LAYER) {
    h->length[l] = get64(b);
    memcpy(h->absmax[l], b + 8, sizeof h->absmax[l]);
    if (h->shape.v_from_k) /* its v is its k's rows, whatever the file says */
      h->absmax[l][1] = h->absmax[l][0];
    if (h->length[l] < 0 || h->length[l] > h->shape.max_tokens)
      return why_set(why, "layer %lld's length (%lld) is not 0 to max_tokens (%lld)", (long long)l,
                     (long long)h->length[l], (long long)h->shape.max_tokens);
    for (int t = 0; t < 2; t++)
      if (!(h->absmax[l][t] >= 0 && isfinite(h->absmax[l][t])))
        return why_set(why, "layer %lld's largest |%c| is not a finite number 0 or more",
                       (long long)l, t ? 'v' : 'k');
  }
  return 0;
}

/* The magic and the version, from the header's first bytes: its fixed
 * bytes, or 0 with why set. */
static uint32_t format_of(const unsigned char *b, char *why) {
  if (memcmp(b, KVF_MAGIC, 8)) {
    why_set(why, "it is not a session file (it does not start with ATTNKV1)");
    return 0;
  }
  const uint32_t v = get32(b + 8);
  if (v < 1 || v > KVF_VERSION) {
    why_set(why, "it is format version %u; this attnd reads versions 1 to %u", v, KVF_VERSION);
    return 0;
  }
  return fixed_bytes(v);
}

/* The header into c->h, checked, and against the file's size. */
static int header_read(kvf_ctx *c, kvf_in *in, uint64_t size, const char *name, char *why) {
  uint32_t tl = 0, il = 0, fixed;
  memset(&c->h.shape, 0, sizeof c->h.shape);
  if (size < KVF_FIXED_V1)
    return why_set(why, "it is %llu bytes, shorter than a header (truncated?)",
                   (unsigned long long)size);
  if (!in_get(in, c->head, KVF_FIXED_V1))
    return ends_early(in, why);
  if (!(fixed = format_of(c->head, why)))
    return -1;
  if (size < fixed)
    return why_set(why, "it is %llu bytes, shorter than a header (truncated?)",
                   (unsigned long long)size);
  if (!in_get(in, c->head + KVF_FIXED_V1, fixed - KVF_FIXED_V1))
    return ends_early(in, why);
  if (fixed_parse(c->head, &c->h, &tl, &il, why))
    return -1;
  if (size < c->h.bytes)
    return why_set(why, "it is %llu bytes, shorter than its header (truncated?)",
                   (unsigned long long)size);
  if (!in_get(in, c->head + fixed, c->h.bytes - fixed))
    return ends_early(in, why);
  if (names_parse(c->head + fixed, tl, il, &c->h, name, why) ||
      layers_parse(c->head + fixed + tl + il, &c->h, why))
    return -1;
  uint64_t want = c->h.bytes + data_bytes(&c->h) + KVF_TRAILER;
  if (size != want)
    return why_set(why, "it is %llu bytes; its header says %llu (%s)", (unsigned long long)size,
                   (unsigned long long)want, size < want ? "truncated?" : "bytes appended?");
  return 0;
}

/* Rows [j, j + n) of head hk of layer l's K (t 0) or V (t 1), at p: as a
 * call's new tokens are (admit.c), finite, and within the largest |k| or
 * |v| the header records, which the kernels take as the bound of every
 * row stored (a file's rows past it would compute on unchecked values). */
static int rows_check(const void *p, const kvf_header *h, int64_t l, int t, int64_t hk, int64_t j,
                      int64_t n, char *why) {
  int64_t bad = 0;
  float m = h->shape.kv_quant
                ? attn__kv_xrows_absmax(&h->shape, t, p, n, &bad)
                : attn__absmax(p, h->shape.dtype, (size_t)(n * attn__kv_cols(&h->shape, t)));
  if (m < 0 && h->shape.kv_quant)
    return why_set(why,
                   "layer %lld's %c, head %lld, row %lld, is no quantized row (a scale not "
                   "finite and 0 or more, 0 under codes not 0, or an F8_E4M3 NaN code)",
                   (long long)l, t ? 'v' : 'k', (long long)hk, (long long)(j + bad));
  if (m < 0)
    return why_set(why, "layer %lld's %c, head %lld, rows %lld to %lld, holds a non-finite value",
                   (long long)l, t ? 'v' : 'k', (long long)hk, (long long)j, (long long)(j + n));
  if (m > h->absmax[l][t])
    return why_set(why,
                   "layer %lld's %c, head %lld, rows %lld to %lld, holds |%g|, past the largest "
                   "|%c| (%g) its header records",
                   (long long)l, t ? 'v' : 'k', (long long)hk, (long long)j, (long long)(j + n),
                   (double)m, t ? 'v' : 'k', (double)h->absmax[l][t]);
  return 0;
}

/* What filling a session from its file works with. */
typedef struct kvf_fill {
  kvf_ctx *c;
  kvf_in *in;
  int64_t l, hk;
  int t;
  char bad[KVF_WHY]; /* the first row out of bounds */
  char *why;         /* why the fill failed */
} kvf_fill;

static int fill_failed(kvf_fill *f, attn_status *st) {
  return attn_status_set(st, ATTN_EINVAL, "%s", f->why);
}

static int rows_in(void *arg, void *rows, int64_t j, int64_t n, size_t bytes, attn_status *st) {
  kvf_fill *f = arg;
  if (!in_get(f->in, rows, bytes)) {
    ends_early(f->in, f->why);
    return fill_failed(f, st);
  }
  if (!f->bad[0])
    rows_check(rows, &f->c->h, f->l, f->t, f->hk, j, n, f->bad);
  return 0;
}

/* The rows into ks's pages, then the checksum over the whole file. A row
 * out of bounds is said once the checksum matches: a damaged file is said
 * to be damaged. */
static int rows_read(attn_kv_store *s, kv_session *ks, void *arg, attn_status *st) {
  kvf_fill *f = arg;
  for (f->l = 0; f->l < ks->shape.layers; f->l++)
    for (f->hk = 0; f->hk < ks->shape.heads_kv; f->hk++)
      for (f->t = 0; f->t < attn__kv_tensors(&ks->shape); f->t++) {
        const kv_layer *L = &ks->layers[f->l];
        int rc = attn__kvf_rows_in(s, ks, L, f->t, f->hk, f->c->h.length[f->l], f->c->page, rows_in,
                                   f, st);
        if (rc && !f->why[0])
          why_set(f->why, "its rows could not be stored: %s", st->message);
        if (rc)
          return fill_failed(f, st);
      }
  uint64_t sum;
  if (fread(&sum, 1, sizeof sum, f->in->f) != sizeof sum)
    ends_early(f->in, f->why);
  else if (sum != attn__kvf_hash_end(&f->in->hash))
    why_set(f->why, "its checksum does not match its contents: the file is damaged");
  else if (f->bad[0])
    why_set(f->why, "%s", f->bad);
  return f->why[0] ? fill_failed(f, st) : 0;
}

static int insert_failed(attn_kv_store *s, const kvf_header *h, const attn_status *e, char *why) {
  if (e->code != ATTN_ESESSION_MEMORY || h->shape.grow) /* a grow one's message says it all */
    return why_set(why, "%.150s", e->message);
  pthread_mutex_lock(&s->mu);
  const uint64_t free_pages = (uint64_t)(s->pages.npages - s->pages.reserved);
  pthread_mutex_unlock(&s->mu);
  return why_set(why,
                 "it reserves %llu bytes and %llu of the %llu bytes of session memory are "
                 "free: raise --session-memory, then rename the file back to load it",
                 (unsigned long long)attn_kv_reserve_bytes(s, &h->shape),
                 (unsigned long long)attn__kvpages_bytes(&s->pages, free_pages),
                 (unsigned long long)attn__kvpages_bytes(&s->pages, s->pages.npages));
}

/* The session of c->h into the store: 1 loaded, 0 left (the store has one
 * of that name), -1 not loadable; why says why when not loaded. */
static int session_read(attn_kv_store *s, kvf_ctx *c, kvf_in *in, double now, char *why) {
  const kvf_header *h = &c->h;
  attn_status e;
  kvf_fill f = {.c = c, .in = in, .why = why};
  why[0] = 0;
  if (attn__kv_computable(s, &h->shape, &e))
    return why_set(why, "%.190s", e.message);
  int rc = attn__kvf_install(s, h, fmin(h->ttl_s, c->ttl_max), now, false, rows_read, &f, &e);
  if (rc == 0)
    return 1;
  if (rc == ATTN_ESESSION_EXISTS) {
    why_set(why, "the store holds session '%s' already", h->id);
    return 0;
  }
  return why[0] ? -1 : insert_failed(s, h, &e, why);
}

/* File name of dir, as session_read. */
static int load_one(attn_kv_store *s, kvf_ctx *c, const char *name, double now, char *why) {
  /* O_NONBLOCK: a FIFO of that name must not hang the start */
  int fd = openat(c->dfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0)
    return why_set(why, "cannot open it: %s", strerror(errno));
  struct stat sb;
  if (fstat(fd, &sb) || !S_ISREG(sb.st_mode)) {
    close(fd);
    return why_set(why, "it is not a regular file");
  }
  kvf_in in = {fdopen(fd, "rb"), KVF_HASH_INIT};
  if (!in.f) {
    close(fd);
    return why_set(why, "cannot read it: %s", strerror(errno));
  }
  setvbuf(in.f, c->iobuf, _IOFBF, KVF_IOBUF);
  int r = header_read(c, &in, (uint64_t)sb.st_size, name, why);
  if (r == 0)
    r = session_read(s, c, &in, now, why);
  fclose(in.f);
  return r;
}

static bool ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), k = strlen(suffix);
  return n >= k && !strcmp(s + n - k, suffix);
}

static int names_cmp(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static int list_add(char ***v, size_t *n, size_t *cap, const char *name) {
  if (*n == *cap) {
    size_t c = *cap ? 2 * *cap : 16;
    char **w = realloc(*v, c * sizeof *w);
    if (!w)
      return -1;
    *v = w;
    *cap = c;
  }
  if (!((*v)[*n] = strdup(name)))
    return -1;
  (*n)++;
  return 0;
}

/* The names in dir ending in ".kv" or ".kv.tmp", sorted (a log in a fixed
 * order); all read before any is renamed, as readdir over a directory
 * that changes may skip or repeat names. */
static int list_dir(kvf_ctx *c, char ***pv, size_t *pn, attn_status *st) {
  int fd = dup(c->dfd);
  DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
  char **v = NULL;
  size_t n = 0, cap = 0;
  int rc = 0;
  if (!d) {
    rc = attn_status_set(st, ATTN_EINVAL, "cannot list the session directory %s: %s", c->dir,
                         strerror(errno));
    if (fd >= 0)
      close(fd);
  }
  for (struct dirent *de; d && rc == 0 && (de = readdir(d));)
    if (ends_with(de->d_name, ".kv") || ends_with(de->d_name, ".kv.tmp"))
      if (list_add(&v, &n, &cap, de->d_name))
        rc = attn_status_set(st, ATTN_ENOMEM, "out of memory listing the session directory %s",
                             c->dir);
  if (d)
    closedir(d);
  if (rc) {
    while (n)
      free(v[--n]);
    free(v);
    return rc;
  }
  if (n > 1) /* qsort may not be given NULL, which an empty list is */
    qsort(v, n, sizeof *v, names_cmp);
  *pv = v;
  *pn = n;
  return 0;
}

/* A file that does not load, moved aside (never served) and logged. */
static void set_aside(kvf_ctx *c, const char *name, const char *why, const kvf_log *lg) {
  char bad[300];
  snprintf(bad, sizeof bad, "%s.bad", name);
  if (renameat(c->dfd, name, c->dfd, bad) == 0)
    say(lg, "session file %s/%s: not loaded, moved to %s: %s", c->dir, name, bad, why);
  else
    say(lg, "session file %s/%s: not loaded: %s; cannot move it to %s: %s", c->dir, name, why, bad,
        strerror(errno));
}

/* One name of the directory: a save's stale temporary file removed, a
 * session loaded (its file then removed), or a file left or set aside.
 * Returns whether it loaded; *changed when the directory changed. */
static bool take_file(attn_kv_store *s, kvf_ctx *c, const char *name, double now, const kvf_log *lg,
                      bool *changed) {
  char why[KVF_WHY];
  if (ends_with(name, ".tmp")) {
    if (unlinkat(c->dfd, name, 0) == 0)
      say(lg, "session file %s/%s: removed: a save that did not finish left it", c->dir, name);
    else
      say(lg,
          "session file %s/%s: a save that did not finish left it, and it cannot be "
          "removed: %s",
          c->dir, name, strerror(errno));
    *changed = true;
    return false;
  }
  int r = load_one(s, c, name, now, why);
  if (r == 0)
    say(lg, "session file %s/%s: not loaded, left in place: %s", c->dir, name, why);
  else if (r < 0)
    set_aside(c, name, why, lg);
  else if (unlinkat(c->dfd, name, 0))
    say(lg,
        "session file %s/%s: loaded, but cannot be removed (a later start would load it "
        "again): %s",
        c->dir, name, strerror(errno));
  if (r == 1 && c->h.ttl_s > c->ttl_max)
    say(lg,
        "session file %s/%s: loaded with ttl_s %g, not its %g: the most --session-ttl-max allows",
        c->dir, name, c->ttl_max, c->h.ttl_s);
  *changed |= r != 0;
  return r == 1;
}

int64_t attn_kv_load(attn_kv_store *s, const char *dir, double now, double ttl_max,
                     void (*log)(const char *line, void *arg), void *arg, attn_status *st) {
  kvf_ctx *c;
  char **names;
  size_t n;
  if (!(ttl_max > 0))
    return attn_status_set(st, ATTN_EINVAL, "the sessions' ttl max must be above 0, not %g",
                           ttl_max);
  int rc = attn__kvf_ctx_open(s, dir, &c, st);
  if (rc)
    return rc;
  c->ttl_max = ttl_max;
  rc = list_dir(c, &names, &n, st);
  if (rc) {
    attn__kvf_ctx_close(c);
    return rc;
  }
  const kvf_log lg = {log, arg};
  int64_t loaded = 0;
  bool changed = false;
  for (size_t i = 0; i < n; i++) {
    loaded += take_file(s, c, names[i], now, &lg, &changed);
    free(names[i]);
  }
  free(names);
  if (changed && fsync(c->dfd)) /* the removals and renames, durable */
    say(&lg,
        "session directory %s: cannot sync it: %s (a crash may bring back the files "
        "loaded or moved aside)",
        dir, strerror(errno));
  attn__kvf_ctx_close(c);
  return loaded;
}
