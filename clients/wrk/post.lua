-- wrk script for attnd: POSTs the safetensors body in $ATTND_BODY to
-- /attention and prints one machine-readable line at the end.
--   ATTND_BODY=req.safetensors wrk -t1 -c1 -d10s -s clients/wrk/post.lua http://127.0.0.1:8080/attention
local f = assert(io.open(os.getenv("ATTND_BODY"), "rb"))
local body = f:read("*a")
f:close()

wrk.method = "POST"
wrk.body = body
wrk.headers["Content-Type"] = "application/octet-stream"

local bad = 0
function response(status, headers, body)
  if status ~= 200 then bad = bad + 1 end
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "RESULT requests=%d duration_us=%d errors=%d p50_us=%d p99_us=%d mean_us=%.1f\n",
    summary.requests, summary.duration,
    e.connect + e.read + e.write + e.status + e.timeout,
    latency:percentile(50), latency:percentile(99), latency.mean))
end
