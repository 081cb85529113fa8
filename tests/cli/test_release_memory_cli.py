"""The anti-rollback watermark and the known-bad memory through the whole CLI (docs/trust.md).

The rig's systemctl is ``/bin/false``, so only refusals before the switch are driven here: the history that
sets the watermark or condemns a release is written into the journal directly (``tests/cli/_journals.py``),
as the orchestrator writes it. Each refusal: exit 1, result ``aborted`` with the reason, the host unchanged.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import attrs

from upgrade_core import Event, UpgradeResult
from upgrade_core import _events as ev

from ._journals import committed_episode, write_journal
from ._rig import Rig, version_script
from .test_signed_releases import keypair, release, sign, trust_root


def refused_before_switch(rig: Rig, op: str, archive: Path, reason: str, *extra: str) -> None:
    """``upgrade --operation op``: exit 1, aborted with ``reason`` in its reason, the host unchanged."""
    before = rig.host_facts()
    run = rig.cli("upgrade", "--archive", str(archive), "--operation", op, *extra)
    assert run.code == 1, run
    run.assert_clean_stderr()
    out = run.payload()
    assert out["result"] == "aborted" and reason in (out["reason"] or ""), out
    assert rig.host_facts() == before
    assert rig.staging_leftovers() == []


def signed_commit(op: str, agent: str, security_version: int) -> list[Event]:
    """A committed upgrade to a signed 2.0.0 whose trusted comment carried ``security_version``."""
    events = committed_episode(op, agent)
    at = next(i for i, e in enumerate(events) if isinstance(e, ev.CandidateVerified)) + 1
    trusted = ev.ReleaseTrusted("0123456789ABCDEF", agent, "2.0.0", security_version)
    return [*events[:at], trusted, *events[at:]]


def rolled_back(op: str, agent: str, sha: str) -> list[Event]:
    """An upgrade blue -> green of member ``sha`` whose two health attempts failed (MainPID changed): rolled
    back to blue."""
    reason = "candidate unhealthy after 2 attempt(s): MainPID changed"
    result = UpgradeResult(op, "rolled_back", "1.0.0", "2.0.0", "blue", reason)
    head = committed_episode(op, agent)[:9]  # opened ... mirrors synced
    head = [ev.CandidateStaged("green", sha, 8192, e.staging_path) if isinstance(e, ev.CandidateStaged)
            else ev.CandidateInstalled("green", sha) if isinstance(e, ev.CandidateInstalled) else e
            for e in head]

    def attempt(n: int, target: ev.HealthTarget, passed: bool) -> list[Event]:
        return [
            ev.HealthAttemptStarted(n, target),
            ev.RestartRequested(f"{agent}-restart-{op[:8]}-{n}-00a{n}", 10.0 * n),
            ev.RestartObserved(4240 + n, f"{n:032x}"),
            ev.HealthPassed(n, target) if passed else ev.HealthFailed(n, "MainPID changed", target),
        ]

    return [
        *head, *attempt(1, "candidate", False), *attempt(2, "candidate", False),
        ev.RollbackStarted(reason, "blue"), *attempt(1, "last_good", True), ev.RolledBack("blue"),
        ev.ResultPublished(result), ev.EpisodeClosed("rolled_back"),
    ]


def test_a_signed_release_below_the_watermark_is_refused(installed_rig: Rig, tmp_path: Path) -> None:
    rig = installed_rig
    sec, pub = keypair(tmp_path, "publisher")
    trust_root(rig, pub)
    write_journal(rig.journal_dir, [("op-high", signed_commit("op-high", rig.name, 5))])
    status = rig.cli("status").payload()
    assert (status["security_watermark"], status["known_bad"]) == (5, []), status
    archive = release(rig, tmp_path, "3.0.0")
    sign(sec, archive, f"name={rig.name} version=3.0.0 security_version=3")
    refused_before_switch(rig, "op-low", archive, "security version 3 is below this host's watermark 5")
    assert rig.cli("status").payload()["security_watermark"] == 5  # a refusal never lowers it


def test_a_rolled_back_release_is_refused_unless_retry_known_bad(installed_rig: Rig, tmp_path: Path) -> None:
    rig = installed_rig
    sha = hashlib.sha256(version_script("2.0.0")).hexdigest()  # the member release() packs
    write_journal(rig.journal_dir, [("op-bad", rolled_back("op-bad", rig.name, sha))])
    status = rig.cli("status").payload()
    assert status["known_bad"] == [{"sha256": sha, "operation": "op-bad"}], status
    assert status["security_watermark"] is None
    archive = release(rig, tmp_path, "2.0.0")
    refusal = f"release {sha[:12]} was rolled back by operation op-bad; --retry-known-bad to try it again"
    refused_before_switch(rig, "op-again", archive, refusal)
    # --retry-known-bad gets past the memory to the version command (here refused for --expect-version, so
    # that the rig never reaches a switch; a mismatch never condemns a release either).
    retry = ("--retry-known-bad", "--expect-version", "9.9.9")
    refused_before_switch(rig, "op-retry", archive, "expected 9.9.9", *retry)
    assert rig.cli("status").payload()["known_bad"] == [{"sha256": sha, "operation": "op-bad"}]


UNSIGNED_REFUSAL = (
    "release is unsigned and this host's watermark is 5: only signed releases are accepted "
    "(upgrade-agent trust reset clears the watermark)"
)


def test_an_unsigned_release_is_refused_on_a_host_with_a_watermark(
    installed_rig: Rig, tmp_path: Path
) -> None:
    """Stripping the signature is no way around the watermark: neither ``require_signatures = false``
    beside a root key nor a configuration without ``[trust]`` lets an unsigned release in once a signed
    one committed."""
    rig = installed_rig
    _sec, pub = keypair(tmp_path, "publisher")
    write_journal(rig.journal_dir, [("op-high", signed_commit("op-high", rig.name, 5))])
    archive = release(rig, tmp_path, "3.0.0")  # no .minisig beside it
    configs = {
        "optional": f'[trust]\nroot_keys = ["{pub}"]\nrequire_signatures = false\n',
        "no-trust": "",
    }
    for op, extra in configs.items():
        rig.write_config(extra=extra)
        before = rig.host_facts()
        run = rig.cli("upgrade", "--archive", str(archive), "--operation", op)
        assert run.code == 1, run
        run.assert_clean_stderr()
        out = run.payload()
        assert (out["result"], out["reason"]) == ("aborted", UNSIGNED_REFUSAL), out
        assert rig.host_facts() == before
        assert rig.staging_leftovers() == []
    assert rig.cli("status").payload()["security_watermark"] == 5


def _staging(events: list[Event], sha: str) -> list[Event]:
    """``events`` with ``sha`` as the staged and installed member's digest."""
    return [attrs.evolve(e, sha256=sha) if isinstance(e, (ev.CandidateStaged, ev.CandidateInstalled)) else e
            for e in events]


def _swapped(events: list[Event]) -> list[Event]:
    """``events`` with the slots blue and green exchanged (an upgrade green -> blue)."""
    other = {"blue": "green", "green": "blue"}

    def swap(value: object) -> object:
        if isinstance(value, UpgradeResult):
            return attrs.evolve(value, slot=other.get(value.slot or "", value.slot))
        return other.get(value, value) if isinstance(value, str) else value

    return [attrs.evolve(e, **{a.name: swap(getattr(e, a.name)) for a in attrs.fields(type(e))})
            for e in events]


def test_a_rollback_below_the_watermark_is_refused_unless_below_watermark(
    installed_rig: Rig, tmp_path: Path
) -> None:
    """Blue holds a release signed at security version 3, green (current) one at 5: ``rollback`` to
    last-good (blue) is refused, naming both numbers and the override; ``--below-watermark`` is journaled."""
    rig = installed_rig

    def digest(slot: str) -> str:  # last-good's level is looked up by the bytes its slot holds
        return hashlib.sha256(rig.slot(slot).read_bytes()).hexdigest()

    write_journal(rig.journal_dir, [
        ("op-three", _staging(_swapped(signed_commit("op-three", rig.name, 3)), digest("blue"))),
        ("op-five", _staging(signed_commit("op-five", rig.name, 5), digest("green"))),
    ])
    current = rig.agent_dir / f"{rig.name}-current"
    current.unlink()
    current.symlink_to(f"{rig.name}-green")
    before = rig.host_facts()
    refusal = (
        "last-good blue has security version 3, below this host's watermark 5; --below-watermark to roll "
        "back anyway, or upgrade-agent trust reset clears the watermark"
    )
    plan = rig.cli("rollback", "--preflight").payload()["plan"]
    assert plan == [f"refuse (aborted, exit 1): {refusal}"], plan
    overridden = rig.cli("rollback", "--preflight", "--below-watermark").payload()["plan"]
    assert overridden[0] == f"override, journaled (--below-watermark): {refusal}", overridden
    assert "switch current from green" in overridden[2], overridden
    run = rig.cli("rollback", "--operation", "rb-refused")
    assert run.code == 1, run
    run.assert_clean_stderr()
    out = run.payload()
    assert (out["result"], out["reason"]) == ("aborted", refusal), out
    assert rig.host_facts() == before
    # The override goes past the refusal to the switch; the rig's systemctl is /bin/false, so neither slot
    # can be restarted (needs_attention, exit 3). The episode's opening records the override.
    override = rig.cli("rollback", "--below-watermark", "--operation", "rb-override")
    override.assert_clean_stderr()
    switched = "upgrade-agent: switched: current -> blue"
    assert override.code == 3 and switched in override.stderr.splitlines(), override
    dump = rig.cli("journal", "dump", json_out=False)
    opened = [line for line in dump.stdout.splitlines() if "EpisodeOpened operation=rb-" in line]
    assert len(opened) == 2, dump.stdout
    assert "below_watermark=true" not in opened[0] and opened[1].endswith(" below_watermark=true"), opened
    assert rig.cli("status").payload()["security_watermark"] == 5
