"""The minisign key and signature formats (docs/trust.md): parsing is ours, the cryptography is not.

Bytes in, values or :class:`~upgrade_core.errors.SignatureError` out; no I/O. The Ed25519 check is
``cryptography``'s, the pre-hash is ``hashlib.blake2b`` (64-byte digest).

The formats, as Debian's ``minisign`` writes them (one base64 blob per line, standard alphabet, padded)::

    public key (.pub)           untrusted comment: <text>
                                base64( "Ed" | key_id[8] | ed25519_public_key[32] )      42 bytes
    signature (.minisig)        untrusted comment: <text>
                                base64( alg[2] | key_id[8] | ed25519_signature[64] )     74 bytes
                                trusted comment: <text>
                                base64( ed25519_global_signature[64] )                   64 bytes

``alg`` is ``"Ed"`` (legacy: the signature is over the file itself) or ``"ED"`` (pre-hashed, minisign's
default since 0.8: over ``blake2b-512(file)``). The global signature is over
``signature[64] | trusted comment text`` (the text after ``"trusted comment: "``, without the line end),
so the trusted comment cannot be changed without the secret key. A key id is shown, as minisign shows it,
as 16 upper-case hex digits of the little-endian 64-bit number (``RWQ...`` keys print e.g.
``E3FC3B1CF3A6F1A2``).

Why the pre-hash is chosen before the file is read: :func:`parse_signature` runs first, and the caller
feeds the archive's bytes into :meth:`Signature.message_hasher`, so a legacy signature over a large file
costs memory (bounded by ``limits.max_archive_bytes``) and a pre-hashed one costs none.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from collections.abc import Callable
from typing import Literal

import attrs
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from upgrade_core.errors import SignatureError

__all__ = [
    "MAX_SIGNATURE_BYTES",
    "MessageHasher",
    "PublicKey",
    "ReleaseClaims",
    "Signature",
    "key_id_hex",
    "parse_public_key",
    "parse_release_claims",
    "parse_signature",
]

MAX_SIGNATURE_BYTES = 4096
"""A ``.minisig`` (and a ``.pub``) is a few hundred bytes; a longer file is refused, never read whole."""

Algorithm = Literal["Ed", "ED"]
_UNTRUSTED = "untrusted comment: "
_TRUSTED = "trusted comment: "
_B64_LINE = re.compile(r"[A-Za-z0-9+/]+={0,2}")


def key_id_hex(key_id: bytes) -> str:
    """The 8-byte key id as minisign prints it: 16 upper-case hex digits, little-endian number."""
    return key_id[::-1].hex().upper()


def _b64(line: str, length: int, what: str, shown: str) -> bytes:
    if not _B64_LINE.fullmatch(line):
        raise SignatureError(f"{shown}: {what} is not a base64 line")
    try:
        raw = base64.b64decode(line, validate=True)
    except (binascii.Error, ValueError):
        raise SignatureError(f"{shown}: {what} is not valid base64") from None
    if len(raw) != length:
        raise SignatureError(f"{shown}: {what} is {len(raw)} bytes, expected {length}")
    return raw


def _lines(data: bytes, shown: str, what: str) -> list[str]:
    if len(data) > MAX_SIGNATURE_BYTES:
        raise SignatureError(f"{shown}: {what} is longer than {MAX_SIGNATURE_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise SignatureError(f"{shown}: {what} is not UTF-8 text") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    lines = [line[:-1] if line.endswith("\r") else line for line in lines]
    if any(c in line for line in lines for c in "\r\x00"):
        raise SignatureError(f"{shown}: {what} holds a control character")
    return lines


@attrs.frozen
class PublicKey:
    """A minisign public key.

    Attributes:
        key_id: 8 bytes, as stored (see :func:`key_id_hex` for the printed form).
        key: the 32-byte Ed25519 public key.
    """

    key_id: bytes
    key: bytes

    @property
    def key_id_hex(self) -> str:
        return key_id_hex(self.key_id)

    def verify(self, signature: bytes, message: bytes) -> bool:
        """True when ``signature`` (64 bytes) is this key's Ed25519 signature of ``message``."""
        try:
            Ed25519PublicKey.from_public_bytes(self.key).verify(signature, message)
        except InvalidSignature:
            return False
        return True


def parse_public_key(text: str, shown: str = "public key") -> PublicKey:
    """Parse a public key: the bare base64 line (``RW...``, as in ``[trust] root_keys``) or a ``.pub`` file.

    Args:
        text: one base64 line, or an ``untrusted comment:`` line followed by it.
        shown: what to call it in messages (a config key, a file name).

    Raises:
        SignatureError: not base64, wrong length, or an algorithm other than ``Ed``.
    """
    lines = _lines(text.encode("utf-8", "surrogateescape"), shown, "public key")
    if len(lines) == 2 and lines[0].startswith(_UNTRUSTED):
        lines = lines[1:]
    if len(lines) != 1:
        raise SignatureError(
            f"{shown}: a public key is one base64 line, optionally after an untrusted comment"
        )
    raw = _b64(lines[0].strip(), 42, "public key", shown)
    if raw[:2] != b"Ed":
        raise SignatureError(f"{shown}: public key algorithm {_alg_shown(raw[:2])} is not Ed (Ed25519)")
    return PublicKey(key_id=raw[2:10], key=raw[10:])


def _alg_shown(alg: bytes) -> str:
    return alg.decode("ascii") if alg.isascii() and alg.isalnum() else "0x" + alg.hex()


class MessageHasher:
    """The signed message, fed incrementally: blake2b-512 (``ED``) or the bytes themselves (``Ed``)."""

    def __init__(self, algorithm: Algorithm) -> None:
        self.algorithm = algorithm
        self._blake = hashlib.blake2b(digest_size=64) if algorithm == "ED" else None
        self._whole = bytearray() if algorithm == "Ed" else None

    def update(self, chunk: bytes) -> None:
        if self._blake is not None:
            self._blake.update(chunk)
        else:
            assert self._whole is not None
            self._whole += chunk

    def message(self) -> bytes:
        """The bytes the Ed25519 signature is over."""
        if self._blake is not None:
            return self._blake.digest()
        assert self._whole is not None
        return bytes(self._whole)


@attrs.frozen
class Signature:
    """A parsed ``.minisig``; nothing checked but its shape.

    Attributes:
        algorithm: ``"ED"`` (pre-hashed, blake2b-512) or ``"Ed"`` (legacy, the whole file).
        key_id: 8 bytes: the key the signer claims (the check is :meth:`verify` with that key).
        signature: 64 bytes over the message.
        trusted_comment: the text after ``trusted comment: ``.
        global_signature: 64 bytes over ``signature | trusted_comment``.
        shown: the (redacted) source, for messages.
    """

    algorithm: Algorithm
    key_id: bytes
    signature: bytes
    trusted_comment: str
    global_signature: bytes
    shown: str = "signature"

    @property
    def key_id_hex(self) -> str:
        return key_id_hex(self.key_id)

    def message_hasher(self) -> MessageHasher:
        """A fresh :class:`MessageHasher` for this signature's algorithm."""
        return MessageHasher(self.algorithm)

    def verify(self, key: PublicKey, message: bytes) -> None:
        """Check both signatures with ``key``.

        Args:
            key: the public key whose id the signature names (the caller decides it is trusted).
            message: :meth:`MessageHasher.message` of the file as published.

        Raises:
            SignatureError: another key's id, the file does not match, or the trusted comment was changed.
        """
        if key.key_id != self.key_id:
            raise SignatureError(
                f"{self.shown}: signed by key {self.key_id_hex}, not by key {key.key_id_hex}"
            )
        if not key.verify(self.signature, message):
            raise SignatureError(
                f"{self.shown}: signature by key {self.key_id_hex} does not match the file as published"
            )
        if not key.verify(self.global_signature, self.signature + self.trusted_comment.encode("utf-8")):
            raise SignatureError(
                f"{self.shown}: trusted comment does not match its signature by key {self.key_id_hex}"
            )

    def verify_bytes(self, key: PublicKey, data: bytes) -> None:
        """:meth:`verify` over a whole file held in memory (a keyring)."""
        hasher = self.message_hasher()
        hasher.update(data)
        self.verify(key, hasher.message())


def parse_signature(data: bytes, shown: str = "signature") -> Signature:
    """Parse a ``.minisig`` file.

    Args:
        data: the file's bytes (at most :data:`MAX_SIGNATURE_BYTES`).
        shown: the redacted source, for messages.

    Raises:
        SignatureError: not four lines of the shape above, bad base64 or lengths, an unknown algorithm.
    """
    lines = _lines(data, shown, "signature file")
    if len(lines) != 4:
        raise SignatureError(f"{shown}: a minisign signature has 4 lines, found {len(lines)}")
    if not lines[0].startswith(_UNTRUSTED):
        raise SignatureError(f"{shown}: line 1 does not start with {_UNTRUSTED.strip()!r}")
    raw = _b64(lines[1], 74, "signature (line 2)", shown)
    alg = raw[:2]
    if alg not in (b"Ed", b"ED"):
        raise SignatureError(f"{shown}: signature algorithm {_alg_shown(alg)} is neither ED nor Ed")
    if not lines[2].startswith(_TRUSTED):
        raise SignatureError(f"{shown}: line 3 does not start with {_TRUSTED.strip()!r}")
    global_sig = _b64(lines[3], 64, "global signature (line 4)", shown)
    algorithm: Algorithm = "ED" if alg == b"ED" else "Ed"
    return Signature(
        algorithm=algorithm,
        key_id=raw[2:10],
        signature=raw[10:],
        trusted_comment=lines[2][len(_TRUSTED):],
        global_signature=global_sig,
        shown=shown,
    )


# -- the release's claims in the trusted comment ---------------------------------------------------------
_CLAIM = re.compile(r"([a-z_]+)=(\S+)")
_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")


@attrs.frozen
class ReleaseClaims:
    """What the publisher signed about a release: ``name=<agent> version=<version> security_version=<int>``.

    Attributes:
        name: the agent name the release is for.
        version: the version its binary reports (normalised: no leading ``v``).
        security_version: a non-negative integer (the anti-rollback watermark's unit, docs/trust.md).
    """

    name: str
    version: str
    security_version: int


def parse_release_claims(
    comment: str, shown: str, normalise: Callable[[str], str | None]
) -> ReleaseClaims:
    """Read the trusted comment: space-separated ``key=value``, each of the three keys once; others ignored.

    Args:
        comment: :attr:`Signature.trusted_comment` (already proven authentic).
        shown: the signature's source, for messages.
        normalise: the version token rule (``agent.release.verify``'s), None for a value that is not a
        version.

    Raises:
        SignatureError: a missing or repeated key, a bad name, version or security_version.
    """
    found: dict[str, str] = {}
    for word in comment.split():
        m = _CLAIM.fullmatch(word)
        if m is None:
            continue
        key, value = m.groups()
        if key in ("name", "version", "security_version"):
            if key in found:
                raise SignatureError(f"{shown}: trusted comment names {key} twice")
            found[key] = value
    for key in ("name", "version", "security_version"):
        if key not in found:
            raise SignatureError(
                f"{shown}: trusted comment has no {key}= (expected name=... version=... security_version=N)"
            )
    if not _NAME.fullmatch(found["name"]):
        raise SignatureError(f"{shown}: trusted comment name {found['name']!r} is not an agent name")
    version = normalise(found["version"])
    if version is None:
        raise SignatureError(f"{shown}: trusted comment version {found['version']!r} is not a version")
    sv = found["security_version"]
    if not sv.isascii() or not sv.isdigit() or len(sv) > 18:
        raise SignatureError(
            f"{shown}: trusted comment security_version {sv!r} is not a non-negative integer"
        )
    return ReleaseClaims(name=found["name"], version=version, security_version=int(sv))
