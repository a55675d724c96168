"""The refinement phase: configurations next to the best so far, for when the sampler
stalls.

Accelerators have cliffs in the batch cost (tile and wave boundaries, padding to
multiples of 8 or 16, the batch sizes a runtime captured graphs for), so the best batch
size often sits right on an edge, and a smooth sampler circles around it without landing
there. Refinement tries the edges next to the best: the integer neighbours of its batch
size, the powers of two and the multiples of 8 and 16 around it, and its wait halved
and doubled.

Everything here is a pure function of the trial records, so a tuner rebuilt from its
records (the operator's path) decides exactly as the original did.

A trial that killed the server (`SERVER_DIED` in its reason) is retried once; when the
retry kills it too, every batch size at or above its own is out of the study, whatever
the wait: what kills a server at a large batch
is memory, which a batch of that size needs however long the batcher waited to fill it,
and under the capacity search's rising load the batches fill whatever the wait.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

from batchpilot.tuner.space import BATCH, QUEUE, Params, SearchSpace

# The sampler has stalled when the best has not improved for this many measured trials.
STALL_TRIALS = 3
# ... or when no more trials than this are left in the budget.
TAIL_TRIALS = 4
# A stall is worked off in rounds: this many refinement trials, then as many sampler
# trials, and so on while the best stands (a long list of edges around a mediocre early
# best would otherwise starve the sampler).
ROUND_TRIALS = 3
SERVER_DIED = "ServerDied"


class RecordLike(Protocol):
    @property
    def number(self) -> int: ...
    @property
    def params(self) -> Mapping[str, float | int]: ...
    @property
    def state(self) -> str: ...
    @property
    def effective_rps(self) -> float | None: ...
    @property
    def reason(self) -> str: ...


def server_died_reason(max_batch_size: int, detail: str) -> str:
    """The reason recorded for a trial that killed the server."""
    return f"{SERVER_DIED} at max_batch_size {max_batch_size}: {detail}"


# A batch size is out once the server died this many times at it or above: a trial and
# its retry (Tuner.tell_server_died queues one), or two sizes, since what fits memory at
# a batch size fits at every smaller one. One transient crash (a neighbour's memory
# spike, a node event) does not close the space above it for good.
CONFIRMED_DEATHS = 2
FINISHED = ("Complete", "Pruned", "Infeasible")


def deaths_by_batch(records: Iterable[RecordLike]) -> dict[int, int]:
    """How many trials killed the server at each batch size, leaving out each death
    that a later trial of the same configuration survived (a transient crash)."""
    ordered = sorted(records, key=lambda r: r.number)
    deaths: dict[int, int] = {}
    for i, r in enumerate(ordered):
        if not r.reason.startswith(SERVER_DIED):
            continue
        if any(later.state in FINISHED and later.params == r.params for later in ordered[i + 1 :]):
            continue
        batch = int(r.params[BATCH])
        deaths[batch] = deaths.get(batch, 0) + 1
    return deaths


def batch_limit(records: Iterable[RecordLike]) -> int | None:
    """The smallest batch size at which the server died such that it died at least
    CONFIRMED_DEATHS times at that size or above: it and every larger one are out. None
    while no death is confirmed."""
    deaths = deaths_by_batch(records)
    confirmed = [
        b for b in deaths if sum(n for other, n in deaths.items() if other >= b) >= CONFIRMED_DEATHS
    ]
    return min(confirmed, default=None)


def _best(records: Sequence[RecordLike]) -> RecordLike | None:
    done = [r for r in records if r.state == "Complete" and r.effective_rps]
    return max(done, key=lambda r: (r.effective_rps or 0.0, -r.number), default=None)


def since_best(records: Sequence[RecordLike]) -> int:
    """Measured trials since the best (interrupted ones do not count); 0 without one."""
    best = _best(records)
    if best is None:
        return 0
    return sum(1 for r in records if r.number > best.number and r.reason != "interrupted")


def stalled(records: Sequence[RecordLike], *, stall_trials: int = STALL_TRIALS) -> bool:
    """No new best for `stall_trials` measured trials."""
    return _best(records) is not None and since_best(records) >= stall_trials


def refinement_turn(records: Sequence[RecordLike], *, stall_trials: int = STALL_TRIALS) -> bool:
    """Whether a stalled study's next trial is a refinement's: rounds of `ROUND_TRIALS`
    refinements and as many sampler trials alternate from the stall on."""
    k = since_best(records)
    return (
        stalled(records, stall_trials=stall_trials)
        and (k - stall_trials) % (2 * ROUND_TRIALS) < ROUND_TRIALS
    )


def _nearby_batches(b: int) -> list[int]:
    """Edges around batch size b, nearest kinds first: b-1 and b+1, the powers of two
    below and above, the multiples of 8 and of 16 below and above (b itself excluded)."""
    out = [b - 1, b + 1]
    power = 1
    while power * 2 <= b:
        power *= 2
    out += [power, power * 2]
    for step in (8, 16):
        below = (b // step) * step
        out += [below, below + step] if below != b else [b - step, b + step]
    return [v for v in out if v != b]


def proposals(
    best: Mapping[str, float | int], space: SearchSpace, limit: int | None = None
) -> list[Params]:
    """Refinement candidates around `best`, in the order to try them, clamped to the
    space and below the batch limit, without duplicates (already-tried ones are
    removed by `next_refinement`)."""
    b = int(best[BATCH])
    q = float(best[QUEUE])
    b_lo, b_hi = space.batch_bounds
    if limit is not None:
        b_hi = min(b_hi, limit - 1)
    q_lo, q_hi = space.queue_bounds
    out: list[Params] = []

    def add(batch: int, wait: float) -> None:
        batch = min(max(batch, b_lo), b_hi)
        wait = space.decode_queue(space.encode_queue(min(max(wait, q_lo), q_hi)))
        params: Params = {**best, BATCH: batch, QUEUE: wait}
        if batch >= 1 and params not in out and not (batch == b and wait == q):
            out.append(params)

    for batch in _nearby_batches(b):
        add(batch, q)
    add(b, q / 2.0)
    add(b, q * 2.0 if q > 0 else 1.0)
    return out


def _same(a: Mapping[str, float | int], b: Mapping[str, float | int]) -> bool:
    return int(a[BATCH]) == int(b[BATCH]) and float(a[QUEUE]) == float(b[QUEUE])


def next_refinement(
    records: Sequence[RecordLike],
    space: SearchSpace,
    *,
    remaining: int | None = None,
    stall_trials: int = STALL_TRIALS,
) -> Params | None:
    """The refinement trial to run next, or None to let the sampler suggest.

    Refine in the rounds of a stall (`refinement_turn`), or when the budget left
    (`remaining` trials, None when unbounded) is down to `TAIL_TRIALS`, so the last
    trials of a study are spent on the edges next to the best rather than on distant
    guesses."""
    best = _best(records)
    if best is None:
        return None
    candidates = [
        p
        for p in proposals(best.params, space, batch_limit(records))
        if not any(_same(p, r.params) for r in records)
    ]
    if not candidates:
        return None
    budget_tail = remaining is not None and remaining <= TAIL_TRIALS
    if refinement_turn(records, stall_trials=stall_trials) or budget_tail:
        return candidates[0]
    return None
