"""``upgrade-agent ignition`` (design §10, docs/ignition.md): the rendered config, checked by Debian's real
``ignition-validate``, and its bad inputs (one line, exit 2).

Every configuration here names the paths of the *new* host (``/opt/upgrade-agent``, ``/var/lib/...``): the
command only renders, so nothing on this machine is read but the config file, and nothing is written.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from agent.session.ignition import SPEC_VERSION, all_paths

from ._rig import Run, run_cli

VALIDATE = "/usr/bin/ignition-validate"
VALIDATE_TIMEOUT_S = 30
DIGEST = "ab" * 32
RUNTIME_DIGEST = "cd" * 32
ARCHIVE = "https://releases.example.com/demo-agent-1.0.0.tar.gz?X-Sig=abc"
RUNTIME = "https://releases.example.com/upgrade-agent-runtime.tar.gz"
ROOT_KEY = "RWQf6LRCGA9i53mlYecO4IzT51TGPpvWucNSCh1CBM0QTaLn73Y7GFO3"  # a minisign public key line

CONFIGS = {
    "defaults": '[agent]\nname = "demo-agent"\n',
    "custom paths": (
        '[agent]\nname = "edge"\nunit = "edge-daemon.service"\nexec_args = ["serve", "--port=8080"]\n'
        '[host]\nroot = "/var/opt/edge"\nstate_dir = "/var/lib/edge-state"\n'
        'lock_path = "/run/edge/edge.lock"\n'
        '[health]\nmax_attempts = 5\n'
    ),
    "signature trust keys": f'[agent]\nname = "signed"\n[trust]\nroot_keys = ["{ROOT_KEY}"]\n',
    "operator spool": (
        '[agent]\nname = "managed"\n[operations]\nsource = "spool"\nspool_dir = "/var/spool/managed"\n'
    ),
}


def _need_validate() -> None:
    if not Path(VALIDATE).is_file():
        pytest.fail(f"{VALIDATE} missing: run scripts/bootstrap.sh (apt-get install ignition)")


def _render(tmp_path: Path, toml: str, *extra: str, json_out: bool = False) -> Run:
    config = tmp_path / "agent.toml"
    config.write_text(toml)
    argv = ["--config", str(config), *(["--json"] if json_out else []), "ignition",
            "--archive", ARCHIVE, "--sha256", DIGEST, *extra]
    return run_cli(argv)


def _good(tmp_path: Path, toml: str, *, json_out: bool = False) -> dict:
    run = _render(tmp_path, toml, "--runtime", RUNTIME, "--runtime-sha256", RUNTIME_DIGEST, json_out=json_out)
    assert run.code == 0, run.stderr
    return json.loads(run.stdout)


@pytest.mark.parametrize("case", sorted(CONFIGS))
def test_ignition_validate_accepts_every_rendered_config(tmp_path: Path, case: str) -> None:
    _need_validate()
    config = _good(tmp_path, CONFIGS[case])
    out = tmp_path / "config.ign"
    out.write_text(json.dumps(config))
    done = subprocess.run([VALIDATE, str(out)], capture_output=True, text=True, timeout=VALIDATE_TIMEOUT_S,
                          check=False)
    assert done.returncode == 0 and not done.stdout.strip() and not done.stderr.strip(), (done.stdout,
                                                                                        done.stderr)
    assert config["ignition"]["version"] == SPEC_VERSION
    # nothing under /usr, whatever the configuration
    for path in all_paths(config):
        assert path.startswith("/") and not (path == "/usr" or path.startswith("/usr/")), path


def test_the_config_holds_the_toml_the_archives_and_the_units(tmp_path: Path) -> None:
    toml = CONFIGS["signature trust keys"]
    config = _good(tmp_path, toml, json_out=True)  # --json prints the same one object
    files = {f["path"]: f for f in config["storage"]["files"]}
    cfg = files["/etc/upgrade-agent/signed.toml"]
    assert base64.b64decode(cfg["contents"]["source"].split(",", 1)[1]).decode() == toml
    assert cfg["mode"] == 0o600
    runtime = files["/opt/upgrade-agent/bootstrap/runtime.tar.gz"]
    assert runtime["contents"] == {"source": RUNTIME, "verification": {"hash": f"sha256-{RUNTIME_DIGEST}"}}
    release = files["/opt/upgrade-agent/bootstrap/release.archive"]
    assert release["contents"] == {"source": ARCHIVE, "verification": {"hash": f"sha256-{DIGEST}"}}
    assert runtime["mode"] == release["mode"] == 0o600
    sig = files["/opt/upgrade-agent/bootstrap/release.archive.minisig"]
    assert sig["contents"]["source"] == ARCHIVE.replace(".tar.gz?", ".tar.gz.minisig?")
    assert config["storage"]["directories"] == [{"path": "/opt/upgrade-agent/runtime", "mode": 0o755}]
    units = {u["name"]: u for u in config["systemd"]["units"]}
    assert set(units) == {"signed.service", "signed-recover.service", "signed-recover-boot.service",
                          "signed-recover.timer", "signed-recover-timer.service",
                          "signed-bootstrap.service"}
    assert [n for n, u in units.items() if u["enabled"]] == ["signed-bootstrap.service"]
    for unit in units.values():
        assert unit["contents"].startswith("# Managed by upgrade-agent for signed; do not edit\n")
        assert "/.venv/" not in unit["contents"] and "/usr/" not in unit["contents"].replace(
            "/usr/bin/tar", "").replace("/usr/bin/touch", "").replace("/usr/bin/systemctl", "")
    assert ("ExecStart=/opt/upgrade-agent/runtime/recover-agent-upgrade --config "
            "/etc/upgrade-agent/signed.toml --trigger boot") in units[
                "signed-recover-boot.service"]["contents"]
    boot = units["signed-bootstrap.service"]["contents"]
    assert "ConditionPathExists=!/opt/upgrade-agent/bootstrap/done\n" in boot
    assert ("ExecStart=/usr/bin/tar --no-same-owner --strip-components=1 -xzf "
            "/opt/upgrade-agent/bootstrap/runtime.tar.gz -C /opt/upgrade-agent/runtime\n") in boot
    assert (f"ExecStart=/opt/upgrade-agent/runtime/upgrade-agent --config /etc/upgrade-agent/signed.toml "
            f"install --archive /opt/upgrade-agent/bootstrap/release.archive --sha256 {DIGEST} "
            "--signature /opt/upgrade-agent/bootstrap/release.archive.minisig\n") in boot
    assert "ExecStart=/usr/bin/systemctl disable signed-bootstrap.service\n" in boot


def test_every_file_is_written_0600_the_configuration_with_its_credentials_included(tmp_path: Path) -> None:
    """The embedded configuration may carry credentials (a health probe or keyring URL with a password or
    token in it): Ignition must write it, like every other file it places, readable by root alone."""
    toml = (CONFIGS["signature trust keys"]
            + '[health]\nhttp_probe = "http://monitor:S3CRET@127.0.0.1:9000/health"\n')
    config = _good(tmp_path, toml)
    modes = {f["path"]: f["mode"] for f in config["storage"]["files"]}
    assert modes == {"/etc/upgrade-agent/signed.toml": 0o600,
                     "/opt/upgrade-agent/bootstrap/runtime.tar.gz": 0o600,
                     "/opt/upgrade-agent/bootstrap/release.archive": 0o600,
                     "/opt/upgrade-agent/bootstrap/release.archive.minisig": 0o600}, modes
    embedded = next(f for f in config["storage"]["files"] if f["path"].endswith(".toml"))
    assert b"S3CRET" in base64.b64decode(embedded["contents"]["source"].split(",", 1)[1])


def _refused(run: Run, *needles: str) -> None:
    assert run.code == 2, (run.code, run.stdout, run.stderr)
    run.assert_clean_stderr()
    lines = run.error_lines()
    assert len(lines) == 1 and not run.stdout.strip(), run.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


RT = ("--runtime", RUNTIME, "--runtime-sha256", RUNTIME_DIGEST)
BAD_INPUTS = {
    "no runtime": ((), "--runtime is required"),
    "runtime without its digest": (("--runtime", RUNTIME), "--runtime-sha256 is required"),
    "runtime digest without runtime": (("--runtime-sha256", RUNTIME_DIGEST), "--runtime is required"),
    "bad runtime digest": (("--runtime", RUNTIME, "--runtime-sha256", "xyz"),
                           "--runtime-sha256: expected 64 hex"),
    "local runtime path": (("--runtime", "/tmp/runtime.tar.gz", "--runtime-sha256", RUNTIME_DIGEST),
                           "--runtime", "give an http(s) URL"),
    "file url runtime": (("--runtime", "file:///tmp/r.tar.gz", "--runtime-sha256", RUNTIME_DIGEST),
                         "give an http(s) URL"),
    "ftp runtime": (("--runtime", "ftp://h/r.tar.gz", "--runtime-sha256", RUNTIME_DIGEST), "--runtime"),
    "plain http off loopback": (("--runtime", "http://example.invalid/r.tar.gz", "--runtime-sha256",
                                 RUNTIME_DIGEST), "--runtime"),
    "credentials in the url": (("--runtime", "https://u:S3CRET@h/r.tar.gz", "--runtime-sha256",
                                RUNTIME_DIGEST), "credentials"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_is_one_line_exit_2(tmp_path: Path, case: str) -> None:
    extra, *needles = BAD_INPUTS[case]
    run = _render(tmp_path, CONFIGS["defaults"], *extra)
    _refused(run, *needles)
    assert "S3CRET" not in run.stderr


def test_bad_archive_and_digest_exit_2(tmp_path: Path) -> None:
    config = tmp_path / "agent.toml"
    config.write_text(CONFIGS["defaults"])
    base = ["--config", str(config), "ignition", *RT]
    _refused(run_cli([*base, "--archive", "/srv/a.tar.gz", "--sha256", DIGEST]), "--archive", "http(s) URL")
    _refused(run_cli([*base, "--archive", ARCHIVE, "--sha256", "nothex"]), "--sha256: expected 64 hex")
    _refused(run_cli([*base, "--archive", ARCHIVE]), "--sha256")  # required


@pytest.mark.parametrize("key,toml", [
    ("host.root", '[host]\nroot = "/usr/local/upgrade-agent"\n'),
    ("host.state_dir", '[host]\nstate_dir = "/usr/lib/x/../state"\n'),
    ("host.legacy_root", '[host]\nlegacy_root = "/usr/local"\n'),
    ("mirrors[0].path", '[[mirrors]]\npath = "/usr/local/bin/demo-agent"\n'),
    ("host.unit_dir", '[host]\nunit_dir = "/run/systemd/system"\n'),
])
def test_config_paths_under_usr_are_refused(tmp_path: Path, key: str, toml: str) -> None:
    run = _render(tmp_path, '[agent]\nname = "demo-agent"\n' + toml, *RT)
    _refused(run, key)


def test_tools_are_where_the_tests_expect_them() -> None:
    _need_validate()
    assert shutil.which("ignition-validate") == VALIDATE
