-- wrk script for bench/run.sh's many-key targets (redis1k, redis3k): each
-- request carries an X-Api-Key of one of BENCH_KEYS clients (100000 by
-- default), a key per client, every key in turn in an order that differs
-- per thread (a stride coprime with the count). The requests are formatted
-- once per thread (init), so request() only picks one. The summary line is
-- wrk-report.lua's.
local n = tonumber(os.getenv("BENCH_KEYS") or "100000")
local reqs, i, step = {}, 0, 7919
local threads = 0

function setup(thread)
  thread:set("tid", threads) -- a global of the thread's own Lua state
  threads = threads + 1
end

function init(args)
  for k = 0, n - 1 do
    reqs[k + 1] = wrk.format(nil, nil, { ["X-Api-Key"] = "client-" .. k })
  end
  i = ((tid or 0) * 4099) % n
end

function request()
  i = (i + step) % n
  return reqs[i + 1]
end

-- Fields: requests, duration (µs), p50 (µs), p99 (µs), responses with a
-- status >= 400, socket errors (connect+read+write+timeout).
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("SLUICE_BENCH %d %d %d %d %d %d\n",
    summary.requests, summary.duration,
    math.floor(latency:percentile(50)), math.floor(latency:percentile(99)),
    e.status, e.connect + e.read + e.write + e.timeout))
end
