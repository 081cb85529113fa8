"""Fold benchmark: decode + fold of ~100k journal payloads against a ``json.loads`` baseline, side by side.

Run: ``python -m benchmarks.core_fold`` (from the repository root). Prints seconds for each stage and the
ratio (decode + fold) / json.loads; the target of the replay benchmark is <= 3x for replay + decode + fold.
Best of 3 runs per stage (``time.perf_counter``), on synthetic episodes alternating a full commit (15
events) and a full rollback (28 events).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import attrs

from upgrade_core import EVENT_CODEC, UpgradeResult, fold
from upgrade_core import _events as ev


@attrs.frozen
class _Rec:
    seq: int
    episode_id: str
    wall_time: float
    event: ev.Event


def _episode(op: str, good: bool) -> list[ev.Event]:
    events: list[ev.Event] = [
        ev.EpisodeOpened(op, "upgrade", "https://h/a.tar.gz", None, None, "blue", "1.0", 3, 3.0, 60.0),
        ev.ArchiveFetched(500, "a" * 64), ev.CandidateStaged("green", "c" * 64, 1000, "/s"),
        ev.CandidateVerified("2.0"), ev.CandidateInstalled("green", "c" * 64),
        ev.SwitchIntended("green", "blue", "blue"), ev.SwitchCommitted("green"), ev.MirrorsSynced(()),
    ]
    attempts = 1 if good else 3
    for n in range(1, attempts + 1):
        events += [ev.HealthAttemptStarted(n), ev.RestartRequested(f"u-{n}", 1.0),
                   ev.RestartObserved(9, "f" * 32)]
        events.append(ev.HealthPassed(n) if good else ev.HealthFailed(n, "MainPID changed"))
    if good:
        result = UpgradeResult(op, "committed", "1.0", "2.0", "green")
        events += [ev.UpgradeCommitted("green", "2.0")]
    else:
        result = UpgradeResult(op, "rolled_back", "1.0", "2.0", "blue", "unhealthy")
        events += [ev.RollbackStarted("unhealthy", "blue"), ev.HealthAttemptStarted(1, "last_good"),
                   ev.HealthPassed(1, "last_good"), ev.RolledBack("blue")]
    return [*events, ev.ResultPublished(result), ev.EpisodeClosed(result.result)]


def _best(fn: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main(target: int = 100_000) -> None:
    pairs: list[tuple[str, ev.Event]] = []
    i = 0
    while len(pairs) < target:
        i += 1
        pairs += [(f"op{i}", e) for e in _episode(f"op{i}", good=i % 2 == 1)]
    payloads = [EVENT_CODEC.encode(e) for _op, e in pairs]
    decoded = [EVENT_CODEC.decode(p) for p in payloads]
    records = [_Rec(k + 1, op, 0.0, e) for k, ((op, _e), e) in enumerate(zip(pairs, decoded, strict=True))]
    t_json = _best(lambda: [json.loads(p) for p in payloads])
    t_decode = _best(lambda: [EVENT_CODEC.decode(p) for p in payloads])
    t_fold = _best(lambda: fold(records))
    print(f"records: {len(records)}")
    print(f"json.loads baseline: {t_json:.3f} s")
    print(f"decode (cattrs):     {t_decode:.3f} s  ({t_decode / t_json:.2f}x)")
    print(f"fold:                {t_fold:.3f} s  ({t_fold / t_json:.2f}x)")
    print(f"decode + fold:       {(t_decode + t_fold) / t_json:.2f}x json.loads")


if __name__ == "__main__":
    main()
