#!/usr/bin/env bash
# tests/gpu/check.sh OUTDIR — everything the GPU machine should tell us, in
# one call that fits the lease: build for sm_90 only
# (BUILD=build-gpu, never mixed with a CPU build), the GPU tests,
# compute-sanitizer on a few small cases, bench-gpu and PyTorch's SDPA on
# the same shapes, bench-gpu --staging (one large job's data path step by
# step) and --sessions (a decode step with the pages on the GPU), then a
# short table. Each stage runs under `timeout`
# within one overall budget (CHECK_BUDGET_S, default 420 s) and the script
# goes on to the next stage when one fails. The LAST lines printed are the
# summary table, since only the tail of the output comes back.
#
# Files in OUTDIR (the device tool returns at most 8): build.log (with the
# ptxas register/spill report), tests.log, sanitizer.log, bench.log,
# bench.csv, sdpa.csv, hopper.csv (bench-gpu --hopper-full: the sm_90a
# instance beside mma.sync, with SDPA's numbers for the same shapes joined
# in), summary.txt (the final table).
#
# Environment: CHECK_BUDGET_S (seconds for the whole script), CHECK_CUDA_ARCHS
# (default "90 90a": the sm_90a Hopper instance is built, and its test group
# and table run, only with 90a), CHECK_HOPPER=0 (skip the Hopper table),
# CHECK_JOBS (make -j, default nproc). No network is needed. If
# the machine lacks a library the build needs (libcjson-dev above all:
# libattn.a's codecs use it), carry the Debian packages in a folder .debs/
# at the repository root: they are unpacked under /tmp/attn-deps and put on
# the compiler's and loader's paths.
set -u

if [ $# -lt 1 ]; then
  echo "usage: tests/gpu/check.sh OUTDIR" >&2
  exit 2
fi
mkdir -p "$1" || exit 2
OUT=$(cd "$1" && pwd)
cd "$(dirname "$0")/../.." || exit 2
ROOT=$(pwd)

T0=$(date +%s)
BUDGET=${CHECK_BUDGET_S:-420}
ARCHS=${CHECK_CUDA_ARCHS:-90 90a}
JOBS=${CHECK_JOBS:-$(nproc 2>/dev/null || echo 8)}
BUILD=build-gpu
export ARCHS JOBS BUILD
export PATH="$PATH:/usr/local/cuda/bin"
export PYTHONUNBUFFERED=1
# On this machine a missing device is a failure, not a skip.
export ATTN_GPU_REQUIRE=1

STAGES=""   # one line per stage for the summary
elapsed() { echo $(( $(date +%s) - T0 )); }
left() { echo $(( BUDGET - $(elapsed) )); }

# timeout_for CAP RESERVE: CAP seconds, or less so that RESERVE seconds stay
# for the stages after this one; at least 10.
timeout_for() {
  local cap=$1 reserve=$2 l
  l=$(( $(left) - reserve ))
  if [ "$l" -lt "$cap" ]; then cap=$l; fi
  if [ "$cap" -lt 10 ]; then cap=10; fi
  echo "$cap"
}

# stage NAME CAP RESERVE LOG CMD...: runs CMD under timeout, output to LOG;
# records the verdict and the time. Returns CMD's status.
stage() {
  local name=$1 cap=$2 reserve=$3 log=$4
  shift 4
  local to s rc verdict el
  to=$(timeout_for "$cap" "$reserve")
  s=$(date +%s)
  echo "=== $name: start at $(elapsed)s, timeout ${to}s: $*" | tee -a "$log"
  if [ "$(type -t "$1")" = function ]; then
    # a function of this script (no arguments): run it in a child bash
    timeout -k 5 "$to" bash -c "$(declare -f "$1"); $1" >>"$log" 2>&1
  else
    timeout -k 5 "$to" "$@" >>"$log" 2>&1
  fi
  rc=$?
  el=$(( $(date +%s) - s ))
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    verdict="TIMEOUT (${to}s)"
  elif [ $rc -ne 0 ]; then
    verdict="FAILED (exit $rc)"
  else
    verdict="ok"
  fi
  echo "=== $name: $verdict in ${el}s" | tee -a "$log"
  STAGES="$STAGES$(printf '%-10s %-20s %4ds' "$name" "$verdict" "$el")
"
  return $rc
}

skip_stage() {
  echo "=== $1: skipped: $2"
  STAGES="$STAGES$(printf '%-10s %-20s %5s' "$1" "skipped" "-") ($2)
"
}

# ---- 0. the machine ------------------------------------------------------
# shellcheck disable=SC2317 # run through stage()
info() {
  echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC'), $(uname -srm), $(nproc) CPUs"
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi -L
    nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.sm,clocks.max.sm,temperature.gpu,power.draw \
      --format=csv 2>&1 | head -3
  else
    echo "nvidia-smi: not found"
  fi
  echo "nvcc: $(nvcc --version 2>/dev/null | tail -1 || echo 'not found')"
  echo "cc: $(cc --version 2>/dev/null | head -1)"
  echo "make: $(make --version 2>/dev/null | head -1)"
  echo "python3: $(python3 -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1 | tail -1)"
  echo "compute-sanitizer: ${SANITIZER:-not found}"
  local h
  for h in cjson/cJSON.h microhttpd.h uv.h criterion/criterion.h; do
    if echo "#include <$h>" | cc -E -x c - >/dev/null 2>&1; then
      echo "header $h: found"
    else
      echo "header $h: MISSING"
    fi
  done
}

SANITIZER=$(command -v compute-sanitizer 2>/dev/null || true)
for c in /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda/compute-sanitizer/compute-sanitizer; do
  if [ -z "$SANITIZER" ] && [ -x "$c" ]; then SANITIZER=$c; fi
done
export SANITIZER

# Carried Debian packages (see the header): unpacked, never installed.
if ls "$ROOT"/.debs/*.deb >/dev/null 2>&1; then
  DEPS=/tmp/attn-deps
  mkdir -p "$DEPS"
  for d in "$ROOT"/.debs/*.deb; do
    dpkg-deb -x "$d" "$DEPS" && echo "unpacked $(basename "$d")"
  done
  MA=$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
  export C_INCLUDE_PATH="$DEPS/usr/include${C_INCLUDE_PATH:+:$C_INCLUDE_PATH}"
  export LIBRARY_PATH="$DEPS/usr/lib/$MA:$DEPS/usr/lib${LIBRARY_PATH:+:$LIBRARY_PATH}"
  export LD_LIBRARY_PATH="$DEPS/usr/lib/$MA:$DEPS/usr/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}/usr/local/cuda/lib64"

stage info 20 400 "$OUT/summary.txt" info >/dev/null
grep -v '^=== ' "$OUT/summary.txt"

# ---- 1. build ----------------------------------------------------------------
# shellcheck disable=SC2317 # run through stage()
build() {
  # -Otarget keeps each nvcc's ptxas report in one piece.
  make -j"$JOBS" -Otarget CUDA=1 CUDA_ARCHS="$ARCHS" BUILD="$BUILD" \
    "$BUILD/tests/gpu" "$BUILD/bench-gpu" || return 1
  make -j"$JOBS" -Otarget CUDA=1 CUDA_ARCHS="$ARCHS" BUILD="$BUILD" "$BUILD/attnd" ||
    echo "check.sh: attnd did not build (the tests and the benchmark do not need it)"
}
stage build 240 150 "$OUT/build.log" build
BUILD_RC=$?
if [ $BUILD_RC -ne 0 ]; then
  echo "--- last lines of build.log:"
  grep -v '^ptxas info\|bytes stack frame' "$OUT/build.log" | tail -25
fi

# ptxas: registers, stack frame and spills of each kernel; spills flagged.
PTXAS=$(awk '
  /Compiling entry function/ { n = split($0, a, "'"'"'"); fn = a[2]; arch = a[4] }
  /bytes stack frame/ { frame = $1; sst = $5; sld = $9 }
  /ptxas info *: Used [0-9]+ registers/ {
    match($0, /Used [0-9]+ registers/); regs = substr($0, RSTART + 5, RLENGTH - 15)
    printf "%-6s regs %3s frame %5s spill st %5s ld %5s  %s\n", arch, regs, frame, sst, sld, fn
  }' "$OUT/build.log" 2>/dev/null)
if command -v c++filt >/dev/null; then PTXAS=$(printf '%s\n' "$PTXAS" | c++filt); fi
SPILLS=$(grep -E '[1-9][0-9]* bytes spill (stores|loads)' "$OUT/build.log" 2>/dev/null | sort | uniq -c)
{
  echo "--- ptxas report (sm, registers, stack frame, spill bytes, kernel):"
  printf '%s\n' "$PTXAS" | cut -c1-160
} >>"$OUT/build.log"
NKERN=$(printf '%s\n' "$PTXAS" | grep -c regs)
MAXREG=$(printf '%s\n' "$PTXAS" | awk '{ if ($3 > m) m = $3 } END { print m + 0 }')
if [ -n "$SPILLS" ]; then
  SPILL_LINE="SPILLS in $(printf '%s\n' "$PTXAS" | awk '$8 > 0 || $10 > 0' | wc -l) of $NKERN kernels"
  echo "!!! ptxas reports spills (not '0 bytes spill'):"
  printf '%s\n' "$PTXAS" | awk '$8 > 0 || $10 > 0' | cut -c1-150 | head -12
else
  SPILL_LINE="no spills in $NKERN kernels"
fi
FRAMES=$(printf '%s\n' "$PTXAS" | awk '$5 > 0' | wc -l)
echo "ptxas: $SPILL_LINE; max $MAXREG registers; $FRAMES kernels with a stack frame"

# ---- 2. the GPU tests -----------------------------------------------------------
TESTS_RC=-
if [ -x "$BUILD/tests/gpu" ]; then
  TO=$(timeout_for 150 100)
  stage tests 150 100 "$OUT/tests.log" "$BUILD/tests/gpu" --timeout $(( TO - 5 ))
  TESTS_RC=$?
  grep -E '^  FAIL|^  CUDA|watchdog' "$OUT/tests.log" | cut -c1-220 | head -20
else
  skip_stage tests "$BUILD/tests/gpu was not built"
fi

# ---- 3. compute-sanitizer on small cases --------------------------------------
SAN_LINES=""
# sanitize NAME CAP RESERVE "TOOL ARGS" "TEST ARGS": one tool over the tests
sanitize() {
  local name=$1 cap=$2 reserve=$3 targs=$4 pargs=$5
  local to
  to=$(timeout_for "$cap" "$reserve")
  # shellcheck disable=SC2086 # the two argument lists split on purpose
  stage "$name" "$cap" "$reserve" "$OUT/sanitizer.log" \
    "$SANITIZER" --error-exitcode 9 $targs "$BUILD/tests/gpu" $pargs --quiet --timeout $(( to - 5 ))
  local rc=$?
  local s
  s=$(sed -n "/=== $name: start/,/=== $name: /p" "$OUT/sanitizer.log" |
      grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|gpu tests: (PASS|FAIL)' | sed 's/^========= //' | tr '\n' ';')
  SAN_LINES="$SAN_LINES$(printf '%-10s exit %-3s %s' "$name" "$rc" "$s")
"
}
if [ -z "$SANITIZER" ]; then
  skip_stage sanitizer "compute-sanitizer not found"
elif [ ! -x "$BUILD/tests/gpu" ]; then
  skip_stage sanitizer "$BUILD/tests/gpu was not built"
else
  sanitize memcheck 60 75 "--tool memcheck --leak-check full" "--small"
  sanitize racecheck 60 50 "--tool racecheck" "--small --group small,kapi,hopper"
  if [ "$(left)" -gt 110 ]; then
    sanitize initcheck 35 75 "--tool initcheck" "--small --group small"
  else
    skip_stage initcheck "not enough time left"
  fi
  grep -E '^========= (Invalid|Race|Uninitialized|Error|Program hit|Leaked|.*[Hh]azard)' \
    "$OUT/sanitizer.log" | sort | uniq -c | sort -rn | head -12
fi

# ---- 4. benchmarks ---------------------------------------------------------------
QUICK=""
if [ "$(left)" -lt 170 ]; then QUICK="--quick"; fi
if [ -x "$BUILD/bench-gpu" ]; then
  stage bench 90 80 "$OUT/bench.log" "$BUILD/bench-gpu" $QUICK --csv "$OUT/bench.csv"
  # One large job step by step: would receiving request bodies into pinned
  # memory beat packing them into pinned staging? Its lines (all beginning
  # "staging") go to bench.log, since OUTDIR already holds 8 files, and into
  # the summary.
  stage staging 40 40 "$OUT/bench.log" "$BUILD/bench-gpu" --staging
  # A session's decode step at 32K cached tokens, its pages on the GPU,
  # against the kernel alone ("sessions" lines, into bench.log too).
  stage sessions 40 30 "$OUT/bench.log" "$BUILD/bench-gpu" --sessions
else
  skip_stage bench "$BUILD/bench-gpu was not built"
  skip_stage staging "$BUILD/bench-gpu was not built"
  skip_stage sessions "$BUILD/bench-gpu was not built"
fi
stage sdpa 90 5 "$OUT/bench.log" python3 tests/gpu/sdpa_bench.py $QUICK --csv "$OUT/sdpa.csv"
# The Hopper instance's table (issue 19): bench-gpu times each shape as
# mma.sync and as the sm_90a instance; SDPA the same shapes, joined in.
if [ "${CHECK_HOPPER:-1}" != 0 ] && [ -x "$BUILD/bench-gpu" ] && [ "$(left)" -gt 60 ]; then
  stage hopper 120 20 "$OUT/bench.log" "$BUILD/bench-gpu" --hopper-full --csv "$OUT/hopper.csv"
  stage hsdpa 80 10 "$OUT/bench.log" python3 tests/gpu/sdpa_bench.py --hopper-full \
    --csv "$OUT/hopper_sdpa.csv"
  if [ -s "$OUT/hopper_sdpa.csv" ]; then
    # one file comes back instead of two: SDPA's rows appended as kind "sdpa"
    sed -n '2,$s/^prefill,/sdpa,/p' "$OUT/hopper_sdpa.csv" >>"$OUT/hopper.csv"
    rm -f "$OUT/hopper_sdpa.csv"
  fi
else
  skip_stage hopper "CHECK_HOPPER=0, no bench-gpu, or not enough time left"
fi
grep -E 'ERROR|BAD|skipped|Error' "$OUT/bench.log" | head -8

# ---- 5. the summary: the last lines of the output ---------------------------------
table() {
  echo
  echo "======================== check.sh summary ($(elapsed)s of ${BUDGET}s) ========================"
  printf '%s' "$STAGES"
  echo "build: $SPILL_LINE; max $MAXREG registers; $FRAMES with a stack frame"
  if [ -n "$SAN_LINES" ]; then printf '%s' "$SAN_LINES"; fi
  if grep -q '^gpu tests: summary' "$OUT/tests.log" 2>/dev/null; then
    sed -n '/^gpu tests: summary/,$p' "$OUT/tests.log" | grep -v '^thresholds' | head -20
  elif [ -f "$OUT/tests.log" ]; then
    echo "gpu tests: no summary; last lines of tests.log:"
    tail -6 "$OUT/tests.log" | cut -c1-200
  fi
  if [ -s "$OUT/bench.csv" ]; then
    awk -F, -v sdpa="$OUT/sdpa.csv" '
      BEGIN {
        while ((getline line < sdpa) > 0) {
          n = split(line, f, ",")
          if (f[1] == "kind" || n < 18) continue
          k = f[1] FS f[2] FS f[3] FS f[4] FS f[5] FS f[6] FS f[7] FS f[8] FS f[9]
          sm[k] = f[14]; st[k] = f[16]; sk[k] = f[10]
        }
      }
      FNR == 1 { next }
      {
        # a bwd_atomic row (the atomic dQ path) is set against the SDPA backward of its shape,
        # a decode-mma row (the tiled forward) against the SDPA decode of its shape
        k = ($1 == "bwd_atomic" ? "backward" : $1 == "decode-mma" ? "decode" : $1) FS $2 FS $3 FS $4 FS $5 FS $6 FS $7 FS $8 FS $9
        sdk = (k in sk) ? sk[k] : "-"; sub(/:.*\+graph/, "+graph", sdk); sub(/:.*/, "", sdk)
        if (!header++)
          printf "%-34s %-5s %1s %10s %10s %6s  %-14s %s\n", "shape", "dtype", "c", "ours", "sdpa", "ratio", "ours kernel", "sdpa"
        if ($1 ~ /^decode/) {
          shape = sprintf("%s B%d Hq%d Hkv%d Nkv%d D%d", $1, $2, $3, $4, $6, $7)
          ours = sprintf("%.1fus", $14 * 1000); sd = (k in sm && sm[k] > 0) ? sprintf("%.1fus", sm[k] * 1000) : "-"
          r = (k in sm && sm[k] > 0 && $14 > 0) ? sprintf("%.2f", sm[k] / $14) : "-"
          extra = sprintf("  %.0f GB/s", $17)
        } else {
          shape = sprintf("%s B%d H%d N%d D%d", $1, $2, $3, $5, $7)
          ours = sprintf("%.1f", $16); sd = (k in st && st[k] > 0) ? sprintf("%.1f", st[k]) : "-"
          r = (k in st && st[k] > 0 && $16 > 0) ? sprintf("%.2f", $16 / st[k]) : "-"
          if (r != "-" && $1 == "prefill") { lg += log(r); nr++ }
          if (r != "-" && $1 == "backward") { lgb += log(r); nrb++ }
          if (r != "-" && $1 == "bwd_atomic") { lga += log(r); nra++ }
          extra = ""
        }
        if ($18 != "ok") extra = extra "  " $18
        printf "%-34s %-5s %1s %10s %10s %6s  %-14s %s%s\n", shape, $8, $9, ours, sd, r, $10 "/" $11, sdk, extra
      }
      END {
        if (header) print "(prefill, backward: TFLOP/s, ratio = ours/sdpa; decode: median time, ratio = sdpa time/ours; >1: ours faster)"
        if (nr) printf "prefill geometric mean of ours/sdpa over %d shapes: %.2f\n", nr, exp(lg / nr)
        if (nrb) printf "backward geometric mean of ours/sdpa over %d shapes: %.2f\n", nrb, exp(lgb / nrb)
        if (nra) printf "bwd_atomic (--deterministic off) geometric mean of ours/sdpa over %d shapes: %.2f\n", nra, exp(lga / nra)
      }' "$OUT/bench.csv" ||
      echo "(table failed)"
    if [ ! -s "$OUT/sdpa.csv" ]; then echo "(no SDPA numbers: see bench.log)"; fi
  else
    echo "bench: no results (see bench.log)"
  fi
  if grep -q '^staging' "$OUT/bench.log" 2>/dev/null; then
    echo "--- a large job's data path, step by step (bench-gpu --staging):"
    grep '^staging' "$OUT/bench.log" | cut -c1-160
  else
    echo "staging: no results (see bench.log)"
  fi
  if grep -q '^sessions' "$OUT/bench.log" 2>/dev/null; then
    echo "--- a session's decode step, pages on the GPU (bench-gpu --sessions):"
    grep '^sessions' "$OUT/bench.log" | cut -c1-160
  else
    echo "sessions: no results (see bench.log)"
  fi
}
# The Hopper table: TFLOP/s of mma.sync, the sm_90a instance and SDPA per
# shape, and issue 31's targets (BF16, D=128, N=4096: >= 600 non-causal,
# >= 500 causal; ahead of SDPA on at least D=64 and D=256).
hopper_table() {
  [ -s "$OUT/hopper.csv" ] || return 0
  echo "--- Hopper (sm_90a) instance, BF16 B=4 H=16, TFLOP/s:"
  awk -F, '
    $1 == "kind" { next }
    { k = $5 FS $7 FS $9; if (!(k in seen)) { seen[k] = 1; order[n++] = k } }
    $1 == "prefill" { mma[k] = $16; mst[k] = $18 }
    $1 == "hopper" { hp[k] = $16; hst[k] = $18 }
    $1 == "sdpa" { sd[k] = $16; sk[k] = $10; sub(/:.*/, "", sk[k]) }
    END {
      printf "%6s %4s %1s %9s %9s %9s %6s  %s\n", "N", "D", "c", "mma.sync", "hopper", "sdpa", "hp/sd", "verdict"
      for (i = 0; i < n; i++) {
        split(order[i], f, FS); k = order[i]
        h = (k in hp) ? hp[k] : 0; s = (k in sd) ? sd[k] : 0
        v = (k in hst && hst[k] != "ok") ? hst[k] : ""
        if (h > 0 && s > 0 && h <= s) v = v " behind-sdpa"
        if (f[2] == 128 && f[1] == 4096 && f[3] == 0) v = v (h >= 600 ? " target-met" : " target-missed(600)")
        if (f[2] == 128 && f[1] == 4096 && f[3] == 1) v = v (h >= 500 ? " target-met" : " target-missed(500)")
        printf "%6d %4d %1d %9.1f %9.1f %9.1f %6s %s\n", f[1], f[2], f[3], (k in mma) ? mma[k] : 0, h, s,
               (h > 0 && s > 0) ? sprintf("%.2f", h / s) : "-", v
      }
    }' "$OUT/hopper.csv"
}
{ table; hopper_table; } | tee -a "$OUT/summary.txt"

FAIL=0
[ "$BUILD_RC" = 0 ] || FAIL=1
[ "$TESTS_RC" = 0 ] || FAIL=1
exit $FAIL
