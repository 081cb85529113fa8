"""``[[mirrors]]`` naming the active machine (docs/configuration.md ``[[mirrors]]``, SPEC §12): the copy goes
to the machine a JSON file the host keeps names as active at the time of the copy, read through the checked
layer, and a bad file or key is one line naming it.

Two machine roots (``kube1``, ``kube2``, as the seeds' nspawn machines) and a state file switched between
copies; what is asserted is read from the machine trees themselves.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from agent.fs import durable
from agent.host.mirrors import MAX_ACTIVE_FILE_BYTES, Mirror, read_active_root
from upgrade_core.errors import ActiveMachineError, HostError, HostRefusedError

from ._helpers import BLUE_BYTES, GREEN_BYTES, installed_host

pytestmark = pytest.mark.anyio

KEY = "/nspawn/active~1root"  # RFC 6901: "~1" is "/" in a member name
MEMBER = "usr/local/bin/demo-agent"


def machines(base: Path) -> tuple[Path, Path, Path]:
    """Two machine roots with their ``usr/local/bin`` and a state file naming ``kube1`` active."""
    kube1, kube2 = base / "machines" / "kube1", base / "machines" / "kube2"
    for m in (kube1, kube2):
        (m / "usr" / "local" / "bin").mkdir(parents=True)
    state = base / "state" / "daemon.json"
    state.parent.mkdir()
    activate(state, kube1)
    return kube1, kube2, state


def activate(state: Path, machine: Path) -> None:
    """The host's daemon switching its active machine (written the way such a daemon would: atomically)."""
    doc = {"nspawn": {"active/root": str(machine), "standby/root": "elsewhere"}, "generation": 7}
    durable.atomic_write_bytes(str(state), json.dumps(doc).encode(), 0o644)


async def test_the_copy_follows_the_active_machine(tmp_path: Path) -> None:
    kube1, kube2, state = machines(tmp_path)
    mirror = Mirror(MEMBER, active_from=str(state), active_key=KEY)
    host = installed_host(tmp_path / "R", mirrors=[mirror])
    durable.atomic_write_bytes(host.slot_path("green"), GREEN_BYTES, 0o755)
    blue_sha = await host.slot_sha256("blue")
    green_sha = await host.slot_sha256("green")
    assert blue_sha is not None and green_sha is not None

    assert await host.sync_mirrors("blue", blue_sha) == (str(kube1 / MEMBER),)
    assert (kube1 / MEMBER).read_bytes() == BLUE_BYTES and not (kube2 / MEMBER).exists()

    activate(state, kube2)  # the host switched machines between two upgrades
    assert await host.sync_mirrors("green", green_sha) == (str(kube2 / MEMBER),)
    assert (kube2 / MEMBER).read_bytes() == GREEN_BYTES
    assert (kube1 / MEMBER).read_bytes() == BLUE_BYTES  # the machine no longer active is left alone

    assert await host.sync_mirrors("blue", blue_sha) == (str(kube2 / MEMBER),)  # a rollback re-syncs kube2
    assert (kube2 / MEMBER).read_bytes() == BLUE_BYTES
    assert os.stat(kube2 / MEMBER).st_mode & 0o777 == 0o755


@pytest.mark.parametrize(
    ("content", "key", "words"),
    [
        (b"{not json", KEY, "not JSON"),
        (json.dumps({"nspawn": {}}).encode(), KEY, "active~1root"),
        (json.dumps({"nspawn": {"active/root": 7}}).encode(), KEY, "names 7, not an absolute path"),
        (json.dumps({"nspawn": {"active/root": "relative/kube1"}}).encode(), KEY, "not an absolute path"),
        (json.dumps({"nspawn": {"active/root": "/var/lib/../../etc"}}).encode(), KEY, "not an absolute path"),
        (b" " * (MAX_ACTIVE_FILE_BYTES + 1), KEY, f"larger than {MAX_ACTIVE_FILE_BYTES} bytes"),
    ],
)
def test_a_bad_file_or_key_is_one_line_naming_both(
    tmp_path: Path, content: bytes, key: str, words: str
) -> None:
    state = tmp_path / "daemon.json"
    state.write_bytes(content)
    with pytest.raises(ActiveMachineError) as caught:
        read_active_root(str(state), key)
    message = str(caught.value)
    assert message.startswith(f"{state} (mirrors active_key {key}): ") and "\n" not in message
    assert words in message
    assert caught.value.exit_code == 2


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ActiveMachineError, match=f"^{tmp_path}/absent.json .*cannot read it"):
        read_active_root(str(tmp_path / "absent.json"), KEY)


@pytest.mark.parametrize("how", ["link", "writable", "fifo", "not-roots"])
def test_a_file_others_control_is_refused(tmp_path: Path, how: str) -> None:
    _kube1, _kube2, state = machines(tmp_path)
    if how == "link":
        os.rename(state, tmp_path / "real.json")
        os.symlink(tmp_path / "real.json", state)
    elif how == "writable":
        os.chmod(state, 0o666)
    elif how == "fifo":
        state.unlink()
        os.mkfifo(state)
    else:
        os.chown(state, 1000, 1000)
    with pytest.raises(HostRefusedError, match=f"^{state}: "):
        read_active_root(str(state), KEY)


async def test_check_mirrors_names_a_bad_file_before_anything(tmp_path: Path) -> None:
    _kube1, _kube2, state = machines(tmp_path)
    state.write_text("[]")
    host = installed_host(tmp_path / "R", mirrors=[Mirror(MEMBER, active_from=str(state), active_key=KEY)])
    with pytest.raises(ActiveMachineError, match=str(state)):
        host.check_mirrors()
    with pytest.raises(HostError, match=str(state)):  # at a copy it fails that copy, as any mirror failure
        await host.sync_mirrors("blue", "0" * 64)


async def test_a_machine_tree_with_a_link_inside_is_not_followed(tmp_path: Path) -> None:
    kube1, _kube2, state = machines(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (kube1 / "usr" / "local" / "bin").rmdir()
    os.symlink(outside, kube1 / "usr" / "local" / "bin")
    host = installed_host(tmp_path / "R", mirrors=[Mirror(MEMBER, active_from=str(state), active_key=KEY)])
    with pytest.raises(HostRefusedError):
        host.check_mirrors()
    assert list(outside.iterdir()) == []


@pytest.mark.parametrize(
    ("entry", "words"),
    [
        ('path = "usr/local/bin/x"', "mirrors[0].path: must be an absolute path"),
        ('path = "/abs/x"\nactive_from = "/d.json"\nactive_key = "/a"', "mirrors[0].path: must be relative"),
        ('path = "../x"\nactive_from = "/d.json"\nactive_key = "/a"', "mirrors[0].path: must be relative"),
        ('path = "x"\nactive_from = "/d.json"', "mirrors[0].active_key: active_from and active_key go"),
        ('path = "/x/y"\nactive_key = "/a"', "mirrors[0].active_key: active_from and active_key go"),
        ('path = "x"\nactive_from = "/d.json"\nactive_key = "a"', "mirrors[0].active_key: must be a JSON"),
        ('path = "x"\nactive_from = "d.json"\nactive_key = "/a"', "mirrors[0].active_from: must be"),
        ('path = "x"\nroot = "/m"\nactive_from = "/d.json"\nactive_key = "/a"', "mirrors[0].root: must be"),
    ],
)
def test_the_configuration_refuses_a_bad_entry_naming_the_key(tmp_path: Path, entry: str, words: str) -> None:
    from agent.config.loader import load_config
    from agent.errors import ConfigError

    config = tmp_path / "a.toml"
    config.write_text(f'[agent]\nname = "demo-agent"\n\n[[mirrors]]\n{entry}\n')
    with pytest.raises(ConfigError) as caught:
        load_config(str(config))
    assert words in str(caught.value)


def test_the_configuration_takes_an_active_machine_entry(tmp_path: Path) -> None:
    from agent.config.loader import load_config

    config = tmp_path / "a.toml"
    config.write_text('[agent]\nname = "demo-agent"\n\n[[mirrors]]\npath = "usr/local/bin/{name}"\n'
                      'active_from = "/var/lib/daemon//state.json"\nactive_key = "/machines/active"\n')
    (entry,) = load_config(str(config)).mirrors
    assert (entry.path, entry.root, entry.active_from, entry.active_key) == (
        "usr/local/bin/demo-agent", "", "/var/lib/daemon/state.json", "/machines/active")
