"""RFC 6962 (section 2.1) Merkle tree hashes over SHA-256, as certificate transparency and the C2SP transparency logs
compute them: the root a statement's checkpoint commits to, built as its lines stream past in O(log n) memory."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

HASH_SIZE = 32  # bytes: SHA-256
EMPTY_ROOT = hashlib.sha256(b"").digest()  # MTH({}), the hash of the empty string


def leaf_hash(data: bytes) -> bytes:
    """MTH({d}) = SHA-256(0x00 || d): the leaf's own prefix keeps a leaf from passing for an inner node."""
    return hashlib.sha256(b"\x00" + data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    """SHA-256(0x01 || left || right): the hash of an inner node from its children's."""
    return hashlib.sha256(b"\x01" + left + right).digest()


class TreeBuilder:
    """The Merkle tree hash of the leaf hashes appended so far, holding one hash per perfect subtree.

    After n leaves, the tree splits into perfect subtrees, one for each bit set in n, largest (leftmost) first;
    RFC 6962's MTH is those subtrees' hashes folded from the right. Appending a leaf merges the trailing subtrees of
    equal size as a binary counter carries, so at most n.bit_length() hashes are ever kept.
    """

    __slots__ = ("_size", "_subtrees")

    def __init__(self) -> None:
        self._size = 0
        self._subtrees: list[bytes] = []  # the perfect subtrees' hashes, largest first

    @property
    def size(self) -> int:
        """How many leaves have been appended."""
        return self._size

    def append(self, leaf_hash: bytes) -> None:
        """Adds a leaf by its hash (`leaf_hash(data)`: the builder never sees the data itself)."""
        if len(leaf_hash) != HASH_SIZE:
            raise ValueError(f"a leaf hash is {HASH_SIZE} bytes, not {len(leaf_hash)}")
        node = leaf_hash
        carry = self._size
        while carry & 1:  # each trailing set bit is a subtree as large as `node`: merge them
            node = node_hash(self._subtrees.pop(), node)
            carry >>= 1
        self._subtrees.append(node)
        self._size += 1

    def root(self) -> bytes:
        """MTH of the leaves appended so far; the builder is left as it was, so more may be appended after."""
        if not self._subtrees:
            return EMPTY_ROOT
        node = self._subtrees[-1]
        for left in reversed(self._subtrees[:-1]):
            node = node_hash(left, node)
        return node


def root_of(leaf_hashes: Iterable[bytes]) -> bytes:
    """MTH of the leaves, by their hashes, read once in order (an iterator of any length will do)."""
    builder = TreeBuilder()
    for leaf in leaf_hashes:
        builder.append(leaf)
    return builder.root()
