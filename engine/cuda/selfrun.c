/*
 * selfrun.c — the start-up self-check on one device, and what it leaves
 * off.
 *
 * It runs every case of selfcheck.h through the same staging and launch
 * path as a job and turns off what fails (a kernel, the split-KV merge, the
 * GQA packing; the Hopper instances start off and are turned on only by
 * their passing cases), with why, for attn_engine_backends().
 */
#include "cuda_int.h"

#include "selfcheck.h"

#include <stdio.h>

int attn__cu_run_case(cu_slot *sl, const attn_request *r, unsigned off, bool *sticky,
                      attn_status *st) {
  cudaError_t e, se = cudaSuccess;
  const char *what = "cudaMallocFromPoolAsync";
  int rc;
  *sticky = false;
  if ((rc = attn__cu_plan(sl, r, sl->dev->sms, off, st)) < 0)
    return rc;
  attn__cu_route(sl, r, NULL); /* staged both ways, as most jobs' tensors are not */
  if ((rc = attn__cu_grow_pinned(sl, attn__cu_staging_bytes(sl), st)) < 0)
    return rc;
  attn__cu_stage_misc(sl, r);
  if ((rc = attn__cu_alloc(sl, &e, st)) != 0) {
    if (rc < -1)
      return rc;
    goto fail;
  }
  attn__cu_set_pointers(sl, r, sl->dmem);
  e = attn__cu_queue_work(sl, r, false, &what);
  se = attn__cu_sync_slot(sl);
  if (e == cudaSuccess && se == cudaSuccess) {
    attn__cu_unpack_outputs(sl, r);
    return 0;
  }
  if (e == cudaSuccess)
    e = se, what = "a self-check kernel";
  if (sl->dmem)
    cudaFree(sl->dmem);
  sl->dmem = NULL;
fail:
  cudaGetLastError();
  *sticky = attn__cu_sticky(e) || (se != cudaSuccess && attn__cu_sticky(se));
  return attn__cu_fail(st, ATTN_EDEVICE, what, e);
}

/* Turns off what the failed case ran (the GQA packing, else the split-KV
 * path, else its kernel: the cases test each instance plain, then split,
 * then packed; the decode kernel itself, whatever it packed or split), with why, for every device:
 * the selection then falls back. */
static void disable(cu_state *s, const cu_dev *d, const attn_cu_choice *ch, const char *why) {
  /* The decode kernel packs and splits in its own code: it alone is to blame. */
  const bool dec = attn_cu_is_decode(ch->kernel);
  bool pack = !dec && ch->pack > 1, split = !dec && !pack && ch->nsplit > 1;
  bool atomic = attn_cu_is_atomic_dq(ch);
  int bit = atomic  ? ATTN_CU_KERNEL_COUNT + 2
            : pack  ? ATTN_CU_KERNEL_COUNT + 1
            : split ? ATTN_CU_KERNEL_COUNT
                    : (int)ch->kernel;
  if (s->off & (1u << bit))
    return;
  s->off |= 1u << bit;
  const char *name = atomic  ? "the backward's atomic dQ path"
                     : pack  ? "GQA head packing"
                     : split ? "split-KV merge"
                             : attn_cu_kernel_name(ch->kernel);
  snprintf(s->off_why[bit], sizeof s->off_why[bit], "device %d: %s", d->ordinal, why);
  fprintf(stderr,
          "attn: cuda device %d (%s): the self-check disabled %s: %s; requests it would run "
          "take another kernel or the CPU\n",
          d->ordinal, d->name, name, why);
}

/* A Hopper case's outcome: the instance of its head dim stays off (the
 * bits start set) when the case failed or never reached it. */
static void hopper_outcome(cu_state *s, const cu_dev *d, const attn_request *r,
                           const attn_cu_choice *ch, int rc, const char *why) {
  int bit = (int)attn_cu_hopper_of(attn_cu_dp(r->head_dim));
  if (rc == 0 && !why && (int)ch->kernel == bit)
    return;
  s->hopper_failed |= 1u << bit;
  snprintf(s->off_why[bit], sizeof s->off_why[bit], "device %d: %.140s", d->ordinal,
           why  ? why
           : rc ? "its self-check case was refused"
                : "its self-check case ran another kernel");
  fprintf(stderr, "attn: cuda device %d (%s): %s stays off: %s\n", d->ordinal, d->name,
          attn_cu_kernel_name((attn_cu_kernel)bit), s->off_why[bit]);
}

/* A sticky error in a self-check case: the device takes no jobs. */
static void device_failed(cu_dev *d, const attn_status *st) {
  d->healthy = false;
  snprintf(d->why, sizeof d->why, "failed its start-up self-check: %.120s", st->message);
  fprintf(stderr, "attn: cuda device %d (%s) %s; it takes no jobs\n", d->ordinal, d->name, d->why);
}

/* Runs every case on the device (see selfcheck.h); a case that fails or is
 * refused at launch disables what it ran, a sticky error the device. The
 * Hopper cases run only when hopper is set (hopper_gate), with that
 * instance allowed. */
void attn__cu_self_check(cu_state *s, cu_dev *d, bool hopper) {
  for (int i = 0; i < attn_cu_check_count() && d->healthy; i++) {
    bool hp = attn_cu_check_is_hopper(i);
    attn_cu_check c;
    attn_status st = {0};
    if ((hp && !hopper) || attn_cu_check_make(i, &c, &st) < 0) {
      if (!hp || hopper)
        fprintf(stderr, "attn: cuda self-check case %d skipped: %s\n", i, st.message);
      continue;
    }
    cu_slot *sl = &d->slots[0];
    bool sticky;
    char why[160];
    /* only the atomic cases may take the atomic path, whatever the configuration says */
    unsigned off =
        (hp ? s->off & ~ATTN_CU_HOPPER_OFF : s->off) | (c.atomic ? 0u : ATTN_CU_ATOMIC_DQ_BIT);
    int rc = attn__cu_run_case(sl, &c.req, off, &sticky, &st);
    bool ok = rc == 0 && attn_cu_check_verify(&c, why, sizeof why);
    if (hp)
      hopper_outcome(s, d, &c.req, &sl->ch, rc, ok ? NULL : rc == 0 ? why : st.message);
    if (rc == 0 && !ok && !hp)
      disable(s, d, &sl->ch, why);
    else if (rc == ATTN_EDEVICE && !sticky && !hp)
      disable(s, d, &sl->ch, st.message);
    else if (rc == ATTN_EDEVICE && sticky)
      device_failed(d, &st);
    attn_cu_check_free(&c);
  }
}

/* The sinks' kernels have no other instance to fall back to: a case that
 * fails (or is refused at launch) turns sinks off, and requests with them
 * go to the CPU. A case the selection refuses says nothing of them. */
void attn__cu_self_check_sinks(cu_state *s, cu_dev *d) {
  for (int i = 0; i < attn_cu_check_sinks_count() && d->healthy && !*s->sinks_why; i++) {
    attn_cu_check c;
    attn_status st = {0};
    if (attn_cu_check_sinks_make(i, &c, &st) < 0)
      continue;
    bool sticky;
    char why[160] = "";
    int rc = attn__cu_run_case(&d->slots[0], &c.req, s->off | ATTN_CU_ATOMIC_DQ_BIT, &sticky, &st);
    if (rc == ATTN_EDEVICE && sticky)
      device_failed(d, &st);
    else if (rc == ATTN_EDEVICE)
      snprintf(why, sizeof why, "%.150s", st.message);
    else if (rc == 0)
      attn_cu_check_verify(&c, why, sizeof why);
    if (*why) {
      snprintf(s->sinks_why, sizeof s->sinks_why, "device %d: %.140s", d->ordinal, why);
      fprintf(stderr,
              "attn: cuda device %d (%s): sinks failed their self-check (%s); requests with "
              "sinks run on the CPU\n",
              d->ordinal, d->name, why);
    }
    attn_cu_check_free(&c);
  }
}

/* The decode kernel has not run on a device yet (decode.cuh): without the
 * self-check to pass it, it stays off and says why; its decodes take the
 * tiled forward. */
void attn__cu_decode_off(cu_state *s) {
  s->off |= ATTN_CU_DECODE_KERNELS;
  for (int k = 0; k < ATTN_CU_KERNEL_COUNT; k++)
    if (attn_cu_is_decode((attn_cu_kernel)k))
      snprintf(s->off_why[k], sizeof s->off_why[k], "%s",
               "compile-verified only: served after it passes the start-up self-check, which is "
               "off (--gpu-self-check off)");
}

/* The Hopper instances start off, each with why; 1 when they may be
 * tried: this build holds their sm_90a code, the self-check runs, and
 * every device is compute capability 9.0. */
bool attn__cu_hopper_gate(cu_state *s, bool checking) {
  const char *why = !attn_cu_hopper_built()
                        ? "this build has no sm_90a code (CUDA_ARCHS without 90a)"
                    : !checking ? "compile-verified only: served after it passes the start-up "
                                  "self-check, which is off (--gpu-self-check off)"
                                : NULL;
  for (int i = 0; !why && i < s->ndev; i++)
    if (s->devs[i].major != 9 || s->devs[i].minor != 0)
      why = "needs compute capability 9.0 on every device (sm_90a)";
  s->off |= ATTN_CU_HOPPER_OFF;
  for (int k = ATTN_CU_HOPPER_D64; k <= ATTN_CU_HOPPER_D256; k++)
    snprintf(s->off_why[k], sizeof s->off_why[k], "%s",
             why ? why : "compile-verified only: served after it passes the start-up self-check");
  return !why;
}
