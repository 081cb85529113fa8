"""Delta upgrades (docs/delta.md) through the real CLI against the private systemd: the candidate is
rebuilt from the current slot and a delta made by the real ``zstd --patch-from``, served on loopback; a
delta that does not apply falls back to the full archive in the same episode (journaled), or, with no
archive, aborts with the host unchanged."""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from agent.testing.releases import agent_script
from tests.agent_fetch._archives import zstd_patch

from . import agent_env
from .agent_env import AgentEnv, Release

pytestmark = pytest.mark.systemd

make_env = agent_env.make_env
release_server = agent_env.release_server

MakeEnv = Callable[..., AgentEnv]


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _publish_delta(env: AgentEnv, base: bytes, target: bytes, name: str) -> tuple[str, str]:
    """``zstd --patch-from=BASE TARGET`` into the served directory; returns (url, sha256 of the delta)."""
    work = env.work / f"delta-{name}"
    work.mkdir()
    served = env.server.directory / f"{env.name}-deltas"
    served.mkdir(exist_ok=True)
    out = served / f"{name}.zst"
    zstd_patch(base, target, work / f"{name}.zst")
    shutil.copyfile(work / f"{name}.zst", out)  # the base and target stay out of the served directory
    return f"{env.server.base}/{served.name}/{out.name}", _sha(out.read_bytes())


def _fetched(env: AgentEnv, operation: str) -> dict[str, object]:
    (fetched,) = [r["event"] for r in env.journal()
                  if r["episode"] == operation and r["event"]["_type"] == "ArchiveFetched"]
    return dict(fetched)


def _upgrade(env: AgentEnv, url: str, sha: str, rel: Release, op: str, *extra: str) -> agent_env.Cli:
    return env.cli("upgrade", "--delta", url, "--delta-sha256", sha, "--member-sha256", rel.member_sha256,
                   "--operation", op, *extra)


def test_a_delta_upgrade_commits_the_exact_target_bytes(make_env: MakeEnv) -> None:
    env = make_env()
    v1, v2 = env.release("1.0.0"), env.release("1.1.0")
    env.install(v1)
    old_pid = env.assert_running("blue", v1)
    target = agent_script("1.1.0")
    url, sha = _publish_delta(env, agent_script("1.0.0"), target, "1.0.0-1.1.0")

    up = _upgrade(env, url, sha, v2, "by-delta")
    assert up.code == 0, up.stderr
    assert up.json is not None and (up.json["result"], up.json["to_version"]) == ("committed", "1.1.0")
    assert env.assert_running("green", v2) != old_pid
    assert (env.lib / f"{env.name}-green").read_bytes() == target
    assert env.slot_sha256("blue") == v1.member_sha256
    fetched = _fetched(env, "by-delta")
    assert fetched["sha256"] == sha and "delta_refused" not in fetched


def test_a_delta_made_against_another_base_falls_back_to_the_archive(make_env: MakeEnv) -> None:
    env = make_env()
    v1, v2 = env.release("1.0.0"), env.release("1.1.0")
    env.install(v1)
    target = agent_script("1.1.0")
    # a base close to the target (so the delta refers to it throughout) that is not what the host runs
    other = target.replace(b"import", b"IMPORT")
    url, sha = _publish_delta(env, other, target, "other-base")

    up = _upgrade(env, url, sha, v2, "fell-back", "--archive", v2.url, "--sha256", v2.sha256)
    assert up.code == 0, up.stderr
    assert up.json is not None and up.json["result"] == "committed"
    env.assert_running("green", v2)
    refused = [ln for ln in up.stderr.splitlines() if "delta refused" in ln]
    assert len(refused) == 1 and "another base" in refused[0] and "Traceback" not in up.stderr, up.stderr
    fetched = _fetched(env, "fell-back")
    assert fetched["sha256"] == v2.sha256
    assert isinstance(fetched["delta_refused"], str) and "another base" in fetched["delta_refused"]
    assert f"sha256 {v1.member_sha256}" in fetched["delta_refused"]


def test_a_delta_that_does_not_apply_without_an_archive_aborts_and_changes_nothing(
    make_env: MakeEnv,
) -> None:
    env = make_env()
    v1, v2 = env.release("1.0.0"), env.release("1.1.0")
    env.install(v1)
    pid = env.assert_running("blue", v1)
    before = sorted(p.name for p in Path(env.lib).iterdir())
    target = agent_script("1.1.0")
    url, sha = _publish_delta(env, target.replace(b"import", b"IMPORT"), target, "no-archive")

    up = _upgrade(env, url, sha, v2, "refused")
    assert up.code == 1, up.stderr
    assert up.json is not None and up.json["result"] == "aborted"
    assert "another base" in (up.json["reason"] or "")
    assert env.assert_running("blue", v1) == pid
    assert sorted(p.name for p in Path(env.lib).iterdir()) == before
    assert env.link("current") == f"{env.name}-blue"


@pytest.mark.parametrize("member", [True, False], ids=["with-member-digest", "frame-checksum"])
def test_a_spool_operation_with_a_delta_commits_by_the_delta(make_env: MakeEnv, member: bool) -> None:
    """The spool spec's ``delta`` {url, sha256} with or without ``memberSHA256`` (docs/managed.md): the
    operator rebuilds the candidate from the current slot (checked by the member digest, or else by the
    frame's checksum); the journal's episode fetched the delta, not the archive."""
    from .test_operator_spool import operator_once, put, spec, spool_env, status

    env, _v1 = spool_env(make_env)
    v2 = env.release("1.1.0")
    url, sha = _publish_delta(env, agent_script("1.0.0"), agent_script("1.1.0"), "spool")
    delta = {"url": url, "sha256": sha} | ({"memberSHA256": v2.member_sha256} if member else {})
    put(env, "op-delta", spec(env, v2, delta=delta))
    out = operator_once(env)
    assert out.code == 0, out.stderr
    env.assert_running("green", v2)
    st = status(env, "op-delta")
    assert st is not None and (st["phase"], st["result"]) == ("Succeeded", "committed")
    fetched = _fetched(env, "op-delta")
    assert fetched["sha256"] == sha and "delta_refused" not in fetched


def test_with_trust_a_signed_delta_commits_and_an_unsigned_one_falls_back_to_the_signed_archive(
    make_env: MakeEnv, tmp_path: Path
) -> None:
    """[trust] (docs/trust.md): the delta's signature is ``<delta>.minisig`` over the delta as published,
    with the release's trusted comment; ``ReleaseTrusted`` is journaled as for an archive. A delta without a
    signature is refused where signatures are required, and the signed archive is the fall-back."""
    from tests.cli.test_signed_releases import keypair, sign

    sec, pub = keypair(tmp_path, "root")
    env = make_env(extra_config=f'[trust]\nroot_keys = ["{pub}"]\n')
    v1, v2 = env.release("1.0.0"), env.release("1.1.0")
    for rel, level in ((v1, 1), (v2, 2)):
        sign(sec, rel.path, f"name={env.name} version={rel.version} security_version={level}")
    env.install(v1)

    unsigned, unsigned_sha = _publish_delta(env, agent_script("1.0.0"), agent_script("1.1.0"), "unsigned")
    up = _upgrade(env, unsigned, unsigned_sha, v2, "unsigned", "--archive", v2.url, "--sha256", v2.sha256)
    assert up.code == 0 and up.json is not None and up.json["result"] == "committed", up.stderr
    fetched = _fetched(env, "unsigned")
    assert fetched["sha256"] == v2.sha256 and "no signature" in str(fetched["delta_refused"])
    env.assert_running("green", v2)

    v3 = env.release("1.2.0")
    url, sha = _publish_delta(env, agent_script("1.1.0"), agent_script("1.2.0"), "signed")
    served = env.server.directory / f"{env.name}-deltas" / "signed.zst"
    sign(sec, served, f"name={env.name} version=1.2.0 security_version=3")
    up = _upgrade(env, url, sha, v3, "signed")
    assert up.code == 0 and up.json is not None and up.json["result"] == "committed", up.stderr
    env.assert_running("blue", v3)
    trusted = [r["event"] for r in env.journal()
               if r["episode"] == "signed" and r["event"]["_type"] == "ReleaseTrusted"]
    assert len(trusted) == 1 and trusted[0]["security_version"] == 3 and trusted[0]["version"] == "1.2.0"
    assert "delta_refused" not in _fetched(env, "signed")
