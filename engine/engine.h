/*
 * engine.h — the attention engine's public contract: requests, backends,
 * the memory plan, status codes.
 *
 * It is the engine's one public header (the rest of engine/ is internal to
 * it). It describes one forward or backward pass of scaled-dot-product
 * attention as a plain struct (struct attn_request), validates it against
 * the rules of docs/design.md, and runs it asynchronously on a backend
 * chosen by name or automatically:
 *
 *   attn_engine *e;  attn_status st;
 *   attn_config cfg; attn_config_init(&cfg);
 *   if (attn_engine_open(&cfg, &e, &st) < 0) fail(st.message);
 *   attn_request r; attn_request_init(&r);  ...fill shapes and pointers...
 *   attn_engine_submit(e, &r, on_done, arg, &st);   // or attn_engine_run()
 *   attn_engine_close(e);
 *
 * Layout. A tensor is row-major [B, H, N, D] unless strides are given: element
 * (b, h, n, d) of Q sits at q + b*q_stride[0] + h*q_stride[1] + n*q_stride[2]
 * + d, in elements of the request's dtype (the innermost dimension is always
 * contiguous). An all-zero stride array means the contiguous layout. The
 * statistics m, l and lse are F32 arrays laid out [B, Hq, Nq] contiguously.
 *
 * Errors. Every function that can fail returns 0 or a negative ATTN_E* code
 * and, when given an attn_status, fills it with the code and a message that
 * names the offending field and value (e.g. "heads_q (6) is not a multiple of
 * heads_kv (4)"). attn_strerror() and attn_err_name() describe a bare code.
 *
 * Cancellation. A caller that may give up on a job (a deadline, a client
 * that left) points attn_request.cancel at an int it owns, zero at submit,
 * and later calls attn_cancel_set() on it from any thread. The engine reads
 * the flag between work items: the CPU backends before each item (a block of
 * query rows, a head of the reference), the CUDA backend before it stages a
 * job, after packing it and before unpacking the result (a kernel already
 * launched runs to its end). A job canceled in time still completes exactly
 * once, with ATTN_ECANCELED and its outputs partly written; one whose work
 * was all done may complete normally. Submitting with the flag already set
 * fails with ATTN_ECANCELED. The flag must stay valid until the callback.
 *
 * Threads. attn_engine_submit() and attn_engine_run() may be called from any
 * thread, concurrently. All requests share one worker pool sized by
 * attn_config.threads, so concurrent requests queue for cores instead of
 * oversubscribing them.
 *
 * Sessions (a KV cache kept between requests) are not the engine's: the
 * session store (kv/kv.h) is a client that runs its calls as engine jobs
 * over paged K/V. The ESESSION_* codes are listed here all the same, so
 * that every caller maps one list of codes.
 */
#ifndef ATTN_ENGINE_H
#define ATTN_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ATTN_VERSION "0.1.0"

/* Limits of the contract (docs/design.md, "Attention semantics"): q and k
 * take a head dim D up to ATTN_MAX_HEAD_DIM, v a value head dim Dv up to
 * ATTN_MAX_HEAD_DIM_V (DeepSeek's absorbed MLA decode: D 576, Dv 512). A
 * backend may take less (the cuda backend: 256) and declines the rest. */
#define ATTN_MAX_HEAD_DIM 576
#define ATTN_MAX_HEAD_DIM_V 512
/* A page of a paged K/V (attn_request.k_pages) holds a multiple of
 * ATTN_PAGE_MIN_TOKENS tokens. A session store gives its pages a multiple
 * of ATTN_PAGE_ALIGN_TOKENS wherever a page has room for that many rows
 * (the cuda kernels' key tiles divide it), and fewer only to rows too wide
 * for that (over 1 KiB: D 576 in BF16), which the cpu backend reads. */
#define ATTN_PAGE_MIN_TOKENS 16
#define ATTN_PAGE_ALIGN_TOKENS 64
/* Dimensions above this are refused as too large before any arithmetic. */
#define ATTN_MAX_DIM ((int64_t)1 << 40)

/*
 * The error list: one source for codes, names and default messages. The
 * server maps each to an HTTP status in one table (server/), so a new code
 * here must be added there too.
 */
#define ATTN_ERRNO_MAP(XX)                                                   \
  XX(EINVAL, "invalid argument")                                             \
  XX(ESHAPE, "invalid shape")                                                \
  XX(EHEADS, "heads_q is not a multiple of heads_kv")                        \
  XX(EDTYPE, "unknown or mismatched dtype")                                  \
  XX(ESCALE, "scale is not a finite number")                                 \
  XX(EWINDOW, "invalid attention window")                                    \
  XX(ENONFINITE, "input holds a non-finite value")                           \
  XX(EOVERFLOW, "sizes overflow 64-bit arithmetic")                          \
  XX(ERANGE, "attention scores overflow float32")                            \
  XX(ETOOBIG, "problem too large for this backend")                          \
  XX(ENOMEM, "out of memory")                                                \
  XX(EBACKEND, "unknown backend")                                            \
  XX(EUNSUPPORTED, "request not supported by this backend")                  \
  XX(ENODEV, "no device available for this backend")                         \
  XX(EDEVICE, "device failure")                                              \
  XX(ESHUTDOWN, "engine is shutting down")                                   \
  XX(ECANCELED, "request canceled")                                          \
  XX(ESESSION_EXISTS, "a session with this id exists with other parameters") \
  XX(ESESSION_NOT_FOUND, "no such session")                                  \
  XX(ESESSION_CONFLICT, "pos is not the layer's length")                     \
  XX(ESESSION_FULL, "the session's max_tokens would be passed")              \
  XX(ESESSION_MEMORY, "the session memory is fully reserved")

typedef enum attn_errno {
  ATTN_OK = 0,
  ATTN__ERRNO_BASE = -1000,
#define ATTN_ERRNO_DEF(name, msg) ATTN_##name,
  ATTN_ERRNO_MAP(ATTN_ERRNO_DEF)
#undef ATTN_ERRNO_DEF
      ATTN__ERRNO_END
} attn_errno;

/* Default message for a code; never NULL. */
const char *attn_strerror(int code);
/* Symbolic name of a code ("EHEADS"); never NULL. */
const char *attn_err_name(int code);

/* Seconds on the monotonic clock (CLOCK_MONOTONIC): the one clock of the
 * engine and the server, for durations and deadlines only. */
double attn_now(void);

#define ATTN_MSG_MAX 256

/* A code and a message a user can act on. */
typedef struct attn_status {
  int code;
  char message[ATTN_MSG_MAX];
} attn_status;

/* Sets st (when not NULL) from a printf format and returns code. */
int attn_status_set(attn_status *st, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ---- dtypes ----------------------------------------------------------- */

typedef enum attn_dtype { ATTN_F32 = 0, ATTN_F16 = 1, ATTN_BF16 = 2, ATTN_DTYPE_COUNT } attn_dtype;

/* safetensors name ("F32", "F16", "BF16"), or "?" for an unknown value. */
const char *attn_dtype_name(attn_dtype dt);
/* Parses a safetensors dtype name; returns 0 or ATTN_EDTYPE. */
int attn_dtype_parse(const char *name, attn_dtype *pdt);
/* Bytes of one element (4 or 2); 0 for an unknown dtype. */
size_t attn_dtype_size(attn_dtype dt);

/* Scalar conversions, round-to-nearest-even when narrowing. */
float attn_f16_to_f32(uint16_t h);
uint16_t attn_f32_to_f16(float f);
float attn_bf16_to_f32(uint16_t b);
uint16_t attn_f32_to_bf16(float f);
/* Doubles rounded once, to nearest even, straight to the narrow dtype (not
 * through float, whose own rounding could land on a tie). */
uint16_t attn_f64_to_f16(double x);
uint16_t attn_f64_to_bf16(double x);
/* Quantized session pages (attn_request.kv_quant): each row of K or V
 * stored as one-byte codes with one F32 scale, the row's largest |x|
 * over the code's largest magnitude (448 for F8_E4M3, the "fn" variant
 * with no infinity; 127 for I8), so code c stands for value(c)·scale. A
 * row of zeros has scale 0. */
typedef enum attn_kv_quant {
  ATTN_KVQ_NONE = 0,
  ATTN_KVQ_F8_E4M3 = 1,
  ATTN_KVQ_I8 = 2,
  ATTN_KVQ_COUNT
} attn_kv_quant;
/* The safetensors name of a quantized kind ("F8_E4M3", "I8"; "?" for
 * NONE or an unknown value), and the kind a name gives (0 or ATTN_EDTYPE). */
const char *attn_kv_quant_name(attn_kv_quant q);
int attn_kv_quant_parse(const char *name, attn_kv_quant *pq);
/* The largest magnitude of a kind's codes: 448 or 127. */
float attn_kv_quant_max(attn_kv_quant q);
/* Code c's value (E4M3: NaN for 0x7F and 0xFF, which no row holds). */
float attn_e4m3_to_f32(uint8_t c);
float attn_kv_code_value(attn_kv_quant q, uint8_t c);
/* x (finite) to the nearest code, ties to even, saturating at ±448
 * (±127): what a quantizer stores for x / scale. */
uint8_t attn_f32_to_e4m3(float x);
uint8_t attn_f32_to_i8(float x);
/* n elements of dtype dt at src quantized as one row: codes into dst, and
 * the scale returned (0 for a row of zeros, its codes all 0). */
float attn_kv_quantize_row(attn_kv_quant q, const void *src, attn_dtype dt, int64_t n,
                           uint8_t *dst);
/* Where a quantized page's row scales start: after page_tokens rows of
 * width bytes (a page's rows are its width apart), at a 64-byte boundary;
 * F32 scale i belongs to row i. The one layout of a quantized page, which
 * the store writes and the kernels read. */
static inline size_t attn_kv_quant_scales_at(int64_t page_tokens, int64_t width) {
  return ((size_t)page_tokens * (size_t)width + 63) & ~(size_t)63;
}

/* Element i of a buffer of dtype dt, widened to double. */
double attn_load_elem(const void *p, attn_dtype dt, size_t i);
/* Stores x rounded to dtype dt as element i. */
void attn_store_elem(void *p, attn_dtype dt, size_t i, float x);

/* ---- the request ------------------------------------------------------ */

/*
 * One forward pass. Shapes: Q [B, Hq, Nq, D], K and V [B, Hkv, Nkv, D],
 * O [B, Hq, Nq, D]; query head h reads KV head h / (Hq / Hkv).
 *
 * Masking is aligned to the bottom-right: with off = Nkv - Nq (or
 * diag_offset when set; attn_request_offset()), key j is visible to query i
 * when i + off - window_left <= j <= i + off + window_right;
 * a window side of -1 is unbounded. causal = true means window_right = 0 (a
 * window_right other than -1 or 0 together with causal is refused as
 * contradictory). A row with no visible key yields O = 0, m = -inf, l = 0,
 * lse = -inf.
 *
 * The request and every buffer it points to must stay valid until the
 * completion callback has run. When a job fails (ENONFINITE, ERANGE,
 * cancellation), O and the statistics hold garbage, never a result.
 */
typedef enum attn_pass { ATTN_FORWARD = 0, ATTN_BACKWARD = 1 } attn_pass;

/* diag_offset's default: off = seq_kv - seq_q (bottom-right alignment). */
#define ATTN_DIAG_AUTO INT64_MIN

/* n rows of a session's new keys or values that a job writes into a
 * device's page before it reads it (attn_request.page_rows): src holds
 * them packed, head_dim elements each; dst is the first row's place in a
 * page of the device's (attn_kv_open), rows page_pitch elements apart,
 * whose padding stays zero. */
typedef struct attn_page_rows {
  const void *src;
  void *dst;
  int64_t n;
} attn_page_rows;

typedef struct attn_request {
  attn_pass pass; /* ATTN_FORWARD (the default) or ATTN_BACKWARD, below */
  int64_t batch, heads_q, heads_kv, seq_q, seq_kv, head_dim;
  /* The values' own head dim Dv (DeepSeek's MLA: D 192, Dv 128), or 0:
   * head_dim. V is then [B, Hkv, Nkv, Dv] and O [B, Hq, Nq, Dv] (a
   * backward's dO and dV too); q and k keep head_dim, and so does the
   * default scale. The engine runs such a request as one of head dim
   * max(D, Dv) with the narrower side zero-padded (dv.c), on any backend;
   * with pages, rows max(D, Dv) wide (below). */
  int64_t head_dim_v;
  /* The engine's own, 0 in a caller's request (refused otherwise): on the
   * job dv.c makes of a request with Dv < head_dim, Dv. Past it, v's
   * columns reach only columns of o (a backward's dv) that are cut, and
   * o's and dout's are zero, so a backend may leave them out of its
   * products. */
  int64_t v_cols;
  attn_dtype dtype;
  double scale; /* NaN (set by attn_request_init) means 1/sqrt(head_dim) */
  bool causal;
  int64_t window_left, window_right; /* -1: unbounded */
  /* Variants (FlashAttention's definitions), applied in this order to each
   * scaled score s before the mask and the softmax: soft-capping, then the
   * ALiBi bias -slope·|i + off - j| (off as in the mask rule above). */
  double softcap;            /* 0: off; > 0: softcap * tanh(s / softcap) */
  const float *alibi_slopes; /* NULL: off; F32 slopes, [Hq] or [B, Hq] */
  int64_t alibi_stride_b;    /* 0: one [Hq] vector shared by every batch; Hq: [B, Hq] */

  /* Sinks (gpt-oss): NULL, or F32 logits [Hq], one per query head and
   * shared by the batch. Each adds to every row's softmax a virtual key of
   * logit sinks[h] (not scaled, not masked, no variant) and a zero value:
   * m = max(max_j s_ij, sinks[h]), l = sum_j exp(s_ij - m) + exp(sinks[h]
   * - m), O = sum_j exp(s_ij - m) v_j / l, lse = m + ln l. A row with no
   * visible key gives O = 0, m = lse = sinks[h], l = 1. */
  const float *sinks;

  /* ATTN_DIAG_AUTO (set by attn_request_init): off = Nkv - Nq. Otherwise
   * the off of the mask rule, |off| <= 2^40: 0 is torch's top-left
   * is_causal; a shard holding keys [a, b) of a longer K/V uses the whole
   * problem's off minus a. Refused with cu_seqlens (each sequence has its
   * own off). */
  int64_t diag_offset;
  /*
   * Variable-length batch (FlashAttention's cu_seqlens): NULL, or both set
   * to [batch + 1] non-decreasing offsets from 0 to seq_q (seq_kv). Q and O
   * are then [Hq, seq_q, D] and K, V [Hkv, seq_kv, D] (the batch strides
   * are ignored) with the batch's sequences concatenated along N; sequence
   * b is its own problem on rows [cu_seqlens_q[b], cu_seqlens_q[b + 1]) and
   * keys [cu_seqlens_kv[b], cu_seqlens_kv[b + 1]) with its own off, and may
   * have no query or no key. Statistics (and lse_in) are packed [Hq, seq_q].
   */
  const int64_t *cu_seqlens_q, *cu_seqlens_kv;

  const void *q, *k, *v; /* inputs, dtype elements */
  /*
   * Paged K and V (a session's cache, kv/kv.h), used instead of k and v
   * (which must then be NULL) when k_pages is set: key j of (batch b, KV
   * head hk) is row j % page_tokens of page
   * k_pages[(b * heads_kv + hk) * pages_per_head + j / page_tokens] (v
   * likewise), rows head_dim elements apart, contiguous within a page
   * (with head_dim_v set, rows W = max(head_dim, head_dim_v) elements apart
   * for K and V alike: k's columns past head_dim must be zero, and v's past
   * head_dim_v are ignored, so v_pages may be k_pages, as a latent
   * session's are). With cu_seqlens, b is the sequence and its keys are
   * numbered from 0. Only the forward pass reads pages; page_tokens is at
   * least ATTN_PAGE_MIN_TOKENS. k_stride and v_stride are ignored.
   * page_pitch 0: host pages, rows head_dim (W) elements apart, which the
   * cpu backend reads; else device pages (a store on a GPU: attn_kv_open), rows
   * page_pitch (at least W) elements apart, zero-padded, which only the
   * backend that lent them reads.
   */
  const void *const *k_pages, *const *v_pages;
  int64_t page_tokens, pages_per_head; /* page_tokens: a multiple of ATTN_PAGE_MIN_TOKENS */
  int64_t page_pitch;
  /* With a device's pages only ([batch], or NULL): batch entry b attends
   * keys [0, seqused_kv[b]) of its tables, its mask's diagonal at
   * seqused_kv[b] - seq_q (diag_offset must be auto), seq_kv being the
   * largest of them; so one job computes many sessions' steps of one
   * shape, each as it would be alone (FlashAttention's seqused_k). */
  const int64_t *seqused_kv;
  /* With a device's pages only, no cu_seqlens and no head_dim_v: rows the
   * job writes into its pages before its kernel reads them (a session
   * call's new tokens, which travel in the job's own upload); NULL and 0:
   * none. A job that fails may have written all, some or none of them. */
  const attn_page_rows *page_rows;
  int64_t npage_rows;
  /* The pages' largest |k| and |v|: their values were checked finite when
   * they were stored, so the kernel does not scan them again. */
  float kv_absmax[2];
  /* Host pages only (page_pitch 0): ATTN_KVQ_NONE (the default), or pages
   * of quantized rows: row i of a page is width W bytes of codes at i·W
   * (W = max(head_dim, head_dim_v)), its scale the F32 at
   * attn_kv_quant_scales_at(page_tokens, W) + 4·i; keys and values are
   * code·scale, computed in the request's dtype. */
  attn_kv_quant kv_quant;
  void *o; /* output, dtype elements */
  /* Element strides of the batch, head and sequence dimensions; all zero
   * means contiguous [B, H, N, D]. */
  int64_t q_stride[3], k_stride[3], v_stride[3], o_stride[3];

  /* Optional statistics, F32 [B, Hq, Nq]; NULL for those not wanted. */
  float *m, *l, *lse;

  /* "auto" (or NULL), "cpu", "cuda" or "reference". */
  const char *backend;

  /* NULL, or a flag the caller sets with attn_cancel_set() to stop the job
   * early (see "Cancellation" above). */
  const int *cancel;

  /* Backward pass (seed exercise 5), when pass == ATTN_BACKWARD. Reads q, k,
   * v, o (the forward output: an input here, never written) and dout = dL/dO
   * [B, Hq, Nq, D]; writes dq [B, Hq, Nq, D], dk and dv [B, Hkv, Nkv, D], all
   * in the request's dtype, with the same stride rules as above. lse_in is
   * the forward's lse (F32 [B, Hq, Nq], contiguous) or NULL, in which case
   * the backend recomputes it. m, l and lse must be NULL: a backward pass
   * returns no statistics. With GQA, dk and dv sum over the query heads of a
   * group; a row with no visible key contributes nothing. With sinks,
   * lse_in is the forward's lse with them, and dsinks (NULL: not wanted;
   * F32 [Hq], written whole) receives dL/dsinks[h] = -sum over the batch's
   * rows i of head h of exp(sinks[h] - lse_i) * (dO_i . O_i). */
  const void *dout;
  const float *lse_in;
  void *dq, *dk, *dv;
  float *dsinks;
  int64_t do_stride[3], dq_stride[3], dk_stride[3], dv_stride[3];
} attn_request;

/* Sets a cancel flag (atomically; any thread). */
void attn_cancel_set(int *flag);
/* Whether a cancel flag (NULL: none) is set (an atomic read). */
bool attn_cancel_is_set(const int *flag);

/* Zeroes r and sets the defaults: F32, scale NaN (default), windows -1. */
void attn_request_init(attn_request *r);

/*
 * Checks every rule of docs/design.md that can be checked without reading the
 * tensors (values are checked when the job runs: ATTN_ENONFINITE, and for a
 * backward pass's lse_in, ATTN_EINVAL on a -inf where the row sees keys). Returns 0
 * or the first error found, with a message naming the field. The ALiBi
 * slopes, a few floats, are the exception: they are read here (ENONFINITE
 * naming the slope, ERANGE when a bias could overflow float32), so every
 * backend refuses the same slopes.
 */
int attn_request_validate(const attn_request *r, attn_status *st);

/* One cu_seqlens array of n + 1 offsets named name: starts at 0, never
 * decreases, ends at total; ESHAPE naming the offset otherwise, the last
 * case in the words "<name>[n] = x but <rows> <total>" (rows: "seq_q is",
 * "q has"). The engine's own check of a request's offsets, for a codec
 * that cuts a body by them before a request exists. */
int attn_offsets_check(attn_status *st, const char *name, const int64_t *cu, int64_t n,
                       int64_t total, const char *rows);

/* Effective scale: r->scale, or 1/sqrt(head_dim) when it is NaN. */
double attn_request_scale(const attn_request *r);

/* The values' head dim: head_dim_v, or head_dim when it is 0. */
int64_t attn_request_dv(const attn_request *r);

/* The ALiBi slope of (batch b, query head h); 0 when ALiBi is off. */
double attn_request_alibi_slope(const attn_request *r, int64_t b, int64_t h);

/* Effective window; causal folded in, and a side so wide that it bounds no
 * key of any valid request (past 2^42) folded into -1, so that sums such as
 * i + off + right never overflow. */
void attn_request_window(const attn_request *r, int64_t *pleft, int64_t *pright);

/* The off of the mask rule: diag_offset, or seq_kv - seq_q when it is
 * ATTN_DIAG_AUTO. */
int64_t attn_request_offset(const attn_request *r);

/* Number of (query, key) pairs that are visible, summed over batch and heads. */
uint64_t attn_request_visible_pairs(const attn_request *r);

/* Score pairs before any mask, the work a request asks for whatever its
 * window: batch x heads_q x seq_q x seq_kv, or for a variable-length batch
 * heads_q times the sum of each sequence's seq_q x seq_kv. r must have
 * passed attn_request_validate(), which keeps it within 64 bits. */
uint64_t attn_request_pairs(const attn_request *r);

/* FLOPs actually needed: 4 * D * visible pairs for a forward pass (two
 * matrix products), 2.5 times that for a backward pass (five: S again, dV,
 * dP, dK and dQ), the convention of FlashAttention's papers. */
double attn_request_flops(const attn_request *r);

/* Sequence b of a valid variable-length request r as a problem of its own,
 * the one the engine runs for it: batch 1, the sequence's own seq_q and
 * seq_kv (either may be 0), pointers at its first rows, strides filled, no
 * cu_seqlens and no statistics (they are packed [Hq, total] in r). */
void attn_request_sequence(const attn_request *r, int64_t b, attn_request *sub);

/* ---- the float64 yardstick (reference.c, reference_bwd.c) -------------- */

/*
 * Standard attention in float64 on a valid request (one problem: no
 * cu_seqlens, no pages; attn_request_sequence() cuts a variable-length batch
 * into problems): o is [B, Hq, Nq, D] and m, l, lse [B, Hq, Nq], all
 * contiguous doubles (the statistics may be NULL). Returns 0 or an error
 * (ATTN_ENONFINITE naming the element for a non-finite input).
 */
int attn_reference(const attn_request *r, double *o, double *m, double *l, double *lse,
                   attn_status *st);

/*
 * Its backward pass: dq [B, Hq, Nq, D], dk and dv [B, Hkv, Nkv, D],
 * contiguous doubles. Returns 0 or an error.
 */
int attn_reference_backward(const attn_request *r, double *dq, double *dk, double *dv,
                            attn_status *st);

/*
 * A backward request's gradient of its sinks by the definition, [Hq]
 * doubles: through the softmax's Jacobian with the sink as one more logit
 * whose value is zero (not the kernels' shortcut from lse and dO·O).
 * Returns 0 or an error; EINVAL when the request has no sinks.
 */
int attn_reference_dsinks(const attn_request *r, double *dsinks, attn_status *st);

/*
 * The softmax merge rule (softmax.c): the statistics (m2, l2) of another
 * key range merged into (*pm, *pl), m = max(m1, m2), l = l1·e^(m1-m) +
 * l2·e^(m2-m) -- how the tiles, a split decode's chunks and attn infer's
 * shards are put together -- and e^(x - m) with its conventions at
 * infinities (softmax.h: -inf weighs 0, x = m = ±inf weighs 1).
 */
void attn_softmax_merge(double *pm, double *pl, double m2, double l2);
double attn_softmax_weight(double x, double m);

/* ---- the memory plan (seed exercise 1) --------------------------------- */

typedef struct attn_plan_params {
  int64_t batch, heads_q, heads_kv, seq_q, seq_kv, head_dim;
  attn_dtype dtype;
  int threads;    /* worker threads the flash workspace is counted for; 0: cores */
  attn_pass pass; /* ATTN_FORWARD (the default) or ATTN_BACKWARD */
} attn_plan_params;

/*
 * Bytes of each buffer. Standard attention materializes S = scale·QKᵀ and
 * P = softmax(S), both [B, Hq, Nq, Nkv] in the input dtype; the flash path
 * keeps m and l ([B, Hq, Nq], F32) and a per-thread tile workspace instead.
 *
 * A backward plan adds the gradients (dO in; dQ, dK, dV out, each the size
 * of its tensor). Standard backward holds S, P, dP = dO·Vᵀ and
 * dS = P∘(dP − rowsum(P∘dP)), all four [B, Hq, Nq, Nkv]; flash backward
 * holds per query row the forward's lse and D = rowsum(dO∘O) (F32), its
 * F32 dQ accumulators and the per-thread tile workspace, and recomputes S
 * and P tile by tile.
 */
typedef struct attn_plan {
  attn_pass pass;
  uint64_t q, k, v, o;
  uint64_t s, p, s_plus_p;
  uint64_t m, l, lse;
  uint64_t dout, dq, dk, dv; /* backward only (0 for forward) */
  uint64_t dp, ds, delta, dq_accum;
  uint64_t workspace_per_thread, workspace;
  int threads;
  /* Forward: q + k + v + o + s + p. Backward: q + k + v + o + dout + dq + dk
   * + dv + s + p + dp + ds. */
  uint64_t standard_total;
  /* Forward: q + k + v + o + m + l + workspace. Backward: the same tensors
   * and gradients + lse + delta + dq_accum + workspace. */
  uint64_t flash_total;
  double s_over_q; /* S : Q, the seed's 1:N/D */
  double standard_over_flash;
} attn_plan;

int attn_plan_compute(const attn_plan_params *pp, attn_plan *plan, attn_status *st);

/* ---- the engine ------------------------------------------------------- */

typedef struct attn_config {
  int threads; /* CPU worker threads; 0: one per online core */
  /* CPU kernel: NULL or "auto" (the best this CPU runs), "amx" (AMX-BF16
   * tiles; needs Linux's XTILEDATA permission, which the engine requests),
   * "avx512bf16" (VDPBF16PS), "avx512", "avx2" or "generic"; naming one
   * the CPU lacks makes the cpu backend unavailable. The first two compute
   * BF16 inputs with BF16 products (P rounded to BF16); all others, and F16
   * and F32 inputs everywhere, compute in F32. */
  const char *cpu_isa;
  /* Tuning of the AVX-512 kernels' F32 products (F32 and F16 inputs, and
   * BF16 on the avx512 kernel): NULL or "auto" (from the CPU: "intel" on
   * Intel, "amd" elsewhere), "intel" (6-row register blocks, V prefetched
   * and two query blocks per pass over K and V, for cores with two 512-bit
   * FMA pipes) or "amd" (4-row blocks, as tuned on Zen 4, whose 512-bit
   * FMAs issue as two 256-bit halves); an unknown name makes the cpu
   * backend unavailable. Results are the same bits either way. */
  const char *cpu_tune;
  /* Largest reference problem: S + P of one head, in bytes of float64. */
  uint64_t reference_max_bytes;
  /* CUDA backend: streams per device (0: 4) and the devices to use, a
   * comma-separated list of ordinals ("0,1"); NULL or "" means device 0. */
  int cuda_streams;
  const char *cuda_devices;
  /* Skips the CUDA backend's start-up self-check, which runs every kernel
   * instance on small shapes against the float64 reference and disables
   * those that fail (see attn_backend_info.disabled). */
  bool cuda_self_check_off;
  /* CUDA backend: most bytes of page-locked host memory it lends out
   * through attn_engine_host_alloc() (request bodies and replies the
   * device copies to and from directly); 0: none, every copy is staged. */
  uint64_t cuda_pinned_bytes;
  /* CUDA backend: the backward's dQ by atomic additions inside the dK/dV
   * pass (5 matrix products per tile pair instead of 7), whose dQ varies in
   * its last bits from run to run; false (the default) keeps the two-kernel
   * path, bitwise reproducible. The CPU backends are deterministic either
   * way. */
  bool cuda_bwd_atomic_dq;
} attn_config;

void attn_config_init(attn_config *cfg);

/* Whether attn_config.cpu_tune takes name: auto, intel or amd (NULL and ""
 * mean auto), for the tools that check a flag before opening an engine. */
bool attn_cpu_tune_known(const char *name);

/* Most CUDA devices one engine drives. */
#define ATTN_MAX_CUDA_DEVICES 16

/*
 * Parses a cuda_devices list ("0,2"; NULL or "" means device 0) into at most
 * cap ordinals, each listed once. Returns how many, or ATTN_EINVAL with a
 * message. Whether each device exists is checked when the engine opens.
 */
int attn_cuda_devices_parse(const char *spec, int *ord, int cap, attn_status *st);

typedef struct attn_engine attn_engine;

int attn_engine_open(const attn_config *cfg, attn_engine **pe, attn_status *st);
/* Waits for every submitted job to complete, then frees the engine. */
void attn_engine_close(attn_engine *e);

/* Worker threads of the CPU pool. */
int attn_engine_threads(const attn_engine *e);

/* What a completed job reports. */
typedef struct attn_result {
  attn_status status;    /* code 0 on success */
  const char *backend;   /* name of the backend that ran it, or NULL */
  double engine_seconds; /* wall time from the job's start to its end */
  double flops;          /* attn_request_flops() of the request */
} attn_result;

/*
 * Completion callback. It runs exactly once per accepted job, on an engine
 * thread (a CPU worker, or a backend's completion thread), never inside
 * attn_engine_submit(). It must not block for long: hand the result to your
 * own loop (uv_async_send) and return. The result is valid only during the
 * call.
 */
typedef void (*attn_done_fn)(const attn_result *res, void *arg);

/*
 * Validates r, picks a backend (r->backend, or the best one that supports r)
 * and queues the job. On failure nothing is queued, the callback is not
 * called, and the error is returned. On success the callback will run.
 */
int attn_engine_submit(attn_engine *e, const attn_request *r, attn_done_fn done, void *arg,
                       attn_status *st);

/* Submits and waits; res (optional) receives the result. */
int attn_engine_run(attn_engine *e, const attn_request *r, attn_result *res, attn_status *st);
/* The same, computed on the calling thread where the backend allows (the
 * CPU backend's forward pass; others queue as attn_engine_run does): for a
 * job so small that waking a worker and waiting for it costs more than
 * the job. The caller's thread is busy for the whole job. */
int attn_engine_run_here(attn_engine *e, const attn_request *r, attn_result *res, attn_status *st);

/* A kernel a backend's start-up self-check found wrong and turned off:
 * requests it would have run take another kernel or another backend. */
typedef struct attn_disabled {
  char kernel[24]; /* e.g. "mma_d128", "split_kv_merge" */
  char why[160];   /* e.g. "device 0: o error 0.31 > 4e-03 on F16 forward [...]" */
} attn_disabled;

/* Room for everything the cuda backend can turn off: its kernels
 * (ATTN_CU_KERNEL_COUNT, 18 today, with room for more), the split-KV
 * merge, the GQA packing, the backward's atomic dQ path and the paged view
 * ("paged_kv": sessions' pages then stay in host memory). */
#define ATTN_MAX_DISABLED 24

/* Backends compiled in, in preference order, and whether each can run now. */
typedef struct attn_backend_info {
  const char *name;
  bool available;
  char detail[128]; /* e.g. "avx512, 2 threads" or "no CUDA device found" */
  int ndisabled;    /* entries of disabled[] (at most ATTN_MAX_DISABLED) */
  attn_disabled disabled[ATTN_MAX_DISABLED];
} attn_backend_info;

/* Fills up to cap entries; returns how many backends there are. */
int attn_engine_backends(const attn_engine *e, attn_backend_info *out, int cap);

/*
 * Host memory a device backend copies to and from without staging: a
 * caller that puts a request's tensors (its body) and its outputs there
 * saves the host copy each way. n bytes, 64-byte aligned, from the cuda
 * backend's pool of page-locked memory (attn_config.cuda_pinned_bytes);
 * NULL when no backend lends any or the pool is spent: use ordinary memory
 * then, which works the same, staged. attn_engine_host_free() takes back
 * what came from here and returns true; false for any other pointer (the
 * caller frees that its own way). Any thread.
 */
void *attn_engine_host_alloc(attn_engine *e, size_t n);
bool attn_engine_host_free(attn_engine *e, void *p);
/* That pool: its cap, bytes lent out now, bytes page-locked now (lent and
 * kept idle for reuse), and allocations it refused (spent); all 0 without
 * one. */
typedef struct attn_host_stats {
  uint64_t cap, lent, pinned, refused;
} attn_host_stats;
void attn_engine_host_stats(attn_engine *e, attn_host_stats *out);

#ifdef __cplusplus
}
#endif
#endif /* ATTN_ENGINE_H */
