"""The worker pool as a pure state machine: who is online, who is busy, who is next.

No I/O and no trio: every method takes `now` (seconds on any monotonic clock) and returns
what the I/O layer must log, so tests are tables of (state, event) -> state. The
dispatcher is the only runtime writer; the prober and the forwarder report through it.

Invariants:
- a worker is leased to at most one request at a time;
- a worker is selectable only when online, not leased, and not reported busy by a probe
  sent after the gateway's last request to it ended;
- a worker that answered a forward "busy" (another gateway's job runs there) is marked
  busy in the same step that gives the lease back (`release(busy_elsewhere=True)`), so no
  waiter can be handed it in between; only a probe sent after that says it is free again,
  and only when a second one sent `FREE_CONFIRM_SECONDS` later still says so (a host
  between two jobs of the gateway that holds it is free for a moment, and that gateway's
  next job is already on its way); until then it is *seen free*, selectable only by a
  waiter that has waited too long to defer (`select(seen_free=True)`);
- a worker *shared* (busy elsewhere in the last `SHARED_MEMORY_SECONDS`) that is idle on
  knowledge older than `FREE_CONFIRM_SECONDS` (our own answer, or the confirming probe)
  is held again until probes say free (`expire_holds`): another gateway may have taken it
  since, and a stale "idle" would send it an upload it refuses;
- with `leases_shared` (the gateways lease hosts in Redis) the lease, not /health, guards
  a forward: a probe that finds a host busy holds nothing (asking for the lease costs a
  round trip, no upload, and tells who runs a job there; held on /health alone, a host that
  its holder keeps across its hand-overs was never free to a probe, and a gateway never
  asked for it, never marked it wanted: it starved), one free probe ends the hold of a
  busy answer, nothing is held as stale, and a release announced for a host also ends
  that hold;
- a worker whose shared lease (Redis) another gateway holds is leased elsewhere: not
  selectable until that lease is announced given back (`lease_released`) or its time is
  up (`release(leased_elsewhere_seconds=…)`); probes do not end that hold (a host between
  two of the holder's jobs says free while the holder keeps it);
- a worker whose request was abandoned mid-forward (its client left) is draining: it is
  not selectable until a probe sent after the abandonment says it is free, or until the
  attempt's timeout has passed (by then the host has given up the job itself);
- for a slow request, a worker whose last probe said ComfyUI is "down" is not eligible
  while another eligible worker says "ok" (`eligible(slow=True)`, the one eligibility rule
  shared by dispatch and the capabilities of gateway.md);
- a worker *resting* (a host that named a failure the gateway backs off from: out of GPU
  memory, its deadline: gateway.md § Failure kinds) stays online but is not selectable
  until `resting_until` (`rest`, ended by `expire_holds`); `failures_in_a_row` counts each
  kind since its last good answer (`count_failure`, reset by `answered`), the n of the
  backoff's 2ⁿ;
- the offline warning is emitted only on an online -> offline transition;
- a worker's index never changes and is never reused: a reload (`reconfigure`) retires
  removed workers (a request still on one finishes and releases it by its index) and
  appends new ones, offline until a probe brings them in.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

from shared.contract import CHECK_COMFYUI, CHECK_DISK, CHECK_DOWN, CHECK_LOW, CHECK_OK, HOST_WANTED_SECONDS

# gateway.md § Several gateways: a host busy elsewhere is free when two probes this far
# apart say so; longer than the holder's turn-around from its answer to its next forward.
FREE_CONFIRM_SECONDS = 0.05
# … and a host found busy elsewhere counts as shared with other gateways for this long.
SHARED_MEMORY_SECONDS = 30.0
# A host another gateway waits for (the host's `/health` said "wanted" while our job ran) is
# left to it this long after our job: longer than that gateway's slow probe interval
# (prober.HELD_SLOW_PROBE_INTERVAL_SECONDS, 0.4 s) and the time its waiter takes to send.
HOST_TURN_SECONDS = 0.6
# A host whose /health names no model version (one of before seed 002 §6.2, mid-upgrade): a
# version of its own in /gateway-health, the metric and the mixed-versions warning.
UNKNOWN_VERSION = "unknown"


@dataclass(frozen=True)
class Thresholds:
    """The `edge.health_check` numbers the state machine needs."""

    unhealthy_threshold: int = 2
    healthy_threshold: int = 1
    cooldown_seconds: float = 60.0


@dataclass
class WorkerState:
    """One worker as the gateway sees it; mutated only by `Pool`."""

    index: int
    url: str
    primary: bool
    online: bool = False
    leased: bool = False
    reported_busy: bool = False
    successes: int = 0
    failures: int = 0
    cooldown_until: float = -math.inf
    last_request_ended: float = -math.inf
    idle_since: float = -math.inf
    retired: bool = False  # removed from the settings: gets nothing new, counts nowhere
    draining_until: float | None = None  # its client left mid-forward: the host may still be at it
    leased_elsewhere_until: float | None = None  # another gateway holds its shared lease (Redis)
    free_seen_at: float | None = None  # busy elsewhere, then a probe sent then said free: unconfirmed
    shared_until: float = -math.inf  # found busy elsewhere lately: another gateway uses it too
    known_free_at: float = -math.inf  # when we last knew it free (our answer, a confirming probe)
    turn_wanted: bool = False  # our job runs there and another gateway waits: it gets a turn after
    free_not_before: float = -math.inf  # its turn: no probe says it is free for us before this
    asked_for_at: float = -math.inf  # our last probe that told the host we want it
    running_slow: bool = False  # leased (or draining) with a slow request: the reservation counts it
    leased_at: float = -math.inf
    leased_path: str = ""
    checks: Mapping[str, str] = field(default_factory=dict)  # the host's deep checks, last seen
    inference_timeout_seconds: float | None = None  # as its /health reports it
    model_version: str | None = None  # as its /health reports it (None: it names none)
    resting_until: float | None = None  # it named a failure we back off from: no job before this
    failures_in_a_row: dict[str, int] = field(default_factory=dict)  # by kind, since its last good answer

    @property
    def busy(self) -> bool:
        """Running a job: ours (leased), another gateway's (it said so, or holds its shared
        lease), or one a departed client left behind (draining)."""
        return (
            self.leased
            or self.reported_busy
            or self.draining_until is not None
            or self.leased_elsewhere_until is not None
        )

    @property
    def idle(self) -> bool:
        return self.online and not self.busy and self.resting_until is None

    @property
    def seen_free(self) -> bool:
        """Busy elsewhere by the last word, but one probe since said free (not yet confirmed)."""
        return (
            self.online
            and self.reported_busy
            and self.free_seen_at is not None
            and not self.leased
            and self.draining_until is None
            and self.leased_elsewhere_until is None
            and self.resting_until is None
        )

    @property
    def awaiting_probe(self) -> bool:
        """Held until a probe says it is free: draining after a departure, or busy elsewhere."""
        return not self.leased and (self.reported_busy or self.draining_until is not None)

    @property
    def comfyui_down(self) -> bool:
        return self.checks.get(CHECK_COMFYUI) == CHECK_DOWN

    @property
    def generation_ready(self) -> bool:
        """Online and able to draw: ComfyUI "ok", or "off" (the built-in preview). A host
        that reports no checks is not known to be unable."""
        return self.online and not self.comfyui_down

    @property
    def disk_low(self) -> bool:
        return self.checks.get(CHECK_DISK) == CHECK_LOW


@dataclass(frozen=True)
class ProbeResult:
    """One `/health` probe: `sent_at` is when it left, which decides if its `busy` counts."""

    sent_at: float
    ok: bool
    busy: bool = False
    wanted: bool = False  # busy, and another gateway waits for it (its probes said so)
    reason: str = ""
    loading: bool = False  # 503 {"status": "loading"}: models still loading, not a failure to report loudly
    checks: Mapping[str, str] | None = None  # None: the answer carried no JSON body (keep the last)
    inference_timeout_seconds: float | None = None
    model_version: str | None = None


class Transition(Enum):
    CAME_ONLINE = "came_online"
    WENT_OFFLINE = "went_offline"
    EJECTED = "ejected"
    ADDED = "added"
    RETIRED = "retired"
    UNREACHABLE = "unreachable"  # not online and failing its probes: logged once per streak, with why
    LOADING = "loading"  # not online yet because its models are loading: waiting, not failing


@dataclass(frozen=True)
class PoolEvent:
    """Something the I/O layer logs: which worker, what happened, why."""

    transition: Transition
    index: int
    url: str
    reason: str = ""


@dataclass(frozen=True)
class PoolStatistics:
    """Immutable snapshot of the counts `/monitor` and `/gateway-health` show."""

    workers_total: int
    workers_healthy: int
    workers_busy: int
    workers_primary_total: int
    workers_primary_healthy: int
    drill: bool
    workers_generation_ready: int = 0
    # online workers by the model version their /health reports, sorted (UNKNOWN_VERSION: none)
    model_versions: tuple[tuple[str, int], ...] = ()


class Pool:
    """The state of every configured worker, plus the monitor drill flag."""

    def __init__(
        self,
        workers: Sequence[str],
        primary_workers: Iterable[str] = (),
        thresholds: Thresholds = Thresholds(),
    ) -> None:
        primaries = set(primary_workers) or set(workers)  # empty means all are primary
        self.thresholds = thresholds
        self.drill = False
        self.leases_shared = False  # the gateways lease hosts through shared state (set by the dispatcher)
        self.workers = [WorkerState(i, url, url in primaries) for i, url in enumerate(workers)]

    @property
    def active(self) -> list[WorkerState]:
        """The workers of the current settings (retired ones are kept only for their index)."""
        return [w for w in self.workers if not w.retired]

    def reconfigure(
        self, workers: Sequence[str], primary_workers: Iterable[str], thresholds: Thresholds
    ) -> list[PoolEvent]:
        """Apply a reloaded worker list: keep what stays, retire what went, add what is new."""
        primaries = set(primary_workers) or set(workers)
        wanted = list(dict.fromkeys(workers))
        events: list[PoolEvent] = []
        by_url = {w.url: w for w in self.workers}
        for worker in self.active:
            if worker.url not in wanted:
                worker.retired, worker.online = True, False
                events.append(PoolEvent(Transition.RETIRED, worker.index, worker.url))
        for url in wanted:
            known = by_url.get(url)
            if known is None or known.retired:
                if known is None:
                    known = WorkerState(len(self.workers), url, False)
                    self.workers.append(known)
                # new, or back after a removal: unknown health until a probe says otherwise
                known.retired, known.online, known.successes, known.failures = False, False, 0, 0
                events.append(PoolEvent(Transition.ADDED, known.index, known.url))
            known.primary = url in primaries
        self.thresholds = thresholds
        return events

    # --- probes -------------------------------------------------------------------------

    def record_probe(self, index: int, result: ProbeResult, now: float) -> PoolEvent | None:
        worker = self.workers[index]
        if worker.retired:
            return None  # a probe sent before the reload that retired it
        if result.checks is not None:
            worker.checks = result.checks
            worker.inference_timeout_seconds = result.inference_timeout_seconds
            worker.model_version = result.model_version
        if result.ok:
            return self._probe_succeeded(worker, result, now)
        return self._probe_failed(worker, result)

    def _probe_succeeded(self, worker: WorkerState, result: ProbeResult, now: float) -> PoolEvent | None:
        worker.failures = 0
        worker.successes += 1
        if result.wanted and worker.leased and not self.leases_shared:
            # the job running there is ours; a mark we set ourselves before we got it is not another's
            worker.turn_wanted = worker.turn_wanted or result.sent_at > worker.asked_for_at + HOST_WANTED_SECONDS
        # A probe sent while (or before) our own request ran says nothing about whether the
        # worker is free now; only one sent after that request ended may (un)set the flag.
        if result.sent_at >= worker.last_request_ended:
            if result.busy:
                if not self.leases_shared:  # with them, whose job it is and when it ends the lease says
                    # while draining: our own abandoned job, the drain already holds it
                    worker.reported_busy = not worker.leased and worker.draining_until is None
                    worker.free_seen_at = None
                    if worker.reported_busy:
                        worker.shared_until = now + SHARED_MEMORY_SECONDS
            elif worker.reported_busy:
                _confirm_free(worker, result.sent_at, at_once=self.leases_shared)
            if not result.busy and worker.draining_until is not None:
                worker.draining_until, worker.running_slow = None, False
        if worker.online or now < worker.cooldown_until:
            return None
        if worker.successes < self.thresholds.healthy_threshold:
            return None
        worker.online = True
        worker.idle_since = min(worker.idle_since, now)
        return PoolEvent(Transition.CAME_ONLINE, worker.index, worker.url)

    def _probe_failed(self, worker: WorkerState, result: ProbeResult) -> PoolEvent | None:
        reason = result.reason
        worker.successes = 0
        worker.failures += 1
        if worker.online and worker.failures >= self.thresholds.unhealthy_threshold:
            worker.online = False
            return PoolEvent(Transition.WENT_OFFLINE, worker.index, worker.url, reason)
        if not worker.online and worker.failures == self.thresholds.unhealthy_threshold:
            # A worker that never came online (a certificate the CA did not sign, a wrong
            # port) would otherwise fail silently: its operator needs the reason once.
            transition = Transition.LOADING if result.loading else Transition.UNREACHABLE
            return PoolEvent(transition, worker.index, worker.url, reason)
        return None

    # --- requests -----------------------------------------------------------------------

    def eligible(self, exclude: frozenset[int] = frozenset(), *, slow: bool = False) -> list[WorkerState]:
        """Online primaries; online backups only when no primary is online. For a slow
        request, not a worker whose ComfyUI is down while another eligible one says "ok"
        (when none does, generation goes where it would have gone)."""
        online = [w for w in self.workers if w.online]  # a retired worker is never online
        tier = [w for w in online if w.primary] or online
        if slow and any(w.checks.get(CHECK_COMFYUI) == CHECK_OK for w in tier):
            tier = [w for w in tier if not w.comfyui_down]
        return [w for w in tier if w.index not in exclude]

    def select(
        self, exclude: frozenset[int] = frozenset(), *, slow: bool = False, seen_free: bool = False
    ) -> WorkerState | None:
        """The idle eligible worker idle the longest (ties: lowest index), or None.
        `seen_free`: for a waiter that no longer defers, a seen-free worker when none is idle."""
        eligible = self.eligible(exclude, slow=slow)
        idle = [w for w in eligible if w.idle] or ([w for w in eligible if w.seen_free] if seen_free else [])
        return min(idle, key=lambda w: (w.idle_since, w.index), default=None)

    def asked_for(self, index: int, now: float) -> None:
        """A probe told worker `index`'s host that a request here waits for it."""
        self.workers[index].asked_for_at = now

    def lease(self, index: int, now: float = 0.0, *, path: str = "", slow: bool = False) -> None:
        worker = self.workers[index]
        if not (worker.idle or worker.seen_free):
            raise RuntimeError(f"worker {index} is not idle")
        worker.reported_busy, worker.free_seen_at = False, None  # a seen-free one taken: ours now
        worker.leased = True
        worker.leased_at, worker.leased_path, worker.running_slow = now, path, slow

    def release(
        self,
        index: int,
        now: float,
        *,
        drain_seconds: float | None = None,
        busy_elsewhere: bool = False,
        leased_elsewhere_seconds: float | None = None,
    ) -> None:
        """The request on `index` is over. `drain_seconds`: it was abandoned mid-forward, so
        the worker waits for a probe that says it is free, at most that long.
        `busy_elsewhere`: it answered "busy", so it is busy from this very step until a
        probe sent after it says free. `leased_elsewhere_seconds`: another gateway holds
        its shared lease, so it is busy from this very step until that lease is announced
        given back (`lease_released`) or this time is up."""
        worker = self.workers[index]
        worker.leased = False
        worker.reported_busy, worker.free_seen_at = busy_elsewhere, None
        if worker.turn_wanted and leased_elsewhere_seconds is None and drain_seconds is None:
            # another gateway's turn: held as if busy elsewhere, and no probe says free
            # before it could have come (HOST_TURN_SECONDS)
            worker.reported_busy, busy_elsewhere = True, True
            worker.free_not_before = now + HOST_TURN_SECONDS
        worker.turn_wanted = False
        if busy_elsewhere:
            worker.shared_until = now + SHARED_MEMORY_SECONDS
        elif leased_elsewhere_seconds is None and drain_seconds is None:
            worker.known_free_at = now  # its answer came: free now
        if leased_elsewhere_seconds is not None:
            worker.leased_elsewhere_until = now + leased_elsewhere_seconds
        worker.last_request_ended = now
        worker.idle_since = now
        if drain_seconds is None:
            worker.running_slow = False
        else:
            worker.draining_until = now + drain_seconds

    def expire_holds(self, now: float) -> list[int]:
        """End the holds that end by time alone: draining (the host gave the job up by then)
        and another gateway's lease (it expires by itself, or is looked at again); hold
        again a shared worker idle on stale knowledge (those are returned: someone must look)."""
        stale: list[int] = []
        for worker in self.workers:
            if worker.draining_until is not None and worker.draining_until <= now:
                worker.draining_until, worker.running_slow = None, False
            if worker.leased_elsewhere_until is not None and worker.leased_elsewhere_until <= now:
                worker.leased_elsewhere_until = None
            if worker.resting_until is not None and worker.resting_until <= now:
                worker.resting_until = None
            if self.leases_shared:
                continue
            if worker.idle and now < worker.shared_until and now > worker.known_free_at + FREE_CONFIRM_SECONDS:
                worker.reported_busy = True  # stale: another gateway may have it now; look again
                stale.append(worker.index)
        return stale

    def lease_released(self, url: str | None) -> bool:
        """Another gateway gave back its lease on `url` (None: any may have been missed):
        the hold on it ends. True when a worker became free of that hold."""
        ended = False
        for worker in self.workers:
            if worker.leased_elsewhere_until is not None and url in (None, worker.url):
                worker.leased_elsewhere_until, ended = None, True
            if worker.url == url and worker.reported_busy and not worker.leased and worker.draining_until is None:
                worker.reported_busy, worker.free_seen_at, ended = False, None, True  # the job a probe saw ended
        return ended

    def eject(self, index: int, now: float, reason: str, *, cooldown_seconds: float | None = None) -> PoolEvent | None:
        """Passive ejection after a failed forward: offline at once, then a cooldown
        (`cooldown_seconds`, else the thresholds'; a failed model load has its own).

        Returns an event only when the worker was online (the offline warning is logged
        on that transition alone); the cooldown applies either way.
        """
        worker = self.workers[index]
        was_online = worker.online
        worker.online = False
        worker.successes = 0
        seconds = self.thresholds.cooldown_seconds if cooldown_seconds is None else cooldown_seconds
        worker.cooldown_until = now + seconds
        return PoolEvent(Transition.EJECTED, index, worker.url, reason) if was_online else None

    # --- failures a host named (gateway.md § Failure kinds) -----------------------------

    def count_failure(self, index: int, kind: str) -> int:
        """One more failure of `kind` from worker `index` since its last good answer; the count."""
        counts = self.workers[index].failures_in_a_row
        counts[kind] = counts.get(kind, 0) + 1
        return counts[kind]

    def answered(self, index: int) -> None:
        """Worker `index` gave a good answer: its failures in a row start again from none."""
        self.workers[index].failures_in_a_row.clear()

    def rest(self, index: int, now: float, seconds: float) -> None:
        """Worker `index` stays online but gets no job for `seconds` (a backoff; a longer
        rest already under way is kept)."""
        worker = self.workers[index]
        worker.resting_until = max(worker.resting_until or -math.inf, now + seconds)

    def next_hold_end(self) -> float:
        """The soonest a hold that ends by time alone ends (a rest, a drain, another
        gateway's lease): when a waiter should look again. inf when none is under way."""
        ends = [
            end
            for worker in self.workers
            for end in (worker.resting_until, worker.draining_until, worker.leased_elsewhere_until)
            if end is not None
        ]
        return min(ends, default=math.inf)

    def load(self, now: float) -> float:
        """Busy online workers over online workers (gateway.md § Failure kinds), 0-1: a
        worker resting at `now` counts as busy (it takes no job; a rest over but not yet
        expired does not); with none online, 1 (nothing can take one)."""
        online = [w for w in self.active if w.online]
        if not online:
            return 1.0
        taken = [w.busy or (w.resting_until is not None and w.resting_until > now) for w in online]
        return sum(taken) / len(online)

    def seconds_until_free(self, now: float, probe_interval_seconds: float, busy_seconds: float) -> float:
        """The soonest any worker may take a job: 0 for an idle one; a resting one when its
        rest ends; a busy one after `busy_seconds` (its job's end is not known); an offline
        one at the first probe after its cooldown."""
        waits = []
        for worker in self.active:
            if not worker.online:
                waits.append(max(probe_interval_seconds, worker.cooldown_until - now))
                continue
            wait = busy_seconds if worker.busy else 0.0
            if worker.resting_until is not None:
                wait = max(wait, worker.resting_until - now)
            waits.append(wait)
        return min(waits, default=probe_interval_seconds)

    # --- monitor ------------------------------------------------------------------------

    def set_drill(self, enabled: bool) -> bool:
        """Set the drill flag; True when it changed."""
        changed = self.drill != enabled
        self.drill = enabled
        return changed

    def any_online(self) -> bool:
        return any(w.online for w in self.workers)

    def seconds_until_one_may_return(self, now: float, probe_interval_seconds: float) -> float:
        """With nothing online: the soonest a worker can be back, at the first probe after
        its cooldown (an ejected one stays out for `cooldown_seconds`, whatever the probes say)."""
        waits = [max(probe_interval_seconds, w.cooldown_until - now) for w in self.active]
        return min(waits, default=probe_interval_seconds)

    def statistics(self) -> PoolStatistics:
        active = self.active
        return PoolStatistics(
            workers_total=len(active),
            workers_healthy=sum(w.online for w in active),
            workers_busy=sum(w.busy for w in active),
            workers_primary_total=sum(w.primary for w in active),
            workers_primary_healthy=sum(w.primary and w.online for w in active),
            drill=self.drill,
            workers_generation_ready=sum(w.generation_ready for w in active),
            model_versions=tuple(sorted(Counter(version_of(w) for w in active if w.online).items())),
        )


def version_of(worker: WorkerState) -> str:
    """The model version a worker runs, as the pool's views name it (`UNKNOWN_VERSION`: it says none)."""
    return worker.model_version or UNKNOWN_VERSION


def _confirm_free(worker: WorkerState, sent_at: float, *, at_once: bool = False) -> None:
    """A probe sent at `sent_at` says the worker held busy elsewhere is free: the first
    such one makes it seen free; one `FREE_CONFIRM_SECONDS` after that ends the hold
    (`at_once`: the first one does, a shared lease guards the forward)."""
    if sent_at < worker.free_not_before:
        return  # another gateway's turn (`release`): a free host is theirs for now
    if at_once:
        worker.reported_busy, worker.free_seen_at = False, None
    elif worker.free_seen_at is None:
        worker.free_seen_at = sent_at
    elif sent_at >= worker.free_seen_at + FREE_CONFIRM_SECONDS:  # as the prober computes its second look
        worker.reported_busy, worker.free_seen_at = False, None
        worker.known_free_at = sent_at
