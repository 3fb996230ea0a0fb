/*
 * v2.c — the Open Inference Protocol (KServe v2, as Triton speaks it over
 * HTTP), so that tritonclient, perf_analyzer and KServe's SDK talk to attnd
 * unmodified: the infer request decoder (JSON, and Triton's binary tensor
 * extension), the reply encoder, and the metadata documents.
 *
 * The decoder follows the JSON codec's rules (json.c): the JSON part is
 * pre-scanned and grammar-checked whole before anything is read, every key
 * is known or refused (a typo in a parameter must not change a result
 * unnoticed), numbers are converted straight into buffers of the input's
 * dtype, and options go through the one option parser. Binary inputs are
 * read in place when aligned, else copied once; the sizes must add up
 * exactly. What it finds ends in attn_proto_build(), which holds the shape
 * rules every codec shares.
 */
#include "internal.h"
#include "proto.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const model_names[ATTN_V2_NMODELS] = {"attention", "attention_fp16",
                                                         "attention_bf16"};
static const attn_dtype model_dtypes[ATTN_V2_NMODELS] = {ATTN_F32, ATTN_F16, ATTN_BF16};
static const char *const out_names[ATTN_V2_NOUTS] = {"o", "m", "l", "lse"};

/* Parameters the protocol reserves for features attnd does not have: named
 * as such rather than as unknown, so the user learns it is not a typo. */
static const char *const reserved_request[] = {"sequence_id",
                                               "sequence_start",
                                               "sequence_end",
                                               "priority",
                                               "timeout",
                                               "shared_memory_region",
                                               "shared_memory_byte_size",
                                               "shared_memory_offset",
                                               "headers",
                                               "triton_enable_empty_final_response"};
static const char *const reserved_tensor[] = {"shared_memory_region", "shared_memory_byte_size",
                                              "shared_memory_offset", "classification"};

int attn_proto_v2_model(const char *name, size_t len) {
  for (int i = 0; i < ATTN_V2_NMODELS; i++)
    if (strlen(model_names[i]) == len && !memcmp(model_names[i], name, len))
      return i;
  return -1;
}

const char *attn_proto_v2_model_name(int model) {
  return model >= 0 && model < ATTN_V2_NMODELS ? model_names[model] : NULL;
}

const char *attn_proto_v2_datatype(attn_dtype dt) {
  return dt == ATTN_F16 ? "FP16" : dt == ATTN_BF16 ? "BF16" : "FP32";
}

static int parse_datatype(const char *s, attn_dtype *dt) {
  static const char *const names[3] = {"FP32", "FP16", "BF16"};
  static const attn_dtype dts[3] = {ATTN_F32, ATTN_F16, ATTN_BF16};
  for (int i = 0; i < 3; i++)
    if (!strcmp(s, names[i])) {
      *dt = dts[i];
      return 0;
    }
  return -1;
}

static bool key_is(const char *key, size_t klen, const char *want) {
  return klen == strlen(want) && !memcmp(key, want, klen);
}

static bool in_list(const char *key, size_t klen, const char *const *list, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (key_is(key, klen, list[i]))
      return true;
  return false;
}

/* A client's key for a message: cut and escaped. */
static const char *qkey(char *dst, size_t cap, const char *key, size_t klen, size_t kcap) {
  return attn_quote(dst, cap, key, klen < kcap ? klen : kcap - 1);
}

/* ---- decoding: the pieces --------------------------------------------------- */

/* The inputs: q, k, v and the optional alibi_slopes, cu_seqlens_q and
 * cu_seqlens_kv, in that order here; v2_slot() gives each one's place in
 * the codecs' tensor table. */
enum { V2_NIN = 6, V2_ALIBI = 3, V2_CU_Q = 4 };
static int v2_slot(int i) { return i < V2_ALIBI ? i : ATTN_PROTO_T_ALIBI + (i - V2_ALIBI); }
static bool v2_is_cu(int i) { return i >= V2_CU_Q; }

typedef struct v2_input {
  attn_proto_tensor t;
  size_t at_data; /* where "data" starts (0: absent) */
  int64_t binary; /* binary_data_size, or -1 */
  size_t count;   /* elements of the shape */
  int cu_bytes;   /* cu_seqlens: 4 (INT32) or 8 (INT64) on the wire; else 0 */
} v2_input;

typedef struct v2_dec {
  const char *body;
  size_t len, json_len;
  attn__jr j;
  attn_proto_req *pr;
  attn_v2_info *info;
  attn_options opts;
  bool bin_out, bin_out_set;
  v2_input in[V2_NIN];
  size_t at_inputs, at_outputs, at_params;
  attn_status *st;
} v2_dec;

/* A boolean parameter's value at v. */
static int get_bool(attn__jr v, const char *what, bool *out, attn_status *st) {
  char c = v.s[v.pos];
  if (c != 't' && c != 'f')
    return attn_status_set(st, ATTN_PROTO_EOPTVALUE, "%s must be true or false, not %s", what,
                           attn__jr_type(&v));
  *out = c == 't';
  return 0;
}

/* The request's "parameters": the options, and binary_data_output. */
static int request_params(v2_dec *d, attn__jr v) {
  char key[64], qk[48];
  size_t klen;
  attn__seen seen = {0};
  int rc;
  if (v.s[v.pos] != '{')
    return attn_status_set(d->st, ATTN_PROTO_EJSON, "\"parameters\" must be an object, not %s",
                           attn__jr_type(&v));
  while (attn__jr_member(&v, key, sizeof key, &klen)) {
    size_t kl = klen < sizeof key ? klen : sizeof key - 1;
    qkey(qk, sizeof qk, key, klen, sizeof key);
    if (!attn__seen_first(&seen, key, klen)) /* refused as /attention refuses one */
      return attn_status_set(d->st, ATTN_PROTO_EJSON, "duplicate key \"%s\" in \"parameters\"", qk);
    if (key_is(key, klen, "binary_data_output")) {
      if ((rc = get_bool(v, "parameter \"binary_data_output\"", &d->bin_out, d->st)) < 0)
        return rc;
      d->bin_out_set = true;
    } else if (in_list(key, klen, reserved_request, sizeof reserved_request / sizeof(char *))) {
      return attn_status_set(d->st, ATTN_PROTO_EOPTION,
                             "parameter \"%s\" is reserved by the inference protocol for a "
                             "feature attnd does not implement; leave it out",
                             qk);
    } else if (key_is(key, klen, "stats") || attn_option_kind_of(key, kl) == ATTN_OPTK_NONE) {
      return attn_status_set(
          d->st, ATTN_PROTO_EOPTION,
          "unknown parameter \"%s\" (parameters: causal, scale, window_left, "
          "window_right, softcap, diag_offset, backend, binary_data_output; name the statistics "
          "m, l, lse in \"outputs\" to get them)",
          qk);
    } else if ((rc = attn__json_option(&d->opts, key, kl, v, "parameters", d->st)) < 0) {
      return rc;
    }
    attn__jr_skip(&v);
  }
  return 0;
}

/* The request object's keys: where inputs, outputs and parameters start;
 * the id. */
static int request_keys(v2_dec *d) {
  char key[64], qk[48];
  size_t klen;
  bool seen_id = false;
  attn__jr *j = &d->j;
  while (attn__jr_member(j, key, sizeof key, &klen)) {
    size_t *at = key_is(key, klen, "inputs")       ? &d->at_inputs
                 : key_is(key, klen, "outputs")    ? &d->at_outputs
                 : key_is(key, klen, "parameters") ? &d->at_params
                                                   : NULL;
    qkey(qk, sizeof qk, key, klen, sizeof key);
    if (!at && !key_is(key, klen, "id"))
      return attn_status_set(d->st, ATTN_PROTO_EJSON,
                             "unknown key \"%s\" in the request (keys: id, inputs, outputs, "
                             "parameters)",
                             qk);
    if ((at && *at) || (!at && seen_id))
      return attn_status_set(d->st, ATTN_PROTO_EJSON, "duplicate key \"%s\" in the request", qk);
    if (at) {
      *at = j->pos;
    } else {
      if (j->s[j->pos] != '"')
        return attn_status_set(d->st, ATTN_PROTO_EJSON, "\"id\" must be a string, not %s",
                               attn__jr_type(j));
      attn__jr v = *j;
      size_t n = attn__jr_string(&v, d->info->id, sizeof d->info->id);
      if (n > ATTN_V2_MAX_ID || strlen(d->info->id) != n)
        return attn_status_set(d->st, ATTN_PROTO_EJSON,
                               "\"id\" must be a string of at most %d bytes without NUL",
                               ATTN_V2_MAX_ID);
      d->info->has_id = seen_id = true;
    }
    attn__jr_skip(j);
  }
  return 0;
}

/* "shape": 2 to 4 integers >= 0 (attn_proto_build() refuses zeros);
 * alibi_slopes 1 or 2 ([Hq] or [B, Hq]); cu_seqlens 1 ([B+1]). */
static int input_shape(attn__jr v, v2_input *in, attn_status *st) {
  const char *name = in->t.name;
  if (v.s[v.pos] != '[')
    return attn_status_set(st, ATTN_PROTO_ETENSOR,
                           "input \"%s\": shape must be an array of integers, not %s", name,
                           attn__jr_type(&v));
  int rank = (int)attn__jr_count(&v);
  const bool alibi = !strcmp(name, "alibi_slopes"), cu = in->cu_bytes != 0;
  if (cu ? rank != 1 : alibi ? rank < 1 || rank > 2 : rank < 2 || rank > 4)
    return attn_status_set(st, ATTN_PROTO_ETENSOR,
                           cu      ? "input \"%s\" has %d dimensions; use [B+1] (offsets)"
                           : alibi ? "input \"%s\" has %d dimensions; use [Hq] or [B, Hq]"
                                   : "input \"%s\" has %d dimensions; use [N, D], [H, N, D] or "
                                     "[B, H, N, D]",
                           name, rank);
  size_t n = 1;
  for (int i = 0; attn__jr_elem(&v); i++) {
    double x = attn__jr_is_number(&v) ? attn__jr_number(&v) : -1;
    if (!(x >= 0) || x != floor(x) || x > (double)ATTN_MAX_DIM)
      return attn_status_set(st, ATTN_PROTO_ETENSOR,
                             "input \"%s\": shape[%d] must be an integer from 0 to %lld", name, i,
                             (long long)ATTN_MAX_DIM);
    in->t.shape[i] = (int64_t)x;
    if (__builtin_mul_overflow(n, (size_t)x, &n))
      return attn_status_set(st, ATTN_PROTO_ETENSOR,
                             "input \"%s\": the shape's element count overflows", name);
  }
  in->t.rank = rank;
  in->count = n;
  return 0;
}

/* FP32, FP16 or BF16; for cu_seqlens (cu set) INT32 or INT64, which are
 * the codecs' I32 and I64. */
static int input_datatype(attn__jr v, v2_input *in, bool cu, attn_status *st) {
  char s[32], qs[48];
  if (v.s[v.pos] != '"')
    return attn_status_set(st, ATTN_PROTO_ETENSOR,
                           "input \"%s\": datatype must be a string, not %s", in->t.name,
                           attn__jr_type(&v));
  size_t n = attn__jr_string(&v, s, sizeof s);
  bool ok = n < sizeof s && strlen(s) == n;
  if (cu)
    ok = ok && (in->cu_bytes = !strcmp(s, "INT32") ? 4 : !strcmp(s, "INT64") ? 8 : 0) != 0;
  else
    ok = ok && parse_datatype(s, &in->t.dtype) == 0;
  if (!ok)
    return attn_status_set(st, ATTN_PROTO_ETENSOR,
                           "input \"%s\": datatype \"%s\" is not supported (use %s)", in->t.name,
                           qkey(qs, sizeof qs, s, n, sizeof s),
                           cu ? "INT32 or INT64" : "FP32, FP16 or BF16");
  return 0;
}

/* An input's "parameters": binary_data_size, nothing else. */
static int input_params(attn__jr v, v2_input *in, attn_status *st) {
  char key[64], qk[48];
  size_t klen;
  attn__seen seen = {0};
  if (v.s[v.pos] != '{')
    return attn_status_set(st, ATTN_PROTO_EJSON, "input \"%s\": parameters must be an object",
                           in->t.name);
  while (attn__jr_member(&v, key, sizeof key, &klen)) {
    qkey(qk, sizeof qk, key, klen, sizeof key);
    if (!attn__seen_first(&seen, key, klen))
      return attn_status_set(st, ATTN_PROTO_EJSON,
                             "input \"%s\": duplicate key \"%s\" in its parameters", in->t.name,
                             qk);
    if (!key_is(key, klen, "binary_data_size"))
      return attn_status_set(st, ATTN_PROTO_EOPTION,
                             "input \"%s\": parameter \"%s\" is %s (inputs take binary_data_size)",
                             in->t.name, qk,
                             in_list(key, klen, reserved_tensor, 4) ? "not supported" : "unknown");
    double x = attn__jr_is_number(&v) ? attn__jr_number(&v) : -1;
    if (!(x >= 0) || x != floor(x) || x > 0x1p53)
      return attn_status_set(st, ATTN_PROTO_EOPTVALUE,
                             "input \"%s\": binary_data_size must be an integer >= 0", in->t.name);
    in->binary = (int64_t)x;
  }
  return 0;
}

/* The input object at v: name first (for the messages), then the rest. */
static int input_fields(v2_dec *d, attn__jr v, int k) {
  static const char *const keys[5] = {"name", "shape", "datatype", "data", "parameters"};
  size_t at[5] = {0}, klen;
  char key[64], qk[48];
  if (v.s[v.pos] != '{')
    return attn_status_set(d->st, ATTN_PROTO_EJSON, "inputs[%d] must be an object, not %s", k,
                           attn__jr_type(&v));
  while (attn__jr_member(&v, key, sizeof key, &klen)) {
    int f = 0;
    while (f < 5 && !key_is(key, klen, keys[f]))
      f++;
    qkey(qk, sizeof qk, key, klen, sizeof key);
    if (f == 5 || at[f])
      return attn_status_set(d->st, ATTN_PROTO_EJSON,
                             "inputs[%d]: %s key \"%s\" (keys: name, shape, datatype, data, "
                             "parameters)",
                             k, f == 5 ? "unknown" : "duplicate", qk);
    at[f] = v.pos;
    attn__jr_skip(&v);
  }
  for (int f = 0; f < 3; f++)
    if (!at[f])
      return attn_status_set(d->st, ATTN_PROTO_EJSON, "inputs[%d] has no \"%s\"", k, keys[f]);
  attn__jr x = v;
  x.pos = at[0];
  char name[16];
  size_t n = x.s[x.pos] == '"' ? attn__jr_string(&x, name, sizeof name) : sizeof name;
  /* by length too: "q\u0000" is no input's name */
  int i = 0;
  while (i < V2_NIN && !(n < sizeof name && key_is(name, n, attn_proto_tensor_name(v2_slot(i)))))
    i++;
  if (i == V2_NIN)
    return attn_status_set(d->st, ATTN_PROTO_EUNKNOWNTENSOR,
                           "inputs[%d]: the name must be \"q\", \"k\", \"v\", "
                           "\"alibi_slopes\", \"cu_seqlens_q\" or \"cu_seqlens_kv\"",
                           k);
  v2_input *in = &d->in[i];
  if (in->t.name)
    return attn_status_set(d->st, ATTN_PROTO_ETENSOR, "input \"%s\" is given twice",
                           attn_proto_tensor_name(v2_slot(i)));
  in->t.name = attn_proto_tensor_name(v2_slot(i));
  in->at_data = at[3];
  int rc;
  x.pos = at[2];
  if ((rc = input_datatype(x, in, v2_is_cu(i), d->st)) < 0)
    return rc;
  x.pos = at[1];
  if ((rc = input_shape(x, in, d->st)) < 0)
    return rc;
  x.pos = at[4];
  if (at[4] && (rc = input_params(x, in, d->st)) < 0)
    return rc;
  if ((in->binary >= 0) == (at[3] != 0))
    return attn_status_set(d->st, ATTN_PROTO_ETENSOR,
                           "input \"%s\" needs either \"data\" or parameters.binary_data_size, "
                           "not %s",
                           in->t.name, at[3] ? "both" : "neither");
  return 0;
}

static int inputs(v2_dec *d) {
  attn__jr v = d->j;
  v.pos = d->at_inputs;
  if (!d->at_inputs || v.s[v.pos] != '[')
    return attn_status_set(d->st, d->at_inputs ? ATTN_PROTO_EJSON : ATTN_PROTO_EMISSING,
                           d->at_inputs ? "\"inputs\" must be an array of q, k and v"
                                        : "the request has no \"inputs\" (it needs q, k and v)");
  for (int i = 0; i < V2_NIN; i++)
    d->in[i].binary = -1;
  int rc;
  for (int k = 0; attn__jr_elem(&v); k++) {
    if ((rc = input_fields(d, v, k)) < 0)
      return rc;
    attn__jr_skip(&v);
  }
  for (int i = 0; i < 3; i++)
    if (!d->in[i].t.name)
      return attn_status_set(d->st, ATTN_PROTO_EMISSING,
                             "input \"%s\" is missing (the request needs q, k and v)",
                             attn_proto_tensor_name(i));
  return 0;
}

/* ---- decoding: the data ----------------------------------------------------- */

/*
 * "data" at v, flat ([n numbers]) or nested to the shape; mode check counts
 * and checks, store converts (after a check). level is the shape's
 * dimension the array at v spans when nested.
 */
static int data_walk(v2_input *in, attn__jr *v, int level, bool flat, void *out, size_t *pos,
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

static int input_json_data(v2_dec *d, v2_input *in, void **owned) {
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
static int input_binary(v2_dec *d, v2_input *in, size_t *off, void **owned) {
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
static int input_data(v2_dec *d) {
  int order[V2_NIN], n = 0, rc;
  attn__jr v = d->j;
  v.pos = d->at_inputs;
  while (attn__jr_elem(&v) && n < V2_NIN) {
    attn__jr x = v;
    char key[8], name[16];
    size_t klen;
    while (attn__jr_member(&x, key, sizeof key, &klen) && !key_is(key, klen, "name"))
      attn__jr_skip(&x);
    size_t nl = attn__jr_string(&x, name, sizeof name); /* input_fields() knows it */
    int i = 0;
    while (i < V2_NIN - 1 && !key_is(name, nl, attn_proto_tensor_name(v2_slot(i))))
      i++;
    order[n++] = i;
    attn__jr_skip(&v);
  }
  size_t off = 0;
  for (int k = 0; k < n; k++) {
    v2_input *in = &d->in[order[k]];
    void **owned = &d->pr->owned[v2_slot(order[k])];
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

/* ---- decoding: outputs -------------------------------------------------------- */

/* An output's name (the string at x): which of out_names, by its whole
 * length ("o\u0000" is none). */
static int output_name(v2_dec *d, attn__jr x, int k, int *which) {
  char name[16];
  size_t n = attn__jr_string(&x, name, sizeof name);
  for (int i = 0; i < ATTN_V2_NOUTS && n < sizeof name; i++)
    *which = key_is(name, n, out_names[i]) ? i : *which;
  if (*which < 0)
    return attn_status_set(d->st, ATTN_PROTO_EUNKNOWNTENSOR,
                           "outputs[%d]: the name must be \"o\", \"m\", \"l\" or \"lse\"", k);
  return 0;
}

/* An output's "parameters" (the object at x): binary_data, nothing else. */
static int output_params(v2_dec *d, attn__jr x, int k, bool *bin) {
  char pk[64], qp[48];
  size_t pl;
  attn__seen seen = {0};
  int rc;
  while (attn__jr_member(&x, pk, sizeof pk, &pl)) {
    qkey(qp, sizeof qp, pk, pl, sizeof pk);
    if (!attn__seen_first(&seen, pk, pl))
      return attn_status_set(d->st, ATTN_PROTO_EJSON,
                             "outputs[%d]: duplicate key \"%s\" in its parameters", k, qp);
    if (!key_is(pk, pl, "binary_data"))
      return attn_status_set(d->st, ATTN_PROTO_EOPTION,
                             "outputs[%d]: parameter \"%s\" is %s (outputs take binary_data)", k,
                             qp, in_list(pk, pl, reserved_tensor, 4) ? "not supported" : "unknown");
    if ((rc = get_bool(x, "parameter \"binary_data\"", bin, d->st)) < 0)
      return rc;
    attn__jr_skip(&x);
  }
  return 0;
}

/* One output's object at v: its name, and parameters.binary_data. */
static int output_one(v2_dec *d, attn__jr v, int k) {
  char key[64], qk[48];
  size_t klen;
  attn__seen seen = {0};
  int which = -1, rc;
  bool bin = d->bin_out;
  if (v.s[v.pos] != '{')
    return attn_status_set(d->st, ATTN_PROTO_EJSON, "outputs[%d] must be an object, not %s", k,
                           attn__jr_type(&v));
  while (attn__jr_member(&v, key, sizeof key, &klen)) {
    qkey(qk, sizeof qk, key, klen, sizeof key);
    if (!attn__seen_first(&seen, key, klen))
      return attn_status_set(d->st, ATTN_PROTO_EJSON, "outputs[%d]: duplicate key \"%s\"", k, qk);
    if (key_is(key, klen, "name") && v.s[v.pos] == '"')
      rc = output_name(d, v, k, &which);
    else if (key_is(key, klen, "parameters") && v.s[v.pos] == '{')
      rc = output_params(d, v, k, &bin);
    else
      rc = attn_status_set(d->st, ATTN_PROTO_EJSON,
                           "outputs[%d]: unexpected key \"%s\" (keys: name, a string, and "
                           "parameters, an object)",
                           k, qk);
    if (rc < 0)
      return rc;
    attn__jr_skip(&v);
  }
  if (which < 0)
    return attn_status_set(d->st, ATTN_PROTO_EJSON, "outputs[%d] has no \"name\"", k);
  if (d->info->outputs & 1u << which)
    return attn_status_set(d->st, ATTN_PROTO_EJSON, "output \"%s\" is asked for twice",
                           out_names[which]);
  d->info->outputs |= 1u << which;
  d->info->binary |= bin ? 1u << which : 0;
  return 0;
}

static int outputs(v2_dec *d) {
  unsigned all = (1u << ATTN_V2_NOUTS) - 1;
  if (!d->at_outputs) { /* the protocol's default: every output */
    d->info->outputs = all;
    d->info->binary = d->bin_out ? all : 0;
    return 0;
  }
  attn__jr v = d->j;
  v.pos = d->at_outputs;
  if (v.s[v.pos] != '[' || attn__jr_count(&v) == 0)
    return attn_status_set(d->st, ATTN_PROTO_EJSON,
                           "\"outputs\" must be a non-empty array (leave it out for all of o, "
                           "m, l and lse)");
  int rc;
  for (int k = 0; attn__jr_elem(&v); k++) {
    if ((rc = output_one(d, v, k)) < 0)
      return rc;
    attn__jr_skip(&v);
  }
  return 0;
}

/* ---- decode ------------------------------------------------------------------ */

static int decode(v2_dec *d) {
  int rc;
  if (d->len == 0 || d->json_len == 0)
    return attn_status_set(d->st, ATTN_PROTO_EEMPTY,
                           d->len ? "Inference-Header-Content-Length is 0: the JSON is empty"
                                  : "the request has no body");
  if (d->json_len > d->len)
    return attn_status_set(d->st, ATTN_PROTO_EFRAMING,
                           "Inference-Header-Content-Length %zu is past the end of the %zu-byte "
                           "body",
                           d->json_len, d->len);
  if ((rc = attn__json_prescan(d->body, d->json_len, ATTN_V2_MAX_DEPTH, d->st)) < 0 ||
      (rc = attn__json_check(d->body, d->json_len, d->st)) < 0)
    return rc;
  d->j = (attn__jr){d->body, d->json_len, 0};
  attn__jr_ws(&d->j);
  if (d->body[d->j.pos] != '{')
    return attn_status_set(d->st, ATTN_PROTO_EJSON,
                           "the request must be a JSON object {\"inputs\": [...]}, not %s",
                           attn__jr_type(&d->j));
  attn__jr top = d->j;
  if ((rc = request_keys(d)) < 0)
    return rc;
  d->j = top;
  attn__jr p = top;
  p.pos = d->at_params;
  if ((d->at_params && (rc = request_params(d, p)) < 0) || (rc = inputs(d)) < 0 ||
      (rc = outputs(d)) < 0 || (rc = input_data(d)) < 0)
    return rc;
  d->opts.stats = (d->info->outputs & ~(1u << ATTN_V2_O)) != 0;
  d->opts.set |= ATTN_OPT_STATS;
  attn_proto_tensor t[ATTN_PROTO_MAX_TENSORS] = {d->in[0].t, d->in[1].t, d->in[2].t};
  for (int i = V2_ALIBI; i < V2_NIN; i++)
    t[v2_slot(i)] = d->in[i].t;
  return attn_proto_build(d->pr, t, &d->opts, d->st);
}

int attn_proto_decode_v2(const void *body, size_t len, size_t json_len, attn_proto_req *pr,
                         attn_v2_info *info, attn_status *st) {
  memset(pr, 0, sizeof *pr);
  memset(info, 0, sizeof *info);
  v2_dec d = {.body = body, .len = len, .json_len = json_len, .pr = pr, .info = info, .st = st};
  attn_options_init(&d.opts);
  int rc = decode(&d);
  if (rc < 0)
    attn_proto_req_free(pr);
  return rc;
}

size_t attn_proto_v2_decode_bound(size_t len, size_t json_len) {
  if (json_len > len)
    json_len = len;
  /* Binary inputs: an aligned copy at most (1x), and INT32 offsets widened
   * to int64 (2x). */
  return attn_proto_json_decode_bound(json_len) + 2 * (len - json_len);
}

/* ---- the reply ---------------------------------------------------------------- */

static void put_dims(attn_sbuf *b, const int64_t *shape, int rank) {
  attn_sbuf_puts(b, "[");
  for (int i = 0; i < rank; i++)
    attn_sbuf_printf(b, i ? ", %lld" : "%lld", (long long)shape[i]);
  attn_sbuf_puts(b, "]");
}

/* The JSON of the reply into b; the binary outputs' parts into parts[]. */
static int reply_json(attn_sbuf *b, const attn_proto_req *pr, const attn_v2_info *info,
                      const char *model, const char *id, const char *backend,
                      const void *parts[ATTN__MAX_OUTS], size_t sizes[ATTN__MAX_OUTS]) {
  attn__out t[ATTN__MAX_OUTS];
  int n = attn__reply_outs(pr, false, t), np = 0;
  attn_sbuf_puts(b, "{\"model_name\": ");
  attn_sbuf_json_str(b, model);
  attn_sbuf_puts(b, ", \"model_version\": \"1\"");
  if (id) {
    attn_sbuf_puts(b, ", \"id\": ");
    attn_sbuf_json_str(b, id);
  }
  attn_sbuf_puts(b, ", \"parameters\": {\"backend\": ");
  attn_sbuf_json_str(b, backend ? backend : "");
  attn_sbuf_puts(b, "}, \"outputs\": [");
  for (int i = 0, first = 1; i < n; i++) {
    if (!(info->outputs & 1u << i) || !t[i].data)
      continue;
    attn_sbuf_printf(b, "%s{\"name\": \"%s\", \"datatype\": \"%s\", \"shape\": ", first ? "" : ", ",
                     t[i].name, attn_proto_v2_datatype(t[i].dtype));
    put_dims(b, t[i].shape, t[i].rank);
    size_t bytes = t[i].count * attn_dtype_size(t[i].dtype);
    if (info->binary & 1u << i) {
      attn_sbuf_printf(b, ", \"parameters\": {\"binary_data_size\": %zu}}", bytes);
      parts[np] = t[i].data;
      sizes[np++] = bytes;
    } else {
      attn_sbuf_puts(b, ", \"data\": [");
      attn__json_put_elems(b, t[i].dtype, t[i].data, t[i].count);
      attn_sbuf_puts(b, "]}");
    }
    first = 0;
  }
  attn_sbuf_puts(b, "]}");
  return np;
}

int attn_proto_encode_v2(const attn_proto_req *pr, const attn_v2_info *info, const char *model,
                         const char *fallback_id, const char *backend, void **pbuf, size_t *plen,
                         size_t *pjson_len, attn_status *st) {
  *pbuf = NULL;
  *plen = *pjson_len = 0;
  if (pr->rank < 2 || pr->rank > 4 || !pr->req.o || pr->req.pass != ATTN_FORWARD)
    return attn_status_set(st, ATTN_EINVAL, "encode_v2: the request has no forward result");
  const void *parts[ATTN__MAX_OUTS];
  size_t sizes[ATTN__MAX_OUTS], total = 0;
  attn_sbuf b = {0};
  const char *id = info->has_id ? info->id : fallback_id;
  int np = reply_json(&b, pr, info, model, id, backend, parts, sizes);
  for (int i = 0; i < np; i++)
    total += sizes[i];
  if (!b.oom && np && attn_sbuf_reserve(&b, total)) {
    for (int i = 0; i < np; i++) {
      memcpy(b.p + b.len, parts[i], sizes[i]);
      b.len += sizes[i];
    }
  }
  if (b.oom) {
    free(b.p);
    return attn_status_set(st, ATTN_PROTO_ENOMEM, "out of memory encoding the reply");
  }
  *pjson_len = np ? b.len - total : 0;
  *pbuf = b.p;
  *plen = b.len;
  return 0;
}

char *attn_proto_v2_error_body(const char *message, size_t *plen) {
  attn_sbuf b = {0};
  attn_sbuf_puts(&b, "{\"error\": ");
  attn_sbuf_json_strn(&b, message ? message : "", message ? strlen(message) : 0,
                      ATTN_PROTO_MAX_MESSAGE);
  attn_sbuf_puts(&b, "}\n");
  if (b.oom) {
    free(b.p);
    return NULL;
  }
  *plen = b.len;
  return b.p;
}

/* ---- metadata ------------------------------------------------------------------ */

void attn_proto_v2_server_metadata(attn_sbuf *b) {
  /* Only what is implemented: binary tensors, parameters, and Triton's
   * model configuration (GET .../config, which perf_analyzer reads). */
  attn_sbuf_printf(b,
                   "{\"name\": \"attnd\", \"version\": \"%s\", \"extensions\": "
                   "[\"binary_tensor_data\", \"parameters\", \"model_configuration\"]}\n",
                   ATTN_VERSION);
}

/* One tensor of the metadata, or with cfg of Triton's configuration,
 * which spells it differently (data_type TYPE_FP32, dims). */
static void put_meta(attn_sbuf *b, bool cfg, bool first, const char *name, const char *dt,
                     int rank) {
  attn_sbuf_printf(b, "%s{\"name\": \"%s\", ", first ? "" : ", ", name);
  if (cfg)
    attn_sbuf_printf(b, "\"data_type\": \"TYPE_%s\", \"dims\": ", dt);
  else
    attn_sbuf_printf(b, "\"datatype\": \"%s\", \"shape\": ", dt);
  attn_sbuf_puts(b, rank == 4 ? "[-1, -1, -1, -1]}" : "[-1, -1, -1]}");
}

/* inputs q, k, v and outputs o, m, l, lse (statistics FP32, q's shape less
 * its last dimension). The optional inputs (alibi_slopes, cu_seqlens_q/kv)
 * are left out: perf_analyzer generates data for every input listed, even
 * one marked optional, and stops at their dynamic shapes ("input
 * alibi_slopes contains dynamic shape"), while made-up offsets would be
 * refused; proto/README.md documents them instead. */
static void put_tensors(attn_sbuf *b, int model, bool cfg) {
  const char *dt = attn_proto_v2_datatype(model_dtypes[model]);
  attn_sbuf_puts(b, cfg ? "\"input\": [" : "\"inputs\": [");
  for (int i = 0; i < 3; i++)
    put_meta(b, cfg, i == 0, attn_proto_tensor_name(i), dt, 4);
  attn_sbuf_puts(b, cfg ? "], \"output\": [" : "], \"outputs\": [");
  for (int i = 0; i < ATTN_V2_NOUTS; i++)
    put_meta(b, cfg, i == 0, out_names[i], i ? "FP32" : dt, i ? 3 : 4);
  attn_sbuf_puts(b, "]");
}

void attn_proto_v2_model_metadata(attn_sbuf *b, int model) {
  attn_sbuf_puts(b, "{\"name\": ");
  attn_sbuf_json_str(b, model_names[model]);
  attn_sbuf_puts(b, ", \"versions\": [\"1\"], \"platform\": \"attnd\", ");
  put_tensors(b, model, false);
  attn_sbuf_puts(b, "}\n");
}

void attn_proto_v2_model_config(attn_sbuf *b, int model) {
  attn_sbuf_puts(b, "{\"name\": ");
  attn_sbuf_json_str(b, model_names[model]);
  attn_sbuf_puts(b, ", \"platform\": \"attnd\", \"backend\": \"attnd\", \"max_batch_size\": 0, "
                    "\"model_transaction_policy\": {\"decoupled\": false}, ");
  put_tensors(b, model, true);
  attn_sbuf_puts(b, "}\n");
}
