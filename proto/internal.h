/*
 * internal.h — helpers the codecs of proto/ share; not part of the
 * contract (proto.h is).
 */
#ifndef ATTN_PROTO_INTERNAL_H
#define ATTN_PROTO_INTERNAL_H

#include "engine.h"
#include "proto.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct cJSON;

/* Length of the well-formed UTF-8 sequence of 2 to 4 bytes at s (n bytes
 * left), or 0 when there is none: an ASCII byte, a stray continuation byte,
 * a cut sequence, an overlong form, a surrogate or a code point past
 * U+10FFFF (RFC 3629). */
size_t attn__utf8_len(const unsigned char *s, size_t n);

/* "an object", "a string", ... for messages about a JSON value's type. */
const char *attn__json_type(const struct cJSON *j);

/* ---- scratch.c: cJSON's nodes from the caller's buffer ----------------- */

/* Between begin and end, cJSON allocates on this thread from buf (past its
 * cap, from the heap as always): for a document parsed and deleted in
 * between, which must not outlive end. Scratches nest. */
typedef struct attn__scratch {
  char *base;
  size_t used, cap;
  struct attn__scratch *outer;
} attn__scratch;
void attn__scratch_begin(attn__scratch *s, void *buf, size_t cap);
void attn__scratch_end(attn__scratch *s);

/* ---- jsonread.c: JSON read in place ----------------------------------- */

/* The deepest nesting any codec's pre-scan lets through (v2's). */
#define ATTN__JSON_MAX_DEPTH ATTN_V2_MAX_DEPTH

/* Checks that s[0..len) is one JSON value (RFC 8259: strict numbers,
 * escapes, UTF-8, nothing but whitespace after it); 0, or ATTN_PROTO_EJSON
 * naming the byte offset. Nesting must already be bounded (the JSON codec's
 * pre-scan). */
int attn__json_check(const char *s, size_t len, attn_status *st);

/* A cursor over text attn__json_check() accepted whose top-level value is
 * an object; pos is at a value unless a function below says otherwise.
 * Nothing here allocates. */
typedef struct attn__jr {
  const char *s;
  size_t len, pos;
} attn__jr;

void attn__jr_ws(attn__jr *j);
/* Steps past the value at pos. */
void attn__jr_skip(attn__jr *j);
/* "an object", "a number", ... for the value at pos. */
const char *attn__jr_type(const attn__jr *j);
bool attn__jr_is_number(const attn__jr *j);
/* The number at pos (strtod: the double nearest its text); steps past it. */
double attn__jr_number(attn__jr *j);
/* The string at pos unescaped into buf, cut to cap - 1 bytes and
 * NUL-terminated; returns its whole length (it may hold NUL bytes). */
size_t attn__jr_string(attn__jr *j, char *buf, size_t cap);
/* Iteration: with pos at '[' (or '{'), each call steps to the next element
 * (member: reads its key as attn__jr_string does into key, *klen its whole
 * length, and steps to its value); false once past the container. The
 * caller reads or skips each value before the next call. */
bool attn__jr_elem(attn__jr *j);
bool attn__jr_member(attn__jr *j, char *key, size_t cap, size_t *klen);
/* Elements of the array at pos (pos does not move). */
size_t attn__jr_count(const attn__jr *j);

/* The keys of one object read so far, for refusing a repeated key (RFC
 * 8259 leaves its meaning open; the last must not silently win). Every key
 * a codec accepts is a known name shorter than ATTN__SEEN_KEY bytes, and no
 * object accepts more than ATTN__SEEN_MAX (the /attention body: 10 tensors
 * and 8 options), so the set holds all of them; a longer key is never
 * stored, which is safe because it is refused as unknown. Zero it before
 * the object's first key. */
#define ATTN__SEEN_MAX 24
#define ATTN__SEEN_KEY 24
typedef struct attn__seen {
  int n;
  unsigned char len[ATTN__SEEN_MAX];
  char key[ATTN__SEEN_MAX][ATTN__SEEN_KEY];
} attn__seen;
/* Whether key[0..klen) (as attn__jr_member() read it: it may hold NUL
 * bytes) is new to s; it is added when it is. False for a repeat. */
bool attn__seen_first(attn__seen *s, const char *key, size_t klen);

/* Whether key[0..klen) (as attn__jr_member() read it) is exactly want. */
bool attn__key_is(const char *key, size_t klen, const char *want);
/* A client's key for a message, cut to what attn__jr_member() kept (kcap:
 * the size of its key buffer) and escaped into dst. */
const char *attn__key_quote(char *dst, size_t cap, const char *key, size_t klen, size_t kcap);

/* ---- json.c, json_tensor.c: pieces the KServe v2 codec (v2.c) shares --- */

/* One pass outside strings: nesting up to max_depth, at most
 * ATTN_PROTO_MAX_JSON_ELEMS numbers (and nulls); run before
 * attn__json_check(), which it bounds. 0, or EJSON / ETOOLARGE. */
int attn__json_prescan(const char *s, size_t len, int max_depth, attn_status *st);
/* x as element i of dt, rounded once; ATTN_PROTO_ENONFINITE (nothing
 * stored) for a value that is not finite or overflows dt. */
int attn__json_store(void *buf, attn_dtype dt, size_t i, double x);
/* The message for a value attn__json_store() refused: tensor name, where
 * ("data[3]"). */
int attn__json_store_error(double x, attn_dtype dt, const char *name, const char *where,
                           attn_status *st);
/* Option key = the JSON value at v: its JSON type checked against the
 * option's kind, then attn_options_set() with source ("JSON field"). */
int attn__json_option(attn_options *o, const char *key, size_t klen, attn__jr v, const char *source,
                      attn_status *st);

/* cu_seqlens data at v: an array of n integers (I32 ones within int32, at
 * most ATTN_PROTO_MAX_JSON_CU) into a new int64 buffer *pbuf, t then rank
 * 1, shape [n]; the /attention codec's and /v2's JSON data alike. */
int attn__json_cu_data(attn__jr v, attn_proto_tensor *t, size_t n, int bytes, void **pbuf,
                       attn_status *st);
/* The tensor t->name of a JSON body at j (an object, nested arrays, or
 * cu_seqlens' array) into a new buffer *pbuf, t's dtype, rank and shape
 * set; 0, or the status naming what is wrong. */
int attn__json_tensor(attn__jr j, attn_proto_tensor *t, void **pbuf, attn_status *st);
/* Calls fn for each name=value pair of a URL query string, both
 * percent-decoded and NUL-terminated; has_value is false for a bare "name".
 * Stops at, and returns, the first error fn returns. */
typedef int (*attn__query_fn)(void *ctx, const char *name, size_t nlen, const char *value,
                              size_t vlen, bool has_value, attn_status *st);
int attn__query_each(const char *query, attn__query_fn fn, void *ctx, attn_status *st);

/* ---- v2.c, v2_data.c, v2_reply.c: the Open Inference Protocol -------- */

/* The output names "o", "m", "l", "lse", by ATTN_V2_*. */
extern const char *const attn__v2_out_names[ATTN_V2_NOUTS];

/* The inputs: q, k, v and the optional alibi_slopes, cu_seqlens_q,
 * cu_seqlens_kv and sinks, in that order here, as in the codecs' tensor
 * table from alibi_slopes on; attn__v2_slot() gives each one's place there. */
enum { ATTN__V2_NIN = 7, ATTN__V2_ALIBI = 3, ATTN__V2_CU_Q = 4, ATTN__V2_SINKS = 6 };
_Static_assert(ATTN_PROTO_T_SINKS - ATTN_PROTO_T_ALIBI == ATTN__V2_SINKS - ATTN__V2_ALIBI,
               "v2 names from alibi_slopes on keep the tensor table's order");
static inline int attn__v2_slot(int i) {
  return i < ATTN__V2_ALIBI ? i : ATTN_PROTO_T_ALIBI + (i - ATTN__V2_ALIBI);
}

typedef struct attn__v2_input {
  attn_proto_tensor t;
  size_t at_data; /* where "data" starts (0: absent) */
  int64_t binary; /* binary_data_size, or -1 */
  size_t count;   /* elements of the shape */
  int cu_bytes;   /* cu_seqlens: 4 (INT32) or 8 (INT64) on the wire; else 0 */
} attn__v2_input;

/* One decode of a v2 request: the body, where its parts start, and what
 * has been read so far. */
typedef struct attn__v2_dec {
  const char *body;
  size_t len, json_len;
  attn__jr j;
  attn_proto_req *pr;
  attn_v2_info *info;
  attn_options opts;
  bool bin_out, bin_out_set;
  attn__v2_input in[ATTN__V2_NIN];
  size_t at_inputs, at_outputs, at_params;
  attn_status *st;
} attn__v2_dec;

/* Every input's data, once the inputs' names, shapes and datatypes are
 * read: JSON "data" or, for those with binary_data_size, the bytes after
 * the JSON in the order of "inputs", which must add up to the body. */
int attn__v2_input_data(attn__v2_dec *d);

/* ---- the tensors of a reply (build.c) ------------------------------- */

/* One tensor of a reply: what the reply encoders write and the reply
 * decoders expect, from the request (pr) it answers. */
typedef struct attn__out {
  const char *name;
  attn_dtype dtype;
  const int64_t *shape;
  int rank;
  size_t count; /* elements */
  void *data;   /* pr's output buffer */
} attn__out;

#define ATTN__MAX_OUTS 4
/* The tensors of pr's reply into t: forward o, and m, l, lse (F32, q's
 * shape less D) when pr->opts.stats; backward dq (q's shape), dk and dv
 * (k's), in the request's dtype, and dsinks (F32 [Hq]) when the request has
 * sinks. Returns how many. With all, a forward request lists m, l, lse even
 * without stats, and a backward one dsinks even without sinks (data NULL),
 * so that a reply decoder can name one that came unasked. */
int attn__reply_outs(const attn_proto_req *pr, bool all, attn__out t[ATTN__MAX_OUTS]);

/* ---- writers the request and reply encoders share -------------------- */

struct attn_sbuf;
/* "name": {"shape": [...], "dtype": "...", "data": [...]}, each number the
 * shortest text that reads back to its dtype's value (null when not
 * finite). */
void attn__json_put_tensor(struct attn_sbuf *b, const char *name, const int64_t *shape, int rank,
                           attn_dtype dt, const void *data);
/* n elements of data, comma-separated, each as attn__json_put_tensor
 * writes them. */
void attn__json_put_elems(struct attn_sbuf *b, attn_dtype dt, const void *data, size_t n);
/* One safetensors header entry "name":{dtype, shape, data_offsets} at h + o
 * (a ',' first unless o <= 1, just past the '{'), dtype by its name ("F32",
 * ..., or the cu_seqlens' "I64"); returns the new length, >= cap once the
 * header does not fit. */
size_t attn__st_put_entry(char *h, size_t cap, size_t o, const char *name, const char *dtype,
                          const int64_t *shape, int rank, size_t begin, size_t end);
/* A safetensors file: the 8-byte length, header h[0..n) padded with spaces
 * to a multiple of 8 bytes, then the parts' bytes in order. *pbuf is
 * malloc'd; `what` ("reply", "request") names it in the out-of-memory
 * message. */
int attn__st_frame(const char *h, size_t n, const void *const *parts, const size_t *sizes,
                   int nparts, const char *what, void **pbuf, size_t *plen, attn_status *st);
/* The frame's head alone: the 8-byte length and h[0..n) padded, in a
 * malloc'd buffer of *plen bytes with room for extra more after it. */
int attn__st_head(const char *h, size_t n, size_t extra, const char *what, void **pbuf,
                  size_t *plen, attn_status *st);

/* safetensors.c's reading, for a file of other tensors than a request's
 * (a session's, session_file.c): one tensor's header entry; its
 * {dtype, shape, data_offsets} checked (data_len bounds the offsets), the
 * entries ne tiling the data exactly (names[i] naming e[i] in messages);
 * a file's header length, bytes and JSON checked, its root object into
 * *proot (the caller cJSON_Deletes it) and its data. */
typedef struct attn__st_entry {
  bool seen;
  /* in: the entry may be a quantized session's rows (F8_E4M3 or I8, one
   * byte an element: quant set, dtype unused), as only a session file's
   * are; a request's tensors are of the three dtypes */
  bool quant_ok;
  attn_kv_quant quant;
  attn_dtype dtype;
  int cu_bytes; /* cu_seqlens: 4 (I32) or 8 (I64); 0 for the others */
  int rank;
  int64_t shape[4]; /* the first four dims; attn_proto_build refuses more */
  uint64_t begin, end;
} attn__st_entry;
struct cJSON;
int attn__st_entry_parse(const struct cJSON *j, const char *name, uint64_t data_len,
                         attn__st_entry *e, attn_status *st);
int attn__st_layout(const attn__st_entry *e, const char *const *names, int ne, uint64_t data_len,
                    attn_status *st);
int attn__st_open(const void *body, size_t len, struct cJSON **proot, const unsigned char **pdata,
                  uint64_t *pdata_len, attn_status *st);

/* session_meta.c: a session file's __metadata__ (session_file.c). */
int attn_proto_session_meta_decode(const struct cJSON *meta, double ttl_max, attn_kv_shape *sh,
                                   double *ttl_s, int64_t *lengths, attn_status *st);

/* numtext.c: snprintf(out, 32, "%.*g", prec, x), the same text, fast for a
 * float's value near 1 (prec <= 17); strtod() of a JSON number's text,
 * the same double, fast for up to 18 digits and exponents within 22; and
 * strtof() of one. */
size_t attn__fmt_g(char out[32], double x, int prec);
double attn__parse_number(const char *s, char **end);
float attn__parse_float(const char *s);

/* build.c's checks, which a session call's build (session.c) calls too: a
 * tensor alone (rank lo to lo + 2, dimensions >= 1); [B, H, N, D] of a
 * rank 2-4 tensor; alibi_slopes against q (t[0]) and cu_seqlens_q; the
 * outputs of pr->req allocated. */
int attn__check_one(const attn_proto_tensor *t, int lo, attn_status *st);
void attn__bhnd(const attn_proto_tensor *t, int64_t d[4]);
/* pr->shape_o and shape_v from shape_q, shape_kv and rank, with last
 * dimension dv (the value head dim, D when v has no width of its own). */
void attn__shapes_dv(attn_proto_req *pr, int64_t dv);
int attn__check_alibi(const attn_proto_tensor *a, const attn_proto_tensor *t, attn_status *st);
/* sinks against q (t[0]): F32 [Hq] when sent. */
int attn__check_sinks(const attn_proto_tensor *s, const attn_proto_tensor *t, attn_status *st);
int attn__alloc_outputs(attn_proto_req *pr, attn_status *st);
/*
 * What a decode with fields of its own (a session call's, session.c) hands
 * the generic codecs as data, through attn_options.fields: whether a name
 * is one of its fields, which it then sets from the field's text (query
 * string, __metadata__) or from its JSON value; and the tensors it may
 * leave out beyond those any request may (bits 1 << ATTN_PROTO_T_*).
 */
typedef struct attn__fields {
  void *ctx;
  bool (*is_field)(const void *ctx, const char *name, size_t len);
  int (*text)(void *ctx, const char *name, size_t nlen, const char *value, size_t vlen,
              const char *source, attn_status *st);
  int (*json)(void *ctx, const char *name, size_t nlen, attn__jr v, attn_status *st);
  unsigned optional;
} attn__fields;

/* options.c: whether name is a field of o's own (o->fields). */
bool attn__own_field(const attn_options *o, const char *name, size_t len);
/* build.c: whether tensor i must be sent for pass with options o. */
bool attn__tensor_required(int i, attn_pass pass, const attn_options *o);

/* The codecs' first half: the body's tensors into t[] (what is not owned
 * read in place, the rest in pr->owned[]) and its options merged over
 * query's into *opts, each checked alone; attn_proto_build_pass, or a
 * decode's own build, makes the request of them. pr is zeroed first. */
int attn__json_tensors(const char *body, size_t len, attn_pass pass, const attn_options *query,
                       attn_proto_req *pr, attn_proto_tensor t[ATTN_PROTO_MAX_TENSORS],
                       attn_options *opts, attn_status *st);
int attn__st_tensors(const void *body, size_t len, attn_pass pass, const attn_options *query,
                     attn_proto_req *pr, attn_proto_tensor t[ATTN_PROTO_MAX_TENSORS],
                     attn_options *opts, attn_status *st);

#endif
