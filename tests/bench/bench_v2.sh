#!/usr/bin/env bash
# tests/bench/bench_v2.sh BUILD VENV — make bench-v2: perf_analyzer (Triton's load
# tool, over /v2 with binary tensors) and `attn load` (POST /attention, safetensors)
# against one attnd, on the same shape, dtype and concurrency, one after the other.
#
# BENCH_V2_SHAPE (B,H,N,D; default 1,8,512,64), BENCH_V2_DTYPE (FP32, FP16 or BF16;
# default FP16), BENCH_V2_CONCURRENCY (default 4), BENCH_V2_SECONDS (each tool's
# measurement, default 5) and ATTND_FLAGS (e.g. --threads 8) change the run.
# perf_analyzer's random data holds NaN, which attnd refuses, so it sends zeros
# (--input-data zero); attn load sends random values: the work is the same.
set -euo pipefail
build=$(realpath "$1")
venv=$(realpath "$2")
shape=${BENCH_V2_SHAPE:-1,8,512,64}
dtype=${BENCH_V2_DTYPE:-FP16}
conc=${BENCH_V2_CONCURRENCY:-4}
secs=${BENCH_V2_SECONDS:-5}
case $dtype in FP32) model=attention attn_dt=F32 ;; FP16) model=attention_fp16 attn_dt=F16 ;;
  BF16) model=attention_bf16 attn_dt=BF16 ;; *) echo "BENCH_V2_DTYPE: FP32, FP16 or BF16" >&2; exit 2 ;;
esac
cudart=$("$venv/bin/python" -c 'import nvidia.cuda_runtime as m; print(list(m.__path__)[0] + "/lib")')
work=$(mktemp -d)
pid=
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT

# port 0: attnd picks a free one and prints it on its first line
# shellcheck disable=SC2086
"$build/attnd" --listen 127.0.0.1:0 ${ATTND_FLAGS:-} >"$work/attnd.log" 2>&1 </dev/null &
pid=$!
for _ in $(seq 100); do
  port=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$work/attnd.log")
  [ -n "$port" ] && break
  sleep 0.1
done
[ -n "$port" ] || { cat "$work/attnd.log" >&2; exit 1; }
echo "bench-v2: attnd on port $port ($(head -1 "$work/attnd.log" | sed 's/.*backend //'))"
echo "bench-v2: shape $shape $dtype, concurrency $conc, ${secs} s each"
echo
echo "== perf_analyzer (POST /v2/models/$model/infer, binary tensors) =="
LD_LIBRARY_PATH="$cudart${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$venv/bin/perf_analyzer" \
  -m "$model" -u "127.0.0.1:$port" -i http --input-data zero \
  --shape "q:$shape" --shape "k:$shape" --shape "v:$shape" \
  --concurrency-range "$conc" --measurement-interval "$((secs * 1000))" 2>&1 |
  sed -n '/^Request concurrency/,$p'
echo
echo "== attn load (POST /attention, safetensors) =="
"$build/attn" load "http://127.0.0.1:$port" --shape "$shape" --dtype "$attn_dt" \
  --concurrency "$conc" --duration "$secs"
