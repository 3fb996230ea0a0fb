/*
 * cpu.c — the "cpu" backend: FlashAttention on the engine's worker pool.
 *
 * A job is one task on the pool, one item per (batch, query head, block of
 * ATTN_FLASH_BQ query rows), or, for short query sequences under GQA, per
 * block of several query heads of one KV head; under the intel tuning, per
 * two such blocks, which share each K/V tile's loads (pairs_worth). Items
 * of a head are handed out last block first: under a causal mask the last
 * blocks see the most keys, and starting them early evens out the tail of
 * the job.
 *
 * Decoding (every query row of a (batch, KV head) fits one block: seq_q ·
 * group <= ATTN_FLASH_BQ) has too few blocks to keep the threads busy and
 * each reads all of K and V, so its keys are split into chunks of a length
 * fixed by the shape alone (seq_kv, heads_kv), one item each; the partial
 * results (unnormalized O, m, l) are merged at the end in chunk order by
 * their log-sum-exp, as the CUDA backend's split path does.
 *
 * The input scan (non-finite values, magnitudes that could overflow) runs
 * inside the kernel on every tile it loads, plus one small item per
 * (batch, KV head) for keys that no query row can see. Paged K and V (a
 * session's cache, read in place through its page tables) were checked
 * when they were stored: only Q is scanned, and the request's kv_absmax
 * stands for K's and V's magnitudes. The verdict is taken
 * when all items are done; a refused job's output is garbage and is never
 * reported as a result (the job fails with the scan's error).
 *
 * Every item's arithmetic depends only on its inputs, never on which thread
 * runs it or in what order, and the merge order is fixed, so results are
 * bit-identical for any thread count.
 *
 * The amx kernel is trusted only after a start-up self-check on this unit
 * (selfcheck.h: a few BF16 cases run as jobs of this backend, against the
 * float64 reference); when it fails, the avx512bf16 kernel runs instead and
 * the backend lists amx as disabled, with why, as the CUDA backend lists
 * its kernels.
 */
#include "backend.h"
#include "check.h"
#include "cpu_bwd.h"
#include "flash.h"
#include "selfcheck.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Key chunks of a split: at least SPLIT_MIN_KEYS keys each, and per KV
 * head at most SPLIT_ITEMS / heads_kv chunks, kept within SPLIT_FEW ..
 * SPLIT_MAX. Every item costs a first tile that waits on memory, partials
 * written and merged, and a claim from the pool: at 32K keys, 8 KV heads,
 * items of 2048 keys ran about 1.1x as fast as items of 512 (Zen 5, BF16
 * and I8 pages alike), and 128 items still give a wide machine's threads
 * one each, or a latent head's 64 chunks. */
#define SPLIT_MIN_KEYS 512
#define SPLIT_ITEMS 128
#define SPLIT_FEW 4
#define SPLIT_MAX 64
/* Key tiles a packing item packs. */
#define PACK_TILES 16
/* Packing waits for blocks of more query rows than this: a decode-like
 * block of a few rows reads each key tile about once, as the packing does. */
#define PACK_MIN_ROWS 8

typedef struct cpu_state {
  attn_pool *pool;
  const attn__flash_isa *isa;
  attn_disabled off; /* the kernel the self-check turned off and why; kernel "": none */
  bool intel;        /* the intel tuning, and the kernel has its wide form */
} cpu_state;

typedef struct cpu_job {
  attn_pool_task task;
  attn_job *job;
  cpu_state *s;
  attn__flash_args args;
  int64_t nqt;         /* query blocks per head */
  int64_t per;         /* query blocks per item (1, or 2: rows_pair) */
  int64_t nunit;       /* items per head: ceil(nqt / per) */
  int64_t hb;          /* query heads packed into one block (GQA decode), >= 1 */
  int64_t hchunks;     /* blocks of hb heads per KV head: ceil(group / hb) */
  int64_t ncompute;    /* compute items; the nscan after them scan unseen keys */
  int64_t nscan;       /* B·Hkv, or 0 for paged K and V (checked when stored) */
  int64_t nsplit;      /* key chunks per (batch, KV head); 0: no split */
  int64_t chunk;       /* keys per chunk */
  float *po, *pm, *pl; /* split partials, item-major */
  uint16_t *kvpack;    /* the kernel's packed key tiles (args.kvpack), or NULL */
  int64_t npack;       /* its items: (batch, KV head, run of PACK_TILES tiles) */
  int64_t *bad;        /* seen: q heads, then k heads, then v heads */
  uint32_t *maxbits;
} cpu_job;

static const char *const scan_names[3] = {"q", "k", "v"};

static void cpu_job_free(cpu_job *cj) {
  free(cj->kvpack);
  free(cj->po);
  free(cj->pm);
  free(cj->pl);
  free(cj->bad);
  free(cj->maxbits);
  free(cj);
}

/* Keys [0, lo) and (hi, seq_kv) are visible to no query row: the kernel
 * never loads them, so they are scanned on their own. */
static void scan_unseen(const cpu_job *cj, int64_t item) {
  const attn_request *r = &cj->job->req;
  const attn__flash_args *a = &cj->args;
  const int64_t b = item / r->heads_kv, hk = item % r->heads_kv, nk = r->seq_kv;
  int64_t lo = a->wl < 0 ? 0 : a->off - a->wl;
  int64_t hi = a->wr < 0 ? nk - 1 : r->seq_q - 1 + a->off + a->wr;
  lo = lo < 0 ? 0 : lo;
  hi = hi > nk - 1 ? nk - 1 : hi;
  if (lo > hi) {
    cj->s->isa->scan_keys(a, b, hk, 0, nk);
    return;
  }
  cj->s->isa->scan_keys(a, b, hk, 0, lo);
  cj->s->isa->scan_keys(a, b, hk, hi + 1, nk);
}

/* Split item -> (batch, KV head, chunk): the whole group's rows, one chunk. */
static void split_block(const cpu_job *cj, int64_t item, attn__flash_block *blk) {
  const attn_request *r = &cj->job->req;
  const int64_t g = cj->args.group, rows = g * r->seq_q, s = item % cj->nsplit;
  const int64_t bh = item / cj->nsplit;
  blk->b = bh / r->heads_kv;
  blk->h0 = (bh % r->heads_kv) * g;
  blk->nh = g;
  blk->i0 = 0;
  blk->nq = r->seq_q;
  blk->j0 = s * cj->chunk;
  blk->j1 = blk->j0 + cj->chunk < r->seq_kv ? blk->j0 + cj->chunk : r->seq_kv;
  blk->po = cj->po + item * rows * r->head_dim;
  blk->pm = cj->pm + item * rows;
  blk->pl = cj->pl + item * rows;
}

/* (batch, KV head, chunk of hb query heads) and query block qblk. */
static void whole_block(const cpu_job *cj, int64_t item, int64_t qblk, attn__flash_block *blk) {
  const attn_request *r = &cj->job->req;
  const int64_t g = cj->args.group;
  int64_t chunk = item % cj->hchunks;
  item /= cj->hchunks;
  blk->b = item / r->heads_kv;
  blk->h0 = (item % r->heads_kv) * g + chunk * cj->hb;
  blk->nh = g - chunk * cj->hb < cj->hb ? g - chunk * cj->hb : cj->hb;
  blk->i0 = qblk * ATTN_FLASH_BQ;
  blk->nq = r->seq_q - blk->i0 < ATTN_FLASH_BQ ? r->seq_q - blk->i0 : ATTN_FLASH_BQ;
  blk->j0 = 0;
  blk->j1 = r->seq_kv;
  blk->po = blk->pm = blk->pl = NULL;
}

/* Item -> (batch, KV head, chunk of hb query heads, query blocks); returns
 * the number of blocks. */
static int whole_blocks(const cpu_job *cj, int64_t item, attn__flash_block blk[2]) {
  const int64_t qhi = cj->nqt - 1 - item % cj->nunit * cj->per;
  int n = 0;
  for (int64_t q = qhi; q >= 0 && q > qhi - cj->per; q--)
    whole_block(cj, item / cj->nunit, q, &blk[n++]);
  return n;
}

static void compute_run(attn_pool_task *task, int64_t item, void *ws) {
  cpu_job *cj = (cpu_job *)task;
  /* Canceled: the remaining items are claimed and skipped, which ends the
   * task within one item's time on each worker. */
  if (attn__job_canceled(cj->job))
    return;
  if (item >= cj->ncompute) {
    scan_unseen(cj, item - cj->ncompute);
    return;
  }
  attn__flash_block blk[2];
  int n = 1;
  if (cj->nsplit)
    split_block(cj, item, &blk[0]);
  else
    n = whole_blocks(cj, item, blk);
  cj->s->isa->rows(&cj->args, blk, n, ws);
}

/* What the kernel saw, in the order of the old separate scan (q, k, v heads
 * in (batch, head) order): the first problem found, or 0. */
static int scan_verdict(const cpu_job *cj, attn_status *st) {
  const attn_request *r = &cj->job->req;
  const int64_t heads[3] = {r->heads_q, r->heads_kv, r->heads_kv};
  /* Paged K and V are not scanned (checked finite when stored): their
   * maxima come with the request, and the verdict takes the larger. */
  double mx[3] = {0, r->k_pages ? r->kv_absmax[0] : 0, r->k_pages ? r->kv_absmax[1] : 0};
  int rc = attn__seen_verdict(r, cj->args.seen, 3, scan_names, heads, mx, st);
  return rc ? rc : attn__check_magnitudes(r, mx, st);
}

/* One query row of a split: the chunks' partials combined in chunk order,
 * each weighted by 2^(m_s - M); chunks that saw no key have l = 0. */
static void merge_row(const cpu_job *cj, int64_t bh, int64_t ii, float *acc) {
  const attn_request *r = &cj->job->req;
  const int64_t D = r->head_dim, rows = cj->args.group * r->seq_q;
  float mx = -INFINITY, l = 0;
  for (int64_t s = 0; s < cj->nsplit; s++)
    mx = fmaxf(mx, cj->pm[(bh * cj->nsplit + s) * rows + ii]);
  const float mu = fmaxf(mx, -FLT_MAX); /* no -inf - -inf */
  memset(acc, 0, (size_t)D * sizeof *acc);
  for (int64_t s = 0; s < cj->nsplit; s++) {
    const int64_t it = bh * cj->nsplit + s;
    const float w = exp2f(cj->pm[it * rows + ii] - mu);
    l += w * cj->pl[it * rows + ii];
    const float *po = cj->po + (it * rows + ii) * D;
    for (int64_t d = 0; d < D; d++)
      acc[d] += w * po[d];
  }
  double mm = mx * (float)M_LN2, ll = l, a = 1; /* m back from base 2 */
  if (r->sinks) /* once per row, here, not in each chunk's partial */
    a = attn__sink_fold(r->sinks[(bh % r->heads_kv) * cj->args.group + ii / r->seq_q], &mm, &ll);
  const float inv = !r->sinks ? (l > 0 ? 1.0f / l : 0.0f) : (float)(a / ll);
  for (int64_t d = 0; d < D; d++)
    acc[d] *= inv;
  acc[D] = (float)mm;
  acc[D + 1] = (float)ll;
}

static void merge_splits(const cpu_job *cj) {
  const attn_request *r = &cj->job->req;
  const int64_t D = r->head_dim, g = cj->args.group, nq = r->seq_q;
  float acc[ATTN_CPU_MAX_D + 2];
  for (int64_t bh = 0; bh < r->batch * r->heads_kv; bh++)
    for (int64_t ii = 0; ii < g * nq; ii++) {
      merge_row(cj, bh, ii, acc);
      const int64_t b = bh / r->heads_kv, h = (bh % r->heads_kv) * g + ii / nq, i = ii % nq;
      const size_t o = (size_t)(b * r->o_stride[0] + h * r->o_stride[1] + i * r->o_stride[2]);
      for (int64_t d = 0; d < D; d++)
        attn_store_elem(r->o, r->dtype, o + (size_t)d, acc[d]);
      const size_t srow = (size_t)((b * r->heads_q + h) * nq + i);
      if (r->m)
        r->m[srow] = acc[D];
      if (r->l)
        r->l[srow] = acc[D + 1];
      if (r->lse)
        r->lse[srow] = acc[D + 1] > 0 ? acc[D] + logf(acc[D + 1]) : -INFINITY;
    }
}

static void compute_finish(attn_pool_task *task) {
  cpu_job *cj = (cpu_job *)task;
  attn_status st = {0};
  /* Items may have been skipped: a canceled job's outputs are not whole. */
  int rc = attn__job_canceled(cj->job) ? attn__canceled(&st) : scan_verdict(cj, &st);
  if (rc == 0 && cj->nsplit)
    merge_splits(cj);
  attn__job_complete(cj->job, rc ? &st : NULL);
  cpu_job_free(cj);
}

/* Decoding shapes get their keys split (see the top of the file); the
 * chunk length depends on the shape only, never on the thread count. */
static int plan_split(cpu_job *cj) {
  const attn_request *r = &cj->job->req;
  const int64_t rows = cj->args.group * r->seq_q;
  if (rows > ATTN_FLASH_BQ || r->seq_kv < 2 * SPLIT_MIN_KEYS)
    return 0;
  int64_t cap = SPLIT_ITEMS / r->heads_kv, n = r->seq_kv / SPLIT_MIN_KEYS;
  cap = cap < SPLIT_FEW ? SPLIT_FEW : cap > SPLIT_MAX ? SPLIT_MAX : cap;
  n = n < cap ? n : cap;
  cj->chunk = (r->seq_kv + n - 1) / n;
  cj->chunk = (cj->chunk + ATTN_FLASH_BK - 1) / ATTN_FLASH_BK * ATTN_FLASH_BK;
  cj->nsplit = (r->seq_kv + cj->chunk - 1) / cj->chunk;
  const size_t parts = (size_t)(r->batch * r->heads_kv * cj->nsplit * rows);
  cj->po = malloc(parts * (size_t)r->head_dim * sizeof *cj->po);
  cj->pm = malloc(parts * sizeof *cj->pm);
  cj->pl = malloc(parts * sizeof *cj->pl);
  return cj->po && cj->pm && cj->pl ? 0 : -1;
}

/* The seen arrays of q, k and v. */
static int plan_scan(cpu_job *cj) {
  const attn_request *r = &cj->job->req;
  const int64_t heads[3] = {r->heads_q, r->heads_kv, r->heads_kv};
  return attn__seen_init(r, cj->args.seen, 3, heads, &cj->bad, &cj->maxbits);
}

/*
 * Items of two query blocks of one head (the intel tuning): the kernel runs
 * them over each K/V tile in turn (rows_pair), so K and V come from L3 once
 * per pair (on Sapphire Rapids, 2 threads, H8 N4096: +2.5% at D=128, +2.9%
 * at D=64; N1024, whose K and V stay in L2: +2.2%). Only while there are
 * pairs enough to keep every thread busy, and never for packed heads or
 * split keys (decoding), nor F16 on a kernel that packs keys (amx: its
 * split tiles), nor BF16 but on that kernel (its tiles, up to head_dim
 * 256, where K and packed Vᵀ of a head outgrow L2: 3-5 % on H8 N4096 at
 * D 64 to 192), nor F32 and F16 past head_dim 128; which the kernel would
 * otherwise run one block after the other (flash.c's pair_kind). Either
 * way the results are the same bits.
 */
static bool pairs_worth(const cpu_job *cj, int64_t heads) {
  const attn_request *r = &cj->job->req;
  const bool packs = cj->s->isa->pack_keys != NULL;
  const bool f32 = r->dtype != ATTN_BF16 && !(r->dtype == ATTN_F16 && packs) &&
                   r->head_dim <= ATTN_FLASH_PAIR_MAX_D;
  const bool tiles = r->dtype == ATTN_BF16 && packs;
  return cj->s->intel && cj->hb == 1 && !cj->nsplit && (f32 || tiles) &&
         heads * (cj->nqt / 2) >= 8 * attn_pool_threads(cj->s->pool);
}

static void plan_blocks(cpu_job *cj) {
  const attn_request *r = &cj->job->req;
  cj->nqt = (r->seq_q + ATTN_FLASH_BQ - 1) / ATTN_FLASH_BQ;
  /* Short query sequences (decoding) pack the heads of a GQA group into one
   * block, so each K/V tile is read and converted once for the group. Long
   * ones keep one head per block: there are blocks enough to go round. */
  int64_t fit = r->seq_q <= ATTN_FLASH_BQ / 2 ? ATTN_FLASH_BQ / r->seq_q : 1;
  cj->hb = fit < cj->args.group ? fit : cj->args.group;
  cj->hchunks = (cj->args.group + cj->hb - 1) / cj->hb;
  const int64_t heads = r->batch * r->heads_kv * cj->hchunks;
  cj->per = pairs_worth(cj, heads) ? 2 : 1;
  cj->nunit = (cj->nqt + cj->per - 1) / cj->per;
  cj->ncompute = cj->nsplit ? r->batch * r->heads_kv * cj->nsplit : heads * cj->nunit;
}

/* Items of the packing phase per (batch, KV head). */
static int64_t pack_runs(const attn_request *r) {
  return (attn__flash_pack_tiles(r) + PACK_TILES - 1) / PACK_TILES;
}

/* Phase one of a job with packed keys: item -> (batch, KV head, run of tiles). */
static void pack_run(attn_pool_task *task, int64_t item, void *ws) {
  (void)ws;
  cpu_job *cj = (cpu_job *)task;
  const attn_request *r = &cj->job->req;
  const int64_t ntiles = attn__flash_pack_tiles(r), runs = pack_runs(r);
  const int64_t head = item / runs, t0 = item % runs * PACK_TILES;
  const int64_t t1 = t0 + PACK_TILES < ntiles ? t0 + PACK_TILES : ntiles;
  if (attn__job_canceled(cj->job))
    return;
  cj->s->isa->pack_keys(&cj->args, head / r->heads_kv, head % r->heads_kv, t0, t1,
                        cj->kvpack + (size_t)(head * ntiles * attn__flash_pack_words(r)));
}

/* Keys packed: the compute phase, on the same task. */
static void pack_finish(attn_pool_task *task) {
  cpu_job *cj = (cpu_job *)task;
  cj->task.nitems = cj->ncompute + cj->nscan;
  cj->task.run = compute_run;
  cj->task.finish = compute_finish;
  attn_pool_submit(cj->s->pool, &cj->task);
}

/*
 * The amx kernel transposes each V tile for its P·V product (and splits F16
 * K and V in two BF16 parts); when a KV head has several blocks of query
 * rows to compute (prefill), its tiles are packed once, by a first phase,
 * into a copy every block reads (the size of V; for F16 twice K's and V's).
 * Tiles follow key 0 unless a left window moves them; a few-row block
 * (decode) takes no tiles. Without memory for the copy the job runs as if
 * nothing were packed.
 */
static void plan_pack(cpu_job *cj) {
  const attn_request *r = &cj->job->req;
  const int64_t ntiles = attn__flash_pack_tiles(r), heads = r->batch * r->heads_kv;
  const int64_t words = attn__flash_pack_words(r);
  const bool worth = cj->ncompute >= 2 * heads && cj->hb * r->seq_q > PACK_MIN_ROWS;
  /* Pages off the tiles' grid (page_tokens is a multiple of 16): a tile
   * that crosses a page is partial to the blocks, but its packing read
   * past the page, and F16's split tiles, which take every tile from the
   * copy, found none for the tiles after it (a NULL read). */
  const bool grid = !r->k_pages || r->page_tokens % ATTN_FLASH_BK == 0;
  if (!cj->s->isa->pack_keys || !words || cj->nsplit || cj->args.wl >= 0 || ntiles == 0 || !worth ||
      !grid || cj->job->here ||
      r->kv_quant) /* quantized tiles are read per block (dq_tile, rf_quant) */
    return;
  cj->kvpack = malloc((size_t)(heads * ntiles * words) * sizeof *cj->kvpack);
  if (!cj->kvpack) /* the blocks pack their own tiles (F16: take F32) */
    return;
  cj->args.kvpack = cj->kvpack;
  cj->npack = heads * pack_runs(r);
}

static int cpu_submit(void *state, attn_job *job, attn_status *st) {
  cpu_state *s = state;
  const attn_request *r = &job->req;
  if (r->pass == ATTN_BACKWARD)
    return attn__cpu_bwd_submit(s->pool, s->isa, job, st);
  cpu_job *cj = calloc(1, sizeof *cj);
  if (!cj)
    return attn_status_set(st, ATTN_ENOMEM, "out of memory queueing a job");
  cj->job = job;
  cj->s = s;
  cj->args.r = r;
  cj->args.scale2 = (float)(attn_request_scale(r) * M_LOG2E);
  attn_request_window(r, &cj->args.wl, &cj->args.wr);
  cj->args.off = attn_request_offset(r);
  cj->args.group = r->heads_q / r->heads_kv;
  cj->args.wide = s->intel;
  attn__variants_init(r, &cj->args.var);
  if (plan_scan(cj) < 0 || plan_split(cj) < 0) {
    cpu_job_free(cj);
    return attn_status_set(st, ATTN_ENOMEM, "out of memory queueing a job");
  }
  plan_blocks(cj);
  plan_pack(cj);
  /* Paged K and V have no unseen keys to scan: no scan items. */
  cj->nscan = r->k_pages ? 0 : r->batch * r->heads_kv;
  cj->task.nitems = cj->npack ? cj->npack : cj->ncompute + cj->nscan;
  cj->task.run = cj->npack ? pack_run : compute_run;
  cj->task.finish = cj->npack ? pack_finish : compute_finish;
  if (job->here)
    attn_pool_run_here(s->pool, &cj->task);
  else
    attn_pool_submit(s->pool, &cj->task);
  return 0;
}

static size_t cpu_workspace_bytes(const attn_config *cfg) {
  (void)cfg;
  size_t fwd = ATTN_FLASH_WS_FLOATS, bwd = ATTN_BWD_WS_FLOATS;
  return (fwd > bwd ? fwd : bwd) * sizeof(float);
}

/* ---- the start-up self-check of the amx kernel (selfcheck.h) ------------- */

typedef struct check_ctx {
  cpu_state *s;
  const attn_request *r;
  attn_jobs jobs;
} check_ctx;

static int check_start(void *ctx, attn_done_fn done, void *arg, attn_status *st) {
  check_ctx *c = ctx;
  attn_job *job = attn__job_new(&c->jobs, c->r, done, arg);
  if (!job)
    return attn_status_set(st, ATTN_ENOMEM, "out of memory queueing a job");
  job->backend = "cpu";
  int rc = cpu_submit(c->s, job, st);
  if (rc)
    attn__job_drop(job);
  return rc;
}

/* A case as a job of this backend on the pool's workers, as a request is
 * run: the items, splits and merges are checked with the kernel. */
static int check_run(void *state, const attn_request *r, attn_status *st) {
  check_ctx c = {.s = state, .r = r};
  attn__jobs_init(&c.jobs);
  int rc = attn__run_waiting(check_start, &c, NULL, st);
  attn__jobs_drain(&c.jobs); /* the job's last reference to c is gone */
  return rc;
}

static bool is_amx(const attn__flash_isa *isa) {
#if defined(__x86_64__)
  return isa == &attn__flash_amx || isa == &attn__flash_amxemu;
#else
  (void)isa;
  return false;
#endif
}

/* The tests' way to see the other outcome on any machine: the self-check
 * then fails its first case. An environment variable rather than an
 * attn_config field, so that no user finds it among the settings. */
static bool self_check_forced_to_fail(void) {
  const char *v = getenv("ATTN_TEST_CPU_SELF_CHECK");
  return v && strcmp(v, "fail") == 0;
}

/* The amx kernel runs only after it matched the float64 reference here, as
 * the CUDA backend's kernels do; else avx512bf16 (which every AMX CPU has)
 * takes its place, one line on stderr says why, and cpu_disabled() lists it
 * for attn_engine_backends() (/v1/info, /readyz). */
static void amx_self_check(cpu_state *s) {
  if (!is_amx(s->isa))
    return;
  char why[sizeof s->off.why];
  if (attn__cpu_self_check(check_run, s, self_check_forced_to_fail(), why, sizeof why))
    return;
  snprintf(s->off.kernel, sizeof s->off.kernel, "%s", s->isa->name);
  memcpy(s->off.why, why, sizeof why);
  s->isa = &attn__flash_avx512bf16;
  fprintf(stderr,
          "attn: cpu: the self-check disabled the %s kernel: %s; the avx512bf16 kernel runs "
          "instead\n",
          s->off.kernel, why);
}

/* Whether to use the intel tuning (attn_config.cpu_tune). */
static int tune_select(const char *want, bool *intel, attn_status *st) {
  if (!attn_cpu_tune_known(want))
    return attn_status_set(st, ATTN_EINVAL,
                           "unknown CPU tuning \"%.40s\" (choose auto, intel or amd)", want);
  if (!want || !*want || strcmp(want, "auto") == 0) {
#if defined(__x86_64__)
    __builtin_cpu_init();
    *intel = __builtin_cpu_is("intel");
#else
    *intel = false;
#endif
    return 0;
  }
  *intel = strcmp(want, "intel") == 0;
  return 0;
}

static int cpu_open(const attn_backend_env *env, void **pstate, attn_status *st) {
  const attn__flash_isa *isa = attn__flash_select(env->cfg->cpu_isa, st);
  if (!isa)
    return st ? st->code : ATTN_EUNSUPPORTED;
  bool intel = false;
  int rc = tune_select(env->cfg->cpu_tune, &intel, st);
  if (rc < 0)
    return rc;
  cpu_state *s = calloc(1, sizeof *s);
  if (!s)
    return attn_status_set(st, ATTN_ENOMEM, "out of memory");
  s->pool = env->pool;
  s->isa = isa;
  amx_self_check(s);
  s->intel = intel && s->isa->wide;
  *pstate = s;
  return 0;
}

static void cpu_close(void *state) { free(state); }

static void cpu_describe(void *state, char *buf, size_t cap) {
  cpu_state *s = state;
  snprintf(buf, cap, "%s kernel, %d threads%s%s", s->isa->name, attn_pool_threads(s->pool),
           s->intel ? ", intel tuning" : "", s->off.kernel[0] ? "; amx failed its self-check" : "");
}

static int cpu_disabled(void *state, attn_disabled *out, int cap) {
  cpu_state *s = state;
  if (!s->off.kernel[0] || cap < 1)
    return 0;
  out[0] = s->off;
  return 1;
}

/* Every valid request, forward or backward, but pages a device holds. */
static int cpu_supports(void *state, const attn_request *r, attn_status *st) {
  (void)state;
  if (r->k_pages && r->page_pitch)
    return attn_status_set(st, ATTN_EUNSUPPORTED,
                           "these sessions' pages are on a GPU, which computes their calls");
  return 0;
}

const struct attn_backend_ops attn__cpu_backend = {
    .name = "cpu",
    .workspace_bytes = cpu_workspace_bytes,
    .open = cpu_open,
    .close = cpu_close,
    .submit = cpu_submit,
    .supports = cpu_supports,
    .describe = cpu_describe,
    .disabled = cpu_disabled,
    .automatic = true,
};
