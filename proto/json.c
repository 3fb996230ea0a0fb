/*
 * json.c — the JSON wire format of POST /attention (docs/api.md):
 * the request decoder. Its tensors are read by json_tensor.c and its
 * replies written by json_encode.c.
 *
 * JSON is the format people type with curl and send from scripts, so the
 * decoder is strict and says exactly what is wrong: every number of a body
 * is checked, every key is known (an unknown key is an error, never silently
 * ignored, so a typo such as "casual" cannot change a result unnoticed), and
 * each message names the tensor, key, index or byte offset. Decoding goes
 * body -> a bounded pre-scan -> a grammar check of the whole body -> typed
 * buffers of the request's dtype (pr->owned[0..2]), each number converted
 * from the body's text straight into its tensor -> attn_proto_build(),
 * which holds the shape rules both codecs share. Options in the body go
 * through the one option parser, attn_options_set(), after their JSON type
 * is checked, and override the query string's.
 *
 * Nothing but the tensors is allocated (jsonread.c reads the body in
 * place), so a decode costs at most attn_proto_json_decode_bound() bytes
 * beyond the body, whether it succeeds or fails: the server counts that
 * against its memory budget before it decodes. A tree parser would cost a
 * node per number, 16 times the tensor.
 *
 * The checks run in a fixed order, the same for every body: the pre-scan
 * (nesting deeper than ATTN_PROTO_MAX_DEPTH, more than
 * ATTN_PROTO_MAX_JSON_ELEMS numbers), then the grammar, then the keys of the
 * body in order (duplicates, options), then q, k and v in that order, each
 * counted before its buffer is allocated.
 */
#include "internal.h"
#include "proto.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define NT ATTN_PROTO_MAX_TENSORS

/* ---- the pre-scan ------------------------------------------------------- */

/*
 * One pass over the bytes, outside strings, counting nesting and number
 * tokens. For valid JSON the counts are exact; for invalid JSON either this
 * or the grammar check refuses the body, both with a 4xx. It runs first so
 * that a deep body ("{{{{...") is named for its depth rather than for its
 * first bad token, and it bounds the grammar check's recursion.
 */
int attn__json_prescan(const char *s, size_t len, int max_depth, attn_status *st) {
  int depth = 0;
  bool in_str = false, esc = false, in_num = false;
  size_t numbers = 0;
  for (size_t i = 0; i < len; i++) {
    char c = s[i];
    if (in_str) {
      if (esc)
        esc = false;
      else if (c == '\\')
        esc = true;
      else if (c == '"')
        in_str = false;
      continue;
    }
    bool digit = c >= '0' && c <= '9';
    if (c == '"') {
      in_str = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth)
        return attn_status_set(st, ATTN_PROTO_EJSON,
                               "invalid JSON at byte %zu: nesting deeper than %d", i, max_depth);
    } else if (c == ']' || c == '}') {
      if (depth > 0)
        depth--;
    } else if (((digit || c == '-') && !in_num) || c == 'n') {
      /* a null is an element too (lse's -inf), so it counts like a number */
      if (++numbers > ATTN_PROTO_MAX_JSON_ELEMS)
        return attn_status_set(st, ATTN_PROTO_ETOOLARGE,
                               "the JSON body holds more than %zu numbers",
                               (size_t)ATTN_PROTO_MAX_JSON_ELEMS);
    }
    in_num = digit || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E';
  }
  return 0;
}

/* ---- options ------------------------------------------------------------ */

/* Checks a body field's JSON type against its option's kind, then hands its
 * canonical text to attn_options_set(), so values, ranges and messages are
 * the same as the query string's. key is a known name or, when cut, longer
 * than any; v is at the value. */
int attn__json_option(attn_options *o, const char *key, size_t klen, attn__jr v, const char *source,
                      attn_status *st) {
  if (attn__own_field(o, key, klen))
    return o->fields->json(o->fields->ctx, key, klen, v, st);
  attn_option_kind kind = attn_option_kind_of(key, klen);
  char text[128];
  const char *want = NULL;
  char c = v.s[v.pos];
  switch (kind) {
  case ATTN_OPTK_NONE: /* attn_options_set() words the error */
    return attn_options_set(o, key, klen, "", 0, source, st);
  case ATTN_OPTK_BOOL:
    if (c != 't' && c != 'f') {
      want = "true or false";
      break;
    }
    return attn_options_set(o, key, klen, c == 't' ? "true" : "false", c == 't' ? 4 : 5, source,
                            st);
  case ATTN_OPTK_NUMBER:
  case ATTN_OPTK_INT: {
    if (!attn__jr_is_number(&v)) {
      want = kind == ATTN_OPTK_INT ? "an integer" : "a number";
      break;
    }
    double x = attn__jr_number(&v);
    /* Integers print as such; anything else prints as a double, which the
     * option parser then refuses for an integer option with its usual
     * message (e.g. got "2.5"). */
    int len = kind == ATTN_OPTK_INT && x == floor(x) && fabs(x) < 0x1p62
                  ? snprintf(text, sizeof text, "%lld", (long long)x)
                  : snprintf(text, sizeof text, "%.17g", x);
    return attn_options_set(o, key, klen, text, (size_t)len, source, st);
  }
  case ATTN_OPTK_STRING: {
    if (c != '"') {
      want = "a string";
      break;
    }
    /* A value cut to fit text is longer than any valid one, and the option
     * parser quotes only its start. */
    size_t n = attn__jr_string(&v, text, sizeof text);
    return attn_options_set(o, key, klen, text, n < sizeof text ? n : sizeof text - 1, source, st);
  }
  }
  return attn_status_set(st, ATTN_PROTO_EOPTVALUE,
                         "option \"%s\" in the JSON field must be %s, not %s", key, want,
                         attn__jr_type(&v));
}

/* ---- decode ------------------------------------------------------------- */

/* The body object's members: where each tensor of the pass starts (0:
 * absent), and the options, in body order. Every key accepted is a tensor
 * or an option (at most seventeen short names), and a repeat of any is
 * refused. A key that is neither names an unknown tensor when its value is
 * an object or array (what a tensor looks like), else an unknown option. */
static int body_fields(attn__jr *j, attn_pass pass, size_t tat[NT], attn_options *opts,
                       attn_status *st) {
  char key[128], qk[48];
  size_t klen;
  attn__seen seen = {0};
  int rc;
  while (attn__jr_member(j, key, sizeof key, &klen)) {
    size_t kl = klen < sizeof key ? klen : sizeof key - 1;
    if (!attn__seen_first(&seen, key, klen))
      return attn_status_set(st, ATTN_PROTO_EJSON, "duplicate key \"%s\" in the JSON body",
                             attn__key_quote(qk, sizeof qk, key, klen, sizeof key));
    int which = 0;
    while (which < NT && !(attn_proto_tensor_in_pass(which, pass) &&
                           attn__key_is(key, klen, attn_proto_tensor_name(which))))
      which++;
    char c = j->s[j->pos];
    if (which < NT)
      tat[which] = j->pos;
    else if ((c == '{' || c == '[') && attn_option_kind_of(key, kl) == ATTN_OPTK_NONE &&
             !attn__own_field(opts, key, kl))
      return attn_status_set(
          st, ATTN_PROTO_EUNKNOWNTENSOR, "unknown tensor \"%s\"; send exactly %s",
          attn__key_quote(qk, sizeof qk, key, klen, sizeof key), attn_proto_tensor_list(pass));
    else if ((rc = attn__json_option(opts, key, kl, *j, "JSON field", st)) < 0)
      return rc;
    attn__jr_skip(j);
  }
  return 0;
}

/* Each tensor the body holds, in the table's order, into t[] (data NULL
 * for one it does not hold), a required one missing refused. */
static int body_tensors(attn__jr j, attn_pass pass, const attn_options *o, const size_t tat[NT],
                        attn_proto_req *pr, attn_proto_tensor t[NT], attn_status *st) {
  int rc;
  for (int i = 0; i < NT; i++)
    if (!tat[i] && attn__tensor_required(i, pass, o))
      return attn_status_set(st, ATTN_PROTO_EMISSING,
                             "tensor \"%s\" is missing (the body needs %s)",
                             attn_proto_tensor_name(i), attn_proto_tensor_list(pass));
  memset(t, 0, NT * sizeof *t);
  for (int i = 0; i < NT; i++) {
    t[i].name = attn_proto_tensor_name(i);
    j.pos = tat[i];
    if (tat[i] && (rc = attn__json_tensor(j, &t[i], &pr->owned[i], st)) < 0)
      return rc;
  }
  return 0;
}

static int decode(const char *body, size_t len, attn_pass pass, const attn_options *query,
                  attn_proto_req *pr, attn_proto_tensor t[NT], attn_options *opts,
                  attn_status *st) {
  int rc;
  if (len == 0)
    return attn_status_set(st, ATTN_PROTO_EEMPTY, "the request has no body");
  if ((rc = attn__json_prescan(body, len, ATTN_PROTO_MAX_DEPTH, st)) < 0 ||
      (rc = attn__json_check(body, len, st)) < 0)
    return rc;
  attn__jr j = {body, len, 0};
  attn__jr_ws(&j);
  if (body[j.pos] != '{')
    return attn_status_set(st, ATTN_PROTO_EJSON,
                           "the JSON body must be an object {\"q\": ..., \"k\": ..., "
                           "\"v\": ...}, not %s",
                           attn__jr_type(&j));
  size_t tat[NT] = {0};
  attn_options body_opts;
  attn_options_init(&body_opts);
  body_opts.fields = query ? query->fields : NULL; /* they may sit in the body */
  if ((rc = body_fields(&j, pass, tat, &body_opts, st)) < 0 ||
      (rc = body_tensors(j, pass, &body_opts, tat, pr, t, st)) < 0)
    return rc;
  if (query)
    *opts = *query;
  else
    attn_options_init(opts);
  attn_options_merge(opts, &body_opts);
  return 0;
}

int attn__json_tensors(const char *body, size_t len, attn_pass pass, const attn_options *query,
                       attn_proto_req *pr, attn_proto_tensor t[NT], attn_options *opts,
                       attn_status *st) {
  memset(pr, 0, sizeof *pr);
  return decode(body, len, pass, query, pr, t, opts, st);
}

int attn_proto_decode_json_pass(const char *body, size_t len, attn_pass pass,
                                const attn_options *query, attn_proto_req *pr, attn_status *st) {
  attn_proto_tensor t[NT];
  attn_options opts;
  int rc = attn__json_tensors(body, len, pass, query, pr, t, &opts, st);
  if (rc == 0)
    rc = attn_proto_build_pass(pr, pass, t, &opts, st);
  if (rc < 0)
    attn_proto_req_free(pr);
  return rc;
}

int attn_proto_decode_json(const char *body, size_t len, const attn_options *query,
                           attn_proto_req *pr, attn_status *st) {
  return attn_proto_decode_json_pass(body, len, ATTN_FORWARD, query, pr, st);
}

size_t attn_proto_json_decode_bound(size_t len) {
  /* The reader allocates nothing; the tensors are all there is, however
   * many a pass takes. An element stored in a tensor (a number, or a null of
   * lse) is followed by ',' or ']', so the body holds at most len / 2 of
   * them, and the pre-scan refuses more than ATTN_PROTO_MAX_JSON_ELEMS,
   * nulls counted. F32 is the widest dtype. */
  size_t n = len / 2;
  if (n > ATTN_PROTO_MAX_JSON_ELEMS)
    n = ATTN_PROTO_MAX_JSON_ELEMS;
  size_t cu = n < 2 * ATTN_PROTO_MAX_JSON_CU ? n : 2 * ATTN_PROTO_MAX_JSON_CU;
  return n * sizeof(float) + cu * (sizeof(int64_t) - sizeof(float));
}
