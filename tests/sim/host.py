"""A simulated host implementing every port of ``upgrade_core.ports`` (design §8), with crash injection.

The disk separates volatile from durable state. Host effects (staging, rename onto a slot, link flips,
result files) are durable when their port call returns, as the real bindings fsync file and directory
before returning. The journal is where the two differ: ``append`` writes a record (volatile, like the
page cache) and then fsyncs it (durable). A process crash keeps everything written; a power cut drops
every record past the durable prefix (a torn last record disappears on replay, as the real journal's
torn-tail repair makes it).

The agent unit is simulated against the fake monotonic clock: what it runs is decided when it starts
(``ExecStart`` resolves ``current``), and each candidate's :class:`Behavior` says how the process lives:
healthy, exiting after some seconds (then ``Restart=on-failure``/``RestartSec=1`` until the start limit),
or hanging (running but its probe failing).

Crash injection: :class:`CrashPlan` picks the N-th port call (counted over every wrapped call) and
raises :class:`SimCrash` (a ``BaseException``, so no ``except Exception`` can eat it) before or after
it. :meth:`World.crash` then applies the fault (process crash or power cut) and :meth:`World.ports`
builds the ports of a fresh process on the same disk.
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Callable, Sequence
from typing import Any, Literal

import anyio
import attrs

from upgrade_core import Policy, Ports, UpgradeResult, fold
from upgrade_core._events import Event, ReleaseTrusted, Slot
from upgrade_core.errors import (
    DigestMismatchError,
    FetchError,
    HostError,
    LayoutConflictError,
    ServiceError,
    UpgradeError,
    VerifyError,
    VerifyTimeoutError,
    VersionMismatchError,
)
from upgrade_core.ports import LinkState, ProbeUnreachable, StagedCandidate, UnitSnapshot

FaultKind = Literal["crash", "power"]
When = Literal["before", "after"]


class SimCrash(BaseException):
    """The upgrading process died at an injected point; unwinds everything above it."""


@attrs.frozen
class SimRecord:
    """A journal record: the envelope of :class:`upgrade_core.Recorded`."""

    seq: int
    episode_id: str
    wall_time: float
    event: Event


@attrs.frozen
class Behavior:
    """How a binary behaves under the unit.

    Attributes:
        kind: ``good``; ``exit`` (exits after ``exit_after_s``, then auto-restarts); ``hang`` (runs,
            probe fails); ``verify_fail`` (its version command fails); ``verify_hang`` (its version command
            outlives ``verify.timeout_s``: reported at once, the sim does not model the wait); ``unreachable``
            (runs, but its probe cannot connect: a :class:`ProbeUnreachable`, as the network not being up).
        exit_after_s: lifetime of each run for ``exit`` (0.05 = crash loop).
    """

    kind: Literal["good", "exit", "hang", "verify_fail", "verify_hang", "unreachable"] = "good"
    exit_after_s: float = 0.3


@attrs.frozen
class Candidate:
    """An archive the simulated source can serve: its member digest, version, behavior and member size, and
    for a signed release what its verified signature says (docs/trust.md)."""

    sha256: str
    version: str
    behavior: Behavior
    size: int = 1000
    release: ReleaseTrusted | None = None


EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
"""A file recorded with this digest is zero-length: a slot holding it reads as missing (case C12)."""


def archive_sha256(cand: Candidate) -> str:
    """The digest of the compressed archive the simulated source serves for ``cand``."""
    return hashlib.sha256(b"archive" + cand.sha256.encode()).hexdigest()


def make_candidate(label: str, behavior: Behavior) -> Candidate:
    """A candidate whose digest derives from ``label``; version ``1.<n>`` style from the label."""
    sha = hashlib.sha256(label.encode()).hexdigest()
    return Candidate(sha, f"1.{int(sha[:4], 16)}", behavior)


@attrs.frozen
class CrashPlan:
    """Crash with ``kind`` before/after a wrapped port call.

    Attributes:
        call_index: 1-based index over every wrapped call; or, with ``method``, over that method's calls.
        when: ``before`` or ``after`` the call.
        kind: ``crash`` (process dies) or ``power`` (power cut: unsynced journal records are lost).
        method: e.g. ``host.point_current``; None counts every call.
    """

    call_index: int
    when: When
    kind: FaultKind
    method: str | None = None


START_BURST = 5  # StartLimitBurst = max_attempts + 2 with the sim policy's 3 attempts (design §6)
RESTART_SEC = 1.0


class World:
    """The simulated host: disk, unit, clock, result sink and the candidates' catalogue."""

    ROOT = "/sim/R/lib/agent"

    def __init__(self, policy: Policy, *, inside_unit: bool = False) -> None:
        self.policy = policy
        self.now = 1000.0
        self.wall = 1_700_000_000.0
        # disk
        self.records: list[SimRecord] = []
        self.durable_records = 0
        self.files: dict[str, str] = {}  # path -> sha256 of content
        self.current: Slot | None = None
        self.last_good: Slot | None = None
        self.results: dict[str, list[UpgradeResult]] = {}
        self.staging_counter = 0
        # the catalogue: archive source -> candidate; member sha -> candidate
        self.archives: dict[str, Candidate] = {}
        self.archive_faults: dict[str, UpgradeError] = {}  # source -> what staging it raises (bad archive)
        self.by_sha: dict[str, Candidate] = {}
        self.verified_digests: set[str] = set()
        self.base_digests: set[str] = set()
        # the agent unit
        self.unit_sha: str | None = None
        self.unit_slot: Slot | None = None
        self.unit_t0 = 0.0
        self.unit_pid_base = 100
        self.unit_inv_n = 0
        self.unit_n_restarts = 0
        self.unit_active = False
        self.inside_unit = inside_unit
        self.handoffs: list[tuple[str, bool]] = []
        # seconds between a restart request and its job (the --no-block transient unit): meanwhile the
        # unit keeps what it ran, auto-restarts included; None once the job ran
        self.restart_lag_s = 0.0
        self.restart_due: float | None = None
        # crash injection
        self.plan: CrashPlan | None = None
        self.calls = 0
        self.per_method: dict[str, int] = {}
        self.trace: list[tuple[str, When]] = []
        self.fired: tuple[str, When, FaultKind] | None = None
        self.fsync_skip: Callable[[Event], bool] = lambda event: False
        self.on_call: Callable[[str, When], None] | None = None
        self.stall_stage = False
        # mirrors (design §3 [[mirrors]]): path -> sha256 of the copy it holds
        self.mirror_paths: tuple[str, ...] = ()
        self.mirror_files: dict[str, str] = {}
        # links where a real file stands instead of a symlink ("current", "last-good"): LayoutConflictError
        self.link_conflicts: set[str] = set()

    # -- catalogue ---------------------------------------------------------------------------------------
    def add_archive(self, source: str, cand: Candidate) -> None:
        self.archives[source] = cand
        self.by_sha[cand.sha256] = cand

    def install_bare(self, cand: Candidate) -> None:
        """A host installed with ``cand`` in blue, current and last-good on blue, unit running it."""
        self.by_sha[cand.sha256] = cand
        self.files[self.slot_path("blue")] = cand.sha256
        self.current = self.last_good = "blue"
        self.verified_digests.add(cand.sha256)
        self.base_digests.add(cand.sha256)
        self.start_unit()

    # -- paths -------------------------------------------------------------------------------------------
    def slot_path(self, slot: Slot) -> str:
        return f"{self.ROOT}/agent-{slot}"

    def slot_sha(self, slot: Slot | None) -> str | None:
        sha = self.files.get(self.slot_path(slot)) if slot is not None else None
        return None if sha == EMPTY_SHA256 else sha

    # -- the unit ----------------------------------------------------------------------------------------
    def start_unit(self, at: float | None = None) -> None:
        """(Re)start the agent unit at ``at`` (default now): ExecStart resolves ``current`` then."""
        self.restart_due = None
        self.unit_slot = self.current
        self.unit_sha = self.slot_sha(self.current)
        self.unit_t0 = self.now if at is None else at
        self.unit_pid_base += 10
        self.unit_inv_n += 1
        self.unit_n_restarts = 0
        self.unit_active = self.unit_sha is not None

    def behavior(self) -> Behavior:
        cand = self.by_sha.get(self.unit_sha or "")
        return cand.behavior if cand is not None else Behavior("exit", 0.05)

    def settle_restart(self) -> None:
        """Run a requested restart whose job is due (``restart_lag_s`` after the request)."""
        if self.restart_due is not None and self.now >= self.restart_due:
            self.start_unit(self.restart_due)

    def snapshot(self) -> UnitSnapshot:
        self.settle_restart()
        if not self.unit_active or self.unit_slot is None:
            return UnitSnapshot("inactive", "dead", "success", 0, "", 0, 0.0, None, ())
        b = self.behavior()
        exe = self.slot_path(self.unit_slot)
        argv = (f"{self.ROOT}/agent-current",)  # ExecStart runs the current link: argv[0] names it
        inv_base = f"{self.unit_inv_n:08x}"
        if b.kind != "exit":
            return UnitSnapshot("active", "running", "success", self.unit_pid_base, inv_base + "0" * 24,
                                0, self.unit_t0, exe, argv)
        period = b.exit_after_s + RESTART_SEC
        elapsed = self.now - self.unit_t0
        k = int(elapsed // period)
        if (k + 1 >= START_BURST and elapsed - k * period >= b.exit_after_s) or k >= START_BURST:
            return UnitSnapshot("failed", "failed", "start-limit-hit", 0, "", k, 0.0, None, ())
        phase = elapsed - k * period
        if phase < b.exit_after_s:
            return UnitSnapshot("active", "running", "success", self.unit_pid_base + k,
                                inv_base + f"{k:024x}", k, self.unit_t0 + k * period, exe, argv)
        return UnitSnapshot("activating", "auto-restart", "exit-code", 0, "", k + 1, 0.0, None, ())

    def probe(self) -> str | None:
        snap = self.snapshot()
        if snap.sub_state != "running":
            return "connection refused"
        if self.behavior().kind == "hang":
            return "HTTP 503"
        if self.behavior().kind == "unreachable":
            return ProbeUnreachable("http probe: ConnectError: network is unreachable")
        return None

    # -- faults ------------------------------------------------------------------------------------------
    def arm(self, plan: CrashPlan | None) -> None:
        """Arm a crash plan for the next process (counts restart from zero)."""
        self.plan = plan
        self.calls = 0
        self.per_method = {}
        self.fired = None

    def crash(self, kind: FaultKind) -> None:
        """Apply a fault: a process crash keeps the disk; a power cut drops unsynced records and reboots."""
        self.plan = None
        if kind == "power":
            del self.records[self.durable_records:]
            self.start_unit()  # boot: the unit starts from whatever current names

    def replay(self) -> list[SimRecord]:
        """What a new process reads back from the journal."""
        return list(self.records)

    def ports(self, *, crashable: bool = True) -> Ports:
        """The ports of a fresh process on this host (wrapped for crash injection when ``crashable``)."""
        journal = SimJournal(self)
        parts: dict[str, Any] = {
            "journal": journal, "clock": SimClock(self), "host": SimHost(self), "source": SimSource(self),
            "verifier": SimVerifier(self), "service": SimService(self, self.policy.unit),
            "probe": SimProbe(self), "sink": SimSink(self), "ids": SimIds(self),
        }
        if crashable:
            parts = {name: _Crashing(self, name, obj) for name, obj in parts.items()}
        return Ports(**parts)

    def check_call(self, name: str, when: When) -> None:
        if when == "before":
            self.calls += 1
            self.per_method[name] = self.per_method.get(name, 0) + 1
        self.trace.append((name, when))
        if self.on_call is not None:
            self.on_call(name, when)
        plan = self.plan
        if plan is None or plan.when != when:
            return
        count = self.calls if plan.method is None else self.per_method.get(name, 0)
        if (plan.method is None or plan.method == name) and plan.call_index == count:
            self.fired = (name, when, plan.kind)
            raise SimCrash(f"{plan.kind} {when} {name} (call {self.calls})")


# Calls that are pure reads of the process itself (no I/O) are not crash points.
CRASH_METHODS: tuple[str, ...] = (
    "journal.append", "journal.reread", "host.links", "host.slot_sha256", "host.sweep_staging",
    "host.prepare_staging", "host.discard_staging", "host.install_staged", "host.point_current",
    "host.point_last_good", "host.sync_mirrors", "source.stage", "verifier.verify", "service.snapshot",
    "service.restart", "service.restart_done", "service.hand_off_recovery", "probe.check", "sink.publish",
)
"""Every port call a crash can be injected around (design §8)."""

_NOT_CRASH_POINTS = frozenset({
    "clock.monotonic", "clock.wall", "clock.sleep", "host.slot_path", "host.current_link_path",
    "ids.token_hex", "journal.records", "service.unit", "service.runs_inside_unit",
})


class _Crashing:
    """Wraps a port so the world can crash the process before or after any call."""

    def __init__(self, world: World, name: str, inner: Any) -> None:
        self._world = world
        self._name = name
        self._inner = inner

    def __getattr__(self, attr: str) -> Any:
        value = getattr(self._inner, attr)
        qual = f"{self._name}.{attr}"
        if not callable(value) or qual in _NOT_CRASH_POINTS:
            return value
        world = self._world
        if inspect.iscoroutinefunction(value):
            async def async_call(*args: Any, **kwargs: Any) -> Any:
                world.check_call(qual, "before")
                result = await value(*args, **kwargs)
                world.check_call(qual, "after")
                return result
            return async_call

        def call(*args: Any, **kwargs: Any) -> Any:
            world.check_call(qual, "before")
            result = value(*args, **kwargs)
            world.check_call(qual, "after")
            return result
        return call


class SimJournal:
    """In-memory journal whose durable prefix is what was fsynced."""

    def __init__(self, world: World) -> None:
        self.w = world

    def records(self) -> Sequence[SimRecord]:
        return list(self.w.records)

    async def append(self, episode_id: str, event: Event) -> SimRecord:
        w = self.w
        record = SimRecord(len(w.records) + 1, episode_id, w.wall, event)
        w.records.append(record)  # written: volatile until fsynced
        if not w.fsync_skip(event):
            w.durable_records = len(w.records)  # fdatasync covers every earlier write too
        await anyio.lowlevel.checkpoint()
        return record

    async def relinquish(self) -> None:
        # One process per world: the lock is implicit; a handed-off recovery simply runs in reread().
        await anyio.lowlevel.checkpoint()

    async def reread(self) -> Sequence[SimRecord]:
        # The handed-off transient unit runs as another process; simulate it running to completion now.
        w = self.w
        if w.handoffs:
            w.handoffs.clear()
            from upgrade_core import recover

            inside, w.inside_unit = w.inside_unit, False  # the transient unit runs outside the agent's cgroup
            try:
                await recover(w.ports(crashable=False), w.policy, "manual")
            finally:
                w.inside_unit = inside
        return list(w.records)


class SimClock:
    """Fake monotonic clock: ``sleep`` advances time, no real waiting."""

    def __init__(self, world: World) -> None:
        self.w = world

    def monotonic(self) -> float:
        return self.w.now

    def wall(self) -> float:
        return self.w.wall

    async def sleep(self, seconds: float) -> None:
        self.w.now += seconds
        self.w.wall += seconds
        await anyio.lowlevel.checkpoint()

    def boot_id(self) -> str | None:
        return "sim-boot"


class SimHost:
    def __init__(self, world: World) -> None:
        self.w = world

    def _refuse_conflict(self, link: str) -> None:
        if link in self.w.link_conflicts:
            raise LayoutConflictError(f"sim: {World.ROOT}/agent-{link}: a real file stands where a link is")

    def links(self) -> LinkState:
        for link in ("current", "last-good"):
            self._refuse_conflict(link)
        return LinkState(self.w.current, self.w.last_good)

    def slot_path(self, slot: Slot) -> str:
        return self.w.slot_path(slot)

    def current_link_path(self) -> str:
        return f"{World.ROOT}/agent-current"

    async def slot_sha256(self, slot: Slot) -> str | None:
        await anyio.lowlevel.checkpoint()
        return self.w.slot_sha(slot)

    def _staging(self) -> list[str]:
        return [p for p in self.w.files if "/.agent-" in p]

    async def sweep_staging(self) -> list[str]:
        removed = self._staging()
        for path in removed:
            del self.w.files[path]
        await anyio.lowlevel.checkpoint()
        return removed

    async def prepare_staging(self, slot: Slot) -> str:
        self.w.staging_counter += 1
        await anyio.lowlevel.checkpoint()
        return f"{World.ROOT}/.agent-{slot}.stage-{self.w.staging_counter:08x}"

    async def discard_staging(self, staging_path: str) -> None:
        self.w.files.pop(staging_path, None)
        await anyio.lowlevel.checkpoint()

    async def install_staged(self, staged: StagedCandidate) -> None:
        w = self.w
        target = w.slot_path(staged.slot)
        if staged.slot in (w.current, w.last_good):
            raise LayoutConflictError(f"sim: refusing to overwrite the live slot {target}")
        if staged.staging_path not in w.files:
            raise HostError(f"sim: {staged.staging_path}: staged file missing; not installed")
        w.files[target] = w.files.pop(staged.staging_path)
        await anyio.lowlevel.checkpoint()

    def _check_target(self, link: str, slot: Slot) -> None:
        self._refuse_conflict(link)
        if self.w.slot_sha(slot) is None:
            raise HostError(f"sim: {self.w.slot_path(slot)}: missing or empty; {link} is not pointed at it")

    async def point_current(self, slot: Slot) -> None:
        self._check_target("current", slot)
        self.w.current = slot
        await anyio.lowlevel.checkpoint()

    async def point_last_good(self, slot: Slot) -> None:
        self._check_target("last-good", slot)
        self.w.last_good = slot
        await anyio.lowlevel.checkpoint()

    async def sync_mirrors(self, slot: Slot, sha256: str) -> tuple[str, ...]:
        w = self.w
        if w.slot_sha(slot) != sha256:
            raise HostError(f"sim: slot {slot} does not hold {sha256[:12]}")
        for path in w.mirror_paths:
            w.mirror_files[path] = sha256
        await anyio.lowlevel.checkpoint()
        return w.mirror_paths


class SimSource:
    def __init__(self, world: World) -> None:
        self.w = world

    async def stage(self, source: str, expected_sha256: str | None, staging_path: str, slot: Slot) -> (
        StagedCandidate
    ):
        await anyio.lowlevel.checkpoint()
        if self.w.stall_stage:
            await anyio.sleep_forever()
        cand = self.w.archives.get(source)
        if cand is None:
            raise FetchError(f"sim: {source}: no such archive")  # transport, as a missing file or a 404
        if source in self.w.archive_faults:
            raise self.w.archive_faults[source]
        archive_sha = archive_sha256(cand)
        if expected_sha256 is not None and expected_sha256 != archive_sha:
            raise DigestMismatchError(f"sim: {source}: sha256 mismatch")
        self.w.files[staging_path] = cand.sha256
        return StagedCandidate(slot, staging_path, cand.sha256, cand.size, archive_sha, 500, cand.release)


class SimVerifier:
    def __init__(self, world: World) -> None:
        self.w = world

    async def verify(self, path: str, expected_version: str | None) -> str:
        await anyio.lowlevel.checkpoint()
        if path not in self.w.files:
            raise VerifyError(f"sim: {path}: cannot run the version command: no such file")
        cand = self.w.by_sha[self.w.files[path]]
        if cand.behavior.kind == "verify_fail":
            raise VerifyError(f"sim: {path}: version command exited 1")
        if cand.behavior.kind == "verify_hang":
            raise VerifyTimeoutError(f"sim: {path}: version command did not finish within verify.timeout_s")
        if expected_version is not None and expected_version.lstrip("v") != cand.version.lstrip("v"):
            raise VersionMismatchError(f"sim: {path}: reported {cand.version}, expected {expected_version}")
        self.w.verified_digests.add(cand.sha256)
        # the normalised version, as agent.release.verify records it (C29)
        return cand.version.removeprefix("v")


class SimService:
    def __init__(self, world: World, unit: str) -> None:
        self.w = world
        self._unit = unit

    @property
    def unit(self) -> str:
        return self._unit

    async def snapshot(self) -> UnitSnapshot:
        await anyio.lowlevel.checkpoint()
        return self.w.snapshot()

    async def restart(self, transient_name: str) -> None:
        if not transient_name.startswith(f"{self.w.policy.agent}-restart-"):
            raise ServiceError(f"sim: bad transient unit name {transient_name}")
        if self.w.restart_lag_s > 0:
            self.w.restart_due = self.w.now + self.w.restart_lag_s
        else:
            self.w.start_unit()
        await anyio.lowlevel.checkpoint()

    async def restart_done(self, transient_name: str) -> bool:
        await anyio.lowlevel.checkpoint()
        self.w.settle_restart()
        return self.w.restart_due is None

    def runs_inside_unit(self) -> bool:
        return self.w.inside_unit

    async def hand_off_recovery(self, transient_name: str, after_unit: bool) -> None:
        self.w.handoffs.append((transient_name, after_unit))
        await anyio.lowlevel.checkpoint()


class SimProbe:
    def __init__(self, world: World) -> None:
        self.w = world

    async def check(self) -> str | None:
        await anyio.lowlevel.checkpoint()
        return self.w.probe()


class SimSink:
    def __init__(self, world: World) -> None:
        self.w = world

    async def publish(self, result: UpgradeResult) -> None:
        await anyio.lowlevel.checkpoint()
        self.w.results.setdefault(result.operation or "", []).append(result)


class SimIds:
    def __init__(self, world: World) -> None:
        self.w = world
        self.n = 0

    def token_hex(self, nbytes: int) -> str:
        self.n += 1
        return f"{self.n:0{2 * nbytes}x}"[-2 * nbytes:]


SIM_POLICY = Policy(agent="agent", unit="agent.service", stability_s=0.5, health_timeout_s=1.5,
                    max_attempts=3, poll_interval_s=0.25)


def journal_view(world: World) -> Any:
    """``fold(replay(disk))``."""
    return fold(world.replay())
