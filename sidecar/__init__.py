"""The metering sidecar: reports its pod's cumulative GPU consumption to the timekeeper."""
