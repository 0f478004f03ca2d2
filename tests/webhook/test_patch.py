"""JSON pointers of the webhook's patches: escaped per RFC 6901, and a pod author's long keys never kept in memory."""

from __future__ import annotations

from webhook.admission.patch import MAX_CACHED_TOKEN, _cached, pointer


def test_pointer_escapes_tilde_and_slash() -> None:
    assert pointer("metadata", "annotations", "gpusharing.io/a~b", 0) == "/metadata/annotations/gpusharing.io~1a~0b/0"


def test_a_key_longer_than_any_valid_annotation_key_is_escaped_but_not_cached() -> None:
    long_key = "gpusharing.io/" + "k" * (MAX_CACHED_TOKEN + 1)
    before = _cached.cache_info().currsize
    assert pointer("metadata", "annotations", long_key) == "/metadata/annotations/gpusharing.io~1" + "k" * (
        MAX_CACHED_TOKEN + 1
    )
    assert _cached.cache_info().currsize <= before + 2  # "metadata" and "annotations" at most, never the long key
