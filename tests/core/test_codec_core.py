"""Codec round trip for every event the flows write, and the pinned stable tags."""

from __future__ import annotations

import pytest

from upgrade_core import ALL_EVENTS, EVENT_CODEC, EventDecodeError
from upgrade_core import _events as ev

from .journals import FULL_COMMIT, FULL_ROLLBACK

PINNED_TAGS = {
    "EpisodeOpened", "ArchiveFetched", "CandidateStaged", "CandidateVerified", "CandidateUnchanged",
    "CandidateInstalled", "LastGoodRepointed", "SwitchIntended", "SwitchCommitted", "MirrorsSynced",
    "RestartRequested", "RestartObserved", "HealthAttemptStarted", "HealthPassed", "HealthFailed",
    "UpgradeCommitted", "RollbackStarted", "RolledBack", "AttentionNeeded", "Aborted", "ResultPublished",
    "EpisodeClosed", "RecoveryStarted", "HistorySnapshot", "JournalQuarantined", "ReleaseTrusted",
    "TrustReset", "StagedForActivation", "StagedCandidateChecked", "UnitFoundStopped", "LeftStopped",
    "HostMoveIntended", "HostMoved",
}


def test_tags_are_pinned() -> None:
    assert {cls.TAG for cls in ALL_EVENTS} == PINNED_TAGS
    assert all(cls.__name__ == cls.TAG for cls in ALL_EVENTS)


QUARANTINED = ev.JournalQuarantined(
    "/var/lib/upgrade-agent/a/quarantine/20260101T000000Z/journal", "green", "2" * 64, "2.0.0", "blue",
    "1" * 64, "1.0.0",
)


def test_journal_quarantined_golden_payload() -> None:
    """The stable tag and field names of the quarantine record, as bytes on disk (design §10)."""
    assert EVENT_CODEC.encode(QUARANTINED) == (
        b'{"quarantine_path":"/var/lib/upgrade-agent/a/quarantine/20260101T000000Z/journal",'
        b'"current_slot":"green","current_sha256":"' + b"2" * 64 + b'","current_version":"2.0.0",'
        b'"last_good_slot":"blue","last_good_sha256":"' + b"1" * 64 + b'","last_good_version":"1.0.0",'
        b'"_type":"JournalQuarantined"}'
    )


TRUST_RESET = ev.TrustReset(7, ("a" * 64,))

FACTS_SNAPSHOT = ev.HistorySnapshot(
    (ev.EpisodeSummary(
        "op1", ev.UpgradeResult("op1", "committed", "1.0.0", "2.0.0", "green"), 1.0, 2.0, "b" * 64, 7, False,
        opened_seq=1, published_seq=20, boot_id="d" * 32, kind="upgrade",
    ),),
    ev.JournalFacts(
        21, None, (ev.WatermarkRaise(18, 7),), (ev.KnownBadMark(9, "a" * 64, "op0", "health"),),
        (ev.SlotVersion(12, "green", "2.0.0"),),
    ),
)


MOVE_INTENDED = ev.HostMoveIntended(
    "/opt/upgrade-agent", "/usr/local", "/opt/.upgrade-agent.move-0123abcd", "green", "2" * 64, "blue",
    "1" * 64,
)


def test_host_move_golden_payloads() -> None:
    """The stable tags and field names of the host move's intent and completion (docs/host.md)."""
    assert EVENT_CODEC.encode(MOVE_INTENDED) == (
        b'{"root":"/opt/upgrade-agent","legacy_root":"/usr/local",'
        b'"staging_path":"/opt/.upgrade-agent.move-0123abcd","current_slot":"green","current_sha256":"'
        + b"2" * 64 + b'","last_good_slot":"blue","last_good_sha256":"' + b"1" * 64
        + b'","_type":"HostMoveIntended"}'
    )
    assert EVENT_CODEC.encode(ev.HostMoved("/opt/upgrade-agent")) == (
        b'{"root":"/opt/upgrade-agent","_type":"HostMoved"}'
    )


def test_a_slot_fact_keeps_its_bytes_without_a_digest_and_carries_one_when_set() -> None:
    """``SlotVersion.sha256`` (the installed bytes a host move judges) is written only when set."""
    plain = ev.HistorySnapshot((), ev.JournalFacts(3, slot_versions=(ev.SlotVersion(2, "blue", "1.0.0"),)))
    assert b"sha256" not in EVENT_CODEC.encode(plain)
    assert EVENT_CODEC.decode(EVENT_CODEC.encode(plain)) == plain
    with_digest = ev.HistorySnapshot((), ev.JournalFacts(3, slot_versions=(
        ev.SlotVersion(2, "blue", "1.0.0", "a" * 64),)))
    assert b'"sha256":"' + b"a" * 64 in EVENT_CODEC.encode(with_digest)
    assert EVENT_CODEC.decode(EVENT_CODEC.encode(with_digest)) == with_digest


def test_trust_reset_golden_payload() -> None:
    """The stable tag and field names of the trust reset record (docs/trust.md), as bytes on disk."""
    assert EVENT_CODEC.encode(TRUST_RESET) == (
        b'{"security_watermark":7,"known_bad":["' + b"a" * 64 + b'"],"_type":"TrustReset"}'
    )


def test_snapshot_without_facts_keeps_its_bytes() -> None:
    """A snapshot and summaries without the fields added for kept facts encode as they always did."""
    old = ev.HistorySnapshot((ev.EpisodeSummary("op1", ev.UpgradeResult("op1", "noop"), 1.0, 2.0),))
    assert b"facts" not in EVENT_CODEC.encode(old)
    assert b"opened_seq" not in EVENT_CODEC.encode(old)
    assert EVENT_CODEC.decode(EVENT_CODEC.encode(old)) == old


@pytest.mark.parametrize("event", [*FULL_COMMIT, *FULL_ROLLBACK, ev.CandidateUnchanged("blue", None),
                                   QUARANTINED, TRUST_RESET, FACTS_SNAPSHOT,
                                   ev.StagedForActivation("green", "c" * 64, "2.0.0", "a" * 64),
                                   ev.StagedCandidateChecked("op0", "green", "c" * 64, None, "2.0.0"),
                                   ev.UnitFoundStopped("inactive", "dead"), ev.LeftStopped("green"),
                                   MOVE_INTENDED, ev.HostMoved("/opt/upgrade-agent")],
                         ids=lambda e: e.TAG)
def test_round_trip(event: ev.Event) -> None:
    assert EVENT_CODEC.decode(EVENT_CODEC.encode(event)) == event


@pytest.mark.parametrize(("payload", "message"), [
    (b'{"_type":"Nope"}', "unknown event tag 'Nope'"),
    (b'{"_type":"Aborted","_v":2,"reason":"x"}', "payload version 2"),
    (b'{"_type":"Aborted","reason":"x","extra":1}', "does not fit"),
    (b'[1]', "not a JSON object"),
    (b'{', "not JSON"),
])
def test_bad_payloads_raise_one_clear_error(payload: bytes, message: str) -> None:
    with pytest.raises(EventDecodeError, match=message):
        EVENT_CODEC.decode(payload)


def test_archive_fetched_keeps_its_bytes_and_carries_a_delta_fall_back_only_when_set() -> None:
    """``ArchiveFetched.delta_refused`` (docs/delta.md) is omitted on disk while None, so a full-archive
    upgrade writes the bytes it always did and older journals decode; a fall-back's reason round-trips."""
    plain = ev.ArchiveFetched(1234, "a" * 64)
    golden = b'{"size":1234,"sha256":"' + b"a" * 64 + b'","_type":"ArchiveFetched"}'
    assert EVENT_CODEC.encode(plain) == golden
    assert EVENT_CODEC.decode(EVENT_CODEC.encode(plain)) == plain
    fell_back = ev.ArchiveFetched(1234, "a" * 64, "https://r.example/d.zst: the delta does not apply")
    assert EVENT_CODEC.decode(EVENT_CODEC.encode(fell_back)) == fell_back
    reason = b'"delta_refused":"https://r.example/d.zst: the delta does not apply"'
    assert reason in EVENT_CODEC.encode(fell_back)
