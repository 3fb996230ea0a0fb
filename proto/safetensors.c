/*
 * safetensors.c — the binary codec: requests as safetensors files, read and
 * checked (safetensors_write.c writes the results back the same way).
 *
 * Clients that already hold tensors in memory (PyTorch, numpy) send them as
 * safetensors so that nobody prints or parses numbers: where a tensor's
 * bytes lie suitably aligned in the body, the engine reads them in place.
 * The body comes from the network, so every length, offset and count of the
 * header is checked, with overflow-safe arithmetic, before a single data
 * byte is used, and each refusal names the field, tensor or byte offset so
 * that whoever wrote the file can find what their writer got wrong.
 */
#include "internal.h"
#include "proto.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Ranks above what attn_proto_build takes still get their size checked, so
 * a rank-5 tensor is refused for its rank rather than as a broken file. */
#define MAX_RANK 8
/* Doubles (cJSON's only numbers) hold every integer below 2^53 exactly; a
 * larger one may already have been rounded, so it cannot be trusted. */
#define EXACT_LIMIT 9007199254740992.0

#define NT ATTN_PROTO_MAX_TENSORS
static const char *const field_names[3] = {"dtype", "shape", "data_offsets"};

typedef attn__st_entry entry;

static bool is_ws(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/*
 * What cJSON lets through and we must not: it treats every byte up to 0x20
 * (NUL included) as whitespace, decodes "\u0000" into a string it then
 * reads as C text (so "q\u0000x" would pass for "q"), accepts bytes that
 * are not UTF-8, ignores whatever follows the first value, and recurses a
 * thousand levels deep. One pass over the raw bytes closes all of that.
 */
static int scan_header(const unsigned char *h, size_t n, attn_status *st) {
  bool in_str = false, closed = false;
  int depth = 0;
  size_t i;
  for (i = 0; i < n; i++) {
    unsigned char c = h[i];
    if (c == 0)
      return attn_status_set(st, ATTN_PROTO_ESAFETENSORS,
                             "header byte %zu (file offset %zu) is a NUL byte; the "
                             "header must be JSON text",
                             i, i + 8);
    if (c < 0x20 && (in_str || !is_ws(c)))
      return attn_status_set(st, ATTN_PROTO_ESAFETENSORS,
                             "header byte %zu (file offset %zu) is the control byte "
                             "0x%02x, which JSON does not allow there",
                             i, i + 8, c);
    if (c >= 0x80) {
      size_t k = attn__utf8_len(h + i, n - i);
      if (!k)
        return attn_status_set(st, ATTN_PROTO_ESAFETENSORS,
                               "header byte %zu (file offset %zu) starts invalid UTF-8", i, i + 8);
      i += k - 1;
      if (closed)
        goto trailing;
      continue;
    }
    if (closed && !is_ws(c))
      goto trailing;
    if (in_str) {
      if (c == '\\' && i + 1 < n) {
        if (i + 5 < n && h[i + 1] == 'u' && !memcmp(h + i + 2, "0000", 4))
          return attn_status_set(st, ATTN_PROTO_ESAFETENSORS,
                                 "header byte %zu (file offset %zu): the escape \\u0000 "
                                 "is not allowed in names or values",
                                 i, i + 8);
        /* skip the escaped byte unless it needs the checks above */
        if (h[i + 1] >= 0x20 && h[i + 1] < 0x80)
          i++;
      } else if (c == '"') {
        in_str = false;
      }
    } else if (c == '"') {
      in_str = true;
    } else if (c == '{' || c == '[') {
      if (++depth > ATTN_PROTO_MAX_DEPTH)
        return attn_status_set(st, ATTN_PROTO_ESAFETENSORS,
                               "header nests deeper than %d levels at header byte %zu",
                               ATTN_PROTO_MAX_DEPTH, i);
    } else if (c == '}' || c == ']') {
      if (--depth == 0)
        closed = true;
    }
  }
  return 0;
trailing:
  return attn_status_set(st, ATTN_PROTO_ESAFETENSORS,
                         "header byte %zu (file offset %zu): bytes other than spaces "
                         "follow the JSON object",
                         i, i + 8);
}

/* A JSON number that is an integer in [0, 2^53). */
static bool as_index(const cJSON *j, uint64_t *out) {
  double d = j->valuedouble;
  if (!(d >= 0 && d < EXACT_LIMIT) || d != floor(d))
    return false;
  *out = (uint64_t)d;
  return true;
}

static void dims_str(char *buf, size_t cap, const uint64_t *d, int rank) {
  size_t o = (size_t)snprintf(buf, cap, "[");
  for (int i = 0; i < rank && o < cap; i++)
    o += (size_t)snprintf(buf + o, cap - o, i ? ", %llu" : "%llu", (unsigned long long)d[i]);
  if (o < cap)
    snprintf(buf + o, cap - o, "]");
}

int attn__st_entry_parse(const cJSON *j, const char *name, uint64_t data_len, entry *e,
                         attn_status *st) {
  char q[48];
  if (!cJSON_IsObject(j))
    return attn_status_set(st, ATTN_PROTO_ESAFETENSORS,
                           "tensor \"%s\" must be an object {\"dtype\", \"shape\", "
                           "\"data_offsets\"}, not %s",
                           name, attn__json_type(j));
  const cJSON *f[3] = {NULL, NULL, NULL};
  for (const cJSON *c = j->child; c; c = c->next) {
    int i = 0;
    while (i < 3 && strcmp(c->string, field_names[i]))
      i++;
    if (i == 3)
      return attn_status_set(st, ATTN_PROTO_ESAFETENSORS,
                             "tensor \"%s\" has the unknown field \"%s\" (fields: dtype, "
                             "shape, data_offsets)",
                             name, attn_quote(q, sizeof q, c->string, strlen(c->string)));
    if (f[i])
      return attn_status_set(st, ATTN_PROTO_ESAFETENSORS,
                             "tensor \"%s\" has the field \"%s\" twice", name, field_names[i]);
    f[i] = c;
  }
  for (int i = 0; i < 3; i++)
    if (!f[i])
      return attn_status_set(st, ATTN_PROTO_ESAFETENSORS, "tensor \"%s\" lacks the field \"%s\"",
                             name, field_names[i]);

  if (!cJSON_IsString(f[0]))
    return attn_status_set(st, ATTN_PROTO_ESAFETENSORS,
                           "tensor \"%s\": dtype must be a string such as \"F32\", not %s", name,
                           attn__json_type(f[0]));
  const char *dtn = f[0]->valuestring;
  bool cu = !strncmp(name, "cu_seqlens_", 11);
  bool qt = !cu && e->quant_ok && attn_kv_quant_parse(dtn, &e->quant) == 0;
  if (!qt &&
      (cu ? !(e->cu_bytes = attn_proto_cu_dtype_bytes(dtn)) : attn_dtype_parse(dtn, &e->dtype) < 0))
    return attn_status_set(st, ATTN_PROTO_ETENSOR,
                           "tensor \"%s\": dtype \"%s\" is not supported (%s)", name,
                           attn_quote(q, sizeof q, dtn, strlen(dtn)),
                           cu            ? "I32 or I64"
                           : e->quant_ok ? "F32, F16, BF16, F8_E4M3 or I8"
                                         : "F32, F16 or BF16");
  uint64_t es = cu ? (uint64_t)e->cu_bytes : qt ? 1 : attn_dtype_size(e->dtype);

  if (!cJSON_IsArray(f[1]))
    return attn_status_set(st, ATTN_PROTO_ESAFETENSORS,
                           "tensor \"%s\": shape must be an array of integers, not %s", name,
                           attn__json_type(f[1]));
  uint64_t dims[MAX_RANK];
  int rank = 0;
  for (const cJSON *c = f[1]->child; c; c = c->next, rank++) {
    if (rank == MAX_RANK)
      return attn_status_set(st, ATTN_PROTO_ETENSOR,
                             "tensor \"%s\": shape has more than %d dimensions", name, MAX_RANK);
    if (!cJSON_IsNumber(c))
      return attn_status_set(st, ATTN_PROTO_ESAFETENSORS,
                             "tensor \"%s\": shape[%d] must be an integer, not %s", name, rank,
                             attn__json_type(c));
    if (!as_index(c, &dims[rank]))
      return attn_status_set(st, ATTN_PROTO_ETENSOR,
                             "tensor \"%s\": shape[%d] is %.17g; a dimension is an integer "
                             "from 0 to 2^53-1",
                             name, rank, c->valuedouble);
  }
  char sh[160];
  /* A zero dimension makes the product zero whatever the others are; only
   * then does the order of the multiplications not matter. */
  uint64_t count = 1;
  bool zero = false;
  for (int i = 0; i < rank; i++)
    zero |= dims[i] == 0;
  for (int i = 0; i < rank && !zero; i++) {
    if (count > UINT64_MAX / dims[i] || count * dims[i] > UINT64_MAX / es) {
      dims_str(sh, sizeof sh, dims, rank);
      return attn_status_set(st, ATTN_PROTO_ETENSOR,
                             "tensor \"%s\": shape %s holds more bytes than 64-bit sizes "
                             "can count",
                             name, sh);
    }
    count *= dims[i];
  }
  uint64_t nbytes = zero ? 0 : count * es;
  e->rank = rank;
  for (int i = 0; i < 4; i++)
    e->shape[i] = i < rank ? (int64_t)dims[i] : 0;

  const cJSON *off = f[2];
  if (!cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2)
    return attn_status_set(st, ATTN_PROTO_ESAFETENSORS,
                           "tensor \"%s\": data_offsets must be an array [begin, end], not "
                           "%s%s",
                           name, attn__json_type(off),
                           cJSON_IsArray(off) ? " of another length" : "");
  uint64_t be[2];
  int i = 0;
  for (const cJSON *c = off->child; c; c = c->next, i++) {
    if (!cJSON_IsNumber(c))
      return attn_status_set(st, ATTN_PROTO_ESAFETENSORS,
                             "tensor \"%s\": data_offsets[%d] must be an integer, not %s", name, i,
                             attn__json_type(c));
    if (!as_index(c, &be[i]))
      return attn_status_set(st, ATTN_PROTO_ESAFETENSORS,
                             "tensor \"%s\": data_offsets[%d] is %.17g; an offset is an "
                             "integer >= 0",
                             name, i, c->valuedouble);
  }
  unsigned long long b = be[0], en = be[1];
  if (b > en)
    return attn_status_set(st, ATTN_PROTO_ESAFETENSORS,
                           "tensor \"%s\": data_offsets [%llu, %llu] begin after they end", name, b,
                           en);
  if (en > data_len)
    return attn_status_set(st, ATTN_PROTO_ESAFETENSORS,
                           "tensor \"%s\": data_offsets [%llu, %llu] end past the %llu bytes "
                           "of data",
                           name, b, en, (unsigned long long)data_len);
  if (en - b != nbytes) {
    dims_str(sh, sizeof sh, dims, rank);
    return attn_status_set(st, ATTN_PROTO_ESAFETENSORS,
                           "tensor \"%s\": data_offsets [%llu, %llu] span %llu bytes but %s "
                           "%s needs %llu",
                           name, b, en, en - b, cu || qt ? dtn : attn_dtype_name(e->dtype), sh,
                           (unsigned long long)nbytes);
  }
  e->begin = b;
  e->end = en;
  return 0;
}

/* __metadata__ carries options as strings, through the one option parser. */
static int parse_metadata(const cJSON *j, attn_options *meta, attn_status *st) {
  char q[48];
  if (!cJSON_IsObject(j))
    return attn_status_set(st, ATTN_PROTO_ESAFETENSORS,
                           "__metadata__ must be an object of strings, not %s", attn__json_type(j));
  for (const cJSON *c = j->child; c; c = c->next) {
    /* Every key before c passed attn_options_set, so there are at most six
     * of them: the quadratic look-back stays cheap whatever the header. */
    for (const cJSON *p = j->child; p != c; p = p->next)
      if (!strcmp(p->string, c->string))
        return attn_status_set(st, ATTN_PROTO_ESAFETENSORS, "__metadata__ has the key \"%s\" twice",
                               attn_quote(q, sizeof q, c->string, strlen(c->string)));
    if (!cJSON_IsString(c))
      return attn_status_set(
          st, ATTN_PROTO_EOPTVALUE, "__metadata__ value of \"%s\" must be a string, not %s",
          attn_quote(q, sizeof q, c->string, strlen(c->string)), attn__json_type(c));
    /* Writers such as PyTorch's tag files {"format": "pt"}: a convention of
     * the format, not an option, so it is the one key let through. */
    if (!strcmp(c->string, "format"))
      continue;
    int rc = attn_options_set(meta, c->string, strlen(c->string), c->valuestring,
                              strlen(c->valuestring), "__metadata__", st);
    if (rc < 0)
      return rc;
  }
  return 0;
}

/* The tensors must tile the data buffer exactly, as the published format
 * requires: sharing bytes would alias one input with another, and a hole
 * or a tail of bytes belonging to no tensor is how polyglot files hide
 * content. Empty tensors occupy nothing, wherever they point. */
int attn__st_layout(const entry *e, const char *const *names, int ne, uint64_t data_len,
                    attn_status *st) {
  int *idx = malloc((size_t)(ne ? ne : 1) * sizeof *idx), n = 0, rc = 0;
  if (!idx)
    return attn_status_set(st, ATTN_PROTO_ENOMEM, "out of memory checking a safetensors layout");
  for (int i = 0; i < ne; i++)
    if (e[i].end > e[i].begin)
      idx[n++] = i;
  for (int i = 1; i < n; i++)
    for (int j = i; j > 0 && e[idx[j]].begin < e[idx[j - 1]].begin; j--) {
      int t = idx[j];
      idx[j] = idx[j - 1];
      idx[j - 1] = t;
    }
  for (int i = 1; i < n && rc == 0; i++) {
    const entry *a = &e[idx[i - 1]], *b = &e[idx[i]];
    if (b->begin < a->end)
      rc = attn_status_set(st, ATTN_PROTO_ESAFETENSORS,
                           "tensors \"%s\" at data_offsets [%llu, %llu] and \"%s\" at "
                           "[%llu, %llu] overlap",
                           names[idx[i - 1]], (unsigned long long)a->begin,
                           (unsigned long long)a->end, names[idx[i]], (unsigned long long)b->begin,
                           (unsigned long long)b->end);
    else if (b->begin > a->end)
      rc = attn_status_set(st, ATTN_PROTO_ESAFETENSORS,
                           "data bytes [%llu, %llu) between tensors \"%s\" and \"%s\" "
                           "belong to no tensor",
                           (unsigned long long)a->end, (unsigned long long)b->begin,
                           names[idx[i - 1]], names[idx[i]]);
  }
  uint64_t first = n ? e[idx[0]].begin : 0, last = n ? e[idx[n - 1]].end : 0;
  free(idx);
  if (rc == 0 && first > 0)
    rc = attn_status_set(st, ATTN_PROTO_ESAFETENSORS,
                         "data bytes [0, %llu) before the first tensor belong to no tensor",
                         (unsigned long long)first);
  if (rc == 0 && last < data_len)
    rc = attn_status_set(st, ATTN_PROTO_ESAFETENSORS,
                         "data bytes [%llu, %llu) after the last tensor belong to no tensor",
                         (unsigned long long)last, (unsigned long long)data_len);
  return rc;
}

static int check_layout(const entry e[NT], uint64_t data_len, attn_status *st) {
  const char *names[NT];
  for (int i = 0; i < NT; i++)
    names[i] = attn_proto_tensor_name(i);
  return attn__st_layout(e, names, NT, data_len, st);
}

/* Header entry c, a tensor: which of the pass's it is, into e[]. */
static int tensor_entry(const cJSON *c, attn_pass pass, uint64_t data_len, entry e[NT],
                        attn_status *st) {
  char q[48];
  int i = 0;
  while (i < NT &&
         !(attn_proto_tensor_in_pass(i, pass) && !strcmp(c->string, attn_proto_tensor_name(i))))
    i++;
  if (i == NT)
    return attn_status_set(st, ATTN_PROTO_EUNKNOWNTENSOR, "unknown tensor \"%s\"; send exactly %s",
                           attn_quote(q, sizeof q, c->string, strlen(c->string)),
                           attn_proto_tensor_list(pass));
  if (e[i].seen)
    return attn_status_set(st, ATTN_PROTO_ESAFETENSORS, "the header has the tensor \"%s\" twice",
                           attn_proto_tensor_name(i));
  e[i].seen = true;
  return attn__st_entry_parse(c, attn_proto_tensor_name(i), data_len, &e[i], st);
}

/* Walks the parsed header: tensors into e[], options into meta. */
static int parse_root(const cJSON *root, attn_pass pass, uint64_t data_len, entry e[NT],
                      attn_options *meta, bool partial, attn_status *st) {
  bool have_meta = false;
  int rc;
  for (const cJSON *c = root->child; c; c = c->next) {
    if (strcmp(c->string, "__metadata__")) {
      if ((rc = tensor_entry(c, pass, data_len, e, st)) < 0)
        return rc;
      continue;
    }
    if (have_meta)
      return attn_status_set(st, ATTN_PROTO_ESAFETENSORS,
                             "the header has the key \"__metadata__\" twice");
    have_meta = true;
    if ((rc = parse_metadata(c, meta, st)) < 0)
      return rc;
  }
  for (int i = 0; i < NT && !partial; i++)
    if (!e[i].seen && attn__tensor_required(i, pass, meta))
      return attn_status_set(st, ATTN_PROTO_EMISSING,
                             "tensor \"%s\" is missing; the file must hold %s",
                             attn_proto_tensor_name(i), attn_proto_tensor_list(pass));
  return check_layout(e, data_len, st);
}

/* The header's JSON: checked bytes, parsed, walked (partial: a file that
 * may leave out any tensor). */
static int parse_header(const unsigned char *hdr, size_t n, attn_pass pass, uint64_t data_len,
                        entry e[NT], attn_options *meta, bool partial, attn_status *st) {
  int rc = scan_header(hdr, n, st);
  if (rc < 0)
    return rc;
  const char *end = NULL;
  _Alignas(16) char buf[8192];
  attn__scratch scratch;
  attn__scratch_begin(&scratch, buf, sizeof buf);
  cJSON *root = cJSON_ParseWithLengthOpts((const char *)hdr, n, &end, 0);
  if (!root) {
    size_t at = end ? (size_t)(end - (const char *)hdr) : 0;
    rc = attn_status_set(st, ATTN_PROTO_ESAFETENSORS,
                         "the header is not valid JSON (error near header byte %zu, file "
                         "offset %zu)",
                         at, at + 8);
  } else if (!cJSON_IsObject(root)) {
    rc = attn_status_set(st, ATTN_PROTO_ESAFETENSORS,
                         "the header is %s, not a JSON object of tensors", attn__json_type(root));
  } else {
    rc = parse_root(root, pass, data_len, e, meta, partial, st);
  }
  cJSON_Delete(root);
  attn__scratch_end(&scratch);
  return rc;
}

/* The tensors e[] found, in place where aligned, else copied into
 * pr->owned[]; a tensor not sent has data NULL. */
static int place_tensors(const unsigned char *data, const entry e[NT], attn_proto_req *pr,
                         attn_proto_tensor t[NT], attn_status *st) {
  memset(t, 0, NT * sizeof *t);
  for (int i = 0; i < NT; i++) {
    t[i].name = attn_proto_tensor_name(i);
    if (!e[i].seen)
      continue;
    const unsigned char *p = data + e[i].begin;
    if (e[i].cu_bytes) { /* offsets: widened to int64 whatever their width */
      int64_t *w;
      int rc = attn_proto_cu_widen(p, (size_t)(e[i].end - e[i].begin) / (size_t)e[i].cu_bytes,
                                   e[i].cu_bytes, &w, st);
      pr->owned[i] = rc < 0 ? NULL : w;
      if (rc < 0)
        return rc;
      t[i].rank = e[i].rank;
      memcpy(t[i].shape, e[i].shape, sizeof t[i].shape);
      t[i].data = pr->owned[i];
      continue;
    }
    size_t nb = (size_t)(e[i].end - e[i].begin), es = attn_dtype_size(e[i].dtype);
    /* Kernels load whole elements; reading a misaligned one is undefined
     * behaviour, so such a tensor gets an aligned copy. */
    if ((uintptr_t)p % es) {
      pr->owned[i] = malloc(nb ? nb : 1);
      if (!pr->owned[i])
        return attn_status_set(st, ATTN_PROTO_ENOMEM,
                               "out of memory copying tensor \"%s\" (%zu bytes)", t[i].name, nb);
      memcpy(pr->owned[i], p, nb);
      p = pr->owned[i];
    }
    t[i].dtype = e[i].dtype;
    t[i].rank = e[i].rank;
    memcpy(t[i].shape, e[i].shape, sizeof t[i].shape);
    t[i].data = p;
  }
  return 0;
}

/* The 8-byte header length, checked against the body; 0 or an error. */
static int header_length(const unsigned char *b, size_t len, uint64_t *pn, attn_status *st) {
  if (len == 0 || !b)
    return attn_status_set(st, ATTN_PROTO_EEMPTY,
                           "the request body is empty; send a safetensors file");
  if (len < 8)
    return attn_status_set(st, ATTN_PROTO_ESAFETENSORS,
                           "body of %zu bytes is shorter than the 8-byte header length", len);
  uint64_t n = 0;
  for (int i = 0; i < 8; i++)
    n |= (uint64_t)b[i] << (8 * i);
  if (n == 0)
    return attn_status_set(st, ATTN_PROTO_ESAFETENSORS,
                           "header length is 0; the header must be a JSON object");
  /* A length the body cannot hold means the bytes are not safetensors (ten
   * bytes of text or an image read as a length give ~2^60): malformed, 400.
   * Only a header the body really holds can be over the cap, 413; a
   * streaming reader that knows the body's length (Content-Length) can still
   * give either verdict after eight bytes. */
  if (n > len - 8)
    return attn_status_set(st, ATTN_PROTO_ESAFETENSORS,
                           "header length %llu runs past the end of the body: only %zu "
                           "bytes follow the 8-byte length",
                           (unsigned long long)n, len - 8);
  if (n > ATTN_PROTO_MAX_HEADER)
    return attn_status_set(st, ATTN_PROTO_ETOOLARGE,
                           "header length %llu is over the limit of %u bytes",
                           (unsigned long long)n, ATTN_PROTO_MAX_HEADER);
  *pn = n;
  return 0;
}

int attn__st_open(const void *body, size_t len, cJSON **proot, const unsigned char **pdata,
                  uint64_t *pdata_len, attn_status *st) {
  const unsigned char *b = body;
  uint64_t n = 0;
  int rc = header_length(b, len, &n, st);
  rc = rc < 0 ? rc : scan_header(b + 8, (size_t)n, st);
  if (rc < 0)
    return rc;
  const char *end = NULL;
  cJSON *root = cJSON_ParseWithLengthOpts((const char *)b + 8, (size_t)n, &end, 0);
  if (!root || !cJSON_IsObject(root)) {
    cJSON_Delete(root);
    return attn_status_set(st, ATTN_PROTO_ESAFETENSORS, "the header is not a JSON object");
  }
  *proot = root;
  *pdata = b + 8 + n;
  *pdata_len = len - 8 - n;
  return 0;
}

int attn__st_tensors(const void *body, size_t len, attn_pass pass, const attn_options *query,
                     attn_proto_req *pr, attn_proto_tensor t[NT], attn_options *opts,
                     attn_status *st) {
  const unsigned char *b = body;
  uint64_t n = 0;
  memset(pr, 0, sizeof *pr);
  int rc = header_length(b, len, &n, st);
  if (rc < 0)
    return rc;
  const unsigned char *hdr = b + 8, *data = hdr + n;
  entry e[NT];
  memset(e, 0, sizeof e);
  attn_options meta;
  attn_options_init(&meta);
  meta.fields = query ? query->fields : NULL; /* they may sit in __metadata__ */
  if ((rc = parse_header(hdr, (size_t)n, pass, len - 8 - n, e, &meta, false, st)) < 0)
    return rc;
  if (query)
    *opts = *query;
  else
    attn_options_init(opts);
  attn_options_merge(opts, &meta);
  return place_tensors(data, e, pr, t, st);
}

int attn_proto_decode_safetensors_pass(const void *body, size_t len, attn_pass pass,
                                       const attn_options *query, attn_proto_req *pr,
                                       attn_status *st) {
  attn_proto_tensor t[NT];
  attn_options opts;
  int rc = attn__st_tensors(body, len, pass, query, pr, t, &opts, st);
  if (rc == 0)
    rc = attn_proto_build_pass(pr, pass, t, &opts, st);
  if (rc < 0)
    attn_proto_req_free(pr);
  return rc;
}

int attn_proto_decode_safetensors(const void *body, size_t len, const attn_options *query,
                                  attn_proto_req *pr, attn_status *st) {
  return attn_proto_decode_safetensors_pass(body, len, ATTN_FORWARD, query, pr, st);
}

int attn_proto_safetensors_tensor(const void *body, size_t len, int which, attn_proto_tensor *t,
                                  void **pcopy, attn_status *st) {
  const unsigned char *b = body;
  uint64_t n = 0;
  entry e[NT];
  memset(e, 0, sizeof e);
  memset(t, 0, sizeof *t);
  *pcopy = NULL;
  attn_options meta;
  attn_options_init(&meta);
  int rc = header_length(b, len, &n, st);
  if (rc < 0 ||
      (rc = parse_header(b + 8, (size_t)n, ATTN_FORWARD, len - 8 - n, e, &meta, true, st)) < 0)
    return rc;
  if (which < 0 || which >= NT || !e[which].seen)
    return 0;
  attn_proto_req pr;
  attn_proto_tensor all[NT];
  memset(&pr, 0, sizeof pr);
  if ((rc = place_tensors(b + 8 + n, e, &pr, all, st)) == 0) {
    size_t nb = (size_t)(e[which].end - e[which].begin);
    size_t es = e[which].cu_bytes ? sizeof(int64_t) : attn_dtype_size(e[which].dtype);
    if (e[which].cu_bytes) /* widened: 8 bytes an offset */
      nb = nb / (size_t)e[which].cu_bytes * es;
    *t = all[which];
    if (!(*pcopy = malloc(nb ? nb : 1)))
      rc = attn_status_set(st, ATTN_PROTO_ENOMEM, "out of memory copying tensor \"%s\"", t->name);
    else
      memcpy(*pcopy, all[which].data, nb);
    t->data = *pcopy;
  }
  attn_proto_req_free(&pr);
  return rc;
}
