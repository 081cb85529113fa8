"""The project's error hierarchy, split by cause, each class carrying its CLI exit code (design §7).

Roots (in the spirit of python-tuf's data-vs-transport split):

- :class:`CandidateError`: the archive or the binary is bad (rejected, truncated, wrong digest, failing
  version command). Exit 1: the host stays on its previous good binary.
- :class:`FetchError`: the transport failed (HTTP status, short body, refused redirect, timeout). Exit 1.
- :class:`HostError`: the host cannot take the upgrade as it stands (lock busy, a file where a link must
  be, no space, ``noexec``, not installed). Exit code per subclass.
- :class:`JournalError`: the journal cannot be written (:class:`JournalDurabilityError`) or read
  (:class:`JournalUnreadableError`, with file and offset). Exit 3.
- Usage and configuration errors (exit 2) are the agent's (:mod:`agent.errors`): the core never sees a
  command line or a TOML file, and raises ``ValueError`` for caller misuse.
- :class:`HistoryError`: the journal holds an order of events that the lifecycle forbids. Exit 3.
- :class:`ServiceError`: ``systemctl``/``systemd-run`` failed or timed out. Exit 1.

Every message names the file, key, offset or (redacted) URL involved; the CLI prints ``str(error)`` as one
line. Caller misuse of the library stays ``RuntimeError``/``TypeError``.
"""

from __future__ import annotations

from typing import ClassVar


class UpgradeError(Exception):
    """Base of every expected failure. ``exit_code`` is the CLI exit status (design §7)."""

    exit_code: ClassVar[int] = 1


# -- bad candidate ---------------------------------------------------------------------------------
class CandidateError(UpgradeError):
    """The archive or candidate binary is unacceptable; nothing was switched. Exit 1."""


class ArchiveRejectedError(CandidateError):
    """The archive breaks a member rule (design §6, cases K1): escaping names, links, devices, duplicates."""


class ArchiveTruncatedError(CandidateError):
    """The archive, its compressed stream or the response's content coding ended before its proper end
    or is corrupt ("archive truncated/corrupt"; cases C07, C28): one error for every format."""


class ArchiveLimitError(CandidateError):
    """A ``limits.*`` bound was exceeded (case C04): sizes, entry count, zstd window."""


class DigestMismatchError(CandidateError):
    """The compressed bytes do not match ``--sha256`` (compared in constant time)."""


class DeltaBaseError(CandidateError):
    """A delta (docs/delta.md) is the file its digest names but does not decode against the current slot:
    it was made against another base, or the slot's bytes are not the ones it was made from."""


class VerifyError(CandidateError):
    """The candidate's version command failed: non-zero exit, no output, no version token (case C10).

    ``condemns_release``: the failure is the release's own, so its digest becomes known-bad
    (docs/trust.md); False for the subclasses whose cause may be the host or the request.
    """

    condemns_release: ClassVar[bool] = True


class VerifyTimeoutError(VerifyError):
    """The version command ran past ``verify.timeout_s``; its whole process group was killed (C10).
    Not known-bad: a loaded host can be the cause."""

    condemns_release: ClassVar[bool] = False


class VerifyCannotRunError(VerifyError):
    """The version command could not be started (the spawn failed: ENOMEM, EAGAIN, a busy text file...).
    Not known-bad: the host can be the cause."""

    condemns_release: ClassVar[bool] = False


class HostRootMismatchError(VerifyError):
    """The candidate answers ``host-root`` with another host root than this host's (a runtime built or
    configured for another layout, the seeds' ``<candidate> host-root`` check); exit 1, refused before the
    switch, the message naming both roots. Not known-bad: it may be right for hosts of its own root."""

    condemns_release: ClassVar[bool] = False


class VersionMismatchError(VerifyError):
    """The reported version differs from ``--expect-version`` (compared without a leading ``v``).
    Not known-bad: the request expected another release."""

    condemns_release: ClassVar[bool] = False


class SignatureError(CandidateError):
    """The release's minisign signature is missing, malformed, by a key this host does not trust (unknown,
    revoked, expired), does not match the archive as published, or its trusted comment names another agent
    or version (docs/trust.md). Nothing was switched. Exit 1."""


class KeyringError(SignatureError):
    """The signing keyring is malformed, not signed by a root key, or older than the cached one (its
    ``serial`` never goes back). Nothing was switched and the cached keyring was kept. Exit 1."""


class SecurityVersionError(SignatureError):
    """A validly signed release whose ``security_version`` is below this host's watermark, the highest one
    ever committed here (a rollback attack, docs/trust.md). Nothing was switched. Exit 1."""


class KnownBadError(CandidateError):
    """The staged candidate's digest failed its health check or its verification in an earlier operation
    (docs/trust.md); ``--retry-known-bad`` offers it again. Nothing was switched. Exit 1."""


# -- transport -------------------------------------------------------------------------------------
class FetchError(UpgradeError):
    """Fetching the archive failed for a transport reason. The URL in the message is redacted."""


class FetchHTTPError(FetchError):
    """The server answered a non-2xx status.

    Attributes:
        status: the HTTP status code.
    """

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class FetchLengthMismatchError(FetchError):
    """The body was shorter or longer than its ``Content-Length``, or ended early (case C06)."""


class FetchContentEncodingError(FetchError):
    """The server applied a ``Content-Encoding`` that cannot be undone (``br``, ``compress``, ...; C27)."""


class FetchRedirectError(FetchError):
    """A redirect broke design §6: scheme change other than http->https, too many hops (case C08)."""


class FetchTimeoutError(FetchError):
    """The transfer exceeded ``download.timeout_s`` or stalled for the idle timeout."""


class FetchCertificateError(FetchError):
    """The server's TLS certificate failed verification against the host's trust (the operating system's
    store plus ``download.ca_file``); the message reads ``<URL>: certificate verify failed: <reason>``."""


# -- host ------------------------------------------------------------------------------------------
class HostError(UpgradeError):
    """The host cannot take the operation as it stands. Exit 1 unless a subclass says otherwise."""


class LockBusyError(HostError):
    """The host lock is held by another process (flock, non-blocking). Exit 75 (EX_TEMPFAIL)."""

    exit_code: ClassVar[int] = 75


class LayoutConflictError(HostError):
    """A real file or directory stands where a link must be, or a link points outside the slots.

    Refused before anything changes. Exit 2.
    """

    exit_code: ClassVar[int] = 2


class NotInstalledError(HostError):
    """``upgrade`` on a host with no installed layout. Exit 2."""

    exit_code: ClassVar[int] = 2


class NothingToRollBackError(HostError):
    """``rollback`` where ``last-good`` is missing, names ``current``'s slot, or names a missing or empty
    slot: refused before any episode opens, the journal unchanged. Exit 2."""

    exit_code: ClassVar[int] = 2


class NothingStagedError(HostError):
    """``activate`` where the journal knows no staged candidate (``upgrade --stage`` was never run, or its
    candidate was replaced, switched to or found changed since), or where ``current`` or ``last-good``
    names the staged slot: refused before any episode opens, the journal unchanged. Exit 2."""

    exit_code: ClassVar[int] = 2


class StagedCandidateChangedError(HostError):
    """``activate`` found the staged slot's bytes no longer hashing to the digest staging recorded (or the
    slot missing or empty): the episode aborts before the switch, the host unchanged, and the journal
    forgets the staged candidate. Exit 1 (aborted)."""


class CompactionHeldError(HostError):
    """``journal compact`` (or the compaction after a close) while a live record must stay where the
    boot-time no-op reader looks for it: a candidate an ``activate`` left stopped waiting for its check
    (design §4.7), or a candidate ``upgrade --in-window`` left for the recovery timer (docs/configuration.md
    ``[schedule]``). Sealing would move that record out of the live segment and the quick path would answer
    "nothing to do". Nothing is sealed or dropped. Exit 2."""

    exit_code: ClassVar[int] = 2


class UnverifiedCurrentError(HostError):
    """``upgrade`` (or ``upgrade --stage``, or a self-upgrade) while ``current`` names a candidate that an
    ``activate`` switched to with the unit stopped and that has not been health-checked yet (design §4.7):
    staging would overwrite the slot ``last-good`` names, the only verified binary. Refused before any
    episode opens, the journal unchanged. Exit 2."""

    exit_code: ClassVar[int] = 2


class AlreadyInstalledError(HostError):
    """``install`` on a host whose slot holds a different binary: "already installed; use upgrade". Exit 2."""

    exit_code: ClassVar[int] = 2


class NoSpaceError(HostError):
    """The slot filesystem lacks room for the member limit, or a write hit ENOSPC (case C05). Exit 1."""


class NoExecError(HostError):
    """The host root is mounted ``noexec``: a staged binary could never run. Exit 2."""

    exit_code: ClassVar[int] = 2


class ActiveMachineError(HostError):
    """A ``[[mirrors]] active_from`` file cannot tell the active machine: unreadable, not the host's own
    (owner, mode), too large, not JSON, or its ``active_key`` names no absolute path (docs/configuration.md
    ``[[mirrors]]``). Exit 2; the message names the file and the key. Before an episode opens nothing was
    changed; at a mirror copy it fails that copy as any mirror failure does."""

    exit_code: ClassVar[int] = 2


class HostMoveRefusedError(HostError):
    """``upgrade-agent host move`` cannot start: the host root is not a link to the legacy root, an episode
    is open, or a slot ``current`` or ``last-good`` names predates the host root (docs/host.md). Exit 2;
    nothing was changed or journaled."""

    exit_code: ClassVar[int] = 2


class HostRefusedError(HostError):
    """The host refused: permission, ownership, file type, read-only file system; nothing was changed.

    Exit 4 (design §10). Raised before any write when a path the agent would open, create or remove fails its
    checks (case C23): a symlink, FIFO, device, directory or hard link where a regular file of ours must
    be; a directory owned by another user or writable by group or others; EACCES, EPERM or EROFS.

    Attributes:
        path: the path refused.
    """

    exit_code: ClassVar[int] = 4

    def __init__(self, path: str, what: str) -> None:
        super().__init__(f"{path}: {what}; nothing was changed")
        self.path = path


class CleanupIncompleteError(HostError):
    """``reset``/``uninstall`` (or a failed install's clean-up) removed part of what it made and could not
    remove the rest: the message names the first path and why; an operator must look. Exit 3 (exit 1 keeps
    its one meaning: rolled back or aborted, design §10)."""

    exit_code: ClassVar[int] = 3


# -- journal ---------------------------------------------------------------------------------------
class JournalError(UpgradeError):
    """The journal cannot be trusted or written; nothing of it can be journaled. Exit 3.

    Its own root (not a :class:`HostError`): a flow never turns it into an ``aborted`` result, because an
    abort would itself need the journal.
    """

    exit_code: ClassVar[int] = 3


class JournalDurabilityError(JournalError):
    """The journal could not make an event durable (ENOSPC, EIO, a poisoning fsync error). Exit 3."""


class JournalUnreadableError(JournalError):
    """The journal cannot be read past a record in the middle (design §4.5 "do not guess", design §5). Exit 3.

    Links are left as they are. Raised by the journal port (``agent.session.wiring.JournalPort``), never
    guessed around.

    Attributes:
        path: the journal file.
        offset: byte offset of the bad record in it.
        reason: one line.
    """

    def __init__(self, path: str, offset: int, reason: str) -> None:
        super().__init__(f"journal unreadable at {path} offset {offset}: {reason}")
        self.path = path
        self.offset = offset
        self.reason = reason


# -- history and services --------------------------------------------------------------------------
class HistoryError(UpgradeError):
    """The journal's events are in an order the lifecycle forbids; nothing is guessed. Exit 3."""

    exit_code: ClassVar[int] = 3


class IllegalTransitionError(HistoryError):
    """``next_state``/``advance`` refused an event: it cannot follow that state (in that episode's context).

    Raised by the fold on replay and by the orchestrator *before* an append (nothing reaches the journal).

    Attributes:
        state: the episode state name before the event.
        event: the event's stable tag.
        seq: the record's sequence number, or None when refused before an append.
        reason: the broken rule beyond the table (e.g. "Aborted after the switch of a upgrade episode"),
            or None when the table itself has no such transition.
    """

    def __init__(self, state: str, event: str, seq: int | None = None, reason: str | None = None) -> None:
        where = f" at seq {seq}" if seq is not None else ""
        why = f": {reason}" if reason else ""
        super().__init__(f"illegal event order{where}: {event} cannot follow state {state}{why}")
        self.state = state
        self.event = event
        self.seq = seq
        self.reason = reason


class ServiceError(UpgradeError):
    """A ``systemctl``/``systemd-run`` call failed or timed out; the message names the command. Exit 1."""


class EpisodeLeftOpenError(UpgradeError):
    """A failure after ``switch intended``: the candidate may be active, so the episode is left to
    ``recover`` rather than reported as "on the previous good binary" (exit 1). Exit 3."""

    exit_code: ClassVar[int] = 3


class Interrupted(UpgradeError):
    """A second SIGINT/SIGTERM arrived; the open episode is left to ``recover``. Exit 130."""

    exit_code: ClassVar[int] = 130
