#!/usr/bin/env bash
# tests/bench/bench_http.sh BUILD — make bench-http: attnd's HTTP front against baselines
# measured in the same run on the same machine, printed as one table with ratios.
#
#   1. GET /healthz under wrk -t1 -c32: nginx (one worker, access_log off, `return 200`)
#      and attnd in alternating runs, median req/s of each, attnd/nginx (target >= 0.9).
#   2. A 2x2 JSON POST /attention under wrk -t1 -c4, over nginx's /healthz rate from
#      step 1 (target >= 0.5); every reply must be 200.
#   3. A 256 MiB BF16 safetensors upload (q [1, 8, 1, 128], k and v [1, 8, 65536, 128];
#      written once to BUILD/bench-http-256m.safetensors) timed by bench-http-send
#      against bench-http-sink (recv() into a touched buffer: the floor) and nginx
#      holding the body in memory before proxying it to a second server; attnd's time
#      less its Server-Timing compute over each (targets <= 1.2 and <= 1).
#   4. attnd --http-threads 1 and 2 on steps 1 and 2, when this attnd has the flag.
#   5. Instructions per keep-alive GET /healthz and per tiny POST under callgrind, when
#      valgrind is there (tests/bench/small_requests.py: a run serving 2,000 requests
#      less one serving 200, over 1,800), the number a regression shows as.
#
# BENCH_HTTP_SECONDS (each wrk run, default 5), BENCH_HTTP_RUNS (wrk runs of each
# server, default 3), BENCH_HTTP_UPLOADS (uploads to each, default 5). Prints times and
# ratios; judges nothing (a shared machine moves them), but fails when a reply is not
# 200. Everything it starts is stopped on exit, Ctrl-C included.
set -euo pipefail
build=$(realpath "${1:-build}")
secs=${BENCH_HTTP_SECONDS:-5}
runs=${BENCH_HTTP_RUNS:-3}
uploads=${BENCH_HTTP_UPLOADS:-5}
attnd=$build/attnd
upload=$build/bench-http-256m.safetensors
tiny='{"q": [[1, 0], [0, 1]], "k": [[1, 0], [0, 1]], "v": [[1, 2], [3, 4]]}'

tmp=$(mktemp -d "$build/bench-http.XXXXXX")
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'echo "bench-http: interrupted" >&2; exit 130' INT TERM
fail() {
  echo "bench-http: $*" >&2
  exit 1
}
stop() { # PID: stop one server and forget it
  kill -TERM "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
  local keep=() p
  for p in "${pids[@]}"; do [ "$p" = "$1" ] || keep+=("$p"); done
  pids=("${keep[@]}")
}
median() { printf '%s\n' "$@" | sort -g | awk '{ a[NR] = $1 } END {
  print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
# free ports, bound at once so they differ (one could be taken before its server binds)
free_ports() {
  /usr/bin/python3 -c '
import socket, sys
s = [socket.socket() for _ in range(int(sys.argv[1]))]
for x in s: x.bind(("127.0.0.1", 0))
print(" ".join(str(x.getsockname()[1]) for x in s))' "$1"
}
wait_up() { # PID PORT SECONDS: until /healthz (or any reply) answers
  local i
  for ((i = 0; i < $3 * 10; i++)); do
    kill -0 "$1" 2>/dev/null || return 1
    curl -s -o /dev/null --max-time 2 "http://127.0.0.1:$2/healthz" && return 0
    sleep 0.1
  done
  return 1
}

for t in wrk curl "$attnd" "$build/bench-http-sink" "$build/bench-http-send"; do
  command -v "$t" >/dev/null || fail "$t not found (make bench-http installs and builds it)"
done
nginx=$(command -v nginx || echo /usr/sbin/nginx)
[ -x "$nginx" ] || fail "nginx not found (make bench-http installs nginx-light)"

read -r p_nginx p_proxy p_attnd p_sink < <(free_ports 4)

# ---- nginx: /healthz on p_nginx; p_proxy holds a body in memory, then forwards it there
mkdir -p "$tmp/nginx"
{
  echo "worker_processes 1;"
  echo "daemon off;"
  echo "pid $tmp/nginx/nginx.pid;"
  echo "error_log $tmp/nginx/error.log warn;"
  # as root the worker would switch to www-data, which cannot write here
  [ "$(id -u)" = 0 ] && echo "user root root;"
  cat <<EOF
events { worker_connections 1024; }
http {
  access_log off;
  client_body_temp_path $tmp/nginx/body;
  proxy_temp_path $tmp/nginx/proxy;
  fastcgi_temp_path $tmp/nginx/fastcgi;
  uwsgi_temp_path $tmp/nginx/uwsgi;
  scgi_temp_path $tmp/nginx/scgi;
  client_max_body_size 512m;
  # attnd keeps a keep-alive connection for any number of requests; so does nginx here
  keepalive_requests 100000000;
  server {
    listen 127.0.0.1:$p_nginx;
    location / { return 200 "ok\n"; }
  }
  server {
    listen 127.0.0.1:$p_proxy;
    client_body_buffer_size 512m;
    location / {
      proxy_request_buffering on;
      proxy_pass http://127.0.0.1:$p_nginx;
    }
  }
}
EOF
} >"$tmp/nginx/nginx.conf"
"$nginx" -p "$tmp/nginx" -c "$tmp/nginx/nginx.conf" -e "$tmp/nginx/error.log" </dev/null &
pids+=($!)
nginx_pid=$!
wait_up "$nginx_pid" "$p_nginx" 10 || {
  cat "$tmp/nginx/error.log" >&2
  fail "nginx did not start on port $p_nginx"
}

# ---- attnd; its per-request log goes to /dev/null (a file would cost it time wrk measures)
attnd_pid=
start_attnd() { # FLAGS...
  "$attnd" --listen "127.0.0.1:$p_attnd" "$@" 2>/dev/null </dev/null &
  attnd_pid=$!
  pids+=("$attnd_pid")
  if ! wait_up "$attnd_pid" "$p_attnd" 30; then
    stop "$attnd_pid"
    timeout 2 "$attnd" --listen "127.0.0.1:$p_attnd" "$@" </dev/null >&2 || true
    fail "attnd $* did not start on port $p_attnd (its own words above)"
  fi
}

cat >"$tmp/post.lua" <<EOF
wrk.method = "POST"
wrk.body = '$tiny'
wrk.headers["Content-Type"] = "application/json"
EOF
wrk_rps() { # URL CONNECTIONS [LUA]: one wrk run's requests/s; fails unless every reply is 2xx
  local out
  out=$(wrk -t1 -c"$2" -d"${secs}s" ${3:+-s "$3"} "$1" 2>&1) || {
    echo "$out" >&2
    fail "wrk $1 failed"
  }
  if grep -qE 'Non-2xx|Socket errors' <<<"$out"; then
    echo "$out" >&2
    fail "wrk $1: not every reply was 200 (above)"
  fi
  sed -n 's/^Requests\/sec: *\([0-9.]*\).*/\1/p' <<<"$out"
}
check_post() {
  local code
  code=$(curl -s -o "$tmp/post.out" -w '%{http_code}' -H 'Content-Type: application/json' \
    --data-binary "$tiny" "http://127.0.0.1:$p_attnd/attention")
  [ "$code" = 200 ] || fail "POST /attention answered $code: $(cat "$tmp/post.out")"
}

model="$(lscpu | sed -n 's/^Model name: *//p' | head -1) (family $(lscpu | sed -n \
  's/^CPU family: *//p' | head -1), model $(lscpu | sed -n 's/^Model: *//p' | head -1))"
echo "bench-http: $(date -u '+%Y-%m-%d %H:%M UTC'), $model, $(nproc) cores," \
  "load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "bench-http: $("$attnd" --version 2>&1 | head -1), $("$nginx" -v 2>&1 | sed 's/.*: //')," \
  "wrk ${secs} s x $runs runs each, $uploads uploads each"

# ---- 1. GET /healthz, alternating
start_attnd
ng=() at=()
for ((i = 1; i <= runs; i++)); do
  ng+=("$(wrk_rps "http://127.0.0.1:$p_nginx/healthz" 32)")
  at+=("$(wrk_rps "http://127.0.0.1:$p_attnd/healthz" 32)")
  echo "healthz run $i: nginx ${ng[-1]} req/s, attnd ${at[-1]} req/s"
done
ng_med=$(median "${ng[@]}")
at_med=$(median "${at[@]}")

# ---- 2. the tiny POST
check_post
po=()
for ((i = 1; i <= runs; i++)); do
  po+=("$(wrk_rps "http://127.0.0.1:$p_attnd/attention" 4 "$tmp/post.lua")")
  echo "POST run $i: attnd ${po[-1]} req/s"
done
po_med=$(median "${po[@]}")

# ---- 3. the 256 MiB upload
if [ ! -s "$upload" ]; then
  echo "bench-http: writing $upload (once)"
  /usr/bin/python3 - "$upload.tmp" <<'EOF'
import json, struct, sys
import numpy as np
# BF16 is the top half of an F32: N(0, 1) values, truncated; one random block repeated
shapes = {"q": [1, 8, 1, 128], "k": [1, 8, 65536, 128], "v": [1, 8, 65536, 128]}
block = (np.random.default_rng(7).standard_normal(1 << 20, dtype=np.float32)
         .view(np.uint32) >> 16).astype("<u2").tobytes()
header, off = {}, 0
for name, shape in shapes.items():
    n = 2 * int(np.prod(shape))
    header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [off, off + n]}
    off += n
text = json.dumps(header).encode()
text += b" " * (-len(text) % 8)
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<Q", len(text)) + text)
    for name, shape in shapes.items():
        n = 2 * int(np.prod(shape))
        while n:
            f.write(block[:min(n, len(block))])
            n -= min(n, len(block))
EOF
  mv "$upload.tmp" "$upload"
fi
"$build/bench-http-sink" "$p_sink" 300 >"$tmp/sink.out" </dev/null &
pids+=($!)
sink_pid=$!
for _ in $(seq 100); do grep -q listening "$tmp/sink.out" && break; sleep 0.1; done
grep -q listening "$tmp/sink.out" || fail "bench-http-sink did not start on port $p_sink"
send() { # PORT PATH TYPE: one upload's "net_s compute_ms"
  "$build/bench-http-send" "$1" "$2" "$upload" "$3" 1 |
    sed -n 's/^RESULT .*compute_ms=\([0-9.]*\) net_s=\([0-9.]*\)/\2 \1/p'
}
sk=() nx=() an=() ac=() aw=()
for ((i = 1; i <= uploads; i++)); do
  read -r s _ < <(send "$p_sink" / application/octet-stream) || fail "upload to the sink failed"
  read -r n _ < <(send "$p_proxy" / application/octet-stream) || fail "upload to nginx failed"
  read -r a c < <(send "$p_attnd" /attention application/octet-stream) ||
    fail "upload to attnd failed"
  sk+=("$s") nx+=("$n") an+=("$a") ac+=("$c")
  aw+=("$(awk -v a="$a" -v c="$c" 'BEGIN { printf "%.4f", a + c / 1e3 }')")
  echo "upload $i: sink $s s, nginx $n s, attnd ${aw[-1]} s (compute $c ms)"
done
stop "$sink_pid"
if grep -q 'buffered to a temporary file' "$tmp/nginx/error.log"; then
  echo "bench-http: note: nginx wrote the body to a temporary file, not to memory" >&2
fi
sk_med=$(median "${sk[@]}")
nx_med=$(median "${nx[@]}")
an_med=$(median "${an[@]}")
ac_med=$(median "${ac[@]}")
aw_med=$(median "${aw[@]}")
stop "$attnd_pid"

# ---- 4. --http-threads
threads_rows=()
help=$("$attnd" --help 2>&1 || true)
if grep -q -- --http-threads <<<"$help"; then
  for t in 1 2; do
    start_attnd --http-threads "$t"
    check_post
    h=() p=()
    for ((i = 1; i <= runs; i++)); do
      h+=("$(wrk_rps "http://127.0.0.1:$p_attnd/healthz" 32)")
      p+=("$(wrk_rps "http://127.0.0.1:$p_attnd/attention" 4 "$tmp/post.lua")")
      echo "--http-threads $t run $i: healthz ${h[-1]} req/s, POST ${p[-1]} req/s"
    done
    stop "$attnd_pid"
    threads_rows+=("$t $(median "${h[@]}") $(median "${p[@]}")")
  done
fi

# ---- 5. instructions per request under callgrind (tests/bench/small_requests.py)
ir_lines=()
if command -v valgrind >/dev/null; then
  stop "$nginx_pid" # nothing else should share the cores with a slow, serial valgrind
  out=$(ATTND_BIN="$attnd" /usr/bin/python3 tests/bench/small_requests.py healthz post) ||
    fail "the instruction count failed: $out"
  echo "$out"
  while read -r kind ir _; do
    ir_lines+=("$kind $ir")
  done <<<"$out"
fi

# ---- the table
echo
printf '%-38s %16s   %-29s %7s  %s\n' "bench-http" attnd baseline ratio target
printf '%-38s %10.0f req/s   nginx %17.0f req/s %6sx  >= 0.9x\n' \
  "GET /healthz, wrk -t1 -c32" "$at_med" "$ng_med" "$(ratio "$at_med" "$ng_med")"
printf '%-38s %10.0f req/s   nginx /healthz %8.0f req/s %6sx  >= 0.5x\n' \
  "POST /attention 2x2 JSON, wrk -t1 -c4" "$po_med" "$ng_med" "$(ratio "$po_med" "$ng_med")"
printf '%-38s %14.3f s   sink %22.3f s %6sx  <= 1.2x\n' \
  "256 MiB upload, attnd less compute" "$an_med" "$sk_med" "$(ratio "$an_med" "$sk_med")"
printf '%-38s %14.3f s   nginx %21.3f s %6sx  <= 1x\n' \
  "256 MiB upload, attnd less compute" "$an_med" "$nx_med" "$(ratio "$an_med" "$nx_med")"
printf '%-38s %14.3f s   (of which compute %.1f ms)\n' \
  "256 MiB upload, attnd end to end" "$aw_med" "$ac_med"
if [ ${#threads_rows[@]} -gt 0 ]; then
  for row in "${threads_rows[@]}"; do
    read -r t h p <<<"$row"
    printf '%-38s %10.0f req/s   nginx %17.0f req/s %6sx  >= 0.9x\n' \
      "GET /healthz, --http-threads $t" "$h" "$ng_med" "$(ratio "$h" "$ng_med")"
    printf '%-38s %10.0f req/s   nginx /healthz %8.0f req/s %6sx  >= 0.5x\n' \
      "POST 2x2 JSON, --http-threads $t" "$p" "$ng_med" "$(ratio "$p" "$ng_med")"
  done
else
  echo "--http-threads 1 and 2: skipped: this attnd has no --http-threads"
fi
if [ ${#ir_lines[@]} -gt 0 ]; then
  for row in "${ir_lines[@]}"; do
    read -r kind ir <<<"$row"
    printf '%-38s %10s Ir/request   (callgrind: 2,000 keep-alive requests less 200)\n' \
      "$([ "$kind" = healthz ] && echo "GET /healthz" || echo "POST 2x2 JSON") instructions" "$ir"
  done
else
  echo "instructions per request: skipped: valgrind not installed"
fi
