"""What the webhook decides for a pod, as plain functions of the review: `review` (AdmissionReview in and out),
`policy` (admit, refuse or mutate), `safe` (safe admission), `meter` (the injected sidecar), `patch` (JSON Patch)."""
