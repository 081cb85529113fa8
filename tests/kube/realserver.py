"""A real Kubernetes API server and etcd on loopback, built from upstream source (docs/managed.md, "The real
API server"); ``scripts/kube-real`` is its command line.

:func:`ensure_binaries` builds ``kube-apiserver`` (``k8s.io/kubernetes``) and ``etcd``
(``go.etcd.io/etcd/server/v3``) from the Go module in ``tests/kube/servers/`` (go.mod and go.sum pinned) into
a cache outside the checkout, keyed by that module's files and the Go version, so a warm start costs seconds.
:func:`start` runs both on loopback ports it picks (or is given), with a private CA, a serving certificate for
127.0.0.1, an administrator's client certificate (group ``system:masters``), a ServiceAccount signing key and
an audit log of the ServiceAccount's and the administrator's requests; applies ``deploy/kubernetes/crd.yaml``
and ``rbac.yaml`` into the namespace they name; waits until the CRD is served; writes ``DIR/admin.kubeconfig``
and ``DIR/operator.kubeconfig`` (a bound token of the ServiceAccount ``rbac.yaml`` defines: its Role and
nothing more); and leaves the servers running in the background, their pids, executables and start times in
``DIR/kube-real.json``. :func:`stop` ends exactly the processes that file names (a pid whose executable or
start time differs was not started by us and is left alone) and removes what :func:`start` made.

Every wait is bounded and every failure is one :class:`KubeRealError` line naming the server, the port or the
build step and why. The audit log (``DIR/audit.log``: every request of the ServiceAccount at ``Metadata``
level, every status write at ``RequestResponse`` level) is how the tests read which requests the operator made
and which status documents it wrote (:class:`tests.kube.backends.RealBackend`), and how
``benchmarks/bench_operator.py`` counts the requests per node.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import fcntl
import hashlib
import ipaddress
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final

import attrs
import httpx
import yaml

ROOT: Final = Path(__file__).resolve().parents[2]
SERVERS: Final = Path(__file__).resolve().parent / "servers"
"""The Go module: go.mod, go.sum, etcd/main.go."""
DEPLOY: Final = ROOT / "deploy" / "kubernetes"
CACHE: Final = Path(os.environ.get("UPGRADE_CORE_CACHE", "/var/cache/upgrade-core")) / "kube-real"
"""Built binaries, ``CACHE/<key>/{kube-apiserver,etcd}``, and Go's build cache (``CACHE/go-build``)."""
STATE_FILE: Final = "kube-real.json"
BUILD_TIMEOUT_S: Final = 3600.0
"""A cold build (module downloads, ~2,000 packages) takes about 8 minutes on 2 cores; an hour is a hang."""
START_TIMEOUT_S: Final = 90.0
STOP_TIMEOUT_S: Final = 20.0
TOKEN_LIFETIME_S: Final = 7 * 24 * 3600
"""The operator's bound ServiceAccount token outlives any test run or benchmark (the API server's maximum
is unset here)."""
AUDIT_POLICY: Final = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: RequestResponse
    resources: [{group: upgrades.upgrade-core.io, resources: [upgradeoperations/status]}]
    verbs: [update, patch]
  - level: Metadata
    users: [{users}]
  - level: None
"""
ADMIN_USER: Final = "upgrade-core-admin"
"""The administrator's user name (its certificate's CN; group ``system:masters``)."""


class KubeRealError(Exception):
    """One line: what failed (the build, a server, a port, a manifest) and why. Exit 1 from the command."""


# -- the binaries --------------------------------------------------------------------------------------------
@attrs.frozen
class Binaries:
    """The built servers: ``apiserver`` and ``etcd`` paths; ``built``: whether this call built them;
    ``seconds``: how long that build took (0 when cached)."""

    apiserver: Path
    etcd: Path
    built: bool
    seconds: float


def _go() -> str:
    go = shutil.which("go")
    if go is None:
        raise KubeRealError("build: the go command is not on PATH (Go 1.26 builds the test servers)")
    return go


def build_key(go: str, servers: Path = SERVERS) -> str:
    """The cache key: sha256 of the module's files and of ``go version`` (16 hex digits)."""
    h = hashlib.sha256()
    for name in ("go.mod", "go.sum", "etcd/main.go"):
        h.update(name.encode() + b"\0" + (servers / name).read_bytes() + b"\0")
    h.update(subprocess.run([go, "version"], capture_output=True, check=True, timeout=60).stdout)
    return h.hexdigest()[:16]


def kubernetes_version() -> str:
    """The ``k8s.io/kubernetes`` version go.mod pins (``v1.37.2``): stamped into the binary, so ``/version``
    answers it as a released build does."""
    for line in (SERVERS / "go.mod").read_text().splitlines():
        words = line.split()
        if len(words) >= 2 and words[0] in ("k8s.io/kubernetes", "require") and "k8s.io/kubernetes" in words:
            return words[words.index("k8s.io/kubernetes") + 1]
    raise KubeRealError(f"build: {SERVERS / 'go.mod'} pins no k8s.io/kubernetes version")


def ensure_binaries(say: Callable[[str], None] = lambda _: None, *, servers: Path = SERVERS) -> Binaries:
    """The cached servers for the Go module ``servers`` and this Go, built first when missing (one build at a
    time: a lock).

    Raises:
        KubeRealError: no ``go``, or a build failed (the line names the package and Go's last error line;
            the whole log is kept in the cache directory) or took longer than ``BUILD_TIMEOUT_S``.
    """
    go = _go()
    key = build_key(go, servers)
    final = CACHE / key
    binaries = Binaries(final / "kube-apiserver", final / "etcd", False, 0.0)
    if binaries.apiserver.is_file() and binaries.etcd.is_file():
        return binaries
    CACHE.mkdir(parents=True, exist_ok=True, mode=0o755)
    with open(CACHE / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another run building the same key: wait for it, then reuse
        if binaries.apiserver.is_file() and binaries.etcd.is_file():
            return binaries
        say(f"kube-real: building kube-apiserver {kubernetes_version()} and etcd into {final} "
            "(about 8 minutes on 2 cores the first time)")
        began = time.monotonic()
        work = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=CACHE))
        try:
            _build(go, servers, work)
            work.rename(final)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return attrs.evolve(binaries, built=True, seconds=time.monotonic() - began)


def _build(go: str, servers: Path, out: Path) -> None:
    version = kubernetes_version()
    stamp = (f"-X k8s.io/component-base/version.gitVersion={version} "
             f"-X k8s.io/component-base/version.gitMajor={version[1:].split('.')[0]} "
             f"-X k8s.io/component-base/version.gitMinor={version.split('.')[1]} "
             "-X k8s.io/component-base/version.gitTreeState=clean")
    env = dict(os.environ, GOFLAGS="-mod=readonly -trimpath", GOTOOLCHAIN="local", CGO_ENABLED="0",
               GOCACHE=str(CACHE / "go-build"))
    deadline = time.monotonic() + BUILD_TIMEOUT_S
    log = CACHE / "build.log"
    for what, package, ldflags in (("etcd", "./etcd", ""),
                                   ("kube-apiserver", "k8s.io/kubernetes/cmd/kube-apiserver", stamp)):
        with open(log, "w") as f:
            try:
                done = subprocess.run([go, "build", "-ldflags", ldflags, "-o", str(out / what), package],
                                      cwd=servers, env=env, stdout=f, stderr=subprocess.STDOUT,
                                      timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise KubeRealError(f"build: {package} took longer than {BUILD_TIMEOUT_S:.0f} s; "
                                    f"see {log}") from None
        if done.returncode != 0:
            last = [line for line in log.read_text(errors="replace").splitlines() if line.strip()][-1:]
            raise KubeRealError(f"build: go build {package} failed (exit {done.returncode}): "
                                f"{last[0] if last else 'no output'}; see {log}")


# -- certificates --------------------------------------------------------------------------------------------
def _pki(where: Path) -> dict[str, Path]:
    """A CA, a serving certificate for 127.0.0.1 and localhost, an administrator's client certificate
    (O=system:masters: every right, as kubeadm's admin.conf), and the ServiceAccount signing key; PEM files,
    mode 0600, in ``where``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)
    files: dict[str, Path] = {}

    def write(name: str, data: bytes) -> None:
        path = where / name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with open(fd, "wb") as f:
            f.write(data)
        files[name] = path

    def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
        return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                 serialization.NoEncryption())

    def cert(subject: x509.Name, key: ec.EllipticCurvePrivateKey, issuer: x509.Name,
             signer: ec.EllipticCurvePrivateKey, *, ca: bool = False,
             san: list[x509.GeneralName] | None = None, usage: Any = None) -> x509.Certificate:
        b = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(key.public_key())
             .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(hours=1))
             .not_valid_after(now + datetime.timedelta(days=30))
             .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if san:
            b = b.add_extension(x509.SubjectAlternativeName(san), critical=False)
        if usage is not None:
            b = b.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        return b.sign(signer, hashes.SHA256())

    def name(cn: str, org: str | None = None) -> x509.Name:
        attrs_ = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
        if org:
            attrs_.insert(0, x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
        return x509.Name(attrs_)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = name("upgrade-core test CA")
    ca = cert(ca_name, ca_key, ca_name, ca_key, ca=True)
    write("ca.crt", ca.public_bytes(serialization.Encoding.PEM))
    srv_key = ec.generate_private_key(ec.SECP256R1())
    srv = cert(name("kube-apiserver"), srv_key, ca_name, ca_key, usage=ExtendedKeyUsageOID.SERVER_AUTH,
               san=[x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")])
    write("apiserver.crt", srv.public_bytes(serialization.Encoding.PEM))
    write("apiserver.key", key_pem(srv_key))
    admin_key = ec.generate_private_key(ec.SECP256R1())
    admin = cert(name(ADMIN_USER, "system:masters"), admin_key, ca_name, ca_key,
                 usage=ExtendedKeyUsageOID.CLIENT_AUTH)
    write("admin.crt", admin.public_bytes(serialization.Encoding.PEM))
    write("admin.key", key_pem(admin_key))
    # the ServiceAccount token signer: the private key in SEC1 form, the public key apart (the API server's
    # key-file reader takes public keys and PKCS#1/SEC1 private keys, not PKCS#8)
    sa = ec.generate_private_key(ec.SECP256R1())
    write("sa.key", sa.private_bytes(serialization.Encoding.PEM,
                                     serialization.PrivateFormat.TraditionalOpenSSL,
                                     serialization.NoEncryption()))
    write("sa.pub", sa.public_key().public_bytes(serialization.Encoding.PEM,
                                                 serialization.PublicFormat.SubjectPublicKeyInfo))
    return files


# -- ports and processes -------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _check_port_free(port: int, what: str, option: str) -> None:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError as exc:
            raise KubeRealError(f"{what}: port 127.0.0.1:{port} is not free ({exc.strerror}); "
                                f"name another with {option} or leave it out") from None


def _start_time(pid: int) -> int | None:
    """Field 22 of ``/proc/PID/stat`` (proc(5)): the start time in clock ticks since boot; None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def _exe(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return None


@attrs.frozen
class Proc:
    """A server process :func:`start` began: ``name``, ``pid``, ``exe`` (its binary), ``started`` (its
    start time, clock ticks since boot), ``log`` (its output)."""

    name: str
    pid: int
    exe: str
    started: int
    log: str

    def ours(self) -> bool:
        """Whether ``pid`` is still this process (same executable, same start time): a pid reused by
        another process is never signalled."""
        return _start_time(self.pid) == self.started and _exe(self.pid) == self.exe

    def alive(self) -> bool:
        if not self.ours():
            return False
        with contextlib.suppress(OSError):
            state = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            return state != "Z"
        return False


_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}
"""Servers this process started, kept so that :func:`stop` in the same process (a test session) reaps them;
a server started by ``scripts/kube-real start`` outlives that command (its own session, no parent wait)."""


def _spawn(name: str, argv: list[str], log: Path) -> Proc:
    with open(log, "ab") as out:
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                             start_new_session=True, close_fds=True, cwd=log.parent)
    _CHILDREN[p.pid] = p
    started = _start_time(p.pid)
    if started is None:
        raise KubeRealError(f"{name}: exited at once (exit {p.wait()}); see {log}")
    return Proc(name, p.pid, os.path.realpath(argv[0]), started, str(log))


def _why_it_died(proc: Proc) -> str:
    """The most telling line of a dead server's log: a bind failure, else the last error line."""
    lines = [ln for ln in Path(proc.log).read_text(errors="replace").splitlines() if ln.strip()]
    for ln in lines:
        if "address already in use" in ln:
            return "address already in use: " + ln[-200:]
    errors = [ln for ln in lines if ln.startswith(("E", "F")) or '"level":"fatal"' in ln
              or '"level":"error"' in ln or "error" in ln.lower()]
    picked = (errors or lines or ["no output"])[-1]
    return picked[-300:]


def _wait(what: str, proc: Proc, ready: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not proc.alive():
            raise KubeRealError(f"{what} exited during start-up: {_why_it_died(proc)} (log: {proc.log})")
        with contextlib.suppress(httpx.HTTPError, OSError):
            if ready():
                return
        time.sleep(0.2)
    raise KubeRealError(f"{what} was not ready within {timeout_s:.0f} s (log: {proc.log})")


# -- start, stop ---------------------------------------------------------------------------------------------
@attrs.frozen
class Cluster:
    """What :func:`start` left running, as ``DIR/kube-real.json`` holds it.

    Attributes:
        dir: the directory; url: ``https://127.0.0.1:PORT``; namespace and service_account: those of
        ``rbac.yaml``; processes: etcd then the API server; made: paths :func:`start` created, removed by
        :func:`stop` (deepest last: ``dir`` itself when :func:`start` created it).
    """

    dir: str
    url: str
    etcd_url: str
    namespace: str
    service_account: str
    processes: tuple[Proc, ...]
    made: tuple[str, ...]

    @property
    def admin_kubeconfig(self) -> str:
        return os.path.join(self.dir, "admin.kubeconfig")

    @property
    def operator_kubeconfig(self) -> str:
        return os.path.join(self.dir, "operator.kubeconfig")

    @property
    def audit_log(self) -> str:
        return os.path.join(self.dir, "audit.log")

    @property
    def ca(self) -> str:
        return os.path.join(self.dir, "pki", "ca.crt")

    @property
    def admin_cert(self) -> tuple[str, str]:
        return os.path.join(self.dir, "pki", "admin.crt"), os.path.join(self.dir, "pki", "admin.key")

    def admin(self, timeout_s: float = 30.0) -> httpx.Client:
        """An HTTP client with every right (the administrator's certificate)."""
        import ssl

        ctx = ssl.create_default_context(cafile=self.ca)
        ctx.load_cert_chain(*self.admin_cert)
        return httpx.Client(base_url=self.url, verify=ctx, timeout=timeout_s, trust_env=False)

    def pid(self, name: str) -> int:
        """The pid of ``etcd`` or ``kube-apiserver``."""
        (proc,) = [p for p in self.processes if p.name == name]
        return proc.pid


def _rbac_account() -> tuple[str, str]:
    docs = [d for d in yaml.safe_load_all((DEPLOY / "rbac.yaml").read_text()) if d]
    (account,) = [d for d in docs if d["kind"] == "ServiceAccount"]
    return account["metadata"]["namespace"], account["metadata"]["name"]


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with open(fd, "w", encoding="utf-8") as f:
        f.write(text)


def _kubeconfig(url: str, ca: Path, namespace: str, user: dict[str, str]) -> str:
    import base64

    doc = {
        "apiVersion": "v1", "kind": "Config", "current-context": "kube-real",
        "clusters": [{"name": "kube-real", "cluster": {
            "server": url, "certificate-authority-data": base64.b64encode(ca.read_bytes()).decode()}}],
        "users": [{"name": "kube-real", "user": user}],
        "contexts": [{"name": "kube-real", "context": {"cluster": "kube-real", "user": "kube-real",
                                                       "namespace": namespace}}],
    }
    return json.dumps(doc, indent=1)


_COLLECTIONS: Final = {
    "Namespace": "/api/v1/namespaces",
    "ServiceAccount": "/api/v1/namespaces/{ns}/serviceaccounts",
    "Role": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles",
    "RoleBinding": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings",
    "ClusterRole": "/apis/rbac.authorization.k8s.io/v1/clusterroles",
    "ClusterRoleBinding": "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
    "CustomResourceDefinition": "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
}


def apply(client: httpx.Client, path: Path) -> list[dict[str, Any]]:
    """Create every object of the YAML file ``path`` (kept as it is when it exists already: 409).

    Raises:
        KubeRealError: a kind this harness does not know, or the API server refused an object (the line
            names the file, the object and the server's message).
    """
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    for doc in docs:
        kind, meta = doc["kind"], doc["metadata"]
        if kind not in _COLLECTIONS:
            raise KubeRealError(f"{path}: {kind} {meta['name']}: not a kind kube-real applies")
        r = client.post(_COLLECTIONS[kind].format(ns=meta.get("namespace", "")), json=doc)
        if r.status_code not in (200, 201, 409):
            raise KubeRealError(f"{path}: {kind} {meta['name']}: HTTP {r.status_code}: "
                                f"{r.json().get('message', r.text)[:300]}")
    return docs


_NAMES: Final = ("pki", "audit-policy.yaml", "etcd-data", "etcd.log", "apiserver.log", "audit.log",
                  "admin.kubeconfig", "operator.kubeconfig", STATE_FILE)
"""What :func:`start` makes in ``DIR``."""


def start(dir_: str, *, apiserver_port: int = 0, etcd_port: int = 0, say: Callable[[str], None] = print,
          ) -> Cluster:
    """Build if needed, start etcd and the API server on loopback, apply the CRD and RBAC, write the
    kubeconfigs (see the module docstring). A second start on a ``DIR`` whose servers still run returns them.

    Args:
        dir_: where everything goes; created (mode 0700) when missing; must not hold a stopped cluster's
            files (``stop`` first).
        apiserver_port, etcd_port: 0 picks a free loopback port.

    Raises:
        KubeRealError: the build, a port, a server or a manifest failed (servers already started are
            stopped again and what was made removed), or ``DIR`` is not a directory of root's.
    """
    d = Path(os.path.abspath(dir_))
    running = _running(d)
    if running is not None:
        say(f"kube-real: already running in {d}: {running.url}")
        return running
    for port, what, option in ((apiserver_port, "kube-apiserver", "--apiserver-port"),
                               (etcd_port, "etcd", "--etcd-port")):
        if port:
            _check_port_free(port, what, option)
    binaries = ensure_binaries(say)
    made: list[str] = []
    if not d.exists():
        d.mkdir(mode=0o700, parents=True)
        made.append(str(d))
    st = d.lstat()
    if not d.is_dir() or d.is_symlink() or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise KubeRealError(f"{d}: not a directory of this user's that only it may write")
    if (d / STATE_FILE).exists():
        raise KubeRealError(f"{d}: holds a cluster that is not running; run: scripts/kube-real stop {d}")
    there = [n for n in _NAMES if os.path.lexists(d / n)]
    if there:  # stop removes what start makes: never something of the same name that was there before
        raise KubeRealError(f"{d}: already holds {', '.join(there)}, which kube-real did not make; "
                            "name an empty or new directory")
    procs: list[Proc] = []
    try:
        pki = d / "pki"
        pki.mkdir(mode=0o700)
        made.append(str(pki))
        files = _pki(pki)
        made.extend(str(p) for p in files.values())
        namespace, account = _rbac_account()
        user = f"system:serviceaccount:{namespace}:{account}"
        policy = d / "audit-policy.yaml"
        _write_private(policy, AUDIT_POLICY.replace("{users}", f"{json.dumps(user)}, {ADMIN_USER}"))
        made.append(str(policy))
        made += [str(d / n) for n in ("etcd-data", "etcd.log", "apiserver.log", "audit.log")]

        etcd_port = etcd_port or _free_port()
        peer = _free_port()
        etcd_url = f"http://127.0.0.1:{etcd_port}"
        etcd = _spawn("etcd", [
            str(binaries.etcd), "--name", "kube-real", "--data-dir", str(d / "etcd-data"),
            "--listen-client-urls", etcd_url, "--advertise-client-urls", etcd_url,
            "--listen-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-cluster", f"kube-real=http://127.0.0.1:{peer}", "--log-level", "warn",
        ], d / "etcd.log")
        procs.append(etcd)

        def etcd_healthy() -> bool:
            health = httpx.get(f"{etcd_url}/health", timeout=2, trust_env=False).json()
            return bool(health.get("health") == "true")

        _wait(f"etcd on 127.0.0.1:{etcd_port}", etcd, etcd_healthy, START_TIMEOUT_S)

        apiserver_port = apiserver_port or _free_port()
        url = f"https://127.0.0.1:{apiserver_port}"
        api = _spawn("kube-apiserver", [
            str(binaries.apiserver), f"--etcd-servers={etcd_url}", "--bind-address=127.0.0.1",
            f"--secure-port={apiserver_port}", f"--cert-dir={pki}",
            f"--tls-cert-file={files['apiserver.crt']}", f"--tls-private-key-file={files['apiserver.key']}",
            f"--client-ca-file={files['ca.crt']}", "--authorization-mode=RBAC",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={files['sa.pub']}",
            f"--service-account-signing-key-file={files['sa.key']}",
            "--service-cluster-ip-range=10.96.0.0/16", "--profiling=false",
            f"--audit-policy-file={policy}", f"--audit-log-path={d / 'audit.log'}",
            "--audit-log-mode=blocking", "--audit-log-maxbackup=0",
        ], d / "apiserver.log")
        procs.append(api)
        cluster = Cluster(str(d), url, etcd_url, namespace, account, tuple(procs), tuple(made))
        with cluster.admin(timeout_s=5) as client:
            _wait(f"kube-apiserver on 127.0.0.1:{apiserver_port}", api,
                  lambda: client.get("/readyz").status_code == 200, START_TIMEOUT_S)
            client.timeout = httpx.Timeout(30)
            apply(client, DEPLOY / "crd.yaml")
            made_ns = client.post("/api/v1/namespaces", json={"apiVersion": "v1", "kind": "Namespace",
                                                              "metadata": {"name": namespace}})
            if made_ns.status_code not in (201, 409):
                raise KubeRealError(f"namespace {namespace}: HTTP {made_ns.status_code}: "
                                    f"{made_ns.text[:300]}")
            apply(client, DEPLOY / "rbac.yaml")
            _wait_served(client, api, namespace)
            token = _bound_token(client, namespace, account)
        _write_private(d / "admin.kubeconfig", _kubeconfig(url, files["ca.crt"], namespace, {
            "client-certificate": str(files["admin.crt"]), "client-key": str(files["admin.key"])}))
        _write_private(d / "operator.kubeconfig",
                       _kubeconfig(url, files["ca.crt"], namespace, {"token": token}))
        cluster = attrs.evolve(cluster, made=(*made, str(d / "admin.kubeconfig"),
                                              str(d / "operator.kubeconfig"), str(d / STATE_FILE)))
        _write_private(d / STATE_FILE, json.dumps(attrs.asdict(cluster), indent=1))
        return cluster
    except OSError as exc:
        _end(procs)
        _remove(made)
        raise KubeRealError(f"{exc.filename or d}: {exc.strerror or exc}") from None
    except BaseException:
        _end(procs)
        _remove(made)
        raise


def _wait_served(client: httpx.Client, api: Proc, namespace: str) -> None:
    """Until the CRD is Established and its objects can be listed in ``namespace`` (the discovery and
    storage of a new CRD come up a moment after it is created)."""
    (crd,) = [d for d in yaml.safe_load_all((DEPLOY / "crd.yaml").read_text()) if d]
    group, plural = crd["spec"]["group"], crd["spec"]["names"]["plural"]
    version = crd["spec"]["versions"][0]["name"]

    def served() -> bool:
        got = client.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{plural}.{group}").json()
        conditions = {c["type"]: c["status"] for c in got.get("status", {}).get("conditions", [])}
        if conditions.get("Established") != "True":
            return False
        listed = client.get(f"/apis/{group}/{version}/namespaces/{namespace}/{plural}")
        return listed.status_code == 200

    _wait(f"the CRD {plural}.{group}", api, served, START_TIMEOUT_S)


def _bound_token(client: httpx.Client, namespace: str, account: str) -> str:
    """A TokenRequest (``kubectl create token``) for the ServiceAccount: its Role's rights only."""
    r = client.post(f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token", json={
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
        "spec": {"expirationSeconds": TOKEN_LIFETIME_S}})
    if r.status_code != 201:
        raise KubeRealError(f"TokenRequest for {namespace}/{account}: HTTP {r.status_code}: {r.text[:300]}")
    token: str = r.json()["status"]["token"]
    return token


def _load(d: Path) -> Cluster | None:
    try:
        doc = json.loads((d / STATE_FILE).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise KubeRealError(f"{d / STATE_FILE}: unreadable ({exc})") from None
    doc["processes"] = tuple(Proc(**p) for p in doc["processes"])
    doc["made"] = tuple(doc["made"])
    return Cluster(**doc)


def _running(d: Path) -> Cluster | None:
    cluster = _load(d)
    if cluster is None or not all(p.alive() for p in cluster.processes):
        return None
    return cluster


def _end(procs: list[Proc] | tuple[Proc, ...]) -> list[str]:
    """SIGTERM each process that is still ours (the API server first), SIGKILL after ``STOP_TIMEOUT_S``;
    returns a line for each pid left alone because it is no longer the process we started."""
    left: list[str] = []
    for proc in reversed(procs):
        if not proc.ours():
            if _start_time(proc.pid) is not None:
                left.append(f"pid {proc.pid} is no longer the {proc.name} kube-real started; left alone")
            continue
        os.kill(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while proc.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        if proc.alive():
            os.kill(proc.pid, signal.SIGKILL)
            while proc.alive() and time.monotonic() < deadline + 5:
                time.sleep(0.05)
        child = _CHILDREN.pop(proc.pid, None)
        if child is not None:  # started by this process: reap it (no zombie left behind)
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=5)
    return left


def _remove(made: list[str] | tuple[str, ...]) -> None:
    """Remove what start made, deepest first; a directory only when it is empty after that (``etcd-data``,
    which etcd fills, is removed whole: it is ours)."""
    for path in sorted(made, key=len, reverse=True):
        p = Path(path)
        with contextlib.suppress(FileNotFoundError):
            if p.name == "etcd-data" and p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            elif p.is_dir() and not p.is_symlink():
                with contextlib.suppress(OSError):  # not empty: something we did not make is there
                    p.rmdir()
            else:
                p.unlink()


def stop(dir_: str, say: Callable[[str], None] = print) -> None:
    """End the servers ``DIR/kube-real.json`` names (only while each pid is still the process started) and
    remove what :func:`start` made. Nothing to stop is not an error (a second stop)."""
    d = Path(os.path.abspath(dir_))
    cluster = _load(d)
    if cluster is None:
        say(f"kube-real: nothing to stop in {d}")
        return
    left = _end(cluster.processes)
    for line in left:
        say(f"kube-real: {line}")
    _remove(cluster.made)
    if not left:
        ended = " and ".join(f"{p.name} (pid {p.pid})" for p in cluster.processes)
        say(f"kube-real: stopped {ended}; removed what start made in {d}")


# -- reading the audit log -----------------------------------------------------------------------------------
def audit_size(path: str) -> int:
    """The audit log's size in bytes now (an offset for :func:`audit_events`)."""
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0


def audit_events(path: str, offset: int = 0) -> Iterator[dict[str, Any]]:
    """The audit log's events from byte ``offset`` on (one JSON object a line; a line still being written is
    left for the next read), ``ResponseComplete`` only: one per request."""
    with contextlib.suppress(FileNotFoundError), open(path, encoding="utf-8") as f:
        f.seek(offset)
        for line in f:
            if not line.endswith("\n"):
                return
            event = json.loads(line)
            if event.get("stage") == "ResponseComplete":
                yield event


@contextlib.contextmanager
def running(dir_: str, **options: Any) -> Iterator[Cluster]:
    """``with running(DIR) as cluster``: :func:`start`, then :func:`stop` on the way out."""
    cluster = start(dir_, say=lambda _: None, **options)
    try:
        yield cluster
    finally:
        stop(dir_, say=lambda _: None)


def main(argv: list[str]) -> int:
    """``scripts/kube-real {build,start DIR,stop DIR}``; exit 0, or 1 with one line on stderr."""
    parser = argparse.ArgumentParser(prog="scripts/kube-real", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("build", help="build the servers into the cache (nothing when cached)")
    s = sub.add_parser("start", help="start etcd and kube-apiserver for DIR")
    s.add_argument("dir")
    s.add_argument("--apiserver-port", type=int, default=0, help="default: a free loopback port")
    s.add_argument("--etcd-port", type=int, default=0, help="default: a free loopback port")
    t = sub.add_parser("stop", help="stop them and remove their data")
    t.add_argument("dir")
    args = parser.parse_args(argv)

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    try:
        if args.command == "build":
            b = ensure_binaries(say)
            how = f"built in {b.seconds:.0f} s" if b.built else "cached"
            say(f"kube-real: {how}: {b.apiserver.parent}")
        elif args.command == "start":
            c = start(args.dir, apiserver_port=args.apiserver_port, etcd_port=args.etcd_port, say=say)
            print(f"kube-real: {c.url} (etcd {c.etcd_url}); {c.admin_kubeconfig}, {c.operator_kubeconfig}")
        else:
            stop(args.dir, say)
    except KubeRealError as exc:
        say(f"kube-real: {exc}")
        return 1
    except KeyboardInterrupt:
        say("kube-real: interrupted")
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
