"""Generated archives: accepted exactly when design §6's rules say so, and nothing else is ever written.

The expected verdict is computed from the generation parameters by the small oracle below (its own
reading of the rules), never by calling product code.
"""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path

import anyio
import attrs
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from agent.release.extract import ExtractLimits
from upgrade_core.errors import ArchiveLimitError, ArchiveRejectedError, ArchiveTruncatedError, CandidateError

from ._archives import HOWS, KINDS, Entry, compress, tar_bytes, tar_end_offset, tree
from .conftest import MEMBER, run_extract

NAMES = [
    MEMBER,
    "./" + MEMBER,
    "bin/" + MEMBER,
    "LICENSE",
    "docs/README.md",
    "bin",
    "../" + MEMBER,
    "../../etc/cron.d/x",
    "/" + MEMBER,
    "/etc/passwd",
    f"x/../{MEMBER}",
]


@attrs.frozen
class Case:
    entries: tuple[Entry, ...]
    how: str
    policy: str
    max_entries: int
    max_member_bytes: int
    cut: float | None


BENIGN = ["LICENSE", "docs/README.md", "bin", "bin/" + MEMBER, "docs/"]


def _entry(draw: st.DrawFn, name: str, kind: str | None = None) -> Entry:
    kind = kind or draw(st.sampled_from(KINDS) if draw(st.booleans()) else st.just("reg"))
    if kind == "reg":
        size = draw(st.sampled_from([0, 1, 511, 512, 513, 3000]))
        seed = draw(st.binary(min_size=min(size, 8), max_size=min(size, 8)))
        return Entry(name, kind="reg", data=(seed + bytes(range(256)) * 12)[:size])
    target = "../../../usr/bin/sudo" if kind in ("sym", "lnk") else ""
    return Entry(name, kind=kind, linkname=target)


@st.composite
def cases(draw: st.DrawFn) -> Case:
    """Half the time a plausible release archive (benign names plus the member), else anything."""
    n = draw(st.integers(1, 5))
    if draw(st.booleans()):
        entries = [_entry(draw, draw(st.sampled_from(BENIGN))) for _ in range(n - 1)]
        member_name = draw(st.sampled_from([MEMBER, "./" + MEMBER]))
        kind = draw(st.sampled_from(["reg"] * 6 + list(KINDS)))
        entries.insert(draw(st.integers(0, n - 1)), _entry(draw, member_name, kind))
    else:
        entries = [_entry(draw, draw(st.sampled_from(NAMES))) for _ in range(n)]
    cut = draw(st.sampled_from([None, None, "cut"]))
    return Case(
        entries=tuple(entries),
        how=draw(st.sampled_from(HOWS)),
        policy=draw(st.sampled_from(["exact", "select", "select", "none"])),
        max_entries=draw(st.sampled_from([3, 10000, 10000])),
        max_member_bytes=draw(st.sampled_from([1000, 1 << 20, 1 << 20])),
        cut=None if cut is None else draw(st.floats(0.0, 0.999)),
    )


def _parts(name: str) -> tuple[str, ...]:
    return tuple(p for p in name.split("/") if p not in ("", "."))


def oracle(case: Case, data: bytes) -> tuple[set[type[Exception]], bytes | None]:
    """(error classes the rules allow, member bytes if the archive must be accepted).

    Policy "none": the file itself is the member, whatever it holds (never unpacked): accepted when it
    is non-empty and within max_member_bytes."""
    if case.policy == "none":
        if not data:
            return {ArchiveRejectedError}, None
        if len(data) > case.max_member_bytes:
            return {ArchiveLimitError}, None
        return set(), data
    broken: set[type[Exception]] = set()
    want = (MEMBER,)
    if len(case.entries) > case.max_entries:
        broken.add(ArchiveLimitError)
    for e in case.entries:
        if e.name.startswith("/") or ".." in _parts(e.name):
            broken.add(ArchiveRejectedError)
    matches = [e for e in case.entries if _parts(e.name) == want]
    if case.policy == "exact" and (len(case.entries) != 1 or not matches):
        broken.add(ArchiveRejectedError)
    if len(matches) != 1:
        broken.add(ArchiveRejectedError)
    if matches:
        m = matches[0]
        if m.kind != "reg" or not m.data:
            broken.add(ArchiveRejectedError)
        elif len(m.data) > case.max_member_bytes:
            broken.add(ArchiveLimitError)
    return broken, (matches[0].data if not broken else None)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_generated_archives(case: Case) -> None:
    raw = tar_bytes(case.entries)
    data = compress(raw, case.how)
    if case.cut is not None:
        cut_at = int(len(data) * case.cut)
        complete = case.how == "tar" and cut_at >= tar_end_offset(case.entries) + 1024
        data = data[:cut_at]
    allowed, member = oracle(case, data)
    if case.cut is not None and case.policy != "none" and not complete:
        # A cut compressed stream is the one truncated/corrupt error. A plain tar: empty is truncated; cut
        # before its ustar magic (offset 257) it cannot be told from any other short file, "not an
        # archive" (docs/candidate.md); later, a cut inside a header may also be read as an
        # invalid header.
        if case.how != "tar" or cut_at == 0:
            allowed |= {ArchiveTruncatedError}
        elif cut_at < 262:
            allowed |= {ArchiveRejectedError}
        else:
            allowed |= {ArchiveTruncatedError, ArchiveRejectedError}
        member = None
    limits = ExtractLimits(max_entries=case.max_entries, max_member_bytes=case.max_member_bytes)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "slots").mkdir()
        staging = root / "slots" / ".stage"
        before = tree(tmp)
        try:
            result = anyio.run(
                lambda: run_extract(data, staging, policy=case.policy, limits=limits)  # type: ignore[arg-type]
            )
        except CandidateError as exc:
            assert member is None, f"refused an archive the rules accept: {exc!r}"
            assert type(exc) in allowed, f"{exc!r} not among {allowed}"
            assert tree(tmp) == before
            event(f"refused: {type(exc).__name__}")
            return
        event("accepted")
        assert member is not None, f"accepted an archive the rules refuse ({allowed})"
        assert staging.read_bytes() == member
        assert result.member_sha256 == hashlib.sha256(member).hexdigest()
        after = tree(tmp)
        assert set(after) - set(before) == {"slots/.stage"}
