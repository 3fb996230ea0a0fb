/*
 * copy.c — a job's bytes between the caller's memory and the device.
 *
 * A contiguous tensor that lies in the pinned pool moves in one DMA each
 * way, straight from the request body and into the reply's buffer (a 2-D
 * copy drops or adds the head dim's padding; the padding columns are
 * zeroed on the device). Anything else is packed on the slot's thread into
 * one of two pinned chunks while the other chunk's upload runs, or
 * downloaded into the pinned staging and unpacked once the job is done.
 * Uploads go on the slot's upload stream and downloads on its download
 * stream, group by group, so they overlap the kernels of other groups.
 */
#include "cuda_int.h"

#include <string.h>

static size_t elem_size(const cu_slot *sl) { return attn_dtype_size(sl->prm.dtype); }

/* n rows of D elements at src to n rows of dp at dst, padding zeroed. */
static cudaError_t direct_up(cu_slot *sl, unsigned char *dst, const unsigned char *src, int64_t n) {
  size_t es = elem_size(sl), d = (size_t)sl->prm.head_dim * es, dp = (size_t)sl->prm.dp * es;
  if (d == dp)
    return cudaMemcpyAsync(dst, src, (size_t)n * d, cudaMemcpyHostToDevice, sl->up);
  cudaError_t e = cudaMemcpy2DAsync(dst, dp, src, d, d, (size_t)n, cudaMemcpyHostToDevice, sl->up);
  return e ? e : cudaMemset2DAsync(dst + d, dp, 0, dp - d, (size_t)n, sl->up);
}

/* Rows [row0, row0 + n) of input t packed through the chunks: each chunk
 * is packed once its previous upload has run, then queued up. */
static cudaError_t packed_up(cu_slot *sl, const attn_request *r, int t, int64_t row0, int64_t n,
                             unsigned char *dst) {
  size_t rowb = (size_t)sl->prm.dp * elem_size(sl);
  int64_t per = (int64_t)(CU_CHUNK_BYTES / rowb);
  for (int64_t i = 0; i < n; i += per) {
    int64_t k = n - i < per ? n - i : per;
    int c = sl->chunk_next;
    sl->chunk_next ^= 1;
    cudaError_t e = sl->chunk_busy[c] ? cudaEventSynchronize(sl->ev_chunk[c]) : cudaSuccess;
    sl->chunk_busy[c] = false;
    if (e)
      return e;
    attn__cu_pack_rows(sl->chunk[c], r, t, row0 + i, k, sl->prm.dp);
    e = cudaMemcpyAsync(dst + (size_t)i * rowb, sl->chunk[c], (size_t)k * rowb,
                        cudaMemcpyHostToDevice, sl->up);
    if (!e)
      e = cudaEventRecord(sl->ev_chunk[c], sl->up);
    if (e)
      return e;
    sl->chunk_busy[c] = true;
  }
  return cudaSuccess;
}

cudaError_t attn__cu_upload_group(cu_slot *sl, const attn_request *r, int g, const char **what) {
  if (sl->fold) /* q went up with the staging */
    return cudaSuccess;
  cu_tensor in[5];
  attn__cu_inputs(r, in);
  size_t es = elem_size(sl), rowb = (size_t)sl->prm.dp * es;
  unsigned char *dm = sl->dmem;
  for (int t = 0; t < sl->nin; t++) {
    int64_t row0, n = attn__cu_group_rows(sl, g, in[t].kv, &row0);
    unsigned char *dst = dm + sl->off[t] + (size_t)row0 * rowb;
    *what = sl->direct_in[t] ? "the upload" : "packing an input for its upload";
    cudaError_t e =
        sl->direct_in[t]
            ? direct_up(sl, dst,
                        (const unsigned char *)in[t].in + (size_t)(row0 * sl->prm.head_dim) * es, n)
            : packed_up(sl, r, t, row0, n, dst);
    if (e)
      return e;
  }
  return cudaSuccess;
}

/* n packed rows at src to the caller's dst, padding dropped. */
static cudaError_t direct_down(cu_slot *sl, unsigned char *dst, const unsigned char *src,
                               int64_t n) {
  size_t es = elem_size(sl), d = (size_t)sl->prm.head_dim * es, dp = (size_t)sl->prm.dp * es;
  if (d == dp)
    return cudaMemcpyAsync(dst, src, (size_t)n * d, cudaMemcpyDeviceToHost, sl->down);
  return cudaMemcpy2DAsync(dst, d, src, dp, d, (size_t)n, cudaMemcpyDeviceToHost, sl->down);
}

/* Group g's rows of the statistics, in place or into the staging. */
static cudaError_t stats_down(cu_slot *sl, const attn_request *r, int64_t q0, int64_t n) {
  float *const stats[3] = {r->m, r->l, r->lse};
  const unsigned char *dm = sl->dmem;
  for (int i = 0; i < 3; i++) {
    if (sl->off_stats[i] == SIZE_MAX)
      continue;
    size_t at = sl->off_stats[i] + (size_t)q0 * sizeof(float);
    void *dst = sl->direct_stats[i] ? (void *)(stats[i] + q0) : attn__cu_staged(sl, at);
    cudaError_t e =
        cudaMemcpyAsync(dst, dm + at, (size_t)n * sizeof(float), cudaMemcpyDeviceToHost, sl->down);
    if (e)
      return e;
  }
  return cudaSuccess;
}

cudaError_t attn__cu_download_group(cu_slot *sl, const attn_request *r, int g) {
  void *const outs[3] = {r->pass == ATTN_BACKWARD ? r->dq : r->o, r->dk, r->dv};
  size_t es = elem_size(sl), rowb = (size_t)sl->prm.dp * es;
  const unsigned char *dm = sl->dmem;
  int64_t q0, nq = attn__cu_group_rows(sl, g, false, &q0);
  for (int t = 0; t < sl->nout; t++) {
    int64_t row0 = q0, n = nq;
    if (t > 0) /* dk, dv */
      n = attn__cu_group_rows(sl, g, true, &row0);
    size_t at = sl->off_out[t] + (size_t)row0 * rowb;
    cudaError_t e =
        sl->direct_out[t]
            ? direct_down(sl, (unsigned char *)outs[t] + (size_t)(row0 * sl->prm.head_dim) * es,
                          dm + at, n)
            : cudaMemcpyAsync(attn__cu_staged(sl, at), dm + at, (size_t)n * rowb,
                              cudaMemcpyDeviceToHost, sl->down);
    if (e)
      return e;
  }
  cudaError_t e = stats_down(sl, r, q0, nq);
  if (e || sl->off_dsinks == SIZE_MAX) /* dsinks: a backward job's, one group */
    return e;
  return cudaMemcpyAsync(attn__cu_staged(sl, sl->off_dsinks), dm + sl->off_dsinks,
                         (size_t)r->heads_q * sizeof(float), cudaMemcpyDeviceToHost, sl->down);
}
