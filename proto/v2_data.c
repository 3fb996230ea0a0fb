/*
 * v2_data.c — the data of an Open Inference Protocol request's inputs
 * (v2.c decodes the rest): JSON "data", flat or nested to the shape, and
 * Triton's binary tensor extension, the inputs' bytes after the JSON in
 * the order of "inputs", each binary_data_size long, all of them adding up
 * to the body.
 */
#include "internal.h"
#include "proto.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
/*
 * "data" at v, flat ([n numbers]) or nested to the shape; mode check counts
 * and checks, store converts (after a check). level is the shape's
 * dimension the array at v spans when nested.
 */
static int data_walk(attn__v2_input *in, attn__jr *v, int level, bool flat, void *out, size_t *pos,
                     attn_status *st) {
  const attn_proto_tensor *t = &in->t;
  size_t want = flat ? in->count : (size_t)t->shape[level];
  if (!out && attn__jr_count(v) != want)
    return attn_status_set(st, ATTN_PROTO_ETENSOR,
                           flat ? "input \"%s\": the shape needs %zu values, data has %zu"
                                : "input \"%s\": a row of data has %zu elements where the shape "
                                  "says %zu",
                           t->name, flat ? want : attn__jr_count(v),
                           flat ? attn__jr_count(v) : want);
  bool leaf = flat || level == t->rank - 1;
  int rc;
  while (attn__jr_elem(v)) {
    if (leaf != attn__jr_is_number(v) || (!leaf && v->s[v->pos] != '['))
      return attn_status_set(st, ATTN_PROTO_ETENSOR,
                             "input \"%s\": data element %zu is %s where %s belongs", t->name, *pos,
                             attn__jr_type(v), leaf ? "a number" : "an array (the shape's rows)");
    if (!leaf) {
      if ((rc = data_walk(in, v, level + 1, false, out, pos, st)) < 0)
        return rc;
      continue;
    }
    if (!out) {
      attn__jr_skip(v);
    } else {
      double x = attn__jr_number(v);
      if (attn__json_store(out, t->dtype, *pos, x) < 0) {
        char where[40];
        snprintf(where, sizeof where, "data element %zu", *pos);
        return attn__json_store_error(x, t->dtype, t->name, where, st);
      }
    }
    ++*pos;
  }
  return 0;
}

static int input_json_data(attn__v2_dec *d, attn__v2_input *in, void **owned) {
  attn__jr v = d->j;
  v.pos = in->at_data;
  if (in->cu_bytes) /* the /attention codec's reader: int64 offsets */
    return attn__json_cu_data(v, &in->t, in->count, in->cu_bytes, owned, d->st);
  if (v.s[v.pos] != '[')
    return attn_status_set(d->st, ATTN_PROTO_ETENSOR,
                           "input \"%s\": data must be an array of numbers, not %s", in->t.name,
                           attn__jr_type(&v));
  attn__jr first = v;
  bool flat = !attn__jr_elem(&first) || first.s[first.pos] != '[';
  size_t pos = 0;
  attn__jr w = v;
  int rc = data_walk(in, &w, 0, flat, NULL, &pos, d->st);
  if (rc < 0)
    return rc;
  size_t esz = attn_dtype_size(in->t.dtype);
  *owned = malloc(in->count ? in->count * esz : 1);
  if (!*owned)
    return attn_status_set(d->st, ATTN_PROTO_ENOMEM, "out of memory for input \"%s\"", in->t.name);
  pos = 0;
  w = v;
  if ((rc = data_walk(in, &w, 0, flat, *owned, &pos, d->st)) < 0)
    return rc;
  in->t.data = *owned;
  return 0;
}

/* The binary inputs' bytes, in the order of "inputs" (*off: where the next
 * one starts, from the end of the JSON). */
static int input_binary(attn__v2_dec *d, attn__v2_input *in, size_t *off, void **owned) {
  size_t esz = in->cu_bytes ? (size_t)in->cu_bytes : attn_dtype_size(in->t.dtype);
  size_t want = in->count * esz;
  size_t have = d->len - d->json_len - *off;
  if ((uint64_t)in->binary != want)
    return attn_status_set(d->st, ATTN_PROTO_EFRAMING,
                           "input \"%s\": binary_data_size %lld does not match its shape and "
                           "datatype (%zu values of %zu bytes: %zu bytes)",
                           in->t.name, (long long)in->binary, in->count, esz, want);
  if (want > have)
    return attn_status_set(d->st, ATTN_PROTO_EFRAMING,
                           "input \"%s\" needs %zu bytes of binary data but only %zu follow the "
                           "JSON (Inference-Header-Content-Length %zu)",
                           in->t.name, want, have, d->json_len);
  const char *p = d->body + d->json_len + *off;
  *off += want;
  if (in->cu_bytes) { /* offsets: widened to int64 whatever their width */
    int rc = attn_proto_cu_widen(p, in->count, in->cu_bytes, (int64_t **)owned, d->st);
    in->t.data = *owned;
    return rc;
  }
  /* Kernels load whole elements: a misaligned input gets an aligned copy. */
  if ((uintptr_t)p % esz) {
    if (!(*owned = malloc(want ? want : 1)))
      return attn_status_set(d->st, ATTN_PROTO_ENOMEM, "out of memory for input \"%s\"",
                             in->t.name);
    memcpy(*owned, p, want);
    p = *owned;
  }
  in->t.data = p;
  return 0;
}

/* Binary inputs take their bytes in the order they appear in "inputs". */
int attn__v2_input_data(attn__v2_dec *d) {
  int order[ATTN__V2_NIN], n = 0, rc;
  attn__jr v = d->j;
  v.pos = d->at_inputs;
  while (attn__jr_elem(&v) && n < ATTN__V2_NIN) {
    attn__jr x = v;
    char key[8], name[16];
    size_t klen;
    while (attn__jr_member(&x, key, sizeof key, &klen) && !attn__key_is(key, klen, "name"))
      attn__jr_skip(&x);
    size_t nl = attn__jr_string(&x, name, sizeof name); /* input_fields() knows it */
    int i = 0;
    while (i < ATTN__V2_NIN - 1 &&
           !attn__key_is(name, nl, attn_proto_tensor_name(attn__v2_slot(i))))
      i++;
    order[n++] = i;
    attn__jr_skip(&v);
  }
  size_t off = 0;
  for (int k = 0; k < n; k++) {
    attn__v2_input *in = &d->in[order[k]];
    void **owned = &d->pr->owned[attn__v2_slot(order[k])];
    if ((rc = in->binary >= 0 ? input_binary(d, in, &off, owned) : input_json_data(d, in, owned)) <
        0)
      return rc;
  }
  if (off != d->len - d->json_len)
    return attn_status_set(d->st, ATTN_PROTO_EFRAMING,
                           "%zu bytes follow the JSON (Inference-Header-Content-Length %zu) but "
                           "the inputs' binary_data_size add up to %zu",
                           d->len - d->json_len, d->json_len, off);
  return 0;
}
