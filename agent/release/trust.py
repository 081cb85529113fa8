"""Which release signatures a host trusts (docs/trust.md): root keys, a root-signed keyring, a cache.

A release is accepted when its ``.minisig`` is by a root key (``[trust] root_keys``) or by a key of the
keyring that a root key signed, unexpired (``expires``, RFC 3339, against the wall clock: expiry is a
calendar fact) and not revoked; a key id the newest keyring revokes is refused whoever signed it. Only
minisign's pre-hashed ``ED`` signatures count unless ``[trust] allow_legacy_signatures`` is true: the
algorithm bytes are outside what minisign signs, so accepting ``Ed`` by default would let anyone who can
edit a ``.minisig`` choose how the archive is read.

The keyring (``[trust] keyring``, a file or URL fetched under the archive's rules, with its detached
``<keyring>.minisig`` by a root key) is a JSON object, exactly these keys::

    {"serial": 3,
     "expires": "2027-01-31T00:00:00Z",
     "keys": [{"public_key": "RWQ...", "expires": "2027-06-30T00:00:00Z"}],
     "revoked": ["88666849DDB7434"]}

The top-level ``expires`` (RFC 3339 UTC) is the keyring's own, signed with it: past it the keyring is
refused, served or cached, so a mirror that keeps serving an old, genuine keyring (a freeze attack, the one
TUF's expiring timestamp metadata bounds) cannot keep a revoked key valid for longer than that. A served
keyring without it is refused: it could be frozen forever.

``serial`` is a positive integer that never goes back: the verified keyring is cached in
``state_dir/trust/keyring.json`` (0600 in a 0700 directory, written like a result: temp, fsync, rename,
directory fsync, design §10 ownership) and replaced only by a higher serial. A served keyring with a lower
serial than the cache is refused (a mirror cannot resurrect a revoked key); the same serial must be the
same bytes. The one exception is root rotation: a cache signed by a key that is no longer a configured
root vouches for nothing, so any keyring signed by a configured root replaces it. Key ids are minisign's
(16 hex digits, leading zeros optional).
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import os
from collections.abc import Callable
from typing import Any

import attrs

from agent.fs.statefile import read_state_file, write_state_file
from agent.redact import redact_url
from agent.release.fetch import FetchPolicy, fetch
from agent.release.minisign import (
    MAX_SIGNATURE_BYTES,
    MessageHasher,
    PublicKey,
    Signature,
    key_id_hex,
    parse_public_key,
    parse_release_claims,
    parse_signature,
)
from agent.release.verify import normalise_version
from upgrade_core import ReleaseTrusted
from upgrade_core.errors import FetchError, FetchHTTPError, HostError, KeyringError, SignatureError

__all__ = ["Keyring", "ReleaseTrust", "TrustedKeys", "parse_keyring", "signature_source"]

MAX_KEYRING_BYTES = 1 << 20
_KEYRING_KEYS = {"serial", "keys", "revoked"}
_KEYRING_OPTIONAL = {"expires"}


def signature_source(archive: str) -> str:
    """The default signature of an archive source: ``<archive>.minisig`` (before any query or fragment)."""
    for sep in ("#", "?"):
        if sep in archive and "://" in archive:
            base, _, rest = archive.partition(sep)
            return f"{base}.minisig{sep}{rest}"
    return archive + ".minisig"


def _key_id_from_hex(text: object, where: str) -> bytes:
    hexdigits = "0123456789abcdefABCDEF"
    if not isinstance(text, str) or not 1 <= len(text) <= 16 or any(c not in hexdigits for c in text):
        raise KeyringError(f"{where}: a key id is 1 to 16 hex digits")
    return int(text, 16).to_bytes(8, "little")


def _rfc3339(text: object, where: str) -> dt.datetime:
    if not isinstance(text, str) or "T" not in text.upper():
        raise KeyringError(f"{where}: expires must be an RFC 3339 time such as 2027-06-30T00:00:00Z")
    try:
        when = dt.datetime.fromisoformat(text.replace("z", "Z"))
    except ValueError:
        raise KeyringError(f"{where}: expires must be an RFC 3339 time such as 2027-06-30T00:00Z") from None
    if when.tzinfo is None:
        raise KeyringError(f"{where}: expires needs a time zone (Z or +hh:mm)")
    return when


def _utc(when: dt.datetime) -> str:
    """``when`` as RFC 3339 UTC with a ``Z`` (the form the publisher writes)."""
    return when.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")


@attrs.frozen
class Keyring:
    """A verified keyring.

    Attributes:
        serial: never goes back.
        keys: signing key by key id, with its expiry (aware datetime).
        revoked: key ids refused whoever signed them.
        expires: the keyring's own signed expiry (aware datetime); None only for a cache written before
            keyrings carried one (good as a serial floor, never as the keyring in use).
    """

    serial: int
    keys: dict[bytes, tuple[PublicKey, dt.datetime]]
    revoked: frozenset[bytes]
    expires: dt.datetime | None = None

    def check_fresh(self, shown: str, now: dt.datetime) -> None:
        """Refuse a keyring that is past its ``expires`` or has none.

        Raises:
            KeyringError: naming the serial and the expiry (a freeze attack or a publisher who stopped
                re-signing: either way the keys it lists are no longer vouched for).
        """
        if self.expires is None:
            raise KeyringError(
                f"{shown}: keyring serial {self.serial} has no expires (a keyring must carry its own "
                "signed expiry; publish a new serial with expires)"
            )
        if now >= self.expires:
            raise KeyringError(
                f"{shown}: keyring serial {self.serial} expired at {_utc(self.expires)}"
            )


def parse_keyring(data: bytes, shown: str) -> Keyring:
    """Parse a keyring document (its signature is checked by the caller).

    ``expires`` may be absent (a keyring from before it existed: :attr:`Keyring.expires` is None and
    :meth:`Keyring.check_fresh` refuses it as the keyring in use).

    Raises:
        KeyringError: not UTF-8 JSON of exactly the shape in the module doc; the message names the field.
    """
    try:
        doc: Any = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise KeyringError(f"{shown}: keyring is not UTF-8 JSON") from None
    if not isinstance(doc, dict) or not _KEYRING_KEYS <= set(doc) <= _KEYRING_KEYS | _KEYRING_OPTIONAL:
        raise KeyringError(
            f"{shown}: keyring must be an object with exactly serial, expires, keys and revoked"
        )
    serial = doc["serial"]
    if not isinstance(serial, int) or isinstance(serial, bool) or serial < 1:
        raise KeyringError(f"{shown}: serial must be a positive integer")
    if not isinstance(doc["keys"], list) or not isinstance(doc["revoked"], list):
        raise KeyringError(f"{shown}: keys and revoked must be arrays")
    keys: dict[bytes, tuple[PublicKey, dt.datetime]] = {}
    for i, entry in enumerate(doc["keys"]):
        where = f"{shown}: keys[{i}]"
        if not isinstance(entry, dict) or set(entry) != {"public_key", "expires"}:
            raise KeyringError(f"{where}: must be an object with exactly public_key and expires")
        if not isinstance(entry["public_key"], str):
            raise KeyringError(f"{where}: public_key must be a string")
        try:
            key = parse_public_key(entry["public_key"], f"{where}.public_key")
        except SignatureError as exc:
            raise KeyringError(str(exc)) from None
        keys[key.key_id] = (key, _rfc3339(entry["expires"], where))
    revoked = frozenset(_key_id_from_hex(v, f"{shown}: revoked[{i}]") for i, v in enumerate(doc["revoked"]))
    expires = _rfc3339(doc["expires"], shown) if "expires" in doc else None
    return Keyring(serial, keys, revoked, expires)


@attrs.frozen
class TrustedKeys:
    """The keys a release may be signed by: roots, plus the newest verified keyring (or none)."""

    roots: tuple[PublicKey, ...]
    keyring: Keyring | None = None

    def signer(self, sig: Signature, now: dt.datetime) -> PublicKey:
        """The trusted key ``sig`` names.

        Raises:
            SignatureError: an unknown, revoked or expired key (named by its id).
        """
        kid = sig.key_id
        shown = f"{sig.shown}: signed by key {sig.key_id_hex}"
        if self.keyring is not None and kid in self.keyring.revoked:
            raise SignatureError(f"{shown}, revoked by keyring serial {self.keyring.serial}")
        for root in self.roots:
            if root.key_id == kid:
                return root
        if self.keyring is not None and kid in self.keyring.keys:
            key, expires = self.keyring.keys[kid]
            if now >= expires:
                raise SignatureError(f"{shown}, which expired at {expires.isoformat()}")
            return key
        raise SignatureError(f"{shown}, which is not a root key nor in the keyring (unknown key)")


def _root_of(sig: Signature, roots: tuple[PublicKey, ...]) -> PublicKey | None:
    """The configured root key ``sig`` names, or None."""
    return next((root for root in roots if root.key_id == sig.key_id), None)


def _verify_with_roots(sig: Signature, roots: tuple[PublicKey, ...], data: bytes) -> None:
    root = _root_of(sig, roots)
    if root is None:
        raise KeyringError(f"{sig.shown}: keyring signed by key {sig.key_id_hex}, which is not a root key")
    try:
        sig.verify_bytes(root, data)
    except SignatureError as exc:
        raise KeyringError(str(exc)) from None


def _legacy_refusal(sig: Signature, what: str) -> str:
    """The line refusing a legacy (``Ed``, not pre-hashed) signature of ``what`` (a release, the keyring)."""
    return (
        f"{sig.shown}: the legacy Ed algorithm (not pre-hashed) is not accepted for {what} "
        "([trust] allow_legacy_signatures = false)"
    )


async def fetch_small(source: str, policy: FetchPolicy, limit: int, headers: Any = None) -> bytes:
    """Fetch a small file (a signature, a keyring) under the archive's rules, bounded by ``limit`` bytes."""
    chunks: list[bytes] = []

    async def sink(chunk: bytes) -> None:
        chunks.append(chunk)

    await fetch(source, policy, sink, headers=headers, max_bytes=limit)
    return b"".join(chunks)


@attrs.define
class ReleaseTrust:
    """The ``[trust]`` policy at work for one request: fetch and check the signature, keep the keyring.

    Attributes:
        roots: the root keys.
        keyring_source: ``[trust] keyring`` ("" for none).
        require: a release without a signature is refused.
        state_dir: where the keyring cache lives (``trust/keyring.json``).
        download: the archive's fetch rules (scheme, redirects, http policy).
        signature: ``--signature`` (None: ``<archive>.minisig``).
        allow_legacy: ``[trust] allow_legacy_signatures``: also accept ``Ed`` (not pre-hashed) signatures.
        now: the wall clock (UTC, aware), for key and keyring expiry; tests pass their own.
    """

    roots: tuple[PublicKey, ...]
    keyring_source: str
    require: bool
    state_dir: str
    download: FetchPolicy = attrs.field(factory=FetchPolicy)
    signature: str | None = None
    allow_legacy: bool = False
    now: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC)

    # -- the keyring -------------------------------------------------------------------------------------
    def _cache_path(self) -> str:
        return os.path.join(self.state_dir, "trust", "keyring.json")

    def read_cache(self) -> tuple[bytes, bytes] | None:
        """The cached keyring and its signature (re-verified by the caller), or None; creates nothing."""
        path = self._cache_path()
        try:
            data = read_state_file(self.state_dir, "trust", "keyring.json")
            if data is None:
                return None
            doc: Any = json.loads(data)
            return base64.b64decode(doc["keyring"], validate=True), doc["signature"].encode()
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise KeyringError(f"{path}: unreadable cached keyring: {type(exc).__name__}") from None

    def write_cache(self, data: bytes, sig: bytes) -> None:
        """Replace the cache durably (design §10 ownership, as results)."""
        path = self._cache_path()
        doc = {"keyring": base64.b64encode(data).decode(), "signature": sig.decode()}
        try:
            write_state_file(self.state_dir, "trust", os.path.basename(path),
                             (json.dumps(doc, indent=2) + "\n").encode())
        except OSError as exc:
            raise HostError(f"{path}: cannot write the keyring cache: {exc.strerror or exc}") from None

    def _verified(self, data: bytes, sig_bytes: bytes, shown: str) -> Keyring:
        sig = parse_signature(sig_bytes, shown + ".minisig")
        if sig.algorithm == "Ed" and not self.allow_legacy:
            raise KeyringError(_legacy_refusal(sig, "the keyring"))
        _verify_with_roots(sig, self.roots, data)
        return parse_keyring(data, shown)

    def _floor(self, cached: tuple[bytes, bytes] | None) -> Keyring | None:
        """The cached keyring as the serial floor, or None: no cache, or one signed by a key that is no
        longer a configured root (root rotation: it vouches for nothing, any configured root's keyring
        replaces it).

        Raises:
            KeyringError: the cache names a configured root but does not verify (tampered), or is malformed.
        """
        if cached is None:
            return None
        shown = "cached keyring"
        sig = parse_signature(cached[1], shown + ".minisig")
        if _root_of(sig, self.roots) is None:
            return None
        _verify_with_roots(sig, self.roots, cached[0])
        return parse_keyring(cached[0], shown)

    async def keys(self) -> TrustedKeys:
        """The roots and the served keyring, checked against the cache (the serial floor, unless a root no
        longer configured signed it) and fresh; a higher serial (or a cache without a floor) is cached.

        Raises:
            KeyringError: the served keyring is malformed, not signed by a root key, legacy-signed (unless
                allowed), older than the cache (or the same serial with other contents), without
                ``expires`` or past it; the cache is kept.
            FetchError: the keyring or its signature could not be fetched.
        """
        if not self.keyring_source:
            return TrustedKeys(self.roots)
        shown = redact_url(self.keyring_source)
        cached = self.read_cache()
        floor = self._floor(cached)
        data = await fetch_small(self.keyring_source, self.download, MAX_KEYRING_BYTES)
        sig_source = signature_source(self.keyring_source)
        sig_bytes = await fetch_small(sig_source, self.download, MAX_SIGNATURE_BYTES)
        served = self._verified(data, sig_bytes, shown)
        newer = floor is None or served.serial > floor.serial
        if floor is not None and cached is not None:
            if served.serial < floor.serial:
                raise KeyringError(
                    f"{shown}: keyring serial {served.serial} is older than the cached serial "
                    f"{floor.serial} (a keyring never goes back)"
                )
            if served.serial == floor.serial and data != cached[0]:
                raise KeyringError(
                    f"{shown}: keyring serial {served.serial} differs from the cached keyring "
                    "of the same serial"
                )
        served.check_fresh(shown, self.now())
        if newer:
            self.write_cache(data, sig_bytes)
        return TrustedKeys(self.roots, served)

    # -- the release -------------------------------------------------------------------------------------
    async def release_signature(self, archive: str) -> tuple[Signature, PublicKey] | None:
        """Fetch the release's signature and pick its trusted key, before the archive is fetched.

        Returns:
            The parsed signature and its key; None when no signature is required and none was found.

        Raises:
            SignatureError: missing when required, malformed, legacy ``Ed`` (unless allowed), or by a key
                this host does not trust.
            KeyringError, FetchError: as :meth:`keys`; FetchError for the signature too.
        """
        source = self.signature or signature_source(archive)
        shown = redact_url(source)
        try:
            data = await fetch_small(source, self.download, MAX_SIGNATURE_BYTES)
        except FetchHTTPError as exc:
            if exc.status != 404:
                raise
            missing = f"{shown}: no signature (HTTP 404)"
        except FetchError as exc:
            if "No such file" not in str(exc):
                raise
            missing = f"{shown}: no signature (no such file)"
        else:
            sig = parse_signature(data, shown)
            if sig.algorithm == "Ed" and not self.allow_legacy:
                raise SignatureError(_legacy_refusal(sig, f"release {redact_url(archive)}"))
            key = (await self.keys()).signer(sig, self.now())
            return sig, key
        if self.require:
            raise SignatureError(f"{missing}; [trust] requires signed releases")
        return None


def trusted_release(sig: Signature, key: PublicKey, hasher: MessageHasher) -> ReleaseTrusted:
    """Check ``sig`` over what ``hasher`` saw (the archive as published) and read its claims.

    Raises:
        SignatureError: the archive or the trusted comment does not match; the claims are malformed.
    """
    sig.verify(key, hasher.message())
    claims = parse_release_claims(sig.trusted_comment, sig.shown, normalise_version)
    return ReleaseTrusted(key_id_hex(key.key_id), claims.name, claims.version, claims.security_version)
