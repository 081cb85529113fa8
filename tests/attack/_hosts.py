"""Hosts to attack: templates made once by the real CLI, fresh copies per example, canaries outside.

A template is one agent's whole tree as the agent leaves it, made by the real ``upgrade-agent`` (config,
host root, ``state_dir`` with its journal, a result, the install record and the trust cache, the lock, the
spool with an operation, a mirror). Each example copies it to a fresh directory (modes kept, every path
root's as in the template, absolute paths in the configuration and the install record rewritten), so one
example never sees another's damage. Everything outside the copy's ``host/`` that an attack points at
lives in ``outside/``: :func:`outside_facts` reads every entry there (type, mode, owner, inode, bytes or
link target), and the attacks' canary programs leave :data:`EXEC_MARK` there when run, so a write, a
removal, a creation or an ``exec`` outside shows as a difference.

``host.systemctl_prefix`` is ``/bin/false`` (``tests/cli/_rig.py``): no command here reaches a service
manager; ``install``, ``upgrade`` and ``rollback`` end at their first restart (exit 1 or 3), after every
filesystem step before it has run (staging, the switch, the install record, mirror sync, the keyring cache).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

import attrs
from hypothesis import HealthCheck, settings

from tests.cli._rig import PYTHON, REPO, Rig, Run, cli_env, version_script
from tests.cli.test_signed_releases import keypair, sign

NOBODY = 65534
NAME = "atk"
LONG = os.environ.get("UPGRADE_CORE_LONG") == "1"
TIMEOUT_S = 60.0  # per command: a FIFO that makes a command wait fails the test instead of hanging it
EXEC_MARK = "EXECUTED-BY-ROOT"
OPERATION = "op-1"
RACE_ITERATIONS = 200 if LONG else 20
"""CLI runs per race test: 20 in ``make test``, 200 in ``make test-long`` (``UPGRADE_CORE_LONG=1``)."""

# Hypothesis profiles of this package: ``attack`` (``make test``: 20 hostile trees per command) and
# ``attack-long`` (``UPGRADE_CORE_LONG=1``, ``make test-long``: 200). Tests apply ATTACK_SETTINGS; neither
# profile is loaded globally, so the rest of the suite keeps its settings. No deadline: one example is a whole
# CLI run (about half a second, more on a loaded machine); the examples draw from a fixed table, so shrinking
# is quick.
settings.register_profile("attack", max_examples=20, deadline=None,
                          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
settings.register_profile("attack-long", settings.get_profile("attack"), max_examples=200)
ATTACK_SETTINGS = settings.get_profile("attack-long" if LONG else "attack")


@attrs.frozen
class Template:
    """One prepared tree: ``base/host`` holds the agent's paths, ``base/outside`` is empty (the attacks'
    canaries go there); ``archive`` is the signed candidate 2.0.0 (shared by the templates)."""

    base: Path
    archive: Path


def make_base(prefix: str) -> Path:
    """A fresh 0755 directory under ``/tmp`` (an unprivileged child can traverse it, unlike pytest's
    0700 ``tmp_path``)."""
    d = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    d.chmod(0o755)
    return d


def rig_at(base: Path) -> Rig:
    """The :class:`Rig` whose paths lie under ``base/host`` (the configuration is not rewritten)."""
    rig = Rig.__new__(Rig)
    rig.base, rig.name = base / "host", NAME
    rig.root, rig.state_dir = rig.base / "root", rig.base / "state"
    rig.lock_path, rig.unit_dir = rig.base / "run" / f"{NAME}.lock", rig.base / "units"
    rig.config, rig.agent_dir = rig.base / "etc" / f"{NAME}.toml", rig.base / "root" / "lib" / NAME
    return rig


def _config_extra(host: Path, release: Path, root_pub: str) -> str:
    return (
        f'[operations]\nsource = "spool"\nspool_dir = "{host / "spool"}"\nnode_name = "n1"\npoll_s = 0.1\n\n'
        f'[trust]\nroot_keys = ["{root_pub}"]\nkeyring = "{release / "keyring.json"}"\n\n'
        # the mirror tree may belong to another uid (a container's root): the copy is confined beneath it
        f'[[mirrors]]\npath = "{host / "mirror" / "bin" / NAME}"\nroot = "{host / "mirror"}"\n'
    )


def _release(base: Path) -> tuple[Path, str]:
    """A root key, a signing key, a root-signed keyring naming it, and the candidate 2.0.0 (a bare
    executable, ``member_policy = "none"``) signed by it. Returns (candidate, root public key)."""
    release = base / "release"
    release.mkdir()
    root_sec, root_pub = keypair(release, "root")
    sec, pub = keypair(release, "sign1")
    ring = release / "keyring.json"
    ring.write_text(json.dumps({"serial": 1, "expires": "2099-01-01T00:00:00Z",
                                "keys": [{"public_key": pub, "expires": "2099-01-01T00:00:00Z"}],
                                "revoked": []}))
    sign(root_sec, ring, "keyring")
    candidate = release / "candidate"
    candidate.write_bytes(version_script("2.0.0"))
    candidate.chmod(0o755)
    sign(sec, candidate, f"name={NAME} version=2.0.0 security_version=1")
    return candidate, root_pub


def _record(rig: Rig) -> bytes:
    """The install record ``install`` would have written for this layout (every entry it creates)."""
    lay = [("dir", rig.root / "lib"), ("dir", rig.agent_dir), ("file", rig.slot("blue")),
           ("link", rig.agent_dir / f"{NAME}-current"), ("link", rig.agent_dir / f"{NAME}-last-good"),
           ("dir", rig.root / "bin"), ("link", rig.root / "bin" / NAME)]
    units = [("unit", rig.unit_dir / n) for n in sorted(rig.rendered_units())]
    entries = [{"kind": k, "path": str(p)} for k, p in lay + units]
    return (json.dumps({"format": 1, "agent": NAME, "unit": f"{NAME}.service", "config": str(rig.config),
                        "entries": entries}) + "\n").encode()


def cli(rig: Rig, *argv: str) -> Run:
    """``upgrade-agent --config C --json ARGV`` bounded by :data:`TIMEOUT_S`."""
    args = [PYTHON, "-m", "agent.cli.main", "--config", str(rig.config), "--json", *argv]
    done = subprocess.run(args, cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=TIMEOUT_S,
                          check=False)
    return Run(tuple(argv), done.returncode, done.stdout, done.stderr)


def make_templates(base: Path) -> dict[str, Template]:
    """``installed``: a host after an upgrade that reached its restart (journal, a result, the keyring
    cache, a synced mirror), ``last-good`` naming green so ``rollback`` has work, the install record, and the
    spool holding an operation addressed to another agent (a pass refuses it and writes its status).
    ``bare``: the configuration, an empty host root with ``lib/`` and ``bin/``, nothing else
    (what ``install`` meets)."""
    candidate, root_pub = _release(base)
    out: dict[str, Template] = {}
    for kind in ("installed", "bare"):
        tbase = base / kind
        tbase.mkdir()
        rig = Rig(tbase / "host", NAME)
        rig.write_config(_config_extra(rig.base, candidate.parent, root_pub),
                         agent_extra='member_policy = "none"')
        (tbase / "outside").mkdir()
        if kind == "bare":
            for d in (rig.root, rig.root / "lib", rig.root / "bin", rig.unit_dir):
                d.mkdir(mode=0o755)
            out[kind] = Template(tbase, candidate)
            continue
        rig.install_by_hand()
        (rig.base / "mirror" / "bin").mkdir(parents=True)
        spool = rig.base / "spool"
        spool.mkdir(mode=0o700)
        op = spool / f"{OPERATION}.json"
        op.write_text(json.dumps({"agent": "another-agent", "nodeName": "n1",
                                  "archive": {"url": "https://releases.example/a", "sha256": "0" * 64}}))
        op.chmod(0o600)
        run = cli(rig, "upgrade", "--archive", str(candidate), "--operation", "tpl-upgrade")
        assert run.code == 3 and (rig.state_dir / "trust" / "keyring.json").is_file(), run
        assert (rig.base / "mirror" / "bin" / NAME).is_file(), run
        last_good = rig.agent_dir / f"{NAME}-last-good"
        last_good.unlink()
        last_good.symlink_to(f"{NAME}-green")
        record = rig.state_dir / "install.json"
        record.write_bytes(_record(rig))
        record.chmod(0o600)
        out[kind] = Template(tbase, candidate)
    return out


def copy_template(template: Template, dest: Path) -> Rig:
    """Copy ``template.base`` to ``dest`` (ownership, modes and links kept) and point the configuration and
    the install record at the copy; returns the copy's :class:`Rig`."""
    shutil.copytree(template.base, dest, symlinks=True)
    os.chmod(dest, 0o755)
    old, new = str(template.base), str(dest)
    rig = rig_at(dest)
    for path in (rig.config, rig.state_dir / "install.json"):
        if path.is_file():
            mode = stat.S_IMODE(path.stat().st_mode)
            path.write_text(path.read_text().replace(old, new))
            path.chmod(mode)
    return rig


# -- the outside -----------------------------------------------------------------------------------------
Fact = tuple[str, int, int, int, int, int, str]


def outside_facts(outside: Path) -> dict[str, Fact]:
    """Every entry under ``outside`` (itself included): (type, mode, uid, gid, inode, mtime in ns, sha256 of
    a file's bytes or a link's target). Never opens a FIFO.

    The mtime shows a change undone before the command ended: a file written and restored, an entry created
    in a directory and removed again (the directory's mtime moves). The ctime is left out: removing a hard
    link's other name, in the agent's own directory, changes only the link count."""
    out: dict[str, Fact] = {}
    paths = [str(outside)]
    for dirpath, dirnames, filenames in os.walk(outside):
        paths += [os.path.join(dirpath, n) for n in dirnames + filenames]
    for p in paths:
        st = os.lstat(p)
        if stat.S_ISREG(st.st_mode):
            kind, detail = "file", hashlib.sha256(Path(p).read_bytes()).hexdigest()
        elif stat.S_ISLNK(st.st_mode):
            kind, detail = "link", os.readlink(p)
        else:
            kind, detail = ("dir" if stat.S_ISDIR(st.st_mode) else "other"), ""
        out[os.path.relpath(p, outside)] = (kind, stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, st.st_ino,
                                            st.st_mtime_ns, detail)
    return out


def canary_program(outside: Path, original: bytes) -> bytes:
    """A canary that leaves :data:`EXEC_MARK` in ``outside`` when run, then behaves as ``original`` would
    (its version command answers): an ``exec`` outside shows even when the command succeeds."""
    body = original.split(b"\n", 1)[1] if original.startswith(b"#!") else b""
    return f"#!/bin/sh\n: > {outside / EXEC_MARK}\n".encode() + body


def assert_outside_untouched(outside: Path, before: dict[str, Fact], run: Run | None = None) -> None:
    """Nothing under ``outside`` was written, removed, created, renamed over, chmod-ed, chown-ed or run."""
    assert not (outside / EXEC_MARK).exists(), f"a canary outside was executed ({run})"
    after = outside_facts(outside)
    changed = {k: (before.get(k), after.get(k)) for k in set(before) | set(after)
               if before.get(k) != after.get(k)}
    assert not changed, f"outside changed: {changed} ({run})"


def is_refusal_naming(run: Run, path: str, codes: tuple[int, ...] = (2, 4)) -> bool:
    """Exit in ``codes`` (4 or 2), one JSON error object naming ``path`` (``PATH: what is wrong``) and the
    same one line last on stderr, no traceback."""
    if run.code not in codes or "Traceback" in run.stderr + run.stdout:
        return False
    try:
        error = run.payload().get("error")
    except (AssertionError, ValueError):
        return False
    lines = run.error_lines()
    named = isinstance(error, str) and f"{path}: " in error
    return named and bool(lines) and lines[-1] == f"upgrade-agent: {error}"


def argv_of(command: str, archive: Path) -> Sequence[str]:
    """The command line of each attacked command (the candidate given where one is needed)."""
    return {
        "install": ["install", "--archive", str(archive)],
        "upgrade": ["upgrade", "--archive", str(archive), "--retry-known-bad"],
        "rollback": ["rollback"],
        "recover": ["recover"],
        "reset": ["reset"],
        "uninstall": ["uninstall"],
        "status": ["status"],
        "journal verify": ["journal", "verify"],
        "journal dump": ["journal", "dump"],
        "operator spool pass": ["operator", "--once"],
    }[command]
