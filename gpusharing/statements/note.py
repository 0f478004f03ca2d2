"""Signed notes (c2sp.org/signed-note) with Ed25519 keys, and the transparency-log checkpoint (c2sp.org/tlog-checkpoint)
a statement's note carries: written and read as Go's golang.org/x/mod/sumdb/note writes and reads them, so that the
transparency logs' own tools can check a statement's signature."""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from gpusharing.messages import shortened
from gpusharing.statements.merkle import HASH_SIZE

ED25519 = 0x01  # the signature type byte that key IDs and key data begin with (c2sp.org/signed-note)
ED25519_KEY_SIZE = 32  # bytes, for the public key and the seed alike
ED25519_SIGNATURE_SIZE = 64
SIGNATURE_PREFIX = "\u2014 "  # an em dash and a space begin every signature line

# Bounds, checked before any other work. A note may carry Go's 100 signatures (the spec asks for at least 16), each
# line up to 8 KiB (room for the post-quantum signatures of nearly 5 kB the spec warns of), within 1 MiB in all.
MAX_NOTE_BYTES = 1 << 20
MAX_SIGNATURES = 100
MAX_SIGNATURE_LINE_BYTES = 8 << 10
MAX_CHECKPOINT_LINES = 100
MAX_TREE_SIZE = (1 << 64) - 1  # the logs' uint64

_PRIVATE_PREFIX = "PRIVATE+KEY+"
_KEY_HASH = re.compile(r"[0-9a-f]{8}")
_BASE64 = re.compile(r"(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?")
_DECIMAL = re.compile(r"0|[1-9][0-9]*")
_CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f]")  # ASCII control characters but newline
_MAX_TREE_SIZE_DIGITS = len(str(MAX_TREE_SIZE))


class NoteError(ValueError):
    """A malformed note, key or checkpoint; the message says, in one line, what is wrong with it."""


def key_hash_of(name: str, public_key: bytes) -> int:
    """The key ID of an Ed25519 key: SHA-256(name || 0x0A || 0x01 || public key)'s first 4 bytes, big-endian."""
    digest = hashlib.sha256(name.encode() + b"\n" + bytes([ED25519]) + public_key).digest()
    return int.from_bytes(digest[:4], "big")


@dataclass(frozen=True)
class Verifier:
    """A public key that checks signatures, written as a verifier key: `<name>+<key hash>+base64(0x01 || key)`."""

    name: str
    key_hash: int
    public_key: bytes
    _key: Ed25519PublicKey = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _check_name(self.name, "verifier key")
        if len(self.public_key) != ED25519_KEY_SIZE:
            raise NoteError(f"an Ed25519 public key is {ED25519_KEY_SIZE} bytes, not {len(self.public_key)}")
        expected = key_hash_of(self.name, self.public_key)
        if self.key_hash != expected:
            raise NoteError(
                f"verifier key's hash {self.key_hash:08x} does not match its name and key, which hash to {expected:08x}"
            )
        object.__setattr__(self, "_key", Ed25519PublicKey.from_public_bytes(self.public_key))

    @classmethod
    def for_key(cls, name: str, public_key: bytes) -> Verifier:
        return cls(name, key_hash_of(name, public_key), public_key)

    @classmethod
    def from_text(cls, text: str) -> Verifier:
        name, hash_, public_key = _split_key(text, "verifier key")
        return cls(name, hash_, public_key)

    @property
    def text(self) -> str:
        return f"{self.name}+{self.key_hash:08x}+{_encode_base64(bytes([ED25519]) + self.public_key)}"

    def verify(self, message: bytes, signature: bytes) -> bool:
        """Whether `signature` (without the key hash) is this key's Ed25519 signature of `message`."""
        if len(signature) != ED25519_SIGNATURE_SIZE:
            return False
        try:
            self._key.verify(signature, message)
        except InvalidSignature:
            return False
        return True


class Signer:
    """A private key that signs notes, written as a signer key: `PRIVATE+KEY+<name>+<key hash>+base64(0x01 || seed)`.

    Its text is the secret itself: it is in no error message and no repr.
    """

    __slots__ = ("_private_key", "_verifier")

    def __init__(self, name: str, seed: bytes) -> None:
        _check_name(name, "signer key")
        if len(seed) != ED25519_KEY_SIZE:
            raise NoteError(f"an Ed25519 seed is {ED25519_KEY_SIZE} bytes, not {len(seed)}")
        self._private_key = Ed25519PrivateKey.from_private_bytes(seed)
        self._verifier = Verifier.for_key(name, self._private_key.public_key().public_bytes_raw())

    @classmethod
    def from_text(cls, text: str) -> Signer:
        if not text.startswith(_PRIVATE_PREFIX):
            raise NoteError(f"signer key does not begin with {_PRIVATE_PREFIX!r}")
        name, hash_, seed = _split_key(text[len(_PRIVATE_PREFIX) :], "signer key")
        signer = cls(name, seed)
        if signer.key_hash != hash_:
            raise NoteError(
                f"signer key's hash {hash_:08x} does not match its name and public key, which hash to "
                f"{signer.key_hash:08x}"
            )
        return signer

    @property
    def name(self) -> str:
        return self._verifier.name

    @property
    def key_hash(self) -> int:
        return self._verifier.key_hash

    @property
    def verifier(self) -> Verifier:
        return self._verifier

    @property
    def text(self) -> str:
        seed = self._private_key.private_bytes_raw()
        return f"{_PRIVATE_PREFIX}{self.name}+{self.key_hash:08x}+{_encode_base64(bytes([ED25519]) + seed)}"

    def sign(self, message: bytes) -> bytes:
        """The Ed25519 signature of `message` (64 bytes, without the key hash)."""
        return self._private_key.sign(message)

    def __repr__(self) -> str:
        return f"Signer({self.name!r}, key hash {self.key_hash:08x})"


def generate_signer(name: str) -> Signer:
    """A new Ed25519 key named `name`; its `text` is the secret to keep, its `verifier.text` the key to hand out."""
    return Signer(name, Ed25519PrivateKey.generate().private_bytes_raw())


@dataclass(frozen=True)
class SignatureLine:
    """A signature as a note gives it: the key's name and hash, and the signature bytes after the hash."""

    name: str
    key_hash: int
    signature: bytes


@dataclass(frozen=True)
class OpenedNote:
    """A note's text and what its signatures say. The spec leaves to the caller what to trust: it MUST reject a note
    that no known key signed, and SHOULD reject one that has any `failed` signature."""

    text: str
    verified: tuple[Verifier, ...]  # the known keys whose signature verified, in the note's order
    unknown: tuple[SignatureLine, ...]  # by keys not among the verifiers (by name and hash): ignored, as the spec says
    failed: tuple[SignatureLine, ...]  # by a known key's name and hash, but not that key's signature of the text

    def signed_by(self, verifier: Verifier) -> bool:
        """Whether `verifier`'s key signed the text (whatever the note's other signatures say)."""
        return verifier in self.verified


def sign_note(text: str, signers: Sequence[Signer]) -> bytes:
    """The signed note: `text`, a blank line, then a signature line by each signer, in order.

    The text must end in a newline and have no control character but newline; it may have blank lines (the last one
    in a note is the one before the signatures). What this returns, `open_note` opens: it is refused here otherwise.
    """
    body = _note_text_bytes(text)
    if not signers:
        raise NoteError("a note needs at least one signer")
    if len(signers) > MAX_SIGNATURES:
        raise NoteError(f"a note may have at most {MAX_SIGNATURES} signatures, not {len(signers)}")
    lines = []
    for signer in signers:
        signature = signer.key_hash.to_bytes(4, "big") + signer.sign(body)
        line = f"{SIGNATURE_PREFIX}{signer.name} {_encode_base64(signature)}"
        length = len(line.encode())
        if length > MAX_SIGNATURE_LINE_BYTES:
            raise NoteError(
                f"the signature line of key {shortened(signer.name)!r} would be {length} bytes, more than the "
                f"{MAX_SIGNATURE_LINE_BYTES} a note's reader accepts"
            )
        lines.append(line + "\n")
    note = body + b"\n" + "".join(lines).encode()
    if len(note) > MAX_NOTE_BYTES:
        raise NoteError(f"the note would be {len(note)} bytes, more than the {MAX_NOTE_BYTES} a note's reader accepts")
    return note


def open_note(note: bytes, verifiers: Iterable[Verifier]) -> OpenedNote:
    """The note's text and its signatures, each checked by the verifier of its key name and hash where there is one.

    NoteError if the note is malformed; none for what its signatures say (see OpenedNote). ValueError if two
    different verifiers have the same name and key hash: which one signed could not be told.
    """
    if len(note) > MAX_NOTE_BYTES:
        raise NoteError(f"note is {len(note)} bytes, more than the {MAX_NOTE_BYTES} a note may have")
    known = _by_name_and_hash(verifiers)
    try:
        decoded = note.decode()
    except UnicodeDecodeError as error:
        raise NoteError(f"note is not valid UTF-8: byte {error.start} is not part of a character") from None
    _check_controls(decoded, "note")
    split = decoded.rfind("\n\n")
    if split < 0:
        raise NoteError("note has no blank line before a block of signatures")
    text, block = decoded[: split + 1], decoded[split + 2 :]
    if not block:
        raise NoteError("note has no signature after its last blank line")
    if not block.endswith("\n"):
        raise NoteError("note's last signature line does not end in a newline")
    count = block.count("\n")
    if count > MAX_SIGNATURES:
        raise NoteError(f"note has {count} signature lines, more than the {MAX_SIGNATURES} a note may have")
    lines = block[:-1].split("\n")
    parsed = [_parse_signature_line(line, number) for number, line in enumerate(lines, start=1)]

    message = text.encode()
    verified: list[Verifier] = []
    unknown: list[SignatureLine] = []
    failed: list[SignatureLine] = []
    for signature in dict.fromkeys(parsed):  # a line repeated counts once
        verifier = known.get((signature.name, signature.key_hash))
        if verifier is None:
            unknown.append(signature)
        elif not verifier.verify(message, signature.signature):
            failed.append(signature)
        elif verifier not in verified:
            verified.append(verifier)
    return OpenedNote(text, tuple(verified), tuple(unknown), tuple(failed))


@dataclass(frozen=True)
class Checkpoint:
    """A log's tree head as a note's text (c2sp.org/tlog-checkpoint): its origin, its tree size, the tree's RFC 6962
    root, and optional extension lines, each line ending in a newline."""

    origin: str
    size: int
    root: bytes
    extensions: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _check_line(self.origin, "checkpoint's origin (line 1)")
        if not 0 <= self.size <= MAX_TREE_SIZE:
            raise NoteError(f"checkpoint's tree size {self.size} is not between 0 and 2^64 - 1")
        if len(self.root) != HASH_SIZE:
            raise NoteError(f"checkpoint's root hash is {len(self.root)} bytes, not {HASH_SIZE}")
        if 3 + len(self.extensions) > MAX_CHECKPOINT_LINES:
            raise NoteError(
                f"checkpoint has {3 + len(self.extensions)} lines, more than the {MAX_CHECKPOINT_LINES} it may have"
            )
        for number, extension in enumerate(self.extensions, start=4):
            _check_line(extension, f"checkpoint's extension line {number}")

    @property
    def text(self) -> str:
        lines = (self.origin, str(self.size), _encode_base64(self.root), *self.extensions)
        return "".join(line + "\n" for line in lines)

    @classmethod
    def parse(cls, text: str) -> Checkpoint:
        """The checkpoint `text` (a note's text) writes; NoteError saying which line is malformed, and how."""
        if len(text) > MAX_NOTE_BYTES:
            raise NoteError(f"checkpoint is {len(text)} characters, more than the {MAX_NOTE_BYTES} a note may have")
        count = text.count("\n")
        if count > MAX_CHECKPOINT_LINES:
            raise NoteError(f"checkpoint has {count} lines, more than the {MAX_CHECKPOINT_LINES} it may have")
        if not text.endswith("\n"):
            raise NoteError("checkpoint does not end in a newline")
        lines = text[:-1].split("\n")
        if len(lines) < 3:
            raise NoteError(
                f"checkpoint has {len(lines)} line(s), not the three it needs: origin, tree size, root hash"
            )
        origin, size_text, root_text, *extensions = lines
        if not _DECIMAL.fullmatch(size_text):
            raise NoteError(
                f"checkpoint's tree size (line 2) {shortened(size_text)!r} is not a decimal number without leading "
                "zeros"
            )
        if len(size_text) > _MAX_TREE_SIZE_DIGITS or int(size_text) > MAX_TREE_SIZE:
            raise NoteError(f"checkpoint's tree size (line 2) {shortened(size_text)!r} is more than 2^64 - 1")
        root = _decode_base64(root_text, "checkpoint's root hash (line 3)")
        return cls(origin, int(size_text), root, tuple(extensions))


def _split_key(text: str, what: str) -> tuple[str, int, bytes]:
    """A key's name, hash and Ed25519 key material (public key or seed), from `<name>+<hash>+<key data>`.

    The messages quote no part of the text: a signer key's is its secret."""
    name, _, rest = text.partition("+")
    hash_text, plus, data_text = rest.partition("+")
    if not plus:
        raise NoteError(f"{what} is not of the form <name>+<key hash>+<key data>")
    _check_name(name, what)
    if not _KEY_HASH.fullmatch(hash_text):
        raise NoteError(f"{what}'s key hash is not 8 lowercase hex digits")
    data = _decode_base64(data_text, f"{what}'s key data", quote=False)
    if not data:
        raise NoteError(f"{what}'s key data is empty")
    if data[0] != ED25519:
        raise NoteError(f"{what} is of signature type 0x{data[0]:02x}: only Ed25519 (0x01) keys are supported")
    if len(data) != 1 + ED25519_KEY_SIZE:
        raise NoteError(f"{what}'s Ed25519 key is {len(data) - 1} bytes, not {ED25519_KEY_SIZE}")
    return name, int(hash_text, 16), data[1:]


def _parse_signature_line(line: str, number: int) -> SignatureLine:
    what = f"signature line {number}"
    length = len(line.encode())
    if length > MAX_SIGNATURE_LINE_BYTES:
        raise NoteError(f"{what} is {length} bytes, more than the {MAX_SIGNATURE_LINE_BYTES} a signature line may be")
    if not line.startswith(SIGNATURE_PREFIX):
        raise NoteError(f"{what} does not begin with an em dash and a space: {shortened(line)!r}")
    name, space, encoded = line[len(SIGNATURE_PREFIX) :].partition(" ")
    if not space:
        raise NoteError(f"{what} has no space between the key name and the signature")
    if " " in encoded:
        raise NoteError(f"{what} has more than two words: key names and signatures have no spaces")
    _check_name(name, what)
    raw = _decode_base64(encoded, f"{what}'s signature")
    if len(raw) < 5:
        raise NoteError(f"{what}'s signature is {len(raw)} bytes: too short for a key hash and a signature")
    return SignatureLine(name, int.from_bytes(raw[:4], "big"), raw[4:])


def _by_name_and_hash(verifiers: Iterable[Verifier]) -> dict[tuple[str, int], Verifier]:
    known: dict[tuple[str, int], Verifier] = {}
    for verifier in verifiers:
        if known.setdefault((verifier.name, verifier.key_hash), verifier) != verifier:
            raise ValueError(
                f"two different verifier keys are named {shortened(verifier.name)!r} with key hash "
                f"{verifier.key_hash:08x}: which one signed a note could not be told"
            )
    return known


def _note_text_bytes(text: str) -> bytes:
    if not text.endswith("\n"):
        raise NoteError("note text does not end in a newline")
    try:
        body = text.encode()
    except UnicodeEncodeError as error:
        raise NoteError(f"note text is not valid UTF-8: character {error.start} is a lone surrogate") from None
    _check_controls(text, "note text")
    if len(body) > MAX_NOTE_BYTES:
        raise NoteError(f"note text is {len(body)} bytes, more than the {MAX_NOTE_BYTES} a note may have")
    return body


def _check_name(name: str, what: str) -> None:
    """Key names are non-empty, with no Unicode space, no '+' and no control character."""
    if not name:
        raise NoteError(f"{what}'s key name is empty")
    for character in name:
        if character.isspace():
            raise NoteError(f"{what}'s key name has a space (U+{ord(character):04X})")
        if character == "+":
            raise NoteError(f"{what}'s key name has a '+'")
        if character < " ":
            raise NoteError(f"{what}'s key name has control character U+{ord(character):04X}")
        if "\ud800" <= character <= "\udfff":
            raise NoteError(f"{what}'s key name is not valid UTF-8: it has a lone surrogate")


def _check_line(value: str, what: str) -> None:
    """A checkpoint's line: non-empty, valid UTF-8, and neither a newline nor another control character in it."""
    if not value:
        raise NoteError(f"{what} is empty")
    if "\n" in value:
        raise NoteError(f"{what} has a newline in it")
    control = _CONTROL.search(value)
    if control:
        raise NoteError(f"{what} has control character U+{ord(control.group()):04X}")
    try:
        value.encode()
    except UnicodeEncodeError:
        raise NoteError(f"{what} is not valid UTF-8: it has a lone surrogate") from None


def _check_controls(text: str, what: str) -> None:
    control = _CONTROL.search(text)
    if control:
        line = text.count("\n", 0, control.start()) + 1
        raise NoteError(
            f"{what} has control character U+{ord(control.group()):04X} on line {line}: only newline is allowed"
        )


def _encode_base64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _decode_base64(text: str, what: str, quote: bool = True) -> bytes:
    """Standard base64 with padding (RFC 4648, section 4), in its one canonical form: a text that decodes to the same
    bytes as another is refused, so that what is read is written back as it was."""
    shown = f" {shortened(text)!r}" if quote else ""
    if not _BASE64.fullmatch(text):
        raise NoteError(f"{what}{shown} is not standard base64 with padding")
    data = base64.b64decode(text)
    if _encode_base64(data) != text:
        raise NoteError(f"{what}{shown} is not canonical base64: its last character has bits set past the data")
    return data
