"""The admission webhook: validates GPU requests in every dialect and injects what governance needs."""
