/*
 * v2.c — the Open Inference Protocol (KServe v2, as Triton speaks it over
 * HTTP), so that tritonclient, perf_analyzer and KServe's SDK talk to attnd
 * unmodified: the infer request decoder. The inputs' data (JSON, and
 * Triton's binary tensor extension) is read by v2_data.c; the reply, the
 * metadata documents and the model table are v2_reply.c's.
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

static bool in_list(const char *key, size_t klen, const char *const *list, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (attn__key_is(key, klen, list[i]))
      return true;
  return false;
}

/* ---- decoding: the pieces --------------------------------------------------- */

static bool v2_is_cu(int i) { return i == ATTN__V2_CU_Q || i == ATTN__V2_CU_Q + 1; }

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
static int request_params(attn__v2_dec *d, attn__jr v) {
  char key[64], qk[48];
  size_t klen;
  attn__seen seen = {0};
  int rc;
  if (v.s[v.pos] != '{')
    return attn_status_set(d->st, ATTN_PROTO_EJSON, "\"parameters\" must be an object, not %s",
                           attn__jr_type(&v));
  while (attn__jr_member(&v, key, sizeof key, &klen)) {
    size_t kl = klen < sizeof key ? klen : sizeof key - 1;
    attn__key_quote(qk, sizeof qk, key, klen, sizeof key);
    if (!attn__seen_first(&seen, key, klen)) /* refused as /attention refuses one */
      return attn_status_set(d->st, ATTN_PROTO_EJSON, "duplicate key \"%s\" in \"parameters\"", qk);
    if (attn__key_is(key, klen, "binary_data_output")) {
      if ((rc = get_bool(v, "parameter \"binary_data_output\"", &d->bin_out, d->st)) < 0)
        return rc;
      d->bin_out_set = true;
    } else if (in_list(key, klen, reserved_request, sizeof reserved_request / sizeof(char *))) {
      return attn_status_set(d->st, ATTN_PROTO_EOPTION,
                             "parameter \"%s\" is reserved by the inference protocol for a "
                             "feature attnd does not implement; leave it out",
                             qk);
    } else if (attn__key_is(key, klen, "stats") || attn_option_kind_of(key, kl) == ATTN_OPTK_NONE) {
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
static int request_keys(attn__v2_dec *d) {
  char key[64], qk[48];
  size_t klen;
  bool seen_id = false;
  attn__jr *j = &d->j;
  while (attn__jr_member(j, key, sizeof key, &klen)) {
    size_t *at = attn__key_is(key, klen, "inputs")       ? &d->at_inputs
                 : attn__key_is(key, klen, "outputs")    ? &d->at_outputs
                 : attn__key_is(key, klen, "parameters") ? &d->at_params
                                                         : NULL;
    attn__key_quote(qk, sizeof qk, key, klen, sizeof key);
    if (!at && !attn__key_is(key, klen, "id"))
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
 * alibi_slopes 1 or 2 ([Hq] or [B, Hq]); cu_seqlens 1 ([B+1]); sinks 1
 * ([Hq]). */
static int input_shape(attn__jr v, attn__v2_input *in, attn_status *st) {
  const char *name = in->t.name;
  if (v.s[v.pos] != '[')
    return attn_status_set(st, ATTN_PROTO_ETENSOR,
                           "input \"%s\": shape must be an array of integers, not %s", name,
                           attn__jr_type(&v));
  int rank = (int)attn__jr_count(&v);
  const bool alibi = !strcmp(name, "alibi_slopes"), cu = in->cu_bytes != 0;
  const bool sinks = !strcmp(name, "sinks");
  if (cu || sinks ? rank != 1 : alibi ? rank < 1 || rank > 2 : rank < 2 || rank > 4)
    return attn_status_set(st, ATTN_PROTO_ETENSOR,
                           cu      ? "input \"%s\" has %d dimensions; use [B+1] (offsets)"
                           : sinks ? "input \"%s\" has %d dimensions; use [Hq], one logit a "
                                     "query head"
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
static int input_datatype(attn__jr v, attn__v2_input *in, bool cu, attn_status *st) {
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
                           attn__key_quote(qs, sizeof qs, s, n, sizeof s),
                           cu ? "INT32 or INT64" : "FP32, FP16 or BF16");
  return 0;
}

/* An input's "parameters": binary_data_size, nothing else. */
static int input_params(attn__jr v, attn__v2_input *in, attn_status *st) {
  char key[64], qk[48];
  size_t klen;
  attn__seen seen = {0};
  if (v.s[v.pos] != '{')
    return attn_status_set(st, ATTN_PROTO_EJSON, "input \"%s\": parameters must be an object",
                           in->t.name);
  while (attn__jr_member(&v, key, sizeof key, &klen)) {
    attn__key_quote(qk, sizeof qk, key, klen, sizeof key);
    if (!attn__seen_first(&seen, key, klen))
      return attn_status_set(st, ATTN_PROTO_EJSON,
                             "input \"%s\": duplicate key \"%s\" in its parameters", in->t.name,
                             qk);
    if (!attn__key_is(key, klen, "binary_data_size"))
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
static int input_fields(attn__v2_dec *d, attn__jr v, int k) {
  static const char *const keys[5] = {"name", "shape", "datatype", "data", "parameters"};
  size_t at[5] = {0}, klen;
  char key[64], qk[48];
  if (v.s[v.pos] != '{')
    return attn_status_set(d->st, ATTN_PROTO_EJSON, "inputs[%d] must be an object, not %s", k,
                           attn__jr_type(&v));
  while (attn__jr_member(&v, key, sizeof key, &klen)) {
    int f = 0;
    while (f < 5 && !attn__key_is(key, klen, keys[f]))
      f++;
    attn__key_quote(qk, sizeof qk, key, klen, sizeof key);
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
  while (i < ATTN__V2_NIN &&
         !(n < sizeof name && attn__key_is(name, n, attn_proto_tensor_name(attn__v2_slot(i)))))
    i++;
  if (i == ATTN__V2_NIN)
    return attn_status_set(d->st, ATTN_PROTO_EUNKNOWNTENSOR,
                           "inputs[%d]: the name must be \"q\", \"k\", \"v\", "
                           "\"alibi_slopes\", \"cu_seqlens_q\", \"cu_seqlens_kv\" or \"sinks\"",
                           k);
  attn__v2_input *in = &d->in[i];
  if (in->t.name)
    return attn_status_set(d->st, ATTN_PROTO_ETENSOR, "input \"%s\" is given twice",
                           attn_proto_tensor_name(attn__v2_slot(i)));
  in->t.name = attn_proto_tensor_name(attn__v2_slot(i));
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

static int inputs(attn__v2_dec *d) {
  attn__jr v = d->j;
  v.pos = d->at_inputs;
  if (!d->at_inputs || v.s[v.pos] != '[')
    return attn_status_set(d->st, d->at_inputs ? ATTN_PROTO_EJSON : ATTN_PROTO_EMISSING,
                           d->at_inputs ? "\"inputs\" must be an array of q, k and v"
                                        : "the request has no \"inputs\" (it needs q, k and v)");
  for (int i = 0; i < ATTN__V2_NIN; i++)
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

/* ---- decoding: outputs -------------------------------------------------------- */

/* An output's name (the string at x): which of attn__v2_out_names, by its whole
 * length ("o\u0000" is none). */
static int output_name(attn__v2_dec *d, attn__jr x, int k, int *which) {
  char name[16];
  size_t n = attn__jr_string(&x, name, sizeof name);
  for (int i = 0; i < ATTN_V2_NOUTS && n < sizeof name; i++)
    *which = attn__key_is(name, n, attn__v2_out_names[i]) ? i : *which;
  if (*which < 0)
    return attn_status_set(d->st, ATTN_PROTO_EUNKNOWNTENSOR,
                           "outputs[%d]: the name must be \"o\", \"m\", \"l\" or \"lse\"", k);
  return 0;
}

/* An output's "parameters" (the object at x): binary_data, nothing else. */
static int output_params(attn__v2_dec *d, attn__jr x, int k, bool *bin) {
  char pk[64], qp[48];
  size_t pl;
  attn__seen seen = {0};
  int rc;
  while (attn__jr_member(&x, pk, sizeof pk, &pl)) {
    attn__key_quote(qp, sizeof qp, pk, pl, sizeof pk);
    if (!attn__seen_first(&seen, pk, pl))
      return attn_status_set(d->st, ATTN_PROTO_EJSON,
                             "outputs[%d]: duplicate key \"%s\" in its parameters", k, qp);
    if (!attn__key_is(pk, pl, "binary_data"))
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
static int output_one(attn__v2_dec *d, attn__jr v, int k) {
  char key[64], qk[48];
  size_t klen;
  attn__seen seen = {0};
  int which = -1, rc;
  bool bin = d->bin_out;
  if (v.s[v.pos] != '{')
    return attn_status_set(d->st, ATTN_PROTO_EJSON, "outputs[%d] must be an object, not %s", k,
                           attn__jr_type(&v));
  while (attn__jr_member(&v, key, sizeof key, &klen)) {
    attn__key_quote(qk, sizeof qk, key, klen, sizeof key);
    if (!attn__seen_first(&seen, key, klen))
      return attn_status_set(d->st, ATTN_PROTO_EJSON, "outputs[%d]: duplicate key \"%s\"", k, qk);
    if (attn__key_is(key, klen, "name") && v.s[v.pos] == '"')
      rc = output_name(d, v, k, &which);
    else if (attn__key_is(key, klen, "parameters") && v.s[v.pos] == '{')
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
                           attn__v2_out_names[which]);
  d->info->outputs |= 1u << which;
  d->info->binary |= bin ? 1u << which : 0;
  return 0;
}

static int outputs(attn__v2_dec *d) {
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

static int decode(attn__v2_dec *d) {
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
      (rc = outputs(d)) < 0 || (rc = attn__v2_input_data(d)) < 0)
    return rc;
  d->opts.stats = (d->info->outputs & ~(1u << ATTN_V2_O)) != 0;
  d->opts.set |= ATTN_OPT_STATS;
  attn_proto_tensor t[ATTN_PROTO_MAX_TENSORS] = {d->in[0].t, d->in[1].t, d->in[2].t};
  for (int i = ATTN__V2_ALIBI; i < ATTN__V2_NIN; i++)
    t[attn__v2_slot(i)] = d->in[i].t;
  return attn_proto_build(d->pr, t, &d->opts, d->st);
}

int attn_proto_decode_v2(const void *body, size_t len, size_t json_len, attn_proto_req *pr,
                         attn_v2_info *info, attn_status *st) {
  memset(pr, 0, sizeof *pr);
  memset(info, 0, sizeof *info);
  attn__v2_dec d = {
      .body = body, .len = len, .json_len = json_len, .pr = pr, .info = info, .st = st};
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
