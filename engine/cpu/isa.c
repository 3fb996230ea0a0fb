/*
 * isa.c — which CPU kernel instance runs: those this CPU can run, best
 * first, and the choice by name (cpu_isa; flash.h's attn__flash_select).
 *
 * AMX needs more than the instruction set: Linux hands out the tile data
 * state only on request, so the kernel is usable only once the process was
 * granted it.
 */
#include "flash.h"

#include <string.h>

#if defined(__x86_64__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

/* AMX-BF16 in the CPU and tile data granted by Linux, which hands it out
 * only on request (arch_prctl ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA). */
static bool amx_usable(void) {
#if defined(__x86_64__)
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 22)) || !(d & (1u << 24)))
    return false;
  return syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
#else
  return false;
#endif
}

enum { NISA = 5 };
static const char *const isa_names[NISA] = {"amx", "avx512bf16", "avx512", "avx2", "generic"};

/* The kernels this CPU runs, best first; NULL where it cannot. */
static void flash_usable(const attn__flash_isa *all[NISA]) {
  all[0] = all[1] = all[2] = all[3] = NULL;
  all[4] = &attn__flash_generic;
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
      __builtin_cpu_supports("f16c"))
    all[3] = &attn__flash_avx2;
  if (all[3] && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
    all[2] = &attn__flash_avx512;
  if (all[2] && __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512vnni"))
    all[1] = &attn__flash_avx512bf16;
  if (all[1] && amx_usable())
    all[0] = &attn__flash_amx;
#endif
}

/*
 * The unit tests' amxemu instance: the amx kernel on an emulation of the
 * tile unit (tests/lib/amx_emu.h), whose other instructions are AVX512-BF16.
 * Why a weak symbol rather than a registry the tests fill in: pointing the
 * backend at it needs no state in the engine and no setter in its API; the
 * unit-test binary links the instance and names it like any kernel
 * (cpu_isa "amxemu"), so the whole backend path (items, splits, merges, the
 * self-check) runs on it, while in attnd and attn the symbol is absent and
 * the name is as unknown as any typo.
 */
static const attn__flash_isa *amxemu_select(const attn__flash_isa *all[NISA], attn_status *st) {
  if (all[1])
    return &attn__flash_amxemu;
  attn_status_set(st, ATTN_EUNSUPPORTED,
                  "this CPU cannot run the amxemu kernel (its emulated tiles sit among "
                  "AVX512-BF16 code)");
  return NULL;
}

const attn__flash_isa *attn__flash_select(const char *want, attn_status *st) {
  const attn__flash_isa *all[NISA], *best = NULL;
  flash_usable(all);
  for (int i = NISA - 1; i >= 0; i--)
    best = all[i] ? all[i] : best;
  if (!want || !*want || strcmp(want, "auto") == 0)
    return best;
  if (strcmp(want, "amxemu") == 0 && &attn__flash_amxemu)
    return amxemu_select(all, st);
  for (int i = 0; i < NISA; i++) {
    if (strcmp(want, isa_names[i]) != 0)
      continue;
    if (all[i])
      return all[i];
    attn_status_set(st, ATTN_EUNSUPPORTED, "this CPU cannot run the %s kernel (best: %s)%s", want,
                    best->name,
                    i == 0 ? "; AMX needs AMX-BF16 and Linux's XTILEDATA permission" : "");
    return NULL;
  }
  attn_status_set(st, ATTN_EINVAL,
                  "unknown CPU kernel \"%.40s\" (choose auto, amx, avx512bf16, avx512, avx2 "
                  "or generic)",
                  want);
  return NULL;
}
