-- wrk script for bench/webhook_load.py: AdmissionReviews POSTed to /mutate over keep-alive TLS, the bodies of a file
-- (one JSON document a line, args[1]) taken round-robin; prints one line the benchmark reads.
function init(args)
  bodies = {}
  for line in io.lines(args[1]) do
    bodies[#bodies + 1] = line
  end
  sent = 0
  wrk.method = "POST"
  wrk.headers["Content-Type"] = "application/json"
end

function request()
  sent = sent + 1
  return wrk.format(nil, "/mutate", nil, bodies[sent % #bodies + 1])
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("WRK %d %d %.6f %.3f %.3f\n", summary.requests, e.connect + e.read + e.write + e.status + e.timeout,
    summary.duration / 1e6, latency:percentile(50) / 1000, latency:percentile(99) / 1000))
end
