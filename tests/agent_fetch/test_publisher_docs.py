"""The publisher commands of docs/trust.md (signed releases), run as written with Debian's real ``minisign``.

The two ```sh blocks after "Publisher, with Debian's `minisign`" are executed line for line by ``sh`` in an
empty directory holding only a release archive; then the host side (the agent's own ``ReleaseTrust`` and
``ArchiveSourceImpl``) checks what they produced. Expected outcome: after the first block, the archive
stages and is attributed to ``sign1`` through keyring serial 1; after the rotation block, it stages with
``sign2``'s signature through serial 2, and the copy signed by ``sign1`` is refused as revoked.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from upgrade_core.errors import SignatureError

from .test_signatures import key_id, release, stage, trust

pytestmark = pytest.mark.anyio

TRUST_DOC = Path(__file__).resolve().parents[2] / "docs" / "trust.md"


def publisher_blocks() -> list[str]:
    """The ```sh blocks of the publisher section of docs/trust.md, in order."""
    text = TRUST_DOC.read_text()
    section = text.split("Publisher, with Debian's `minisign`", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```sh\n(.*?)```", section, re.S)
    assert len(blocks) == 2, "docs/trust.md: expected the key-making block and the rotation block"
    return blocks


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
    make, rotate = publisher_blocks()
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
