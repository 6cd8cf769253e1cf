-- wrk script for bench/run.sh: no request() override (so wrk keeps its fast
-- static request), only a machine-readable summary line at the end.
-- Fields: requests, duration (µs), p50 (µs), p99 (µs), responses with a
-- status >= 400, socket errors (connect+read+write+timeout).
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("SLUICE_BENCH %d %d %d %d %d %d\n",
    summary.requests, summary.duration,
    math.floor(latency:percentile(50)), math.floor(latency:percentile(99)),
    e.status, e.connect + e.read + e.write + e.timeout))
end
