/*
 * proto.h — the wire formats: request bytes to an engine request, results to
 * reply bytes. The server and the clients share these codecs, so nothing
 * about formats lives anywhere else. proto/README.md is the prose spec.
 *
 * Decoding (either codec) fills an attn_proto_req: the engine request with
 * its shapes, dtype, options and tensor pointers (into the body where the
 * body's bytes can be used in place, else into buffers the request owns),
 * plus the output buffers. Then:
 *
 *   attn_proto_req pr;  attn_status st;
 *   attn_options q;  attn_options_init(&q);
 *   attn_options_parse_query(&q, "causal=true", &st);   // URL options
 *   if (attn_proto_decode_safetensors(body, len, &q, &pr, &st) < 0) reply(st);
 *   attn_engine_run(engine, &pr.req, NULL, &st);
 *   attn_proto_encode_safetensors(&pr, &out, &outlen, &st);
 *   attn_proto_req_free(&pr);
 *
 * The body must outlive pr (tensors may point into it).
 *
 * Errors are negative ATTN_PROTO_E* codes (a range apart from the engine's
 * ATTN_E* codes) with a message naming the field, tensor or byte offset.
 * Each code has a fixed HTTP status and a stable string for the JSON error
 * body; attn_proto_http_status() and attn_proto_code_name() also map the
 * engine's codes, so this file holds the whole error table of docs/design.md.
 */
#ifndef ATTN_PROTO_H
#define ATTN_PROTO_H

#include "engine.h"
#include "kv/kv.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* name, HTTP status, code string of the JSON error body, default message */
#define ATTN_PROTO_ERRNO_MAP(XX)                                                             \
  XX(EJSON, 400, "malformed_json", "the body is not valid JSON")                             \
  XX(ESAFETENSORS, 400, "malformed_safetensors", "the body is not a valid safetensors file") \
  XX(EEMPTY, 400, "empty_body", "the request has no body")                                   \
  XX(ETOOLARGE, 413, "too_large", "the body or a tensor is over a limit")                    \
  XX(EMEDIATYPE, 415, "unsupported_media_type", "unknown content type")                      \
  XX(EMISSING, 422, "missing_tensor", "a tensor q, k or v is missing")                       \
  XX(EUNKNOWNTENSOR, 422, "unknown_tensor", "a tensor other than q, k, v")                   \
  XX(ETENSOR, 422, "invalid_tensor", "a tensor's shape, dtype or data is invalid")           \
  XX(ESHAPE, 422, "shape_mismatch", "tensor shapes do not fit together")                     \
  XX(EDTYPE, 422, "dtype_mismatch", "tensors have different dtypes")                         \
  XX(ENONFINITE, 422, "non_finite", "a tensor holds NaN or infinity")                        \
  XX(EOPTION, 422, "unknown_option", "an option this API does not have")                     \
  XX(EOPTVALUE, 422, "invalid_option", "an option's value has the wrong type or range")      \
  XX(ENOMEM, 503, "out_of_memory", "out of memory")                                          \
  XX(EFRAMING, 400, "malformed_binary", "binary tensor data does not match its JSON header")

typedef enum attn_proto_errno {
  ATTN_PROTO__ERRNO_BASE = -2000,
#define ATTN_PROTO_ERRNO_DEF(name, status, code, msg) ATTN_PROTO_##name,
  ATTN_PROTO_ERRNO_MAP(ATTN_PROTO_ERRNO_DEF)
#undef ATTN_PROTO_ERRNO_DEF
      ATTN_PROTO__ERRNO_END
} attn_proto_errno;

/* HTTP status for a proto or engine error code (200 for 0, 500 unknown). */
int attn_proto_http_status(int code);
/* The "code" string of the JSON error body for a proto or engine code. */
const char *attn_proto_code_name(int code);

/* ---- limits ------------------------------------------------------------ */

#define ATTN_PROTO_MAX_HEADER (100u << 20) /* safetensors JSON header bytes */
#define ATTN_PROTO_MAX_DEPTH 6             /* JSON nesting: object, tensor, 4 dims */
/* Numbers in one JSON body: 2^24 (64 MiB of F32 tensors) bounds what
 * one JSON decode may allocate, whatever the body size. */
#define ATTN_PROTO_MAX_JSON_ELEMS ((size_t)1 << 24)
/* Most offsets a JSON cu_seqlens tensor may hold (B + 1: 4096 sequences;
 * safetensors takes more). Stored as int64, they are the one part of a JSON
 * decode over 4 bytes a number: attn_proto_json_decode_bound() adds 4 bytes
 * for each number that could be one. */
#define ATTN_PROTO_MAX_JSON_CU ((size_t)4097)

/* ---- options ----------------------------------------------------------- */

/* Bits of attn_options.set */
enum {
  ATTN_OPT_CAUSAL = 1u << 0,
  ATTN_OPT_SCALE = 1u << 1,
  ATTN_OPT_WINDOW_LEFT = 1u << 2,
  ATTN_OPT_WINDOW_RIGHT = 1u << 3,
  ATTN_OPT_STATS = 1u << 4,
  ATTN_OPT_BACKEND = 1u << 5,
  ATTN_OPT_SOFTCAP = 1u << 6,
  ATTN_OPT_DIAG_OFFSET = 1u << 7,
};

struct attn__fields;

typedef struct attn_options {
  bool causal, stats;
  double scale;   /* NaN: 1/sqrt(D) */
  double softcap; /* 0: off */
  int64_t window_left, window_right;
  int64_t diag_offset; /* ATTN_DIAG_AUTO unless set */
  char backend[16];    /* "auto", "cpu", "cuda", "reference" */
  unsigned set;        /* ATTN_OPT_* bits of the options given */
  /* Fields of a decode's own beside the options (a session call's,
   * attn_proto_decode_session): NULL for every other request, to which
   * they are unknown options. */
  const struct attn__fields *fields;
} attn_options;

/* The kind of value an option takes, for typed sources (JSON). */
typedef enum attn_option_kind {
  ATTN_OPTK_NONE = 0, /* not an option */
  ATTN_OPTK_BOOL,
  ATTN_OPTK_NUMBER,
  ATTN_OPTK_INT,
  ATTN_OPTK_STRING,
} attn_option_kind;

void attn_options_init(attn_options *o);
attn_option_kind attn_option_kind_of(const char *name, size_t len);

/*
 * The one option parser: sets option `name` from its text form (as a query
 * string or __metadata__ carries it). Booleans are true/false/1/0; scale a
 * finite number; softcap a finite number >= 0 (0: off; the engine bounds
 * it further); windows an integer >= -1; backend auto, cpu, cuda or
 * reference. Returns 0, ATTN_PROTO_EOPTION (unknown name) or
 * ATTN_PROTO_EOPTVALUE, naming the option and its source ("query",
 * "__metadata__", "JSON field").
 */
int attn_options_set(attn_options *o, const char *name, size_t name_len, const char *value,
                     size_t value_len, const char *source, attn_status *st);

/* A URL query string ("causal=true&scale=0.125", percent-encoding and '+'
 * decoded); NULL or "" sets nothing. */
int attn_options_parse_query(attn_options *o, const char *query, attn_status *st);

/* Options set in `over` replace those in `base` (the body wins over the
 * query string). */
void attn_options_merge(attn_options *base, const attn_options *over);

/* ---- decoded requests -------------------------------------------------- */

/*
 * The tensors of a request, by pass, in this order: q, k, v, and for a
 * backward pass also o (the forward's output), do (dL/dO) and lse (the
 * forward's, optional); then, in either pass, the optional alibi_slopes
 * (F32 [Hq] or [B, Hq]), cu_seqlens_q/kv and sinks (F32 [Hq]). The table is the one both codecs,
 * both directions, read: a name's index is its place in attn_proto_build's array, which has
 * ATTN_PROTO_MAX_TENSORS entries whatever the pass (those not of the pass,
 * or not sent, have data NULL).
 */
enum {
  ATTN_PROTO_T_Q,
  ATTN_PROTO_T_K,
  ATTN_PROTO_T_V,
  ATTN_PROTO_T_O,
  ATTN_PROTO_T_DO,
  ATTN_PROTO_T_LSE,
  ATTN_PROTO_T_ALIBI,
  ATTN_PROTO_T_CU_Q,  /* cu_seqlens_q and cu_seqlens_kv: either pass, optional, */
  ATTN_PROTO_T_CU_KV, /* I32 or I64 [B+1] on the wire, int64 once decoded */
  ATTN_PROTO_T_SINKS, /* sinks: either pass, optional, F32 [Hq] */
  ATTN_PROTO_MAX_TENSORS
};
/* "q", "k", "v", "o", "do", "lse", "alibi_slopes", "cu_seqlens_q",
 * "cu_seqlens_kv", "sinks"; NULL past the end. */
const char *attn_proto_tensor_name(int i);
/* Whether a request of this pass may hold tensor i (q, k, v, alibi_slopes,
 * the cu_seqlens and sinks in both; o, do and lse in a backward pass). */
bool attn_proto_tensor_in_pass(int i, attn_pass pass);
/* Whether tensor i may be left out (lse, alibi_slopes, the cu_seqlens,
 * sinks). */
bool attn_proto_tensor_optional(int i);
/* Element bytes of a cu_seqlens dtype name ("I32" 4, "I64" 8), else 0. */
int attn_proto_cu_dtype_bytes(const char *name);
/* n little-endian integers of `bytes` (4 or 8) at src as a new int64
 * array in *pout (malloc'd); ATTN_PROTO_ENOMEM. */
int attn_proto_cu_widen(const void *src, size_t n, int bytes, int64_t **pout, attn_status *st);
/* The request's tensors of this pass for messages: "q, k and v (and
 * optionally ...)" or "q, k, v, o, do and optionally ...". */
const char *attn_proto_tensor_list(attn_pass pass);

/* One tensor as a codec found it, before the shapes are checked together. */
typedef struct attn_proto_tensor {
  const char *name; /* "q", "k", "v", "o", "do" or "lse" */
  attn_dtype dtype;
  int rank; /* 2 [N, D], 3 [H, N, D] or 4 [B, H, N, D]; lse one less */
  int64_t shape[4];
  const void *data; /* rank-major contiguous elements of dtype; NULL: absent */
} attn_proto_tensor;

typedef struct attn_proto_req {
  attn_request req;    /* ready for attn_engine_submit(); req.pass says which */
  attn_options opts;   /* the effective options */
  int rank;            /* of q, k, v (and o, do, dq, dk, dv) */
  int64_t shape_q[4];  /* q's and dq's; m, l, lse drop the last dim */
  int64_t shape_kv[4]; /* k's and dk's */
  int64_t shape_o[4];  /* o's, do's: q's with v's last dim Dv (the value head dim) */
  int64_t shape_v[4];  /* v's and dv's: k's with last dim Dv */
  void *owned[ATTN_PROTO_MAX_TENSORS]; /* decoder-made buffers (converted or realigned data) */
  void *out; /* forward: O, then m, l, lse when opts.stats; backward: dq, dk, dv (, dsinks) */
  size_t out_bytes; /* of out */
  /* Frees out when set (attn_proto_req_set_out); else free(). */
  void (*out_free)(void *ctx, void *p);
  void *out_ctx;
  /* Members the reply adds after its tensors, or "": JSON text for a JSON
   * reply ("\"length\": 9"), string members of __metadata__ for a
   * safetensors one ("\"length\": \"9\""): a session call's. */
  char *reply_json, *reply_meta; /* NULL: none; malloc'd, freed with pr */
} attn_proto_req;

/*
 * Checks q, k, v together (same rank and dtype, matching B, D of q and k, v
 * k's shape but for its last dim Dv (req.head_dim_v; the engine bounds it),
 * Hq a multiple of Hkv, every dim >= 1), alibi_slopes when t[ATTN_PROTO_T_ALIBI]
 * has data (F32, [Hq] or [B, Hq]), and fills pr->req from them and from opts,
 * allocating O and the statistics. Codecs call this; it is public so clients
 * that build tensors themselves get the same checks.
 */
int attn_proto_build(attn_proto_req *pr, const attn_proto_tensor t[ATTN_PROTO_MAX_TENSORS],
                     const attn_options *opts, attn_status *st);
/*
 * The same for either pass: t holds ATTN_PROTO_MAX_TENSORS tensors in the
 * table's order (data NULL for those absent, and those not of the pass not looked at; cu_seqlens
 * data int64: a variable-length batch, checked as [B+1] both, q not rank 4). A backward pass also
 * checks that o and do have o's shape (q's with v's last dim Dv) and q's dtype (ATTN_PROTO_ESHAPE,
 * EDTYPE) and lse, when t[5].data is not NULL, F32 of q's shape without its last dimension; refuses
 * the option stats (ATTN_PROTO_EOPTVALUE: a backward pass returns no statistics); and allocates dq,
 * dk (D) and dv (Dv) in the input dtype.
 */
int attn_proto_build_pass(attn_proto_req *pr, attn_pass pass, const attn_proto_tensor *t,
                          const attn_options *opts, attn_status *st);

void attn_proto_req_free(attn_proto_req *pr);

/*
 * Moves pr's outputs, before they are computed, into buf (out_bytes at
 * least, 4-byte aligned): the request's output pointers keep their
 * offsets, the old buffer is freed, and free_fn(ctx, buf) frees the new one
 * with pr. A caller puts them in memory of its own this way (the server:
 * page-locked memory a GPU downloads into directly).
 */
void attn_proto_req_set_out(attn_proto_req *pr, void *buf, void (*free_fn)(void *ctx, void *p),
                            void *ctx);

/* ---- the codecs -------------------------------------------------------- */

/*
 * safetensors: an 8-byte little-endian header length N, N bytes of JSON
 * header {name: {"dtype", "shape", "data_offsets": [begin, end]}} with an
 * optional "__metadata__" of string values (options), then the data, offsets
 * relative to its start. Options: the query's, overridden by __metadata__.
 */
int attn_proto_decode_safetensors(const void *body, size_t len, const attn_options *query,
                                  attn_proto_req *pr, attn_status *st);
/* Either pass: a backward request holds q, k, v, o, do and optionally lse
 * (F32), exactly those. attn_proto_decode_safetensors is the forward pass. */
int attn_proto_decode_safetensors_pass(const void *body, size_t len, attn_pass pass,
                                       const attn_options *query, attn_proto_req *pr,
                                       attn_status *st);
/* Tensor `which` (ATTN_PROTO_T_*) of a safetensors file that holds any of
 * the request tensors but need not hold them all (a client's file of one
 * input, e.g. `attn infer --alibi-slopes FILE`): the header and layout get
 * the decoder's checks, the shapes none. *t with its data in *pcopy
 * (malloc'd, the caller frees it), or t->data NULL when the file does not
 * hold that tensor. 0 or an error. */
int attn_proto_safetensors_tensor(const void *body, size_t len, int which, attn_proto_tensor *t,
                                  void **pcopy, attn_status *st);
/* Writes o (and m, l, lse as F32 when pr->opts.stats), or for a backward
 * request dq, dk, dv (and dsinks, F32, with sinks), with the header padded with spaces to a
 * multiple of 8 bytes. *pbuf is malloc'd. */
int attn_proto_encode_safetensors(const attn_proto_req *pr, void **pbuf, size_t *plen,
                                  attn_status *st);
/* The same reply without copying the tensors: *phead (malloc'd, *phlen
 * bytes: the length, header and padding), then parts[0..*nparts) in order,
 * which point into pr's outputs (pr->out) and live as long as they do. */
#define ATTN_PROTO_MAX_PARTS 4
typedef struct attn_proto_part {
  const void *data;
  size_t len;
} attn_proto_part;
int attn_proto_encode_safetensors_parts(const attn_proto_req *pr, void **phead, size_t *phlen,
                                        attn_proto_part parts[ATTN_PROTO_MAX_PARTS], int *nparts,
                                        attn_status *st);

/*
 * JSON: {"q": T, "k": T, "v": T, options...} where T is {"shape": [...],
 * "dtype": "F32"|"F16"|"BF16", "data": [flat row-major numbers]} or nested
 * arrays of numbers (F32, shape inferred, ragged refused). Options: the
 * query's, overridden by the body's fields.
 */
int attn_proto_decode_json(const char *body, size_t len, const attn_options *query,
                           attn_proto_req *pr, attn_status *st);
/* Either pass: a backward body is {"q", "k", "v", "o", "do", "lse"?,
 * options...}, where lse is F32 and a null element is -inf (a row with no
 * visible key). attn_proto_decode_json is the forward pass. */
int attn_proto_decode_json_pass(const char *body, size_t len, attn_pass pass,
                                const attn_options *query, attn_proto_req *pr, attn_status *st);
/*
 * The most memory a JSON decode of a len-byte body allocates beyond the
 * body, whether it succeeds or fails: the input tensors, at most
 * min(len / 2, ATTN_PROTO_MAX_JSON_ELEMS) numbers of 4 bytes (each number
 * takes two bytes of text at least, its separator included), so at most 2x
 * the body and at most 64 MiB, plus 4 more bytes for each of at most
 * 2 x ATTN_PROTO_MAX_JSON_CU numbers that could be cu_seqlens offsets
 * (int64). The reader itself allocates nothing. It
 * holds for either pass: it counts stored elements (numbers and the nulls of
 * a backward lse), not tensors. Not counted: the outputs attn_proto_build()
 * allocates (out_bytes; forward: O, q's rows times Dv, and 12 bytes a query
 * row with stats; backward: dq, dk, dv, the size of q, k and v, and dsinks,
 * the size of sinks), which every codec needs. With Dv above D they can
 * pass the inputs many times over; the server reserves what passes the
 * body's size once a decode has set out_bytes.
 */
size_t attn_proto_json_decode_bound(size_t len);
/* {"o": {shape, dtype, data}, "m"|"l"|"lse": {...} when stats, "backend":
 * backend}; for a backward request {"dq", "dk", "dv", "dsinks" (with sinks), "backend"}. Each
 * number is the shortest %.Ng text that reads back to the same value in its dtype (proto/README.md
 * says how shortest); a non-finite value (the -inf m and lse of a row with no visible key) is
 * written as null. *pbuf is malloc'd and NUL-terminated; *plen excludes the NUL. */
int attn_proto_encode_json(const attn_proto_req *pr, const char *backend, char **pbuf, size_t *plen,
                           attn_status *st);

/* ---- sessions (POST /v1/sessions/{id}/attention, /v1/sessions/_batch) -- */

/*
 * A session call's body is a forward request's (either codec, options
 * from the query string, __metadata__ or JSON fields, the body winning)
 * with these differences: k [Hkv, Nnew, D] and v [Hkv, Nnew, Dv] (or
 * [Nnew, D], [Nnew, Dv]) are optional (both or neither; a latent session's
 * calls send k alone), Dv is the session's and their Nnew need not be q's;
 * o is [Hq, Nq, Dv]; causal defaults to true; diag_offset is refused (the
 * mask aligns to the layer's keys); and three more fields: `layer` (an
 * integer >= 0, default 0), `pos` (an integer >= 0, required with k) and,
 * for a batch call, `sessions` (the ids) with `pos` one per session — JSON
 * arrays, or comma-separated in a query string or __metadata__. A batch
 * call's q is [Hq, total_q, D] with cu_seqlens_q (one sequence a session),
 * k and v [Hkv, total_new, D or Dv] with cu_seqlens_kv.
 * attn_proto_decode_session decodes one.
 */
#define ATTN_PROTO_MAX_BATCH 256

typedef struct attn_proto_session {
  bool batch; /* POST /v1/sessions/_batch */
  int64_t layer;
  int npos, nids;
  int64_t pos[ATTN_PROTO_MAX_BATCH];
  char ids[ATTN_PROTO_MAX_BATCH][ATTN_KV_ID_MAX + 1];
  /* The session's shape (a batch's first session's: the store refuses an
   * entry whose values differ), asked once the fields are read, for what
   * the call's tensors depend on: the width Dv of v and o, and whether v
   * is sent at all (a latent session's, v_from_k, is part of k). 0, or an
   * error with st set (an unknown session's). NULL (the default): a
   * session of v's width, or q's D without v, that takes v. */
  int (*shape_of)(void *arg, const struct attn_proto_session *ps, attn_kv_shape *sh,
                  attn_status *st);
  void *shape_arg;
} attn_proto_session;

void attn_proto_session_init(attn_proto_session *ps, bool batch);

/* A session call's body[0..len) (JSON when json, else safetensors) with
 * the options of query (a URL query string, or NULL): its own fields into
 * ps (attn_proto_session_init'd; ps->batch says which route), its request
 * into pr. 0, or an error with st set and pr freed. */
int attn_proto_decode_session(const char *body, size_t len, bool json, const char *query,
                              attn_proto_session *ps, attn_proto_req *pr, attn_status *st);

/* The store's entries of a call decoded with ps (req its request, as either
 * decoder left it; id the route's session, unused by a batch): one for a
 * session's route, one a session of ps->ids for the batch, each with its
 * pos and its rows of the new k and v (none without them). The decoders
 * checked the batch's offsets (ATTN_ESHAPE otherwise), so this is only
 * arithmetic that cannot overflow. entries holds ATTN_PROTO_MAX_BATCH; the
 * ids point into ps and id. Returns the count. */
int64_t attn_proto_session_entries(const attn_proto_session *ps, const attn_request *req,
                                   const char *id, attn_kv_entry *entries);

/* PUT /v1/sessions/{id}'s body {"heads_kv", "head_dim", "dtype",
 * "max_tokens", "layers"? (1), "ttl_s"? (600; from 1 to ttl_max),
 * "head_dim_v"? (head_dim; from 1 to ATTN_MAX_HEAD_DIM_V), "v_from_k"? (a
 * latent session of that Dv, at most head_dim; with head_dim_v, equal to
 * it), "reserve"? ("whole" or "grow": sh->grow)} into *sh (head_dim_v 0 when it is head_dim) and
 * *ttl_s; unknown and repeated fields refused, another dtype ATTN_EDTYPE, and a string holding a
 * NUL (\u0000) refused, as in the truncate's. */
int attn_proto_session_create_decode(const char *body, size_t len, double ttl_max,
                                     attn_kv_shape *sh, double *ttl_s, attn_status *st);
/*
 * A session as one safetensors file (GET /v1/sessions/{id}/export, PUT
 * /v1/sessions/{id}/import): __metadata__ its parameters as strings,
 * "heads_kv", "head_dim", "head_dim_v", "dtype", "layers", "max_tokens",
 * "ttl_s", "v_from_k" (a latent session's only: its head_dim_v) and
 * "lengths" (a JSON array, one length a layer: "[37,0,300]"); tensors
 * "k.L" [heads_kv, length_L, head_dim] and, unless latent, "v.L"
 * [heads_kv, length_L, head_dim_v] per layer L, in the session's dtype,
 * data in that order; a quantized session's (metadata "kv_dtype") in its
 * kv_dtype (F8_E4M3 or I8), each followed by its rows' scales "k_scale.L"
 * ("v_scale.L"), F32 [heads_kv, length_L]; its k[l] (v[l]) buffers, an
 * export's and an import's, hold the codes and then the scales (kv.h). Encoded from a store's
 * export (attn_kv_export's lengths and buffers; *pbuf malloc'd). Decoded strictly: the header as a
 * call's safetensors, the metadata as a create's fields (ttl_max:
 * --session-ttl-max), each length 0 to max_tokens, exactly the tensors
 * the metadata names, each of its dtype and shape, tiling the data; k[l]
 * and v[l] then point into body (or into f->owned, an aligned copy of the
 * data when body's is not, and for a quantized session each layer's codes
 * joined to their scales: attn_proto_session_file_free frees it). The
 * values' finiteness is the store's to check (attn_kv_import).
 */
typedef struct attn_proto_session_file {
  attn_kv_shape shape; /* head_dim_v set */
  double ttl_s;
  int64_t lengths[ATTN_KV_MAX_LAYERS];
  const void *k[ATTN_KV_MAX_LAYERS], *v[ATTN_KV_MAX_LAYERS];
  void *owned;
} attn_proto_session_file;
int attn_proto_session_file_encode(const attn_kv_shape *sh, double ttl_s, const int64_t *lengths,
                                   void *const *k, void *const *v, void **pbuf, size_t *plen,
                                   attn_status *st);
/* The same file's header alone, for a writer that sends the data after
 * it as the store reads it out (kv.h, attn_kv_export_read: the order
 * attn_kv_export's buffers hold it in): *phead malloc'd, *plen its bytes,
 * *pdata the bytes of data that follow it. */
int attn_proto_session_file_head(const attn_kv_shape *sh, double ttl_s, const int64_t *lengths,
                                 void **phead, size_t *plen, size_t *pdata, attn_status *st);
int attn_proto_session_file_decode(const void *body, size_t len, double ttl_max,
                                   attn_proto_session_file *f, attn_status *st);
void attn_proto_session_file_free(attn_proto_session_file *f);

/* POST /v1/sessions/{id}/truncate's body {"length": n}. */
int attn_proto_session_truncate_decode(const char *body, size_t len, int64_t *length,
                                       attn_status *st);
/* POST /v1/sessions/{id}/fork's body {"id": the new session's id (checked
 * as kv.h's ids are), "length"? (0 to 2^30; absent: -1, each layer's own),
 * "ttl_s"? (from 1 to ttl_max; absent: 0, the source's)}, refused as the
 * truncate's is. */
int attn_proto_session_fork_decode(const char *body, size_t len, double ttl_max,
                                   char new_id[ATTN_KV_ID_MAX + 1], int64_t *length, double *ttl_s,
                                   attn_status *st);
struct attn_sbuf;
/* A session as GET /v1/sessions/{id} describes it: {"id", "heads_kv",
 * "head_dim", "dtype", "kv_dtype", "layers", "max_tokens", "ttl_s", "head_dim_v",
 * "v_from_k" (a latent session's only), "lengths": [one a layer],
 * "tokens", "reserve", "reserved_bytes", "used_bytes" (its tokens'
 * pages), "shared_bytes" (bytes of pages it holds that its forks hold
 * too), "expires_in_s"}; lengths may be NULL
 * (then []). */
void attn_proto_session_info_json(struct attn_sbuf *b, const attn_kv_info *info,
                                  const int64_t *lengths, double now);

/* ---- the Open Inference Protocol (KServe v2, Triton's HTTP API) ------- */

/*
 * POST /v2/models/{model}/infer: a JSON request {"id"?, "inputs": [{"name":
 * "q"|"k"|"v", "shape", "datatype": "FP32"|"FP16"|"BF16", "data": [flat or
 * nested numbers] | "parameters": {"binary_data_size": n}}], "outputs"?:
 * [{"name": "o"|"m"|"l"|"lse", "parameters"?: {"binary_data": bool}}],
 * "parameters"?: {options, "binary_data_output": bool}}, optionally followed
 * by binary tensor data (Triton's binary_data extension): the JSON is the
 * first json_len bytes (the Inference-Header-Content-Length header), the
 * inputs with binary_data_size take the bytes after it in their order,
 * little-endian, row-major, and must use them all. proto/README.md is the
 * prose spec. The models are three names for one computation, differing
 * only in the datatype their metadata declare (tools such as perf_analyzer
 * generate data of that type): every model accepts all three datatypes.
 */
enum { ATTN_V2_O, ATTN_V2_M, ATTN_V2_L, ATTN_V2_LSE, ATTN_V2_NOUTS };
#define ATTN_V2_NMODELS 3
#define ATTN_V2_MAX_ID 256  /* bytes of a request's "id" */
#define ATTN_V2_MAX_DEPTH 7 /* request, inputs, input, data and 3 nested levels */

/* The model named name[0..len), 0 to ATTN_V2_NMODELS - 1, or -1. */
int attn_proto_v2_model(const char *name, size_t len);
/* "attention", "attention_fp16", "attention_bf16"; NULL past the end. */
const char *attn_proto_v2_model_name(int model);
/* "FP32", "FP16", "BF16": the protocol's datatype names. */
const char *attn_proto_v2_datatype(attn_dtype dt);

/* What a v2 request asks of its reply besides the tensors. */
typedef struct attn_v2_info {
  char id[ATTN_V2_MAX_ID + 1]; /* the request's "id", or "" */
  bool has_id;
  unsigned outputs; /* bits 1 << ATTN_V2_*: the outputs to return */
  unsigned binary;  /* those of them sent as binary data */
} attn_v2_info;

/*
 * Decodes body[0..len) whose JSON is its first json_len bytes (json_len ==
 * len: no binary data) into pr (as the other decoders do; opts.stats is set
 * when m, l or lse is asked for) and info. Options come from "parameters"
 * only; "stats" is refused there (outputs decide) and so are the protocol's
 * reserved parameters attnd does not implement (sequence_*, priority,
 * timeout, shared_memory_*, classification). Errors: EEMPTY, EJSON (syntax,
 * unknown or duplicate keys), EFRAMING (binary sizes that do not add up),
 * ETENSOR (datatype, shape, data), EMISSING, EUNKNOWNTENSOR (an input or
 * output name), EOPTION, EOPTVALUE, ENONFINITE, ETOOLARGE, and
 * attn_proto_build()'s. The body must outlive pr.
 */
int attn_proto_decode_v2(const void *body, size_t len, size_t json_len, attn_proto_req *pr,
                         attn_v2_info *info, attn_status *st);
/* The most a v2 decode allocates beyond the body: the JSON decode's bound
 * of its JSON part, plus twice every binary byte (an aligned copy, or
 * INT32 cu_seqlens widened to int64). */
size_t attn_proto_v2_decode_bound(size_t len, size_t json_len);
/*
 * The reply {"model_name", "model_version": "1", "id"?, "parameters":
 * {"backend"}, "outputs": [...]} with the outputs info asks for, in the
 * order o, m, l, lse, those of info->binary as binary data after the JSON
 * (Triton's binary tensor extension). id: info's, else fallback (NULL:
 * none). *phead (malloc'd, *phlen bytes) is the JSON; parts[0..*nparts)
 * are the binary outputs, which point into pr's outputs and are sent from
 * there (with parts, the JSON's length is the reply's
 * Inference-Header-Content-Length).
 */
int attn_proto_encode_v2_parts(const attn_proto_req *pr, const attn_v2_info *info,
                               const char *model, const char *fallback_id, const char *backend,
                               void **phead, size_t *phlen,
                               attn_proto_part parts[ATTN_PROTO_MAX_PARTS], int *nparts,
                               attn_status *st);
/* The protocol's error body {"error": message}, malloc'd, as
 * attn_proto_error_body() makes its own; NULL when out of memory. */
char *attn_proto_v2_error_body(const char *message, size_t *plen);

struct attn_sbuf;
/* GET /v2: {"name": "attnd", "version", "extensions": [...]}. */
void attn_proto_v2_server_metadata(struct attn_sbuf *b);
/* GET /v2/models/{model}: name, versions, platform, inputs q, k, v and
 * outputs o, m, l, lse with the model's datatype and shapes of -1. */
void attn_proto_v2_model_metadata(struct attn_sbuf *b, int model);
/* GET /v2/models/{model}/config: the same as Triton's model configuration
 * (max_batch_size 0: the shapes are whole, batch included). */
void attn_proto_v2_model_config(struct attn_sbuf *b, int model);

/* ---- the client side: requests out, replies in ----------------------- */

/*
 * Request bodies from an engine request's q, k, v (contiguous [B, H, N, D]
 * of r->dtype: batch, heads_q, seq_q, head_dim for q; heads_kv, seq_kv for
 * k and v; v, and a backward's o and do, end in attn_request_dv(r)) and the options set in opts
 * (NULL or none set: no options in the body; the server lets the body's options win over its query
 * string). safetensors: the header padded to a multiple of 8 bytes, so the server reads the tensors
 * in place, options as "__metadata__" string values. JSON: {"q": {"shape", "dtype", "data"}, "k",
 * "v", options as typed fields}, each number the shortest text that reads back to its value. *pbuf
 * is malloc'd (the JSON NUL-terminated, *plen without the NUL). Errors: ATTN_EINVAL for a request
 * without tensors or with a dimension below 1, ATTN_PROTO_ETOOLARGE when the sizes overflow,
 * ATTN_PROTO_ENOMEM. A backward request (r->pass) also writes o (r->o), do (r->dout) and, when
 * r->lse_in is not NULL, lse (F32 [B, Hq, Nq]; -inf as JSON null); send it
 * to POST /attention/backward.
 */
int attn_proto_encode_request_safetensors(const attn_request *r, const attn_options *opts,
                                          void **pbuf, size_t *plen, attn_status *st);
int attn_proto_encode_request_json(const attn_request *r, const attn_options *opts, char **pbuf,
                                   size_t *plen, attn_status *st);

/*
 * A reply read into pr's output buffers (pr->req.o in the request's dtype;
 * m, l, lse F32), pr as a request decoder or attn_proto_build made it for
 * the request that was sent: it says the shapes and dtype the reply must
 * have and, with pr->opts.stats, that m, l, lse are due. Exactly those
 * tensors are accepted: a missing, extra, mistyped or misshapen tensor, or
 * data that does not fit, is refused with a message naming the tensor
 * (ATTN_PROTO_EJSON or ESAFETENSORS for the syntax, EMISSING,
 * EUNKNOWNTENSOR, EDTYPE, ESHAPE, ETENSOR for the content). The output
 * buffers may be partly written when it fails.
 *
 * A backward request's reply (pr->req.pass) is dq, dk and dv, in the
 * request's dtype, into pr->req.dq, dk, dv, and with sinks dsinks (F32
 * [Hq]) into pr->req.dsinks: exactly those.
 *
 * JSON: {"o": {shape, dtype, data}, "m", "l", "lse", "backend"}; a null
 * number is -inf (JSON has no infinity; the encoder writes non-finite
 * statistics as null); F16 and BF16 numbers are rounded once to the dtype.
 * The "backend" string, when present, goes to backend (cap bytes, cut);
 * backend may be NULL.
 */
int attn_proto_decode_reply_safetensors(const void *body, size_t len, attn_proto_req *pr,
                                        attn_status *st);
int attn_proto_decode_reply_json(const char *body, size_t len, attn_proto_req *pr, char *backend,
                                 size_t cap, attn_status *st);

/* ---- JSON text helpers, errors and the memory plan -------------------- */

/* A growing text buffer; zero-initialize it. A failed allocation sets oom
 * and turns later writes into no-ops; p is NUL-terminated when not NULL. */
typedef struct attn_sbuf {
  char *p;
  size_t len, cap;
  bool oom;
} attn_sbuf;

bool attn_sbuf_reserve(attn_sbuf *b, size_t n);
void attn_sbuf_put(attn_sbuf *b, const char *s, size_t n);
void attn_sbuf_puts(attn_sbuf *b, const char *s);
void attn_sbuf_printf(attn_sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* s[0..len) as a quoted JSON string any strict decoder accepts, whatever
 * the bytes: '"' and '\\' escaped, control bytes (and DEL) as \\u00XX,
 * well-formed UTF-8 kept, each byte of invalid UTF-8 as U+FFFD. Over max
 * bytes of s it is cut between two characters and ends in "...". */
void attn_sbuf_json_strn(attn_sbuf *b, const char *s, size_t len, size_t max);
/* The NUL-terminated s, whole, as attn_sbuf_json_strn writes it. */
void attn_sbuf_json_str(attn_sbuf *b, const char *s);

/* Client bytes s[0..len) made safe to quote in a message or a log line:
 * printable ASCII as it is; control bytes, DEL, bytes past ASCII, quotes and
 * backslashes as \xNN (so no line can be ended early and no UTF-8 character
 * split), cut with "..." to fit cap. Returns dst. */
const char *attn_quote(char *dst, size_t cap, const char *s, size_t len);

/* Bytes of an error message that go into an error body; the rest is cut. */
#define ATTN_PROTO_MAX_MESSAGE 1024

/* The error body {"error": {"code": code, "message": message}}, malloc'd
 * and NUL-terminated; NULL when out of memory. Every error body of the
 * server and the clients comes from here, and messages quote what clients
 * sent, so both strings go through attn_sbuf_json_strn: the body is strict
 * JSON for any bytes, the message at most ATTN_PROTO_MAX_MESSAGE bytes. */
char *attn_proto_error_body(const char *code, const char *message, size_t *plen);
/* An error body's code and message read back (each cut to its cap, NUL-
 * terminated): what a client shows of an error reply. false when body[0..len)
 * is not such a body (a proxy's page, a cut reply). */
bool attn_proto_error_read(const char *body, size_t len, char *code, size_t ccap, char *msg,
                           size_t mcap);

/*
 * The memory plan's parameters from a query string (batch, heads, heads_kv,
 * seq_q, seq_kv, head_dim, dtype, pass; seq_q and head_dim required; seq_kv
 * defaults to seq_q, heads and batch to 1, dtype to F32, pass to forward,
 * backward being the other choice). Unknown names are
 * ATTN_PROTO_EOPTION, bad or missing values ATTN_PROTO_EOPTVALUE.
 */
int attn_proto_parse_plan_query(const char *query, attn_plan_params *pp, attn_status *st);
/* The plan as JSON (what `attn plan --json` prints), into b. */
void attn_proto_plan_json(attn_sbuf *b, const attn_plan_params *pp, const attn_plan *pl);

#ifdef __cplusplus
}
#endif
#endif
