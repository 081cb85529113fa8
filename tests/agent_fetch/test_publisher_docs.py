"""The publisher commands of docs/trust.md (signed releases), run as written with Debian's real ``minisign``.

The three ```sh blocks after "Publisher, with Debian's `minisign`" are executed line for line by ``sh`` in an
empty directory holding only a release archive; then the host side (the agent's own ``ReleaseTrust`` and
``ArchiveSourceImpl``, on the wall clock: the blocks date the keyring from today) checks what they produced.
Expected outcome: after the first block, the archive stages and is attributed to ``sign1`` through keyring
serial 1; after the signing-key rotation block, it stages with ``sign2``'s signature through serial 2, and
the copy signed by ``sign1`` is refused as revoked; after the root rotation block, a host with both roots
configured and a host that already dropped the old root (its cache signed by it) both take serial 3.
"""

from __future__ import annotations

import datetime as dt
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from agent.release.trust import ReleaseTrust
from upgrade_core.errors import SignatureError

from .test_signatures import cached_keyring, key_id, release, stage
from .test_signatures import trust as trust_at_a_fixed_time

pytestmark = pytest.mark.anyio

TRUST_DOC = Path(__file__).resolve().parents[2] / "docs" / "trust.md"


def publisher_blocks() -> list[str]:
    """The ```sh blocks of the publisher section of docs/trust.md, in order."""
    text = TRUST_DOC.read_text()
    section = text.split("Publisher, with Debian's `minisign`", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```sh\n(.*?)```", section, re.S)
    assert len(blocks) == 3, "docs/trust.md: expected the key-making block and the two rotation blocks"
    return blocks


def trust(d: Path, roots: list[str], keyring: str) -> ReleaseTrust:
    """A host trusting ``roots`` and ``keyring``, its cache under ``d/state``, on the wall clock."""
    return trust_at_a_fixed_time(d, roots, keyring, now=lambda: dt.datetime.now(dt.UTC))


def run_block(block: str, cwd: Path) -> None:
    done = subprocess.run(["sh", "-e", "-c", block], cwd=cwd, capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, f"docs/trust.md block failed:\n{block}\n{done.stderr}"


def fresh(base: Path, n: int) -> Path:
    """A directory for one staging attempt (each writes ``<dir>/stage``, created exclusively)."""
    d = base / f"attempt-{n}"
    d.mkdir()
    return d


def pub_line(cwd: Path, name: str) -> str:
    return (cwd / f"{name}.pub").read_text().splitlines()[1]


async def test_documented_publisher_commands_make_keys_sign_and_rotate(tmp_path: Path) -> None:
    make, rotate, rotate_root = publisher_blocks()
    work = tmp_path / "publisher"
    work.mkdir()
    archive = release(work)  # demo-agent.tar.gz, the file the publisher blocks sign
    run_block(make, work)
    root = pub_line(work, "root")
    host = trust(tmp_path, [root], str(work / "keyring.json"))
    staged = await stage(fresh(tmp_path, 1), str(archive), host)
    assert staged.release is not None and staged.release.key_id == key_id(pub_line(work, "sign1"))
    assert (staged.release.name, staged.release.version, staged.release.security_version) == (
        "demo-agent", "1.2.0", 3,
    )

    old_signed = tmp_path / "old" / archive.name
    old_signed.parent.mkdir()
    shutil.copy(archive, old_signed)
    shutil.copy(f"{archive}.minisig", f"{old_signed}.minisig")
    run_block(rotate, work)
    host = trust(tmp_path, [root], str(work / "keyring.json"))
    staged = await stage(fresh(tmp_path, 2), str(archive), host)
    assert staged.release is not None and staged.release.key_id == key_id(pub_line(work, "sign2"))
    with pytest.raises(SignatureError, match="revoked"):
        await stage(fresh(tmp_path, 3), str(old_signed), host)

    # Root rotation: one host follows the documented steps (both roots during the change); another drops
    # the old root before it took the new root's keyring. Both caches hold serial 2, signed by the old root.
    both, dropped = tmp_path / "host-both-roots", tmp_path / "host-dropped-old-root"
    for n, base in enumerate((both, dropped), start=4):
        base.mkdir()
        await stage(fresh(tmp_path, n), str(archive), trust(base, [root], str(work / "keyring.json")))
    run_block(rotate_root, work)
    root2 = pub_line(work, "root2")
    ring = str(work / "keyring.json")
    for n, (base, roots) in enumerate(((both, [root, root2]), (dropped, [root2])), start=6):
        staged = await stage(fresh(tmp_path, n), str(archive), trust(base, roots, ring))
        assert staged.release is not None and staged.release.key_id == key_id(pub_line(work, "sign2"))
    for base in (both, dropped):
        assert cached_keyring(base) == (work / "keyring.json").read_bytes()
