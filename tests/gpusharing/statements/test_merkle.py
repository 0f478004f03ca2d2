"""A statement's Merkle root is RFC 6962's tree hash (section 2.1), as certificate transparency's logs compute it:
the published test vectors, and the streaming builder against the RFC's recursive definition at every size."""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterator, Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpusharing.statements.merkle import EMPTY_ROOT, TreeBuilder, leaf_hash, node_hash, root_of

# The test vectors of transparency-dev/merkle (github.com/transparency-dev/merkle, testonly/constants.go at commit
# 417fb0c314750d94e53942e9f92e79b6d35915db: LeafInputs and RootHashes), which carry on those of Google's trillian and
# certificate-transparency suites: eight leaf inputs and the root of the tree of the first n of them, n = 1..8.
LEAF_INPUTS = [
    bytes.fromhex(data)
    for data in ("", "00", "10", "2021", "3031", "40414243", "5051525354555657", "606162636465666768696a6b6c6d6e6f")
]
ROOTS = {
    1: "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
    2: "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
    3: "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
    4: "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    5: "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
    6: "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
    7: "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
    8: "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
}
EMPTY_TREE = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"  # testonly.EmptyRootHash: SHA-256("")


def reference_root(leaves: Sequence[bytes]) -> bytes:
    """RFC 6962's MTH as the RFC writes it, on the leaves' data: split at the largest power of two smaller than n."""
    if not leaves:
        return hashlib.sha256(b"").digest()
    if len(leaves) == 1:
        return hashlib.sha256(b"\x00" + leaves[0]).digest()
    split = 1 << ((len(leaves) - 1).bit_length() - 1)
    return hashlib.sha256(b"\x01" + reference_root(leaves[:split]) + reference_root(leaves[split:])).digest()


def test_the_empty_tree_hashes_to_the_hash_of_nothing() -> None:
    assert EMPTY_ROOT.hex() == EMPTY_TREE
    assert TreeBuilder().root().hex() == EMPTY_TREE
    assert root_of([]).hex() == EMPTY_TREE
    assert TreeBuilder().size == 0


@pytest.mark.parametrize("size", sorted(ROOTS))
def test_the_roots_of_the_published_test_vectors(size: int) -> None:
    assert root_of(leaf_hash(data) for data in LEAF_INPUTS[:size]).hex() == ROOTS[size]


def test_one_builder_gives_every_published_root_as_the_leaves_arrive() -> None:
    builder = TreeBuilder()
    assert builder.root().hex() == EMPTY_TREE
    for size, data in enumerate(LEAF_INPUTS, start=1):
        builder.append(leaf_hash(data))
        assert builder.size == size
        assert builder.root().hex() == ROOTS[size]
        assert builder.root().hex() == ROOTS[size]  # reading the root leaves the builder as it was


def test_leaf_and_node_hashes_are_domain_separated_as_rfc_6962_says() -> None:
    # transparency-dev/merkle, rfc6962/rfc6962_test.go (TestRFC6962Hasher), same commit as above.
    assert leaf_hash(b"").hex() == "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d"
    assert leaf_hash(b"L123456").hex() == "395aa064aa4c29f7010acfe3f25db9485bbd4b91897b6ad7ad547639252b4d56"
    assert node_hash(b"N123", b"N456").hex() == "aa217fe888e47007fa15edab33c2b492a722cb106c64667fc2b044444de66bbb"
    left, right = leaf_hash(b"Hello"), leaf_hash(b"World")
    assert node_hash(left, right) != leaf_hash(left + right)
    assert node_hash(left, right) != node_hash(right, left)


def test_a_leaf_hash_of_the_wrong_length_is_refused() -> None:
    builder = TreeBuilder()
    for wrong in (b"", b"\x00" * 31, b"\x00" * 33, b"raw leaf data, not its hash"):
        with pytest.raises(ValueError, match=r"a leaf hash is 32 bytes, not \d+"):
            builder.append(wrong)
    assert builder.size == 0


def test_a_tree_of_over_a_hundred_thousand_leaves_streams_through_from_a_generator() -> None:
    leaf = leaf_hash(b"pod-hour")

    @functools.cache
    def same_leaves_root(size: int) -> bytes:  # the recursive MTH, when every leaf is the same
        if size == 1:
            return leaf
        split = 1 << ((size - 1).bit_length() - 1)
        return node_hash(same_leaves_root(split), same_leaves_root(size - split))

    size = (1 << 17) + 5

    def leaves() -> Iterator[bytes]:
        for _ in range(size):
            yield leaf

    assert root_of(leaves()) == same_leaves_root(size)


@given(st.lists(st.binary(max_size=12), max_size=300), st.data())
def test_the_builder_agrees_with_the_recursive_definition_at_any_size(leaves: list[bytes], data: st.DataObject) -> None:
    read_at = data.draw(st.sets(st.integers(0, len(leaves)), max_size=6), label="sizes at which the root is read")
    builder = TreeBuilder()
    for size, leaf in enumerate(leaves):
        if size in read_at:
            assert builder.root() == reference_root(leaves[:size])
        builder.append(leaf_hash(leaf))
    assert builder.size == len(leaves)
    assert builder.root() == reference_root(leaves)
    assert root_of(leaf_hash(leaf) for leaf in leaves) == reference_root(leaves)
