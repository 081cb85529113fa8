"""``[download]``'s TLS and proxy keys made into the :class:`~agent.https.Transport` of downloads
(docs/trust.md, TLS).

- ``ca_file``: a PEM bundle of certificates trusted *in addition to* the operating system's store (an internal
  CA the host's store does not hold yet). Root's (or the running user's), not writable by group or others:
  whoever can write it decides which servers the agent believes.
- ``client_cert`` and ``client_key``: PEM, for servers that require mutual TLS; one without the other is a
  configuration error. The key must be unencrypted (the agent runs unattended), root's (or the running
  user's) and give group and others no access (mode 0600 or 0400).
- ``proxy``: an ``http://`` or ``https://`` proxy URL; downloads go through it, and through nothing else (the
  environment's ``HTTPS_PROXY`` and friends are never read, see :mod:`agent.https`).

Every file is read once through :func:`agent.fs.regular.read_regular_file` (a FIFO or device is never
opened; owner and mode are checked on the open descriptor), parsed with ``cryptography``, and the parsed
certificates and key are what OpenSSL loads (the key through a memory file, :mod:`agent.fs.memfile`): the
file is never read a second time, so a file swapped in after the checks is never used.
"""

from __future__ import annotations

import ssl

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes

from agent.errors import ConfigError
from agent.fs.memfile import memory_file
from agent.fs.regular import NotARegularFileError, UntrustedFileError, read_regular_file
from agent.https import Transport, os_trust_context
from upgrade_core.errors import HostRefusedError

__all__ = ["MAX_PEM_BYTES", "download_transport"]

MAX_PEM_BYTES = 4 * 1024 * 1024
"""The largest ``ca_file``, ``client_cert`` or ``client_key`` read, bytes (a public CA bundle is ~0.2 MiB)."""

_PUBLIC = serialization.PublicFormat.SubjectPublicKeyInfo


def _read(where: str, key: str, path: str, *, private: bool = False) -> bytes:
    """The bytes of the file ``key`` names.

    Raises:
        ConfigError: missing, not a regular file, unreadable or larger than :data:`MAX_PEM_BYTES` (exit 2).
        HostRefusedError: owned by another user, writable by group or others, or (``private``) readable by
            them (exit 4).
    """
    try:
        data = read_regular_file(path, trusted=True, private=private, limit=MAX_PEM_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError(f"{where}: {key}: {path}: file not found") from None
    except UntrustedFileError as exc:
        raise HostRefusedError(path, f"{key}: {exc.strerror}") from None
    except NotARegularFileError as exc:
        raise ConfigError(f"{where}: {key}: {path}: {exc.strerror}") from None
    except OSError as exc:
        raise ConfigError(f"{where}: {key}: {path}: cannot read: {exc.strerror or exc}") from None
    if len(data) > MAX_PEM_BYTES:
        raise ConfigError(f"{where}: {key}: {path}: larger than {MAX_PEM_BYTES} bytes")
    return data


def _certificates(where: str, key: str, path: str) -> list[x509.Certificate]:
    """The PEM certificates of the file ``key`` names, in file order (at least one)."""
    data = _read(where, key, path)
    try:
        return x509.load_pem_x509_certificates(data)
    except ValueError:
        raise ConfigError(
            f"{where}: {key}: {path}: not a PEM certificate file (no readable "
            "'-----BEGIN CERTIFICATE-----' block)"
        ) from None


def _pem(certificates: list[x509.Certificate]) -> bytes:
    return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certificates)


def _private_key(where: str, path: str) -> PrivateKeyTypes:
    """``client_key``, parsed."""
    data = _read(where, "download.client_key", path, private=True)
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except TypeError:  # cryptography: "Password was not given but private key is encrypted"
        raise ConfigError(
            f"{where}: download.client_key: {path}: the key is encrypted; the agent runs unattended and "
            "needs an unencrypted key (protect it by its owner and mode 0600 instead)"
        ) from None
    except (ValueError, UnsupportedAlgorithm):
        raise ConfigError(
            f"{where}: download.client_key: {path}: not a PEM private key (RSA, EC or Ed25519)"
        ) from None
    return key


def _load_client_chain(ctx: ssl.SSLContext, where: str, cert_path: str, key_path: str) -> None:
    chain = _certificates(where, "download.client_cert", cert_path)
    private = _private_key(where, key_path)
    der = serialization.Encoding.DER
    if private.public_key().public_bytes(der, _PUBLIC) != chain[0].public_key().public_bytes(der, _PUBLIC):
        raise ConfigError(
            f"{where}: download.client_key: {key_path}: does not match the first certificate of "
            f"download.client_cert ({cert_path})"
        )
    key_pem = private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    try:
        with memory_file(_pem(chain), "client_cert") as cert, memory_file(key_pem, "client_key") as key:
            ctx.load_cert_chain(cert, key)
    except ssl.SSLError as exc:
        raise ConfigError(
            f"{where}: download.client_cert: {cert_path}: OpenSSL refused the certificate and key "
            f"({exc.reason or exc})"
        ) from None


def download_transport(
    where: str, *, ca_file: str = "", client_cert: str = "", client_key: str = "", proxy: str = ""
) -> Transport:
    """The :class:`~agent.https.Transport` of downloads from the ``[download]`` keys.

    Args:
        where: the configuration file, for messages.
        ca_file: "" or the absolute path of a PEM bundle trusted beside the operating system's store.
        client_cert: "" or the absolute path of the PEM client certificate (chain, leaf first).
        client_key: "" or the absolute path of its unencrypted PEM private key (with ``client_cert``).
        proxy: "" or an http(s) proxy URL (checked by the configuration loader).

    Returns:
        The transport: the operating system's trust plus ``ca_file``, the client certificate if any, the
        proxy if any.

    Raises:
        ConfigError: a file is missing, unreadable, not a regular file or not PEM; an encrypted key; a key
            that does not match the certificate; ``client_cert`` without ``client_key`` or the reverse;
            one line ``FILE: download.KEY: PATH: what`` (exit 2).
        HostRefusedError: a file is owned by another user or writable by group or others, or the key is
            readable by them: ``PATH: download.KEY: what`` (exit 4). Nothing was changed.
    """
    if bool(client_cert) != bool(client_key):
        missing, given = ("client_key", "client_cert") if client_cert else ("client_cert", "client_key")
        raise ConfigError(f"{where}: download.{given}: needs download.{missing} (mutual TLS takes both)")
    ctx = os_trust_context()
    if ca_file:
        bundle = _certificates(where, "download.ca_file", ca_file)
        ctx.load_verify_locations(cadata=_pem(bundle).decode("ascii"))
    if client_cert:
        _load_client_chain(ctx, where, client_cert, client_key)
    return Transport(ssl_context=ctx, proxy=proxy or None, client_certificate=bool(client_cert))
