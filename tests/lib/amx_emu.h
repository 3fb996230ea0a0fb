/*
 * amx_emu.h — an emulation of the AMX tile instructions the amx kernel uses, so that its
 * layouts and indices are checked against float64 on any CPU with AVX512-BF16.
 *
 * The unit tests compile engine/cpu/flash.c once more as the `amxemu` instance
 * (the Makefile's ISA_FLAGS_amxemu: the avx512bf16 flags, -DATTN_AMX=1
 * -DATTN_AMX_EMU=1, no -mamx flags, and `-include tests/lib/amx_emu.h`), so
 * this header comes before anything else in that translation unit: it takes
 * <immintrin.h> first, then replaces GCC's tile intrinsics (macros around
 * inline asm, and three inline functions) with calls into amx_emu.c. The
 * product code is left as it is: no hook in flash_amx.h, and libattn and
 * attnd never contain the emulation (cpu.c names the instance only by a weak
 * reference; see attn__flash_select).
 *
 * What it models: eight tile registers of 16 rows × 64 bytes per thread (the
 * tile state is per thread on the real unit too); LDTILECFG's palette-1 memory
 * layout (flash_amx.h's amx_cfg); loads that zero what the configured shape
 * leaves out; TDPBF16PS as the SDM writes it, C[m][n] += A[m][2k]·B[k][2n] +
 * A[m][2k+1]·B[k][2n+1] in F32 from BF16 inputs (products exact, input
 * denormals read as zero, output denormals flushed, round to nearest even).
 *
 * What it refuses, where the real unit would fault (#GP, #UD) or silently
 * compute garbage: a config that palette 1 does not allow (rows > 16, colsb >
 * 64, one of rows/colsb zero without the other, tiles 8-15 or reserved bytes
 * set), any tile instruction before a config or on a tile it leaves
 * unconfigured, a tile number past 7, TDPBF16PS operands that do not fit
 * together (A colsb ≠ B rows·4, C rows ≠ A rows, C colsb ≠ B colsb, colsb not a
 * multiple of 4, two operands in one register), a load or store through a
 * null pointer, and a store whose rows overlap (|stride| < colsb). Each
 * prints what and where on stderr and aborts, so the test running it fails.
 * Out-of-bounds rows are not seen here; SAN=1 sees them in the emulated
 * memcpy.
 */
#ifndef ATTN_TEST_AMX_EMU_H
#define ATTN_TEST_AMX_EMU_H

#include <stdint.h>

/* The instructions, as functions (tile numbers are run-time ints here). */
void tamx_loadconfig(const void *cfg);
void tamx_storeconfig(void *cfg);
void tamx_release(void);
void tamx_zero(int t);
void tamx_loadd(int t, const void *base, long stride);
void tamx_stored(int t, void *base, long stride);
void tamx_dpbf16ps(int c, int a, int b);

/* TDPBF16PS instructions executed so far, by every thread: a test reads it
 * before and after a run to know whether the AMX path ran. */
int64_t tamx_dpbf16ps_count(void);

#if defined(ATTN_AMX_EMU) && ATTN_AMX_EMU
#include <immintrin.h>
#undef _tile_loadd
#undef _tile_stream_loadd
#undef _tile_stored
#undef _tile_zero
#undef _tile_dpbf16ps
/* _tile_loadconfig, _tile_storeconfig and _tile_release are inline functions
 * in GCC's headers: these function-like macros take their calls over. */
#define _tile_loadconfig(cfg) tamx_loadconfig(cfg)
#define _tile_storeconfig(cfg) tamx_storeconfig(cfg)
#define _tile_release() tamx_release()
#define _tile_zero(t) tamx_zero(t)
#define _tile_loadd(t, base, stride) tamx_loadd(t, base, stride)
/* The streaming load differs from tileloadd only in its cache hint. */
#define _tile_stream_loadd(t, base, stride) tamx_loadd(t, base, stride)
#define _tile_stored(t, base, stride) tamx_stored(t, base, stride)
#define _tile_dpbf16ps(c, a, b) tamx_dpbf16ps(c, a, b)
#endif

#endif
