
"""agent.config.loader: design §3 keys and defaults, strict values, discovery, {name}/{arch}, the fast
reader."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import agent.config.loader as config_mod
from agent.config.boot import FAST_SCHEMA, discover_config_path, plausibly_valid, quick_paths
from agent.config.loader import AgentConfig, load_config, parse_config, read_paths
from agent.errors import ConfigError

MINIMAL = '[agent]\nname = "demo-agent"\n'


def write(tmp_path: Path, text: str, name: str = "a.toml") -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_every_default_matches_spec_section_3(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, MINIMAL), machine="x86_64")
    assert cfg.agent.name == "demo-agent"
    assert cfg.agent.unit == "demo-agent.service"
    assert cfg.agent.exec_args == ()
    assert cfg.agent.version_args == ("version",)
    assert cfg.agent.member == "demo-agent-linux-amd64"
    assert cfg.agent.member_policy == "exact"
    assert cfg.agent.socket == ""
    assert cfg.host.root == "/opt/upgrade-agent"
    assert cfg.host.legacy_root == ""
    assert cfg.host.state_dir == "/var/lib/upgrade-agent/demo-agent"
    assert cfg.host.unit_dir == "/etc/systemd/system"
    assert cfg.host.lock_path == "/run/upgrade-agent/demo-agent.lock"
    assert cfg.host.systemctl_prefix == ()
    assert (cfg.download.allow_http, cfg.download.max_redirects, cfg.download.timeout_s) == (
        "loopback", 5, 600.0)
    assert (cfg.limits.max_archive_bytes, cfg.limits.max_member_bytes, cfg.limits.max_total_bytes,
            cfg.limits.max_entries, cfg.limits.max_zstd_window_bytes) == (
        268435456, 268435456, 536870912, 10000, 33554432)
    assert (cfg.verify.timeout_s, cfg.verify.max_output_bytes) == (30.0, 65536)
    assert (cfg.health.stability_s, cfg.health.timeout_s, cfg.health.max_attempts,
            cfg.health.http_probe, cfg.health.command_probe) == (3.0, 60.0, 3, "", ())
    assert cfg.journal.keep_episodes == 50
    assert cfg.mirrors == ()
    assert (cfg.operations.source, cfg.operations.spool_dir, cfg.operations.node_name,
            cfg.operations.namespace, cfg.operations.kubeconfig, cfg.operations.poll_s) == (
        "", "", "", "", "", 2.0)
    assert cfg.source.endswith("a.toml")


def test_full_file_is_read_and_substituted(tmp_path: Path) -> None:
    text = """
[agent]
name = "kube.agent-2"
unit = "x-{name}.service"
exec_args = ["--listen", "127.0.0.1:9"]
version_args = ["--version"]
member = "bin/{name}-{arch}"
member_policy = "select"
[host]
root = "/srv/ua/"
legacy_root = "/usr/local"
state_dir = "/srv/state/{name}"
unit_dir = "/srv/units"
lock_path = "/srv/run/{name}.lock"
systemctl_prefix = ["nsenter", "-t", "1"]
[download]
allow_http = "never"
max_redirects = 0
timeout_s = 10
[limits]
max_member_bytes = 1024
[health]
stability_s = 0.5
http_probe = "http://127.0.0.1:8080/healthz"
command_probe = ["/bin/true"]
[journal]
keep_episodes = 3
[[mirrors]]
path = "/var/lib/machines/k1/usr/local/bin/{name}"
[[mirrors]]
path = "/srv/m2"
"""
    cfg = load_config(write(tmp_path, text), machine="aarch64")
    assert cfg.agent.unit == "x-kube.agent-2.service"
    assert cfg.agent.member == "bin/kube.agent-2-arm64"
    assert cfg.agent.member_policy == "select"
    assert cfg.agent.exec_args == ("--listen", "127.0.0.1:9")
    assert cfg.host.root == "/srv/ua"
    assert cfg.host.state_dir == "/srv/state/kube.agent-2"
    assert cfg.host.lock_path == "/srv/run/kube.agent-2.lock"
    assert cfg.download.timeout_s == 10.0 and isinstance(cfg.download.timeout_s, float)
    assert cfg.download.max_redirects == 0
    assert cfg.limits.max_member_bytes == 1024
    assert cfg.health.command_probe == ("/bin/true",)
    assert [m.path for m in cfg.mirrors] == ["/var/lib/machines/k1/usr/local/bin/kube.agent-2", "/srv/m2"]
    assert isinstance(cfg, AgentConfig)


@pytest.mark.parametrize(
    ("toml", "key", "fragment"),
    [
        ("", "agent.name", "required"),
        ('[agent]\nunit = "x"\n', "agent.name", "required"),
        ('[agent]\nname = "Demo"\n', "agent.name", "must match"),
        ('[agent]\nname = "-demo"\n', "agent.name", "must match"),
        ('[agent]\nname = "' + "a" * 64 + '"\n', "agent.name", "must match"),
        ("[agent]\nname = 5\n", "agent.name", "must be a string"),
        (MINIMAL + 'unit = ""\n', "agent.unit", "empty"),
        (MINIMAL + 'exec_args = "--x"\n', "agent.exec_args", "must be an array"),
        (MINIMAL + "version_args = [1]\n", "agent.version_args[0]", "must be a string"),
        (MINIMAL + 'member = ""\n', "agent.member", "empty"),
        (MINIMAL + 'member_policy = "any"\n', "agent.member_policy", 'must be "exact", "select" or "none"'),
        (MINIMAL + "[verify]\nversion_regex = '\\\\d+'\n", "verify.version_regex",
         "must have exactly one capture group, found 0"),
        (MINIMAL + "[verify]\nversion_regex = '(a)(b)'\n", "verify.version_regex", "found 2"),
        (MINIMAL + "[verify]\nversion_regex = '(1'\n", "verify.version_regex",
         "must be a valid regular expression"),
        (MINIMAL + "[verify]\nversion_regex = 5\n", "verify.version_regex", "must be a string"),
        (MINIMAL + 'color = "red"\n', "agent.color", "unknown key"),
        (MINIMAL + "[host]\nroot = \"opt\"\n", "host.root", "absolute"),
        (MINIMAL + "[host]\nlegacy_root = \"usr/local\"\n", "host.legacy_root", "absolute"),
        (MINIMAL + "[host]\nstate_dir = \"x\"\n", "host.state_dir", "absolute"),
        (MINIMAL + "[host]\nunit_dir = \"x\"\n", "host.unit_dir", "absolute"),
        (MINIMAL + "[host]\nlock_path = \"x.lock\"\n", "host.lock_path", "absolute"),
        (MINIMAL + "[host]\nsystemctl_prefix = \"nsenter\"\n", "host.systemctl_prefix", "array"),
        (MINIMAL + "[host]\nextra = 1\n", "host.extra", "unknown key"),
        (MINIMAL + "[download]\nallow_http = \"yes\"\n", "download.allow_http",
         'must be "never", "loopback" or "always"'),
        (MINIMAL + "[download]\nmax_redirects = -1\n", "download.max_redirects", "0 or more"),
        (MINIMAL + "[download]\ntimeout_s = 0\n", "download.timeout_s", "positive"),
        (MINIMAL + "[download]\ntimeout_s = nan\n", "download.timeout_s", "positive"),
        (MINIMAL + "[download]\ntimeout_s = \"10\"\n", "download.timeout_s", "must be a number"),
        (MINIMAL + "[download]\nca_file = \"ca.pem\"\n", "download.ca_file", "absolute"),
        (MINIMAL + "[download]\nclient_key = \"/etc/k.pem\"\n", "download.client_key",
         "needs client_cert (mutual TLS takes both)"),
        (MINIMAL + "[download]\nclient_cert = \"/etc/c.pem\"\n", "download.client_cert",
         "needs client_key (mutual TLS takes both)"),
        (MINIMAL + "[download]\nproxy = \"socks5://127.0.0.1:1080\"\n", "download.proxy",
         "must be \"\" or a proxy URL"),
        # a proxy has no path; credentials are never echoed
        (MINIMAL + "[download]\nproxy = \"http://u:SECRET@proxy:3128/x\"\n", "download.proxy",
         "got 'http://proxy:3128/x'"),
        (MINIMAL + "[download]\nproxy = \"http://proxy:99999\"\n", "download.proxy", "a proxy URL"),
        (MINIMAL + "[download]\nretry_deadline_s = -1\n", "download.retry_deadline_s",
         "must be 0 or a positive number of seconds"),
        (MINIMAL + "[download]\nretry_deadline_s = \"5m\"\n", "download.retry_deadline_s",
         "must be a number"),
        (MINIMAL + "[limits]\nmax_archive_bytes = 0\n", "limits.max_archive_bytes", "positive"),
        (MINIMAL + "[limits]\nmax_member_bytes = -5\n", "limits.max_member_bytes", "positive"),
        (MINIMAL + "[limits]\nmax_total_bytes = 1.5\n", "limits.max_total_bytes", "integer"),
        (MINIMAL + "[limits]\nmax_entries = true\n", "limits.max_entries", "integer"),
        (MINIMAL + "[limits]\nmax_zstd_window_bytes = \"1\"\n", "limits.max_zstd_window_bytes", "integer"),
        (MINIMAL + "[verify]\ntimeout_s = -1.0\n", "verify.timeout_s", "positive"),
        (MINIMAL + "[verify]\nmax_output_bytes = 0\n", "verify.max_output_bytes", "positive"),
        (MINIMAL + "[health]\nstability_s = inf\n", "health.stability_s", "positive"),
        (MINIMAL + "[health]\ntimeout_s = 0.0\n", "health.timeout_s", "positive"),
        (MINIMAL + "[health]\nmax_attempts = 0\n", "health.max_attempts", "positive"),
        (MINIMAL + "[health]\nhttp_probe = \"ftp://h/x\"\n", "health.http_probe", "http"),
        (MINIMAL + "[health]\nhttp_probe = \"http:///nohost\"\n", "health.http_probe", "host"),
        (MINIMAL + "[health]\ncommand_probe = [\"\"]\n", "health.command_probe", "empty"),
        (MINIMAL + "[journal]\nkeep_episodes = 0\n", "journal.keep_episodes", "positive"),
        (MINIMAL + "[[mirrors]]\npath = \"rel/x\"\n", "mirrors[0].path", "absolute"),
        (MINIMAL + "[[mirrors]]\npath = \"/srv/m/x\"\nroot = \"/srv/other\"\n", "mirrors[0].root",
         "does not hold path"),
        (MINIMAL + "[[mirrors]]\npath = \"/a\"\n[[mirrors]]\n", "mirrors[1].path", "required"),
        (MINIMAL + "[[mirrors]]\npath = \"/a\"\nmode = 1\n", "mirrors[0].mode", "unknown key"),
        (MINIMAL + "mirrors = 3\n", "agent.mirrors", "unknown key"),
        ("mirrors = 3\n" + MINIMAL, "mirrors", "must be an array"),
        (MINIMAL + "[extra]\n", "extra", "unknown key"),
        ("agent = 3\n", "agent", "must be a table"),
        ('source = "x"\n' + MINIMAL, "source", "unknown key"),
        (MINIMAL + '[operations]\nsource = "kafka"\n', "operations.source",
         'must be "", "spool" or "kubernetes"'),
        (MINIMAL + '[operations]\nsource = "spool"\n', "operations.spool_dir", "is required"),
        (MINIMAL + '[operations]\nspool_dir = "spool"\n', "operations.spool_dir", "absolute"),
        (MINIMAL + '[operations]\nspool_dir = "/var"\n', "operations.spool_dir", "system directory"),
        (MINIMAL + '[operations]\nspool_dir = "/opt/upgrade-agent/ops"\n', "operations.spool_dir",
         "must not overlap"),
        (MINIMAL + '[operations]\nspool_dir = "/var/lib/upgrade-agent/demo-agent/ops"\n',
         "operations.spool_dir", "must not overlap"),
        # a spool among the units systemd loads, or around the agent's own directories, would let whoever
        # writes operations write units or reach the agent's files
        (MINIMAL + '[operations]\nspool_dir = "/etc/systemd/system/ops"\n', "operations.spool_dir",
         '"/etc/systemd/system" must not overlap'),
        (MINIMAL + '[operations]\nspool_dir = "/usr/lib/systemd/system"\n', "operations.spool_dir",
         "must not overlap"),
        (MINIMAL + '[host]\nunit_dir = "/srv/units"\n[operations]\nspool_dir = "/srv/units/ops"\n',
         "operations.spool_dir", 'host.unit_dir "/srv/units" must not overlap'),
        (MINIMAL + '[operations]\nspool_dir = "/run/upgrade-agent"\n', "operations.spool_dir",
         "the directory of host.lock_path"),
        (MINIMAL + '[operations]\nnode_name = "Web_1"\n', "operations.node_name", "DNS subdomain"),
        (MINIMAL + '[operations]\nkubeconfig = "kube.yaml"\n', "operations.kubeconfig", "absolute"),
        (MINIMAL + '[operations]\npoll_s = 0\n', "operations.poll_s", "positive"),
        # a microsecond poll would keep a core busy while nothing happens
        (MINIMAL + '[operations]\npoll_s = 0.000001\n', "operations.poll_s", "at least 0.1 seconds"),
        # names systemd would read as an escaped path ("-" is the root) or that need escaping
        (MINIMAL + 'unit = "-.service"\n', "agent.unit", "not a valid systemd unit name"),
        (MINIMAL + 'unit = ".hidden.service"\n', "agent.unit", "not a valid systemd unit name"),
        (MINIMAL + 'unit = "x\\\\x2dy.service"\n', "agent.unit", "not a valid systemd unit name"),
        (MINIMAL + '[operations]\nwatch = 1\n', "operations.watch", "unknown key"),
    ],
)
def test_bad_input_names_file_and_dotted_key(tmp_path: Path, toml: str, key: str, fragment: str) -> None:
    path = write(tmp_path, toml)
    with pytest.raises(ConfigError) as info:
        load_config(path, machine="x86_64")
    message = str(info.value)
    assert message.startswith(f"{path}: {key}: "), message
    assert fragment in message
    assert info.value.exit_code == 2


def test_a_spool_in_the_configurations_own_directory_is_refused(tmp_path: Path) -> None:
    """Whoever writes operations must not be able to write the agent's configuration beside them: the spool
    may not be the configuration's directory or hold it (a subdirectory is apart: configurations are
    discovered as ``*.toml`` in the directory itself)."""
    (tmp_path / "etc").mkdir()
    path = write(tmp_path / "etc", MINIMAL + f'[operations]\nsource = "spool"\nspool_dir = "{tmp_path}"\n')
    with pytest.raises(ConfigError, match="the configuration's directory") as info:
        load_config(path)
    assert str(info.value).startswith(f"{path}: operations.spool_dir: ")
    assert quick_paths(path) is None  # the boot reader leaves it to the full loader


def test_bad_value_message_is_exactly_one_line(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL + 'member_policy = "any"\n')
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == (
        f"{path}: agent.member_policy: must be \"exact\", \"select\" or \"none\", got \"any\""
    )


def test_invalid_toml_and_missing_file_name_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "[agent\n")
    with pytest.raises(ConfigError, match=rf"^{path}: invalid TOML"):
        load_config(path)
    with pytest.raises(ConfigError, match="not found"):
        load_config(str(tmp_path / "missing.toml"))


@pytest.mark.parametrize("kind", ["fifo", "char device", "directory", "link to a fifo"])
def test_a_config_path_that_is_not_a_regular_file_is_refused_unopened(tmp_path: Path, kind: str) -> None:
    """A FIFO would block the read forever (nobody writes it), a device's driver would see an open: both are
    refused before any open, by the full loader, the quick reader and the CLI, with one line (exit 2)."""
    fifo = tmp_path / "cfg.fifo"
    os.mkfifo(fifo)
    path = {"fifo": str(fifo), "char device": "/dev/null", "directory": str(tmp_path),
            "link to a fifo": str(tmp_path / "link.toml")}[kind]
    if kind == "link to a fifo":
        os.symlink(fifo, path)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == (f"{path}: cannot read configuration: not a regular file "
                               "(a FIFO, device, socket or directory)")
    assert quick_paths(path) is None  # the boot reader never answers for a file the full loader refuses
    with pytest.raises(ConfigError, match="not a regular file"):
        read_paths(path)
    for cli, args in (("upgrade-agent", ["status"]), ("recover-agent-upgrade", ["--trigger", "manual"])):
        done = subprocess.run([str(Path(sys.executable).parent / cli), "--config", path, *args],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 2, (cli, done.stderr)
        assert done.stderr.strip().splitlines() == [f"upgrade-agent: {info.value}"], done.stderr


@pytest.mark.parametrize(("machine", "arch"), [("x86_64", "amd64"), ("aarch64", "arm64")])
def test_arch_substitution(machine: str, arch: str) -> None:
    cfg = parse_config({"agent": {"name": "n1"}}, "/c.toml", machine=machine)
    assert cfg.agent.member == f"n1-linux-{arch}"


def test_unsupported_arch_is_an_error_only_where_arch_is_used() -> None:
    with pytest.raises(ConfigError, match=r"^/c\.toml: agent\.member: uses \{arch\}.*'riscv64'"):
        parse_config({"agent": {"name": "n1"}}, "/c.toml", machine="riscv64")
    cfg = parse_config({"agent": {"name": "n1", "member": "n1-bin"}}, "/c.toml", machine="riscv64")
    assert cfg.agent.member == "n1-bin"


def test_other_braces_are_kept_verbatim() -> None:
    cfg = parse_config({"agent": {"name": "n", "exec_args": ["--fmt={x}", "{name}"]}}, "/c", machine="x86_64")
    assert cfg.agent.exec_args == ("--fmt={x}", "n")


# -- discovery ---------------------------------------------------------------------------------------
def test_discovery_prefers_cli_then_env_then_the_only_file(tmp_path: Path) -> None:
    d = tmp_path / "etc"
    d.mkdir()
    only = write(d, MINIMAL, "one.toml")
    env = {"UPGRADE_AGENT_CONFIG": "/x/env.toml"}
    assert discover_config_path("/x/cli.toml", env, str(d)) == "/x/cli.toml"
    assert discover_config_path(None, env, str(d)) == "/x/env.toml"
    assert discover_config_path(None, {}, str(d)) == only


def test_discovery_none_or_several_is_exit_2(tmp_path: Path) -> None:
    d = tmp_path / "etc"
    with pytest.raises(ConfigError, match=r"no \*\.toml") as info:
        discover_config_path(None, {}, str(d))
    assert info.value.exit_code == 2
    d.mkdir()
    (d / "notes.txt").write_text("x")
    with pytest.raises(ConfigError, match=r"no \*\.toml"):
        discover_config_path(None, {}, str(d))
    write(d, MINIMAL, "a.toml")
    write(d, MINIMAL, "b.toml")
    with pytest.raises(ConfigError, match=r"several configurations \(a\.toml, b\.toml\)") as info:
        discover_config_path(None, {}, str(d))
    assert info.value.exit_code == 2


# -- the fast reader ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text",
    [
        MINIMAL,
        MINIMAL + '[host]\nstate_dir = "/srv/s/{name}/"\nlock_path = "/srv/l/{name}-{arch}.lock"\n',
        MINIMAL + '[host]\nroot = "/x"\n[[mirrors]]\npath = "/m"\n',
    ],
)
def test_fast_reader_agrees_with_full_loader(tmp_path: Path, text: str) -> None:
    path = write(tmp_path, text)
    cfg = load_config(path)
    assert quick_paths(path) == (cfg.agent.name, cfg.host.state_dir, cfg.host.lock_path, cfg.host.root)
    assert read_paths(path) == (cfg.agent.name, cfg.host.state_dir, cfg.host.lock_path)


@pytest.mark.parametrize(
    "text",
    [
        "",
        '[agent]\nname = "BAD"\n',
        MINIMAL + '[host]\nstate_dir = "rel"\n',
        MINIMAL + "[host]\nlock_path = 1\n",
        "[agent\n",
    ],
)
def test_fast_reader_reports_the_full_loaders_error(tmp_path: Path, text: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as full:
        load_config(path)
    with pytest.raises(ConfigError) as fast:
        read_paths(path)
    assert str(fast.value) == str(full.value)


def test_fast_reader_imports_neither_attrs_nor_cattrs(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL)
    code = (
        "import sys\n"
        "from agent.config.boot import quick_paths, discover_config_path\n"
        f"print(quick_paths(discover_config_path({path!r})))\n"
        "heavy = ('attrs', 'attr', 'cattrs', 'upgrade_core')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy))\n"
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True)
    lines = out.stdout.splitlines()
    expected = ("demo-agent", "/var/lib/upgrade-agent/demo-agent", "/run/upgrade-agent/demo-agent.lock",
                "/opt/upgrade-agent")
    assert lines[0] == repr(expected)
    assert lines[1] == "[]"


_names = st.from_regex(r"[a-z0-9][a-z0-9._-]{0,62}", fullmatch=True)
_parts = st.sampled_from(["srv", "{name}", "{arch}", "x.{name}-{arch}", "a b", "{other}", ".."])
_templates = st.lists(_parts, min_size=1, max_size=4).map(lambda parts: "/" + "/".join(parts))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=_names, state_dir=st.none() | _templates, lock_path=st.none() | _templates)
def test_fast_reader_agrees_with_full_loader_generated(
    tmp_path: Path, name: str, state_dir: str | None, lock_path: str | None
) -> None:
    keys = (("state_dir", state_dir), ("lock_path", lock_path))
    host = "".join(f"{k} = {json.dumps(v)}\n" for k, v in keys if v is not None)
    path = write(tmp_path, f"[agent]\nname = {json.dumps(name)}\n[host]\n{host}")
    try:
        cfg = load_config(path)
    except ConfigError as refused:  # e.g. a path that normalises to "/" (design §10): the quick reader too
        assert quick_paths(path) is None
        with pytest.raises(ConfigError) as fast:
            read_paths(path)
        assert str(fast.value) == str(refused)
        return
    both = (cfg.agent.name, cfg.host.state_dir, cfg.host.lock_path, cfg.host.root)
    assert quick_paths(path) in (None, both)
    assert read_paths(path) == (cfg.agent.name, cfg.host.state_dir, cfg.host.lock_path)
    assert "{name}" not in cfg.host.state_dir and "{arch}" not in cfg.host.lock_path


# -- the stdlib pre-check of the quick path (agent.config.boot.plausibly_valid) -----------------------
def test_fast_schema_names_exactly_the_full_loaders_keys() -> None:
    sections = {
        "agent": config_mod.AgentSection,
        "host": config_mod.HostSection,
        "download": config_mod.DownloadSection,
        "limits": config_mod.LimitsSection,
        "verify": config_mod.VerifySection,
        "health": config_mod.HealthSection,
        "journal": config_mod.JournalSection,
        "operations": config_mod.OperationsSection,
        "trust": config_mod.TrustSection,
        "schedule": config_mod.ScheduleSection,
    }
    assert set(FAST_SCHEMA) == set(sections)
    for section, cls in sections.items():
        assert set(FAST_SCHEMA[section]) == {a.name for a in attrs.fields(cls)}, section


_KEY = base64.b64encode(b"Ed" + bytes(range(40))).decode()
_values = st.sampled_from(
    [0, 1, -1, 5, 2.5, -2.5, True, "", "x", "/abs", "rel", "exact", "select", "never", "always",
     "loopback", "http://127.0.0.1:8/h", "ftp://h/", "http://proxy:3128", "https://p:99999/", [], ["a"],
     [""], [1], {"k": 1}, False,
     # [trust] root_keys: a well-formed Ed25519 key, one with another algorithm, one a byte short
     [_KEY], [base64.b64encode(b"ED" + bytes(40)).decode()], [_KEY[:-4] + "AAA="]]
)
_all_keys = [(s, k) for s, table in FAST_SCHEMA.items() if s != "agent" for k in table]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(entries=st.lists(st.tuples(st.sampled_from([*_all_keys, ("limits", "max_entrys"), ("limit", "x")]),
                                  _values), max_size=6))
def test_fast_precheck_accepts_only_what_the_full_loader_accepts(
    tmp_path: Path, entries: list[tuple[tuple[str, str], object]]
) -> None:
    doc: dict[str, dict[str, object]] = {"agent": {"name": "demo-agent"}}
    for (section, key), value in entries:
        doc.setdefault(section, {})[key] = value
    if not plausibly_valid(doc):
        return
    body = "".join(
        f"[{section}]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in table.items())
        for section, table in doc.items()
    )
    load_config(write(tmp_path, body))  # must not raise: fast accepted it


@pytest.mark.parametrize(
    "value",
    ["", "8080", "127.0.0.1:8080", "[::1]:8080", "/run/{name}.sock", "/run/demo.sock", "@demo", "0",
     "localhost:80", "/run/%n.sock", "/run//x", "/" + "x" * 107, "/{name}" + "x" * 100, 8080, ["8080"]],
)
def test_agent_socket_quick_check_accepts_only_what_the_full_loader_accepts(
    tmp_path: Path, value: object
) -> None:
    """``[agent] socket`` in the quick reader's schema: a value it accepts loads; ``{name}`` (whose length
    is known only after substitution) and every bad value go to the full loader."""
    doc = {"agent": {"name": "demo-agent", "socket": value}}
    path = write(tmp_path, f'[agent]\nname = "demo-agent"\nsocket = {json.dumps(value)}\n')
    if plausibly_valid(doc):
        assert load_config(path).agent.socket == value
    elif isinstance(value, str) and "{" in value and len(value) < 100:
        assert load_config(path).agent.socket == value.replace("{name}", "demo-agent")
    else:
        with pytest.raises(ConfigError, match=r": agent\.socket: "):
            load_config(path)


@pytest.mark.parametrize(("mode", "owner"), [(0o664, 0), (0o646, 0), (0o644, 65534)])
def test_a_config_others_can_write_is_refused(tmp_path: Path, mode: int, owner: int) -> None:
    """A root-run tool takes ExecStart arguments and paths from it: a file another user owns or may write
    would let that user run commands as root. Refused by the full loader, the quick reader and the CLI."""
    if os.geteuid() != 0:
        pytest.skip("the owner rule is root's (as non-root the file would be this user's)")
    path = write(tmp_path, '[agent]\nname = "n1"\n')
    os.chmod(path, mode)
    os.chown(path, owner, -1)
    want = (f"{path}: cannot read configuration: owned by uid {owner} with mode {mode:04o}: it must be "
            "owned by root (or the user running this) and not writable by group or others")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == want
    assert quick_paths(path) is None
    with pytest.raises(ConfigError, match="not writable by group or others"):
        read_paths(path)
    done = subprocess.run([str(Path(sys.executable).parent / "recover-agent-upgrade"), "--config", path,
                           "--trigger", "manual"], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stderr.strip().splitlines()) == (2, [f"upgrade-agent: {want}"])
    os.chmod(path, 0o644)
    os.chown(path, 0, -1)
    assert load_config(path).agent.name == "n1"  # the same file, once only its owner may write it


def test_ignition_embeds_only_the_configuration_it_checked(tmp_path: Path) -> None:
    """``upgrade-agent ignition`` reads the file again to embed its exact bytes: a file changed since it
    was loaded and checked, or replaced by a FIFO, is refused instead of embedded."""
    from agent.session.ignition import _config_as_loaded

    path = write(tmp_path, '[agent]\nname = "n1"  # kept as written\n')
    cfg = load_config(path)
    assert _config_as_loaded(path, cfg) == Path(path).read_bytes()
    Path(path).write_text('[agent]\nname = "n2"\n')
    with pytest.raises(ConfigError, match=rf"^{path}: changed while upgrade-agent ignition ran"):
        _config_as_loaded(path, cfg)
    os.unlink(path)
    os.mkfifo(path)
    with pytest.raises(ConfigError, match="cannot read the configuration again to embed it: not a regular"):
        _config_as_loaded(path, cfg)
