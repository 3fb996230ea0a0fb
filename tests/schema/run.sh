#!/usr/bin/env bash
# tests/schema/run.sh ATTND VENV — proto/openapi.yaml against a live attnd,
# checked by Schemathesis (from the test venv VENV, see requirements-test.txt).
#
# Every check is on, in both modes: schema-valid requests (must not be
# refused beyond what the spec says) and schema-violating ones (must be
# refused with a 4xx). Generation is derandomized and bounded, so each run
# sends the same requests and takes a few seconds; tests/schema/
# schemathesis.toml says which refusals the spec allows and why.
# The server gets port 0 and we read the port from its startup line, so
# nothing can take the port between choosing and binding it. At the end the
# server must still be alive and exit 0 on SIGTERM (a crash fails the run).
set -euo pipefail

attnd=$(realpath "$1")
venv=$(realpath "$2")
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
work=$(mktemp -d)
pid=

cleanup() {
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

fail() {
  echo "tests/schema: $*" >&2
  echo "---- attnd log ----" >&2
  cat "$work/attnd.log" >&2 || true
  exit 1
}

"$attnd" --listen 127.0.0.1:0 --threads 2 --session-memory 256M >"$work/attnd.log" 2>&1 </dev/null &
pid=$!

url=
for _ in $(seq 200); do  # up to ~10 s for the startup line
  url=$(sed -n 's/^attnd [^:]*: listening on \(http:\/\/[0-9.]*:[0-9]*\).*/\1/p' \
        "$work/attnd.log" | head -n1)
  [ -n "$url" ] && break
  kill -0 "$pid" 2>/dev/null || fail "attnd exited before listening"
  sleep 0.05
done
[ -n "$url" ] || fail "no 'listening on' line from attnd within 10 s"

# From a scratch directory: Schemathesis writes nothing into the checkout.
# too_slow is Hypothesis timing its own data generation, not a check of the
# API: on a loaded machine (or under SAN=1) it would fail runs at random.
# Every check but one: --checks all would also turn on max_response_time (a
# 10 s bound on each reply), and make test measures no time; the list below
# is every other check this Schemathesis has. --request-timeout only bounds a
# wait, generously.
checks=not_a_server_error,status_code_conformance,content_type_conformance
checks=$checks,response_headers_conformance,response_schema_conformance
checks=$checks,negative_data_rejection,positive_data_acceptance,missing_required_header
checks=$checks,unsupported_method,allow_header_conformance,use_after_free
checks=$checks,ensure_resource_availability,ignored_auth,object_level_authorization
# Two runs. The first: every operation but POST /v1/sessions/{id}/attention
# and PUT /v1/sessions/{id}/import, every warning failing it
# (schemathesis.toml). The second: those two alone, their warnings shown
# but not failing: a call succeeds only on a session of its q's D, dtype
# and heads, at the layer's length, and an import only with a whole
# session file, so most generated requests are refused by design, and
# validation_mismatch ("most schema-valid requests refused") would fail
# every run. Every check still
# runs on it, in every phase but the stateful one (its links start at PUT,
# which this run leaves out).
# Before each run, the sessions the computing session routes are sent to
# (schemathesis.toml): a generated id names none, and every call to it would
# be a 404. Each is deleted first (a 404 when it is not there): a run's
# stateful phase may have re-created it with other parameters, which a PUT
# would refuse with 409 session_exists.
st_run() {
  local config=$1 id
  shift
  for id in warm-1 warm-2; do
    curl -s -o /dev/null -X DELETE "$url/v1/sessions/$id"
    curl -sf -o /dev/null -X PUT "$url/v1/sessions/$id" -H 'Content-Type: application/json' \
      -d '{"heads_kv": 1, "head_dim": 1, "dtype": "F32", "max_tokens": 1048576, "ttl_s": 86400}' ||
      fail "PUT /v1/sessions/$id failed"
  done
  (cd "$work" && "$venv/bin/st" --config-file "$config" run \
     "$root/proto/openapi.yaml" --url "$url" \
     --checks "$checks" --mode all --generation-deterministic --max-examples 50 \
     --suppress-health-check too_slow \
     --request-timeout 60 --workers 1 --no-color "$@")
}
sed 's/^fail-on = true$/fail-on = false/' "$here/schemathesis.toml" >"$work/warn-only.toml"
grep -q '^fail-on = false$' "$work/warn-only.toml" || fail "schemathesis.toml has no 'fail-on = true'"
status=0
st_run "$here/schemathesis.toml" --exclude-operation-id session_attention \
  --exclude-operation-id session_import || status=$?
st_run "$work/warn-only.toml" --include-operation-id session_attention \
  --include-operation-id session_import --phases examples,coverage,fuzzing || status=$?

kill -0 "$pid" 2>/dev/null || fail "attnd died during the run"
kill -TERM "$pid"
rc=0
wait "$pid" || rc=$?
pid=
[ "$rc" = 0 ] || fail "attnd exited with status $rc after SIGTERM"
if grep -q Sanitizer "$work/attnd.log"; then
  fail "sanitizer report in attnd's log"
fi
[ "$status" = 0 ] || fail "schemathesis found the failures above"
echo "tests/schema: openapi.yaml matches attnd (schemathesis passed)"
