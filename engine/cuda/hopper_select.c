/*
 * hopper_select.c — the Hopper instance's launch shape and tensor maps, on
 * the host and without a device (the unit tests run it). The kernel itself
 * is hopper.cuh; nothing here picks it unless asked (kernels.h).
 */
#include "kernels.h"
#include "hopper_layout.h"

int attn_cu_hopper_built(void) {
#ifdef ATTN_CU_HOPPER
  return 1;
#else
  return 0;
#endif
}

attn_cu_kernel attn_cu_hopper_of(int dp) {
  return dp <= 64    ? ATTN_CU_HOPPER_D64
         : dp <= 96  ? ATTN_CU_HOPPER_D96
         : dp <= 128 ? ATTN_CU_HOPPER_D128
         : dp <= 192 ? ATTN_CU_HOPPER_D192
                     : ATTN_CU_HOPPER_D256;
}

/* Tile, ring depth and head-dim class of each instance, in enum order. */
static const struct {
  int bn, stages, d;
} shapes[] = {
    {ATTN_CU_HP_BN_D64, ATTN_CU_HP_STAGES_D64, 64},
    {ATTN_CU_HP_BN_D96, ATTN_CU_HP_STAGES_D96, 96},
    {ATTN_CU_HP_BN_D128, ATTN_CU_HP_STAGES_D128, 128},
    {ATTN_CU_HP_BN_D192, ATTN_CU_HP_STAGES_D192, 192},
    {ATTN_CU_HP_BN_D256, ATTN_CU_HP_STAGES_D256, 256},
};

/* A persistent grid: one CTA per multiprocessor (each takes all of the
 * shared memory), walking work units as attn_cu_hp_unit orders them. The
 * softmax folds the scale into its exponent's FMA, taking the row maximum
 * of the raw scores, which is the scaled scores' only for a positive scale;
 * the rare other scales run on the mma.sync instances. */
int attn_cu_select_hopper(const attn_cu_params *p, int sms, attn_cu_choice *c) {
  /* Its TMA tensor maps read packed K and V: never a paged launch. */
  if (p->pass != ATTN_FORWARD || (p->dtype != ATTN_F16 && p->dtype != ATTN_BF16) || p->dp > 256 ||
      c->nsplit != 1 || sms < 1 || p->k_table || p->v_table || !(p->scale_log2 > 0.0f))
    return 0;
  c->kernel = attn_cu_hopper_of(p->dp);
  const int i = (int)c->kernel - ATTN_CU_HOPPER_D64;
  c->smem_bytes = attn_cu_hp_smem(attn_cu_hp_dpad(shapes[i].d), shapes[i].bn, shapes[i].stages);
  int64_t qtiles = (p->seq_q + ATTN_CU_HP_BM - 1) / ATTN_CU_HP_BM;
  int64_t units = qtiles * p->heads_q * p->batch;
  c->block_m = ATTN_CU_HP_BM;
  c->pack = 1;
  c->block_n = shapes[i].bn;
  c->warps = ATTN_CU_HP_THREADS / 32;
  c->grid[0] = (unsigned)(units < sms ? units : sms);
  c->grid[1] = c->grid[2] = 1;
  return 1;
}

void attn_cu_hp_tmap_spec(const attn_cu_params *p, const attn_cu_choice *c,
                          attn_cu_tmap_which which, attn_cu_tmap_spec *s) {
  int kv = which == ATTN_CU_TM_K || which == ATTN_CU_TM_V;
  int rows = kv ? p->seq_kv : p->seq_q, heads = kv ? p->heads_kv : p->heads_q;
  static const int box_rows[] = {ATTN_CU_HP_BM, 0, 0, ATTN_CU_HP_WG_ROWS};
  s->base = which == ATTN_CU_TM_Q   ? p->q
            : which == ATTN_CU_TM_K ? p->k
            : which == ATTN_CU_TM_V ? p->v
                                    : p->o;
  s->dims[0] = (unsigned long long)p->dp;
  s->dims[1] = (unsigned long long)rows;
  s->dims[2] = (unsigned long long)heads * (unsigned long long)p->batch;
  s->strides[0] = (unsigned long long)p->dp * 2;
  s->strides[1] = s->strides[0] * (unsigned long long)rows;
  s->box[0] = ATTN_CU_HP_PANEL;
  s->box[1] = (unsigned)(kv ? c->block_n : box_rows[which]);
  s->box[2] = 1;
}
