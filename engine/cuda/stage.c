/*
 * stage.c — a job's layout in a slot's memory, packed in and unpacked out.
 *
 * Host code without a CUDA call: the kernels' view of a request (its
 * shape, the kernels the selection picks, the groups a large job runs in),
 * where each tensor, the scan results and the outputs sit in the device
 * allocation and the pinned staging, which tensors move straight between
 * the device and the caller's memory, and the copies between the caller's
 * strided tensors and the packed [B, H, N, dp] layout the kernels read
 * (head dim padded to a multiple of 8) for those that do not.
 */
#include "cuda_int.h"

#include "check.h"

#include <math.h>
#include <string.h>

/* Regions of a job's buffers start on this boundary. */
#define ALIGN 256

static size_t align_up(size_t x) { return (x + ALIGN - 1) / ALIGN * ALIGN; }

int attn__cu_inputs(const attn_request *r, cu_tensor t[5]) {
  t[0] = (cu_tensor){"q", r->q, NULL, r->q_stride, false};
  if (r->k_pages) /* K and V are on the device already */
    return 1;
  t[1] = (cu_tensor){"k", r->k, NULL, r->k_stride, true};
  t[2] = (cu_tensor){"v", r->v, NULL, r->v_stride, true};
  if (r->pass != ATTN_BACKWARD)
    return 3;
  t[3] = (cu_tensor){"o", r->o, NULL, r->o_stride, false};
  t[4] = (cu_tensor){"do", r->dout, NULL, r->do_stride, false};
  return 5;
}

static int job_outputs(const attn_request *r, cu_tensor t[3]) {
  if (r->pass != ATTN_BACKWARD) {
    t[0] = (cu_tensor){"o", NULL, r->o, r->o_stride, false};
    return 1;
  }
  t[0] = (cu_tensor){"dq", NULL, r->dq, r->dq_stride, false};
  t[1] = (cu_tensor){"dk", NULL, r->dk, r->dk_stride, true};
  t[2] = (cu_tensor){"dv", NULL, r->dv, r->dv_stride, true};
  return 3;
}

/* The kernels' view of a request (device pointers filled in later). The
 * request may carry counts up to 2^40: they are checked against the grid
 * before they are narrowed to int, or a count of 2^32 + 1 would become 1
 * and the staging buffer would be sized for it. */
static int shape_of(const attn_request *r, attn_cu_params *p, attn_status *st) {
  memset(p, 0, sizeof *p);
  if (r->batch > ATTN_CU_MAX_GRID_YZ || r->heads_q > ATTN_CU_MAX_GRID_YZ)
    return attn_status_set(st, ATTN_EUNSUPPORTED,
                           "the cuda backend takes at most %d query heads and %d batch entries "
                           "(got %lld and %lld)",
                           ATTN_CU_MAX_GRID_YZ, ATTN_CU_MAX_GRID_YZ, (long long)r->heads_q,
                           (long long)r->batch);
  p->pass = r->pass;
  p->dtype = r->dtype;
  p->batch = (int)r->batch;
  p->heads_q = (int)r->heads_q;
  p->heads_kv = (int)r->heads_kv; /* divides heads_q: no larger */
  /* Past the maximum, one more than it: attn_cu_select refuses it. */
  p->seq_q = (int)(r->seq_q <= ATTN_CU_MAX_SEQ ? r->seq_q : ATTN_CU_MAX_SEQ + 1);
  p->seq_kv = (int)(r->seq_kv <= ATTN_CU_MAX_SEQ ? r->seq_kv : ATTN_CU_MAX_SEQ + 1);
  p->head_dim = (int)r->head_dim;
  p->dp = attn_cu_dp(r->head_dim);
  p->scale_log2 = (float)(attn_request_scale(r) * M_LOG2E);
  p->scale = (float)attn_request_scale(r);
  attn_request_window(r, &p->window_left, &p->window_right);
  p->off = attn_request_offset(r);
  /* softcap and ALiBi in log2 units, as the kernels keep scores */
  p->cap2 = (float)(r->softcap * M_LOG2E);
  p->inv_cap2 = r->softcap > 0 ? (float)(1.0 / (r->softcap * M_LOG2E)) : 0.0f;
  if (r->k_pages) { /* the tables' device addresses come with the job's memory */
    static const int32_t placeholder[1];
    p->k_table = p->v_table = placeholder; /* for the selection: a paged instance */
    p->page_bytes = ATTN_KV_PAGE_BYTES;
    p->page_tokens = (int)r->page_tokens;
    p->pages_per_head = (int)r->pages_per_head;
  }
  return 0;
}

/* Bytes of one packed tensor of the job. */
size_t attn__cu_packed_bytes(const cu_slot *sl, bool kv, size_t es) {
  const attn_cu_params *p = &sl->prm;
  size_t rows = (size_t)p->batch * (kv ? p->heads_kv : p->heads_q) * (kv ? p->seq_kv : p->seq_q);
  return rows * (size_t)p->dp * es;
}

/* A job is split into groups once its inputs pass GROUP_MIN bytes, each
 * group at least GROUP_BYTES of them: smaller pieces would cost more in
 * launches and events than their overlap saves. */
#define GROUP_MIN ((size_t)32 << 20)
#define GROUP_BYTES ((size_t)16 << 20)

static size_t input_bytes(const cu_slot *sl, const attn_request *r) {
  size_t es = attn_dtype_size(r->dtype), n = 0;
  cu_tensor in[5];
  int nin = attn__cu_inputs(r, in);
  for (int i = 0; i < nin; i++)
    n += attn__cu_packed_bytes(sl, in[i].kv, es);
  return n;
}

/* The groups of a forward job: whole batch entries when there are two or
 * more, else KV heads; one group for a backward pass or a small job. Each
 * group's shape and kernel choice (a smaller batch may split its keys). */
static int plan_groups(cu_slot *sl, const attn_request *r, int sms, unsigned off, attn_status *st) {
  const attn_cu_params *p = &sl->prm;
  int64_t per = p->batch > 1 ? p->heads_kv : 1; /* units per batch-entry step */
  int64_t steps = p->batch > 1 ? p->batch : p->heads_kv;
  size_t bytes = input_bytes(sl, r);
  int64_t want = r->pass == ATTN_FORWARD && !r->k_pages && bytes >= GROUP_MIN
                     ? (int64_t)(bytes / GROUP_BYTES)
                     : 1;
  want = want < steps ? want : steps;
  want = want < CU_MAX_GROUPS ? want : CU_MAX_GROUPS;
  int64_t each = (steps + want - 1) / want;
  sl->ngroups = (int)((steps + each - 1) / each);
  for (int g = 0; g < sl->ngroups; g++) {
    cu_group *gr = &sl->grp[g];
    int64_t s0 = g * each, ns = steps - s0 < each ? steps - s0 : each;
    gr->u0 = s0 * per;
    gr->nu = ns * per;
    gr->prm = *p;
    gr->prm.batch = p->batch > 1 ? (int)ns : 1;
    gr->prm.heads_kv = p->batch > 1 ? p->heads_kv : (int)ns;
    gr->prm.heads_q = gr->prm.heads_kv * (p->heads_q / p->heads_kv);
    gr->ch = sl->ch;
    int rc = sl->ngroups == 1 ? 0 : attn_cu_select_masked(&gr->prm, sms, off, &gr->ch, st);
    if (rc < 0)
      return rc;
  }
  return 0;
}

int64_t attn__cu_group_rows(const cu_slot *sl, int g, bool kv, int64_t *row0) {
  const attn_cu_params *p = &sl->prm;
  int64_t rows_per_unit = kv ? p->seq_kv : (int64_t)(p->heads_q / p->heads_kv) * p->seq_q;
  *row0 = sl->grp[g].u0 * rows_per_unit;
  return sl->grp[g].nu * rows_per_unit;
}

/* The split-KV scratch the largest group needs. */
static size_t split_bytes(const cu_slot *sl) {
  size_t n = 0;
  for (int g = 0; g < sl->ngroups; g++) {
    size_t b = attn_cu_split_bytes(&sl->grp[g].prm, &sl->grp[g].ch);
    n = b > n ? b : n;
  }
  return n;
}

/* q and O of a paged job up to this size travel in the staging (a memcpy
 * on the host each way), so the job is one upload and one download: a
 * decode step's are a few KiB, and three more DMAs cost it more than the
 * copies do. Larger ones (a prefill) move in place, as other jobs' do. */
#define FOLD_MAX ((size_t)1 << 20)

/* Rows of the job's page_rows, or SIZE_MAX past what a size_t holds. */
static size_t new_rows(const attn_request *r) {
  size_t n = 0;
  for (int64_t i = 0; i < r->npage_rows; i++) {
    if (r->page_rows[i].n < 0 || (uint64_t)r->page_rows[i].n > SIZE_MAX / 1024 - n)
      return SIZE_MAX;
    n += (size_t)r->page_rows[i].n;
  }
  return n;
}

/* The new rows' region and their offsets' after x; false on overflow. */
static bool layout_rows(cu_slot *sl, const attn_request *r, size_t rowb, size_t *x) {
  sl->nrows = new_rows(r);
  if (sl->nrows == SIZE_MAX)
    return false;
  sl->off_rows = sl->off_rowdst = SIZE_MAX;
  if (sl->nrows == 0)
    return true;
  sl->off_rows = *x;
  *x += align_up(sl->nrows * rowb);
  sl->off_rowdst = *x;
  *x += align_up(sl->nrows * sizeof(long long));
  return true;
}

/* Byte layout of a job in device memory; returns false on size overflow. */
static bool layout(cu_slot *sl, const attn_request *r) {
  const attn_cu_params *p = &sl->prm;
  const bool bwd = r->pass == ATTN_BACKWARD;
  size_t es = attn_dtype_size(r->dtype);
  size_t nq = (size_t)p->batch * p->heads_q * p->seq_q;
  size_t nkv = (size_t)p->batch * p->heads_kv * p->seq_kv;
  if (nq > SIZE_MAX / 16 / ((size_t)p->dp * es) || nkv > SIZE_MAX / 16 / ((size_t)p->dp * es))
    return false;
  cu_tensor in[5], out[3];
  sl->nin = attn__cu_inputs(r, in);
  sl->nout = job_outputs(r, out);
  sl->fold =
      r->k_pages && !bwd && sl->ngroups == 1 && attn__cu_packed_bytes(sl, false, es) <= FOLD_MAX;
  size_t x = 0, lse_bytes = align_up(nq * sizeof(float));
  for (int i = 0; i < sl->nin && !sl->fold; i++) {
    sl->off[i] = x;
    x = align_up(x + attn__cu_packed_bytes(sl, in[i].kv, es));
  }
  sl->off_misc = x;
  sl->off_lse = bwd && r->lse_in ? x : SIZE_MAX;
  x += bwd && r->lse_in ? lse_bytes : 0;
  sl->off_alibi = r->alibi_slopes ? x : SIZE_MAX;
  x += r->alibi_slopes ? align_up((size_t)p->batch * p->heads_q * sizeof(float)) : 0;
  const size_t head_bytes = align_up((size_t)p->heads_q * sizeof(float));
  sl->off_sinks = r->sinks ? x : SIZE_MAX;
  x += r->sinks ? head_bytes : 0;
  size_t tables = (size_t)p->batch * p->heads_kv * p->pages_per_head * sizeof(int32_t);
  sl->off_tables = r->k_pages ? x : SIZE_MAX;
  x += r->k_pages ? 2 * align_up(tables) : 0;
  sl->off_used = r->seqused_kv ? x : SIZE_MAX;
  x += r->seqused_kv ? align_up((size_t)p->batch * sizeof(int32_t)) : 0;
  if (!layout_rows(sl, r, (size_t)p->dp * es, &x))
    return false;
  if (sl->fold) { /* q last of the upload: its one copy covers [off_misc, up_end) */
    sl->off[0] = x;
    x = align_up(x + attn__cu_packed_bytes(sl, false, es));
  }
  sl->off_scan = x;
  x = align_up(x + (size_t)sl->ngroups * sl->nin * sizeof(attn_cu_scan_result));
  sl->up_end = x;
  for (int i = 0; i < sl->nout; i++) {
    sl->off_out[i] = x;
    x = align_up(x + attn__cu_packed_bytes(sl, out[i].kv, es));
  }
  float *const want[3] = {r->m, r->l, r->lse};
  for (int i = 0; i < 3; i++) {
    sl->off_stats[i] = want[i] ? x : SIZE_MAX;
    if (want[i])
      x = align_up(x + nq * sizeof(float));
  }
  sl->off_dsinks = r->dsinks ? x : SIZE_MAX;
  x += r->dsinks ? head_bytes : 0;
  sl->down_end = x;
  /* scratch lse: the backward's recomputed one, or the one a sink fold reads */
  if (bwd ? !r->lse_in : r->sinks && !r->lse) {
    sl->off_lse = x;
    x += lse_bytes;
  }
  sl->off_m = !bwd && r->sinks && r->l && !r->m ? x : SIZE_MAX; /* l' depends on m */
  x += sl->off_m != SIZE_MAX ? lse_bytes : 0;
  sl->off_ws = x;
  x += align_up(attn_cu_bwd_bytes(p));
  sl->dev_bytes = x + align_up(split_bytes(sl));
  return true;
}

int attn__cu_plan(cu_slot *sl, const attn_request *r, int sms, unsigned off, attn_status *st) {
  if (r->softcap > 0 || r->alibi_slopes) /* the Hopper instance has no variant path */
    off |= ATTN_CU_HOPPER_OFF;
  int rc = shape_of(r, &sl->prm, st);
  if (rc < 0)
    return rc;
  /* Set only where it is taken, so attn_cu_bwd_bytes sizes no accumulator
   * for a job on the two-kernel path. */
  sl->prm.bwd_atomic_dq = r->pass == ATTN_BACKWARD && !(off & ATTN_CU_ATOMIC_DQ_BIT);
  if ((rc = attn_cu_select_masked(&sl->prm, sms, off, &sl->ch, st)) < 0)
    return rc;
  if (r->pass == ATTN_BACKWARD && !r->lse_in) {
    /* The forward that recomputes lse runs unsplit: it needs no scratch. */
    attn_cu_params fp = sl->prm;
    fp.pass = ATTN_FORWARD;
    if ((rc = attn_cu_select_masked(&fp, 0, off, &sl->fch, st)) < 0)
      return rc;
  }
  if ((rc = plan_groups(sl, r, sms, off, st)) < 0)
    return rc;
  if (!layout(sl, r))
    return attn_status_set(st, ATTN_EOVERFLOW, "cuda: the request's buffers overflow size_t");
  return 0;
}

/* Whether strides s are those of a contiguous [B, H, N, D] tensor. */
static bool contiguous(const int64_t s[3], int64_t H, int64_t N, int64_t D) {
  return s[2] == D && s[1] == N * D && s[0] == H * N * D;
}

/* Whether tensor x, at p, is contiguous and lies in the pinned pool. */
static bool lies_pinned(const attn_request *r, const cu_tensor *x, const void *p, cu_pinned *pp) {
  int64_t H = x->kv ? r->heads_kv : r->heads_q, N = x->kv ? r->seq_kv : r->seq_q;
  size_t n = (size_t)(r->batch * H * N * r->head_dim) * attn_dtype_size(r->dtype);
  return pp && contiguous(x->stride, H, N, r->head_dim) && attn__cu_pinned_holds(pp, p, n);
}

void attn__cu_route(cu_slot *sl, const attn_request *r, cu_pinned *pp) {
  cu_tensor in[5], out[3];
  attn__cu_inputs(r, in);
  job_outputs(r, out);
  if (sl->fold) /* everything goes through the staging */
    pp = NULL;
  for (int t = 0; t < 5; t++)
    sl->direct_in[t] = t < sl->nin && lies_pinned(r, &in[t], in[t].in, pp);
  for (int t = 0; t < 3; t++)
    sl->direct_out[t] = t < sl->nout && lies_pinned(r, &out[t], out[t].out, pp);
  float *const stats[3] = {r->m, r->l, r->lse};
  size_t rows = (size_t)(r->batch * r->heads_q * r->seq_q);
  for (int i = 0; i < 3; i++)
    sl->direct_stats[i] = stats[i] && pp && attn__cu_pinned_holds(pp, stats[i], rows * 4);
}

size_t attn__cu_staging_bytes(const cu_slot *sl) {
  bool all = true;
  for (int t = 0; t < sl->nout; t++)
    all = all && sl->direct_out[t];
  for (int i = 0; i < 3; i++)
    all = all && (sl->off_stats[i] == SIZE_MAX || sl->direct_stats[i]);
  all = all && sl->off_dsinks == SIZE_MAX; /* dsinks always comes through the staging */
  return (all ? sl->up_end : sl->down_end) - sl->off_misc;
}

void attn__cu_pack_rows(unsigned char *dst, const attn_request *r, int t, int64_t row0, int64_t n,
                        int dp) {
  cu_tensor in[5];
  attn__cu_inputs(r, in);
  const cu_tensor *x = &in[t];
  const int64_t H = x->kv ? r->heads_kv : r->heads_q, N = x->kv ? r->seq_kv : r->seq_q;
  const int64_t D = r->head_dim, *s = x->stride;
  const size_t es = attn_dtype_size(r->dtype);
  const unsigned char *src = x->in;
  if (dp == D && contiguous(s, H, N, D)) {
    memcpy(dst, src + (size_t)(row0 * D) * es, (size_t)(n * D) * es);
    return;
  }
  for (int64_t row = row0; row < row0 + n; row++) {
    int64_t b = row / (H * N), h = row / N % H, i = row % N;
    memcpy(dst, src + (size_t)(b * s[0] + h * s[1] + i * s[2]) * es, (size_t)D * es);
    memset(dst + (size_t)D * es, 0, (size_t)(dp - D) * es);
    dst += (size_t)dp * es;
  }
}

/* Packed [B, H, N, dp] -> tensor with strides s, padding dropped. */
static void unpack(void *dst, const unsigned char *src, const int64_t s[3], int64_t B, int64_t H,
                   int64_t N, int64_t D, int dp, size_t es) {
  unsigned char *dp8 = dst;
  if (dp == D && contiguous(s, H, N, D)) {
    memcpy(dp8, src, (size_t)(B * H * N * D) * es);
    return;
  }
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < H; h++)
      for (int64_t n = 0; n < N; n++) {
        memcpy(dp8 + (size_t)(b * s[0] + h * s[1] + n * s[2]) * es, src, (size_t)D * es);
        src += (size_t)dp * es;
      }
}

/* The job's new rows packed into the staging, padding zero, and each
 * row's byte offset in the page pool beside them. */
static void stage_rows(cu_slot *sl, const attn_request *r) {
  const size_t es = attn_dtype_size(r->dtype), d = (size_t)r->head_dim * es,
               rowb = (size_t)sl->prm.dp * es;
  unsigned char *to = attn__cu_staged(sl, sl->off_rows);
  long long *at = (long long *)(void *)attn__cu_staged(sl, sl->off_rowdst);
  const unsigned char *base = sl->dev->state->pages_base;
  for (int64_t i = 0; i < r->npage_rows; i++) {
    const attn_page_rows *pr = &r->page_rows[i];
    const unsigned char *from = pr->src, *dst = pr->dst;
    for (int64_t k = 0; k < pr->n; k++, to += rowb) {
      memcpy(to, from + (size_t)k * d, d);
      memset(to + d, 0, rowb - d);
      *at++ = (long long)(dst - base) + (long long)((size_t)k * rowb);
    }
  }
}

void attn__cu_stage_misc(cu_slot *sl, const attn_request *r) {
  if (sl->fold)
    attn__cu_pack_rows(attn__cu_staged(sl, sl->off[0]), r, 0, 0, r->batch * r->heads_q * r->seq_q,
                       sl->prm.dp);
  if (sl->nrows)
    stage_rows(sl, r);
  if (r->pass == ATTN_BACKWARD && r->lse_in)
    memcpy(attn__cu_staged(sl, sl->off_lse), r->lse_in,
           (size_t)(r->batch * r->heads_q * r->seq_q) * sizeof(float));
  if (r->sinks)
    memcpy(attn__cu_staged(sl, sl->off_sinks), r->sinks, (size_t)r->heads_q * sizeof(float));
  if (r->alibi_slopes) { /* expanded to [B, Hq]: the kernels index b·Hq + h */
    float *a2 = (float *)(void *)attn__cu_staged(sl, sl->off_alibi);
    for (int64_t b = 0; b < r->batch; b++)
      for (int64_t h = 0; h < r->heads_q; h++)
        a2[b * r->heads_q + h] = (float)(-attn_request_alibi_slope(r, b, h) * M_LOG2E);
  }
  if (r->k_pages) {
    size_t n = (size_t)(r->batch * r->heads_kv * r->pages_per_head);
    int32_t *kt = (int32_t *)(void *)attn__cu_staged(sl, sl->off_tables);
    attn__cu_page_tables(sl->dev->state, r, kt, kt + align_up(n * sizeof(int32_t)) / 4);
  }
  int32_t *used = r->seqused_kv ? (int32_t *)(void *)attn__cu_staged(sl, sl->off_used) : NULL;
  for (int64_t b = 0; used && b < r->batch; b++) /* each <= seq_kv <= ATTN_CU_MAX_SEQ */
    used[b] = (int32_t)r->seqused_kv[b];
  attn_cu_scan_result *scan = (attn_cu_scan_result *)(void *)attn__cu_staged(sl, sl->off_scan);
  for (int t = 0; t < sl->ngroups * sl->nin; t++)
    scan[t] = (attn_cu_scan_result){.first_bad = ~0ull, .maxabs_bits = 0, .pad_ = 0};
}

/* Group g's launch params: its slices of the job's tensors. */
static void group_pointers(cu_slot *sl, int g) {
  cu_group *gr = &sl->grp[g];
  const attn_cu_params *p = &sl->prm;
  size_t es = attn_dtype_size(p->dtype), row = (size_t)p->dp * es;
  int64_t q0, k0;
  attn__cu_group_rows(sl, g, false, &q0);
  attn__cu_group_rows(sl, g, true, &k0);
  attn_cu_params *gp = &gr->prm;
  gp->q = (const unsigned char *)p->q + (size_t)q0 * row;
  gp->k = p->k ? (const unsigned char *)p->k + (size_t)k0 * row : NULL;
  gp->v = p->v ? (const unsigned char *)p->v + (size_t)k0 * row : NULL;
  gp->k_table = p->k_table, gp->v_table = p->v_table; /* a paged job is one group */
  gp->page_base = p->page_base;
  gp->seqused_k = p->seqused_k;
  gp->o = (unsigned char *)p->o + (size_t)q0 * row;
  gp->m = p->m ? p->m + q0 : NULL;
  gp->l = p->l ? p->l + q0 : NULL;
  gp->lse = p->lse ? p->lse + q0 : NULL;
  /* the slopes are [B, Hq]: a group starts at its first (batch, head) */
  gp->alibi2 = p->alibi2 ? p->alibi2 + gr->u0 * (p->heads_q / p->heads_kv) : NULL;
  gp->split_ws = gr->ch.nsplit > 1 ? p->split_ws : NULL;
  /* the sinks are [Hq]: a group's rows start at a whole head (q0 / Nq) */
  gr->sinks = sl->sinks ? sl->sinks + (q0 / (p->seq_q ? p->seq_q : 1)) % p->heads_q : NULL;
}

/* A paged job's tables and pool, instead of packed K and V. */
static void paged_pointers(cu_slot *sl, const attn_request *r, unsigned char *dm) {
  attn_cu_params *p = &sl->prm;
  size_t n = (size_t)(r->batch * r->heads_kv * r->pages_per_head) * sizeof(int32_t);
  p->k = p->v = NULL;
  p->k_table = (const int32_t *)(void *)(dm + sl->off_tables);
  p->v_table = (const int32_t *)(void *)(dm + sl->off_tables + align_up(n));
  p->page_base = sl->dev->state->pages_base;
  p->seqused_k = r->seqused_kv ? (const int32_t *)(void *)(dm + sl->off_used) : NULL;
}

void attn__cu_set_pointers(cu_slot *sl, const attn_request *r, unsigned char *dm) {
  attn_cu_params *p = &sl->prm;
  p->q = dm + sl->off[0];
  if (r->k_pages) {
    paged_pointers(sl, r, dm);
  } else {
    p->k = dm + sl->off[1];
    p->v = dm + sl->off[2];
  }
  p->alibi2 = r->alibi_slopes ? (const float *)(dm + sl->off_alibi) : NULL;
  sl->sinks = r->sinks ? (const float *)(void *)(dm + sl->off_sinks) : NULL;
  sl->dsinks = r->dsinks ? (float *)(void *)(dm + sl->off_dsinks) : NULL;
  if (r->pass == ATTN_BACKWARD) {
    p->o = dm + sl->off[3];
    p->dout = dm + sl->off[4];
    p->dq = dm + sl->off_out[0];
    p->dk = dm + sl->off_out[1];
    p->dv = dm + sl->off_out[2];
    p->lse = (float *)(dm + sl->off_lse);
    p->bwd_ws = (float *)(dm + sl->off_ws);
    sl->grp[0].prm = *p; /* a backward job is one group */
    sl->grp[0].sinks = sl->sinks;
    return;
  }
  p->o = dm + sl->off_out[0];
  p->m = r->m                    ? (float *)(dm + sl->off_stats[0])
         : sl->off_m != SIZE_MAX ? (float *)(dm + sl->off_m)
                                 : NULL;
  p->l = r->l ? (float *)(dm + sl->off_stats[1]) : NULL;
  p->lse = r->lse     ? (float *)(dm + sl->off_stats[2])
           : r->sinks ? (float *)(dm + sl->off_lse)
                      : NULL;
  p->split_ws = dm + sl->off_ws;
  for (int g = 0; g < sl->ngroups; g++)
    group_pointers(sl, g);
}

/* Input t's scan over every group: the first non-finite element (in the
 * whole tensor's packed order) and the largest magnitude. */
static attn_cu_scan_result merged_scan(const cu_slot *sl, bool kv, int t) {
  const attn_cu_scan_result *scan = (const void *)attn__cu_staged(sl, sl->off_scan);
  attn_cu_scan_result m = {.first_bad = ~0ull, .maxabs_bits = 0, .pad_ = 0};
  for (int g = 0; g < sl->ngroups; g++) {
    const attn_cu_scan_result *x = &scan[g * sl->nin + t];
    int64_t row0;
    attn__cu_group_rows(sl, g, kv, &row0);
    unsigned long long at = x->first_bad + (unsigned long long)row0 * (unsigned)sl->prm.dp;
    if (x->first_bad != ~0ull && at < m.first_bad)
      m.first_bad = at;
    /* magnitudes are non-negative: their float bits order as the values do */
    m.maxabs_bits = x->maxabs_bits > m.maxabs_bits ? x->maxabs_bits : m.maxabs_bits;
  }
  return m;
}

/* The scan's verdict on the job's inputs: ENONFINITE with the element's
 * coordinates, or ERANGE from the largest magnitudes of q, k and v. */
int attn__cu_check_scan(cu_slot *sl, const attn_request *r, attn_status *st) {
  const unsigned dp = (unsigned)sl->prm.dp;
  cu_tensor in[5];
  attn__cu_inputs(r, in);
  /* paged: K and V were checked finite when the store took them */
  double mx[3] = {0, r->k_pages ? r->kv_absmax[0] : 0, r->k_pages ? r->kv_absmax[1] : 0};
  for (int t = 0; t < sl->nin; t++) {
    attn_cu_scan_result sc = merged_scan(sl, in[t].kv, t);
    if (sc.first_bad != ~0ull) {
      int64_t H = in[t].kv ? r->heads_kv : r->heads_q, N = in[t].kv ? r->seq_kv : r->seq_q;
      int64_t row = (int64_t)(sc.first_bad / dp), dcol = (int64_t)(sc.first_bad % dp);
      return attn__nonfinite(st, in[t].name, row / (H * N), row / N % H, row % N, dcol);
    }
    float f;
    memcpy(&f, &sc.maxabs_bits, sizeof f);
    if (t < 3)
      mx[t] = f;
  }
  return attn__check_magnitudes(r, mx, st);
}

void attn__cu_unpack_outputs(cu_slot *sl, const attn_request *r) {
  cu_tensor out[3];
  int nout = job_outputs(r, out);
  for (int t = 0; t < nout; t++)
    if (!sl->direct_out[t])
      unpack(out[t].out, attn__cu_staged(sl, sl->off_out[t]), out[t].stride, r->batch,
             out[t].kv ? r->heads_kv : r->heads_q, out[t].kv ? r->seq_kv : r->seq_q, r->head_dim,
             sl->prm.dp, attn_dtype_size(r->dtype));
  float *const stats[3] = {r->m, r->l, r->lse};
  size_t rows = (size_t)r->batch * r->heads_q * r->seq_q;
  for (int i = 0; i < 3; i++)
    if (stats[i] && !sl->direct_stats[i])
      memcpy(stats[i], attn__cu_staged(sl, sl->off_stats[i]), rows * sizeof(float));
  if (r->dsinks)
    memcpy(r->dsinks, attn__cu_staged(sl, sl->off_dsinks), (size_t)r->heads_q * sizeof(float));
}
