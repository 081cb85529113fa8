"""``upgrade --delta`` and ``delta make`` through the whole CLI (docs/delta.md).

The rig's systemctl is ``/bin/false``, so only what happens before the switch is driven here: usage errors
(exit 2, nothing created) and hostile deltas (exit 1, ``aborted``, the host unchanged, no staging file). The
committed delta upgrade and the fall-back run against the private systemd (``tests/systemd/test_delta.py``).
"""

from __future__ import annotations

import hashlib
import random
import subprocess
from pathlib import Path

import pytest
import zstandard

from tests.agent_fetch._archives import zstd_patch

from ._rig import Rig, version_script

pytestmark = pytest.mark.skipif(
    subprocess.run(["which", "zstd"], capture_output=True).returncode != 0, reason="needs the real zstd tool"
)

JUNK = random.Random(11).randbytes(512 * 1024)  # after `exec sleep`: never read by the shell


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _binary(version: str, junk: bytes = JUNK) -> bytes:
    """A slot binary of 512 KiB: the version script, then bytes the shell never reaches."""
    return version_script(version) + b"\n" + junk


def _installed(rig: Rig) -> bytes:
    """The rig's layout with a 512 KiB current slot (blue, 1.0.0); returns its bytes."""
    rig.install_by_hand()
    blue = _binary("1.0.0")
    rig.slot("blue").write_bytes(blue)
    return blue


def _refused(
    rig: Rig, delta: Path, member_sha256: str, words: str, *, delta_sha256: str | None = None
) -> str:
    before = rig.host_facts()
    digest = delta_sha256 or _sha(delta.read_bytes())
    run = rig.cli("upgrade", "--delta", str(delta), "--delta-sha256", digest,
                  "--member-sha256", member_sha256, "--operation", "refused")
    assert run.code == 1, run
    run.assert_clean_stderr()
    out = run.payload()
    assert out["result"] == "aborted" and words in (out["reason"] or ""), out
    assert "\n" not in out["reason"]
    assert rig.host_facts() == before
    assert rig.staging_leftovers() == []
    return str(out["reason"])


def test_a_delta_against_another_base_is_refused_naming_the_current_slot(
    installed_rig: Rig, tmp_path: Path
) -> None:
    rig = installed_rig
    blue = _binary("1.0.0")
    rig.slot("blue").write_bytes(blue)
    # made from a base that shares its bulk with the target, so the delta refers to it throughout
    junk = random.Random(12).randbytes(len(JUNK))
    target = _binary("2.0.0", junk)
    delta = zstd_patch(_binary("1.0.0", junk), target, tmp_path / "other.zst")
    reason = _refused(rig, delta, _sha(target), "another base")
    assert f"slot blue ({rig.slot('blue')}) (sha256 {_sha(blue)})" in reason


def test_a_corrupt_delta_is_refused_by_its_digest(rig: Rig, tmp_path: Path) -> None:
    blue = _installed(rig)
    target = _binary("2.0.0")
    good = zstd_patch(blue, target, tmp_path / "good.zst")
    data = bytearray(good.read_bytes())
    data[len(data) // 2] ^= 0x40
    bad = tmp_path / "bad.zst"
    bad.write_bytes(bytes(data))
    published = _sha(good.read_bytes())
    _refused(rig, bad, _sha(target), f"the delta's sha256 is not the expected {published}",
             delta_sha256=published)


def test_a_truncated_delta_is_refused(rig: Rig, tmp_path: Path) -> None:
    blue = _installed(rig)
    target = _binary("2.0.0")
    good = zstd_patch(blue, target, tmp_path / "good.zst")
    cut = tmp_path / "cut.zst"
    cut.write_bytes(good.read_bytes()[:-7])
    _refused(rig, cut, _sha(target), "archive truncated/corrupt")


def test_a_window_above_twice_max_member_bytes_is_refused(rig: Rig, tmp_path: Path) -> None:
    blue = _installed(rig)
    rig.write_config("[limits]\nmax_member_bytes = 1048576\n")
    params = zstandard.ZstdCompressionParameters.from_level(3, window_log=23)
    dictionary = zstandard.ZstdCompressionDict(blue, dict_type=zstandard.DICT_TYPE_RAWCONTENT)
    stream = zstandard.ZstdCompressor(dict_data=dictionary, compression_params=params).compressobj()
    target = _binary("2.0.0")
    wide = tmp_path / "wide.zst"
    wide.write_bytes(stream.compress(target) + stream.flush())
    refusal = "asks for a 8388608-byte window, above 2 * limits.max_member_bytes = 2097152"
    _refused(rig, wide, _sha(target), refusal)


def test_a_decompression_bomb_stops_at_max_member_bytes(rig: Rig, tmp_path: Path) -> None:
    """256 MiB of zeros in a frame that names no content size and a window within the limit: the output
    stops as it passes max_member_bytes."""
    blue = _installed(rig)
    rig.write_config("[limits]\nmax_member_bytes = 1048576\n")
    params = zstandard.ZstdCompressionParameters.from_level(3, window_log=20, write_content_size=0)
    dictionary = zstandard.ZstdCompressionDict(blue, dict_type=zstandard.DICT_TYPE_RAWCONTENT)
    stream = zstandard.ZstdCompressor(dict_data=dictionary, compression_params=params).compressobj()
    bomb = tmp_path / "bomb.zst"
    bomb.write_bytes(b"".join(stream.compress(bytes(1 << 20)) for _ in range(256)) + stream.flush())
    assert bomb.stat().st_size < 64 * 1024
    _refused(rig, bomb, "0" * 64, "limits.max_member_bytes = 1048576")


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["--delta", "D"], "upgrade --delta needs --delta-sha256 HEX"),
        (["--delta", "D", "--delta-sha256", "a" * 64, "--member-sha256", "xyz"],
         "--member-sha256: expected 64 hex digits (optionally 'sha256:' first)"),
        (["--delta", "D", "--delta-sha256", "xyz", "--member-sha256", "a" * 64],
         "--delta-sha256: expected 64 hex digits (optionally 'sha256:' first)"),
        (["--delta", "D", "--delta-sha256", "a" * 64, "--member-sha256", "a" * 64, "--sha256", "b" * 64],
         "--sha256 is the fall-back archive's: it needs --archive"),
        (["--delta", "/nonexistent/d.zst", "--delta-sha256", "a" * 64, "--member-sha256", "a" * 64],
         "--delta /nonexistent/d.zst: No such file or directory"),
        ([], "upgrade needs --archive SRC or --delta SRC"),
        (["--archive", "A", "--member-sha256", "a" * 64],
         "--delta-sha256 and --member-sha256 go with --delta"),
    ],
)
def test_usage_errors_change_nothing(installed_rig: Rig, tmp_path: Path, argv: list[str], line: str) -> None:
    rig = installed_rig
    (tmp_path / "D").write_bytes(b"x")
    (tmp_path / "A").write_bytes(b"x")
    argv = [str(tmp_path / a) if a in ("D", "A") else a for a in argv]
    before = rig.host_facts()
    run = rig.cli("upgrade", *argv, json_out=False)
    assert run.code == 2, run
    assert run.error_lines() == [f"upgrade-agent: {line}"], run
    assert rig.host_facts() == before and not rig.state_dir.exists()


def test_delta_make_prints_both_digests_and_zstd_decodes_its_delta(rig: Rig, tmp_path: Path) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    old.write_bytes(_binary("1.0.0"))
    new.write_bytes(_binary("2.0.0"))
    out = tmp_path / "out.zst"
    run = rig.cli("delta", "make", "--from", str(old), "--to", str(new), "-o", str(out))
    assert run.code == 0, run
    delta = out.read_bytes()
    assert run.payload() == {"delta": str(out), "delta_sha256": _sha(delta), "delta_size": len(delta),
                             "member_sha256": _sha(new.read_bytes()), "member_size": len(new.read_bytes())}
    assert len(delta) < 4096
    decoded = subprocess.run(["zstd", "-q", "-d", "-c", "--patch-from", str(old), str(out)],
                             capture_output=True, check=True, timeout=60).stdout
    assert decoded == new.read_bytes()
    human = rig.cli("delta", "make", "--from", str(old), "--to", str(new), "-o", str(out), json_out=False)
    assert f"--delta-sha256 {_sha(delta)} --member-sha256 {_sha(new.read_bytes())}" in human.stdout


def test_delta_make_of_a_missing_file_is_one_line_and_writes_nothing(rig: Rig, tmp_path: Path) -> None:
    (tmp_path / "new").write_bytes(b"new")
    run = rig.cli("delta", "make", "--from", str(tmp_path / "gone"), "--to", str(tmp_path / "new"),
                  "-o", str(tmp_path / "out.zst"), json_out=False)
    assert run.code == 2, run
    assert run.error_lines() == [f"upgrade-agent: delta make: {tmp_path / 'gone'}: No such file or directory"]
    assert not (tmp_path / "out.zst").exists()
