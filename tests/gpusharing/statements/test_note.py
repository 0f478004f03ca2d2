"""Signed notes and checkpoints are written and read as C2SP's specs (c2sp.org/signed-note, c2sp.org/tlog-checkpoint)
and Go's reference implementation (golang.org/x/mod/sumdb/note) write and read them: their published keys and notes
verify, anything altered does not, and each malformation is refused with a message that says which."""

from __future__ import annotations

import base64
import hashlib
import re

import pytest

from gpusharing.statements.merkle import leaf_hash, root_of
from gpusharing.statements.note import (
    MAX_NOTE_BYTES,
    MAX_SIGNATURES,
    Checkpoint,
    NoteError,
    OpenedNote,
    Signer,
    Verifier,
    generate_signer,
    key_hash_of,
    open_note,
    sign_note,
)

# golang.org/x/mod/sumdb/note (github.com/golang/mod at commit fe2ec04f7c3c3aa6fad97631aafcff6e49e2d1db): the package
# doc comment (note.go) and note_test.go's TestSign and TestOpen.
PETER_SIGNER = "PRIVATE+KEY+PeterNeumann+c74f20a3+AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz"
PETER = "PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW"
ENOCH = "EnochRoot+af0cfe78+ATtqJ7zOtqQtYqOo0CpvDXNlMhV3HeJDpjrASKGLWdop"
NEUMANN_TEXT = "If you think cryptography is the answer to your problem,\nthen you don't know what your problem is.\n"
PETER_SIGNATURE = (
    "— PeterNeumann x08go/ZJkuBS9UG/SffcvIAQxVBtiFupLLr8pAcElZInNIuGUgYN1FFYC2pZSNXgKvqfqdngotpRZb6KE6RyyBwJnAM=\n"
)
ENOCH_SIGNATURE = (
    "— EnochRoot rwz+eBzmZa0SO3NbfRGzPCpDckykFXSdeX+MNtCOXm2/5n2tiOHp+vAF1aGrQ5ovTG01oOTGwnWLox33WWd1RvMc+QQ=\n"
)
NEUMANN_NOTE = (NEUMANN_TEXT + "\n" + PETER_SIGNATURE).encode()

# c2sp.org/signed-note (github.com/C2SP/C2SP, signed-note.md at commit b3a911e3f2bd75a6ccdd0bf04e9e1912961c439a): the
# example under "Verifier keys", and the note at the top of the spec, whose key is not published.
FOO = "example.com/foo+530d903a+AekyeRrm56hApGFkyQR4ZCbV54Id2LKaANYcrnKv3U2k"
FOO_NOTE = (
    "This is an example message.\n"
    "\n"
    "— example.com/foo Uw2QOkn8srV1yJGh2VYRlL1Tnagv1YEq6TfXppzi2ONncAlTgK7Ztg1ERYNZXsYjOBH3mFXmRKuwHjG1Yu72IneyaQM=\n"
).encode()
QUASIMODO_TEXT = "Ognuno sta solo sul cuor della terra\ntrafitto da un raggio di sole:\n\ned è subito sera.\n"
QUASIMODO_NOTE = (
    QUASIMODO_TEXT + "\n— quasimodo.example/salvatore "
    "NnugSzTjtVAewIS+Z/iJhUPeFDkO/5QQ2i5ddnGITLlC+EhfLW9oJKONrMouFSQU0xMcXxj99ihAQwaqP3ZekRwNtIc=\n"
).encode()

# c2sp.org/tlog-checkpoint (tlog-checkpoint.md at commit c0d0289bb8fc9c07c8ffe10a9ebb9bded4a9b500): the example at
# the top of the spec; its key is not published either.
SOFA_TEXT = "example.com/behind-the-sofa\n20852163\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n"
SOFA_NOTE = (
    SOFA_TEXT + "\n— example.com/behind-the-sofa "
    "Az3grlgtzPICa5OS8npVmf1Myq/5IZniMp+ZJurmRDeOoRDe4URYN7u5/Zhcyv2q1gGzGku9nTo+zyWE+xeMcTOAYQ8=\n"
).encode()


def test_go_s_example_signer_key_signs_the_example_note_byte_for_byte() -> None:
    signer = Signer.from_text(PETER_SIGNER)
    assert (signer.name, signer.key_hash) == ("PeterNeumann", 0xC74F20A3)
    assert signer.verifier == Verifier.from_text(PETER)
    assert sign_note(NEUMANN_TEXT, [signer]) == NEUMANN_NOTE


def test_go_s_example_note_verifies_with_its_verifier_key() -> None:
    peter = Verifier.from_text(PETER)
    opened = open_note(NEUMANN_NOTE, [peter])
    assert opened == OpenedNote(NEUMANN_TEXT, verified=(peter,), unknown=(), failed=())
    assert opened.signed_by(peter)


def test_go_s_doubly_signed_note_verifies_with_both_keys_and_reports_a_key_not_given_as_unknown() -> None:
    peter, enoch = Verifier.from_text(PETER), Verifier.from_text(ENOCH)
    note = (NEUMANN_TEXT + "\n" + PETER_SIGNATURE + ENOCH_SIGNATURE).encode()

    both = open_note(note, [enoch, peter])
    assert both.verified == (peter, enoch)  # in the note's order
    assert both.unknown == () and both.failed == ()

    peter_only = open_note(note, [peter])
    assert peter_only.verified == (peter,)
    assert [(line.name, line.key_hash) for line in peter_only.unknown] == [("EnochRoot", 0xAF0CFE78)]
    assert not peter_only.signed_by(enoch)

    neither = open_note(note, [])
    assert neither.verified == ()
    assert [line.name for line in neither.unknown] == ["PeterNeumann", "EnochRoot"]

    repeated = open_note((NEUMANN_TEXT + "\n" + PETER_SIGNATURE * 3 + ENOCH_SIGNATURE * 2).encode(), [peter])
    assert repeated.verified == (peter,) and len(repeated.unknown) == 1  # a line repeated counts once


def test_c2sp_s_example_verifier_key_verifies_its_example_note() -> None:
    foo = Verifier.from_text(FOO)
    assert (foo.name, foo.key_hash) == ("example.com/foo", 0x530D903A)
    opened = open_note(FOO_NOTE, [foo])
    assert opened.text == "This is an example message.\n"
    assert opened.signed_by(foo) and opened.failed == ()


def test_a_note_text_may_have_blank_lines_the_last_one_separates_the_signatures() -> None:
    opened = open_note(QUASIMODO_NOTE, [Verifier.from_text(FOO)])
    assert opened.text == QUASIMODO_TEXT
    assert opened.verified == ()
    assert [line.name for line in opened.unknown] == ["quasimodo.example/salvatore"]

    signer = generate_signer("example.com/statements")
    assert open_note(sign_note(QUASIMODO_TEXT, [signer]), [signer.verifier]).text == QUASIMODO_TEXT
    assert open_note(sign_note("\n", [signer]), [signer.verifier]).text == "\n"
    assert open_note(sign_note("ends in a blank line\n\n", [signer]), [signer.verifier]).text == (
        "ends in a blank line\n\n"
    )


@pytest.mark.parametrize("where", [0, 20, len(NEUMANN_TEXT) - 2])
def test_one_byte_changed_in_the_text_fails_the_signature(where: int) -> None:
    peter = Verifier.from_text(PETER)
    note = bytearray(NEUMANN_NOTE)
    note[where] ^= 0x01
    opened = open_note(bytes(note), [peter])
    assert not opened.signed_by(peter)
    assert opened.verified == () and opened.unknown == ()
    assert [(line.name, line.key_hash) for line in opened.failed] == [("PeterNeumann", 0xC74F20A3)]


def test_one_byte_changed_in_the_signature_fails_it() -> None:
    peter = Verifier.from_text(PETER)
    encoded = PETER_SIGNATURE.split(" ")[2].strip()
    raw = bytearray(base64.b64decode(encoded))
    raw[40] ^= 0x80
    note = NEUMANN_NOTE.replace(encoded.encode(), base64.b64encode(bytes(raw)))
    opened = open_note(note, [peter])
    assert not opened.signed_by(peter)
    assert len(opened.failed) == 1 and opened.failed[0].signature == bytes(raw[4:])


def test_a_signature_by_another_key_of_the_same_name_is_unknown_not_verified() -> None:
    impostor, published = generate_signer("example.com/statements"), generate_signer("example.com/statements")
    opened = open_note(sign_note("statement\n", [impostor]), [published.verifier])
    assert opened.verified == () and opened.failed == ()
    assert [(line.name, line.key_hash) for line in opened.unknown] == [(impostor.name, impostor.key_hash)]
    assert not opened.signed_by(published.verifier)
    assert not opened.signed_by(impostor.verifier)  # a key is "signed by" only when it was given to check with


def test_generated_keys_sign_and_open_a_note_signed_by_two_of_them() -> None:
    log, witness = generate_signer("example.com/statements"), generate_signer("witness.example/w1")
    text = b"origin\n3\n"
    note = sign_note(text.decode(), [log, witness])
    assert note.startswith(text + b"\n")
    signatures = [base64.b64encode(key.key_hash.to_bytes(4, "big") + key.sign(text)).decode() for key in (log, witness)]
    # Ed25519 signatures are deterministic: signing again gives the same bytes.
    assert note[len(text) + 1 :].decode().splitlines() == [
        f"— example.com/statements {signatures[0]}",
        f"— witness.example/w1 {signatures[1]}",
    ]
    opened = open_note(note, [witness.verifier, log.verifier])
    assert opened.text == "origin\n3\n"
    assert opened.verified == (log.verifier, witness.verifier)
    assert opened.signed_by(log.verifier) and opened.signed_by(witness.verifier)


def test_key_texts_round_trip_and_the_key_hash_is_the_spec_s() -> None:
    signer = generate_signer("example.com/statements")
    assert Signer.from_text(signer.text).verifier == signer.verifier
    assert Signer.from_text(signer.text).text == signer.text
    assert Verifier.from_text(signer.verifier.text) == signer.verifier
    assert Verifier.from_text(PETER).text == PETER
    assert Signer.from_text(PETER_SIGNER).text == PETER_SIGNER
    assert signer.text.startswith("PRIVATE+KEY+example.com/statements+")
    assert signer.key_hash == key_hash_of(signer.name, signer.verifier.public_key)
    assert key_hash_of("example.com/foo", Verifier.from_text(FOO).public_key) == 0x530D903A
    assert repr(Signer.from_text(PETER_SIGNER)) == "Signer('PeterNeumann', key hash c74f20a3)"  # no secret in it


def test_every_truncation_or_one_character_change_of_a_key_is_refused() -> None:
    # As Go's TestNewVerifier and TestNewSigner mangle their keys.
    for text, parse in ((PETER, Verifier.from_text), (PETER_SIGNER, Signer.from_text)):
        for start in range(len(text)):
            for end in range(start + 1, len(text) + 1):
                if (start, end) != (0, len(text)):
                    with pytest.raises(NoteError):
                        parse(text[start:end])
        for i in range(len(text)):
            with pytest.raises(NoteError):
                parse(text[:i] + chr(ord(text[i]) + 1) + text[i + 1 :])


def verifier_key_text(name: str, data: bytes) -> str:
    """A verifier key of any key data, with the hash the spec computes for it."""
    key_hash = int.from_bytes(hashlib.sha256(name.encode() + b"\n" + data).digest()[:4], "big")
    return f"{name}+{key_hash:08x}+{base64.b64encode(data).decode()}"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("PeterNeumann", r"^verifier key is not of the form <name>\+<key hash>\+<key data>$"),
        ("PeterNeumann+c74f20a3", r"^verifier key is not of the form"),
        ("+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW", r"^verifier key's key name is empty$"),
        ("Peter Neumann+c74f20a3+ARpc", r"^verifier key's key name has a space \(U\+0020\)$"),
        ("Peter\u00a0Neumann+c74f20a3+ARpc", r"^verifier key's key name has a space \(U\+00A0\)$"),
        ("PeterNeumann+C74F20A3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW", r"is not 8 lowercase hex digits$"),
        ("PeterNeumann+c74f20a+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW", r"is not 8 lowercase hex digits$"),
        ("PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10T", r"key data is not standard base64"),
        ("PeterNeumann+c74f20a3+", r"^verifier key's key data is empty$"),
        ("PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TX", r"hash c74f20a3 does not match"),
        # Go's note_test.go: a key of the wrong length, one of an unknown algorithm, each with its hash adjusted.
        ("PeterNeumann+cc469956+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TWBADKEY==", r"is not canonical base64"),
        ("PeterNeumann+173116ae+ZRpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW", r"of signature type 0x65: only Ed25519"),
        (verifier_key_text("PeterNeumann", b"\x01" + bytes(31)), r"^verifier key's Ed25519 key is 31 bytes, not 32$"),
        (verifier_key_text("PeterNeumann", b"\x04" + bytes(32)), r"of signature type 0x04"),
    ],
)
def test_a_malformed_verifier_key_is_refused_saying_why(text: str, message: str) -> None:
    with pytest.raises(NoteError, match=message):
        Verifier.from_text(text)


def test_a_malformed_signer_key_is_refused_without_quoting_its_secret() -> None:
    secret = PETER_SIGNER.split("+", 4)[4]
    cases = [
        (PETER_SIGNER.removeprefix("PRIVATE+"), "signer key does not begin with 'PRIVATE+KEY+'"),
        (PETER_SIGNER[:-1], "signer key's key data is not standard base64 with padding"),
        (PETER_SIGNER.replace("c74f20a3", "c74f20a4"), "signer key's hash c74f20a4 does not match its name and public"),
        (PETER_SIGNER.replace("Peter", "Paul"), "signer key's hash c74f20a3 does not match its name and public key"),
    ]
    for text, message in cases:
        with pytest.raises(NoteError, match=f"^{re.escape(message)}") as raised:
            Signer.from_text(text)
        assert secret[:8] not in str(raised.value) and secret[-8:] not in str(raised.value)


@pytest.mark.parametrize(
    ("note", "message"),
    [
        (NEUMANN_TEXT, r"^note has no blank line before a block of signatures$"),
        (NEUMANN_TEXT + "\n", r"^note has no signature after its last blank line$"),
        (NEUMANN_TEXT + "\n" + PETER_SIGNATURE[:-1], r"^note's last signature line does not end in a newline$"),
        (
            "\x01" + NEUMANN_TEXT + "\n" + PETER_SIGNATURE,
            r"^note has control character U\+0001 on line 1: only newline",
        ),
        (NEUMANN_TEXT + "\r\n" + PETER_SIGNATURE, r"^note has control character U\+000D on line 3"),
        (NEUMANN_TEXT + "\n" + PETER_SIGNATURE + "Unexpected line.\n", r"^signature line 2 does not begin with an em"),
        (NEUMANN_TEXT + "\n- PeterNeumann x08g\n", r"^signature line 1 does not begin with an em dash and a space"),
        (NEUMANN_TEXT + "\n— PeterNeumann\n", r"^signature line 1 has no space between the key name and the signature"),
        (NEUMANN_TEXT + "\n— Bad Name x08go/ZJ=\n", r"^signature line 1 has more than two words"),
        (
            NEUMANN_TEXT + "\n— PeterNeumann x08go/ZJ!\n",
            r"^signature line 1's signature 'x08go/ZJ!' is not standard base64",
        ),
        (
            NEUMANN_TEXT + "\n— PeterNeumann x08go/Z\n",
            r"^signature line 1's signature 'x08go/Z' is not standard base64",
        ),
        (NEUMANN_TEXT + "\n— PeterNeumann x08gox==\n", r"is not canonical base64: its last character has bits set"),
        (
            NEUMANN_TEXT + "\n— PeterNeumann x08gow==\n",
            r"^signature line 1's signature is 4 bytes: too short for a key",
        ),
        (NEUMANN_TEXT + "\n— Peter+Neumann x08go/ZJ\n", r"^signature line 1's key name has a '\+'$"),
        (NEUMANN_TEXT + "\n—  x08go/ZJ\n", r"^signature line 1's key name is empty$"),
        (
            NEUMANN_TEXT + "\n" + PETER_SIGNATURE * (MAX_SIGNATURES + 1),
            r"^note has 101 signature lines, more than the 100",
        ),
        (
            NEUMANN_TEXT + "\n— PeterNeumann " + "A" * 8192 + "\n",
            r"^signature line 1 is 8209 bytes, more than the 8192",
        ),
    ],
)
def test_a_malformed_note_is_refused_saying_why(note: str, message: str) -> None:
    with pytest.raises(NoteError, match=message):
        open_note(note.encode(), [Verifier.from_text(PETER)])


def test_a_note_that_is_not_utf8_is_refused() -> None:
    with pytest.raises(NoteError, match=r"^note is not valid UTF-8: byte 0 is not part of a character$"):
        open_note(b"\xff" + NEUMANN_NOTE, [])
    with pytest.raises(NoteError, match=r"^note is not valid UTF-8: byte 5"):  # an encoded surrogate, as Go refuses
        open_note(b"text " + "\ud800".encode("utf-8", "surrogatepass") + b"\n\n" + PETER_SIGNATURE.encode(), [])


def test_a_note_over_the_size_limit_is_refused_before_it_is_read() -> None:
    too_long = b"\xff" * (MAX_NOTE_BYTES + 1)  # not even UTF-8: the length is what is checked first
    with pytest.raises(NoteError, match=r"^note is 1048577 bytes, more than the 1048576 a note may have$"):
        open_note(too_long, [])


def test_a_note_of_as_many_signatures_as_allowed_opens() -> None:
    peter = Verifier.from_text(PETER)
    note = NEUMANN_TEXT + "\n" + ENOCH_SIGNATURE * (MAX_SIGNATURES - 1) + PETER_SIGNATURE
    assert open_note(note.encode(), [peter]).verified == (peter,)


def test_two_different_verifiers_of_the_same_name_and_hash_are_refused_as_ambiguous() -> None:
    peter = Verifier.from_text(PETER)
    assert open_note(NEUMANN_NOTE, [peter, Verifier.from_text(PETER)]).verified == (peter,)  # the same key twice
    with pytest.raises(ValueError, match=r"^two different verifier keys are named 'PeterNeumann' with key hash c74f"):
        open_note(NEUMANN_NOTE, [peter, _impostor_of(peter)])


def _impostor_of(verifier: Verifier) -> Verifier:
    """Another key under the same name and hash: only a verifier list someone tampered with has one."""
    impostor = object.__new__(Verifier)
    for name, value in (("name", verifier.name), ("key_hash", verifier.key_hash), ("public_key", bytes(32))):
        object.__setattr__(impostor, name, value)
    return impostor


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("no newline at the end", r"^note text does not end in a newline$"),
        ("", r"^note text does not end in a newline$"),
        ("tab\there\n", r"^note text has control character U\+0009 on line 1: only newline is allowed$"),
        ("line\r\n", r"^note text has control character U\+000D on line 1"),
        ("first\nsecond \ud800\n", r"^note text is not valid UTF-8: character 13 is a lone surrogate$"),
    ],
)
def test_a_text_that_would_not_open_is_not_signed(text: str, message: str) -> None:
    with pytest.raises(NoteError, match=message):
        sign_note(text, [Signer.from_text(PETER_SIGNER)])


def test_a_note_needs_a_signer_and_one_too_long_for_a_reader_is_not_signed() -> None:
    with pytest.raises(NoteError, match=r"^a note needs at least one signer$"):
        sign_note("text\n", [])
    with pytest.raises(NoteError, match=r"^the note would be \d+ bytes, more than the 1048576"):
        sign_note("x" * (MAX_NOTE_BYTES - 50) + "\n", [Signer.from_text(PETER_SIGNER)])
    with pytest.raises(NoteError, match=r"^note text is 1048578 bytes, more than the 1048576"):
        sign_note("x" * (MAX_NOTE_BYTES + 1) + "\n", [Signer.from_text(PETER_SIGNER)])


def test_a_key_name_the_spec_forbids_is_refused_when_generating() -> None:
    for name, message in (
        ("", "is empty"),
        ("a b", "has a space"),
        ("a+b", r"has a '\+'"),
        ("a\u2003b", r"has a space \(U\+2003\)"),
    ):
        with pytest.raises(NoteError, match=f"^signer key's key name {message}"):
            generate_signer(name)


ROOT = root_of(leaf_hash(line) for line in (b"pod-hour 1", b"pod-hour 2", b"node-hour 1"))


def test_a_checkpoint_writes_origin_size_and_root_a_line_each_then_its_extensions() -> None:
    checkpoint = Checkpoint("example.com/statements/2026-06", 3, ROOT, ("period 2026-06", "sequence 7"))
    root_text = base64.b64encode(ROOT).decode()
    assert checkpoint.text == f"example.com/statements/2026-06\n3\n{root_text}\nperiod 2026-06\nsequence 7\n"
    assert Checkpoint.parse(checkpoint.text) == checkpoint
    assert Checkpoint.parse(Checkpoint("o", 0, ROOT).text) == Checkpoint("o", 0, ROOT, ())


def test_a_signed_checkpoint_opens_and_parses_to_what_was_signed() -> None:
    signer = generate_signer("example.com/statements")
    checkpoint = Checkpoint("example.com/statements", (1 << 64) - 1, ROOT, ("extension",))
    opened = open_note(sign_note(checkpoint.text, [signer]), [signer.verifier])
    assert opened.signed_by(signer.verifier)
    assert Checkpoint.parse(opened.text) == checkpoint


def test_c2sp_s_example_checkpoint_parses_and_its_signature_is_by_an_unknown_key() -> None:
    opened = open_note(SOFA_NOTE, [Verifier.from_text(FOO)])
    assert [line.name for line in opened.unknown] == ["example.com/behind-the-sofa"]
    checkpoint = Checkpoint.parse(opened.text)
    assert checkpoint.origin == "example.com/behind-the-sofa"
    assert checkpoint.size == 20852163
    assert checkpoint.root == base64.b64decode("CsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=")
    assert checkpoint.extensions == ()
    assert checkpoint.text == SOFA_TEXT


ROOT_TEXT = base64.b64encode(ROOT).decode()
_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
# The same 32 bytes with a bit set past them in the last character: base64 that decoders commonly accept.
NON_CANONICAL_ROOT = ROOT_TEXT[:-2] + _ALPHABET[_ALPHABET.index(ROOT_TEXT[-2]) | 1] + "="


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (f"origin\n3\n{ROOT_TEXT}", r"^checkpoint does not end in a newline$"),
        ("", r"^checkpoint does not end in a newline$"),
        ("origin\n3\n", r"^checkpoint has 2 line\(s\), not the three it needs: origin, tree size, root hash$"),
        (f"\n3\n{ROOT_TEXT}\n", r"^checkpoint's origin \(line 1\) is empty$"),
        (f"orig\tin\n3\n{ROOT_TEXT}\n", r"^checkpoint's origin \(line 1\) has control character U\+0009$"),
        (f"origin\n03\n{ROOT_TEXT}\n", r"^checkpoint's tree size \(line 2\) '03' is not a decimal number without lead"),
        (f"origin\n+3\n{ROOT_TEXT}\n", r"^checkpoint's tree size \(line 2\) '\+3' is not a decimal number"),
        (f"origin\n-1\n{ROOT_TEXT}\n", r"^checkpoint's tree size \(line 2\) '-1' is not a decimal number"),
        (f"origin\n3.0\n{ROOT_TEXT}\n", r"^checkpoint's tree size \(line 2\) '3.0' is not a decimal number"),
        (f"origin\n 3\n{ROOT_TEXT}\n", r"^checkpoint's tree size \(line 2\) ' 3' is not a decimal number"),
        (f"origin\n\n{ROOT_TEXT}\n", r"^checkpoint's tree size \(line 2\) '' is not a decimal number"),
        (f"origin\n\u0663\n{ROOT_TEXT}\n", r"^checkpoint's tree size \(line 2\) '\u0663' is not a decimal number"),
        (
            f"origin\n18446744073709551616\n{ROOT_TEXT}\n",
            r"^checkpoint's tree size \(line 2\) '18446744073709551616' is",
        ),
        (
            f"origin\n{'9' * 5000}\n{ROOT_TEXT}\n",
            r"^checkpoint's tree size \(line 2\) '9999.*' is more than 2\^64 - 1$",
        ),
        ("origin\n3\nnot base64!\n", r"^checkpoint's root hash \(line 3\) 'not base64!' is not standard base64"),
        (
            f"origin\n3\n{ROOT_TEXT.rstrip('=')}\n",
            r"^checkpoint's root hash \(line 3\) '.*' is not standard base64 with",
        ),
        (f"origin\n3\n{NON_CANONICAL_ROOT}\n", r"^checkpoint's root hash \(line 3\) '.*' is not canonical base64"),
        (f"origin\n3\n{base64.b64encode(ROOT[:31]).decode()}\n", r"^checkpoint's root hash is 31 bytes, not 32$"),
        ("origin\n0\n\n", r"^checkpoint's root hash is 0 bytes, not 32$"),
        (f"origin\n3\n{ROOT_TEXT}\n\n", r"^checkpoint's extension line 4 is empty$"),
        (f"origin\n3\n{ROOT_TEXT}\nfine\n\nfine\n", r"^checkpoint's extension line 5 is empty$"),
        (f"origin\n3\n{ROOT_TEXT}\nbell\x07\n", r"^checkpoint's extension line 4 has control character U\+0007$"),
        (f"origin\n3\n{ROOT_TEXT}\n" + "x\n" * 98, r"^checkpoint has 101 lines, more than the 100 it may have$"),
        ("x" * (MAX_NOTE_BYTES + 1), r"^checkpoint is 1048577 characters, more than the 1048576 a note may have$"),
    ],
)
def test_a_malformed_checkpoint_is_refused_saying_which_line_and_how(text: str, message: str) -> None:
    with pytest.raises(NoteError, match=message):
        Checkpoint.parse(text)


def test_a_checkpoint_that_could_not_be_read_back_is_not_made() -> None:
    cases = [
        (lambda: Checkpoint("", 1, ROOT), r"^checkpoint's origin \(line 1\) is empty$"),
        (lambda: Checkpoint("two\nlines", 1, ROOT), r"^checkpoint's origin \(line 1\) has a newline in it$"),
        (lambda: Checkpoint("origin", -1, ROOT), r"^checkpoint's tree size -1 is not between 0 and 2\^64 - 1$"),
        (lambda: Checkpoint("origin", 1 << 64, ROOT), r"^checkpoint's tree size 18446744073709551616 is not between"),
        (lambda: Checkpoint("origin", 1, ROOT.hex().encode()), r"^checkpoint's root hash is 64 bytes, not 32$"),
        (lambda: Checkpoint("origin", 1, ROOT, ("",)), r"^checkpoint's extension line 4 is empty$"),
        (lambda: Checkpoint("origin", 1, ROOT, ("a\nb",)), r"^checkpoint's extension line 4 has a newline in it$"),
        (lambda: Checkpoint("origin", 1, ROOT, ("x",) * 98), r"^checkpoint has 101 lines, more than the 100"),
        (lambda: Checkpoint("\ud800", 1, ROOT), r"^checkpoint's origin \(line 1\) is not valid UTF-8"),
    ]
    for make, message in cases:
        with pytest.raises(NoteError, match=message):
            make()
