-- wrk script for bench/timekeeper_ingest.py --client wrk: meter reports, each pod's seq and cumulative rising.
-- Pods are taken round-robin, so a pod's consecutive reports are hundreds of requests apart and arrive in order.
local threads_started = 0

function setup(thread)
  thread:set("id", threads_started)
  threads_started = threads_started + 1
end

function init(args)
  pods = tonumber(args[1])
  namespaces = tonumber(args[2])
  seqs = {}
  sent = 0
  wrk.method = "POST"
  wrk.headers["Content-Type"] = "application/json"
  wrk.headers["Authorization"] = "Bearer " .. args[3]
end

function request()
  sent = sent + 1
  local pod = sent % pods
  local seq = (seqs[pod] or 0) + 1
  seqs[pod] = seq
  local body = string.format(
    '{"podUid":"uid-w%d-%d","namespace":"ns-%d","pod":"w%d-%d","gpuShare":0.5,"seq":%d,"gpuSeconds":%.1f}',
    id, pod, (id * pods + pod) % namespaces, id, pod, seq, seq * 15.0)
  return wrk.format(nil, "/api/v1/reports", nil, body)
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("WRK %d %d %.6f %.3f %.3f\n", summary.requests, e.connect + e.read + e.write + e.status + e.timeout,
    summary.duration / 1e6, latency:percentile(50) / 1000, latency:percentile(99) / 1000))
end
