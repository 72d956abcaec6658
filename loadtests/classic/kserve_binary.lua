-- wrk script: KServe v2 infer requests with the binary tensor extension, one body sent again and again.
-- SLUICE_WRK_BODY is the file holding the body (the JSON header, then the tensors' bytes) and
-- SLUICE_WRK_HEADER_LENGTH the JSON header's length. done() prints one JSON line, prefixed "WRK_JSON ",
-- with wrk's own counts and latency percentiles (microseconds), for loadtests/classic/bench_lowcost.py.
local file = assert(io.open(os.getenv("SLUICE_WRK_BODY"), "rb"))
wrk.method = "POST"
wrk.body = file:read("*a")
file:close()
wrk.headers["Content-Type"] = "application/octet-stream"
wrk.headers["Inference-Header-Content-Length"] = os.getenv("SLUICE_WRK_HEADER_LENGTH")

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRK_JSON {"requests": %d, "duration_us": %d, "errors": {"connect": %d, "read": %d, "write": %d, ' ..
    '"status": %d, "timeout": %d}, "p50_us": %d, "p90_us": %d, "p99_us": %d, "mean_us": %.1f}\n',
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.mean))
end
