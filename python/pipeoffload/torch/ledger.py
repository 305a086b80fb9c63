"""Where every stash entry of one iteration is: the bookkeeping of offloaded microbatches, with
no torch in it, so it runs (and is tested) anywhere. The torch offloader drives one
StashLedger beside its tensors; replay() runs a plan through one to predict memory.

Invariants (the tests check these sentences):
  - An entry (stage, chunk, mb) moves NEW -> DEVICE (F) -> COPYING_OUT (OFFLOAD) -> ON_HOST
    (RELEASE) -> RELOADED (RELOAD) -> BACKWARD_DONE (B, split backward only) -> FREED (B, or W
    when split); an entry that is not offloaded goes DEVICE -> [BACKWARD_DONE ->] FREED; a
    recomputed entry goes NEW -> RETAINED (F) -> DEVICE (RECOMPUTE or RECOMPUTE_LEAN) ->
    [BACKWARD_DONE ->] FREED, and when its retained block is offloaded RETAINED ->
    RETAINED_COPYING_OUT (OFFLOAD) -> RETAINED_ON_HOST (RELEASE) -> RETAINED_RELOADED (RELOAD)
    -> DEVICE (the RECOMPUTE). Any other move raises PlanError naming the entry, the op and the
    state it was in.
  - Device residency: an entry counts from F until RELEASE and from RELOAD until it is freed
    (B, or W when split), as the compiler counts its stash peak (peak_units, simulate.h). A
    recomputed entry counts one unit from F until it is freed; in bytes it holds its retained
    block (the chunk's input for RECOMPUTE, the cheap parts' inputs for RECOMPUTE_LEAN) from F,
    the retained block and the whole entry together while the RECOMPUTE runs, then the entry.
    RELEASE drops the device copy without waiting; the memory comes back once the D2H copy has
    finished, which the runtime, not the ledger, enforces.
  - Host residency: an entry holds its host buffers from OFFLOAD until its B, which runs only
    after the reload's H2D copy (the last use of those buffers) has been waited for; a
    recomputed entry's retained block holds its own (the retained bytes) until the RECOMPUTE.
  - At the end of an iteration every entry is FREED (finish() raises otherwise).
"""
import collections
import dataclasses
from typing import Dict, List, Optional, Tuple

from .plan import RECOMPUTE_KINDS, PlanError

NEW, RETAINED, DEVICE, COPYING_OUT, ON_HOST, RELOADED, BACKWARD_DONE, FREED = (
    "NEW", "RETAINED", "DEVICE", "COPYING_OUT", "ON_HOST", "RELOADED", "BACKWARD_DONE", "FREED")
# A recomputed entry's retained block on its way to the host and back.
RETAINED_COPYING_OUT, RETAINED_ON_HOST, RETAINED_RELOADED = (
    "RETAINED_COPYING_OUT", "RETAINED_ON_HOST", "RETAINED_RELOADED")

# op -> {state before: state after}; F's target depends on whether the entry is recomputed and
# B's on split backward (see StashLedger.apply).
_MOVES = {
    "F": {NEW: DEVICE},
    "RECOMPUTE": {RETAINED: DEVICE, RETAINED_RELOADED: DEVICE},
    "RECOMPUTE_LEAN": {RETAINED: DEVICE, RETAINED_RELOADED: DEVICE},
    "OFFLOAD": {DEVICE: COPYING_OUT, RETAINED: RETAINED_COPYING_OUT},
    "RELEASE": {COPYING_OUT: ON_HOST, RETAINED_COPYING_OUT: RETAINED_ON_HOST},
    "RELOAD": {ON_HOST: RELOADED, RETAINED_ON_HOST: RETAINED_RELOADED},
    "B": {DEVICE: FREED, RELOADED: FREED},
    "W": {BACKWARD_DONE: FREED},
}
_RETAINED_STATES = (RETAINED, RETAINED_COPYING_OUT, RETAINED_ON_HOST, RETAINED_RELOADED)
_ON_DEVICE = (RETAINED, RETAINED_COPYING_OUT, RETAINED_RELOADED, DEVICE, COPYING_OUT, RELOADED,
              BACKWARD_DONE)
_ON_HOST = (COPYING_OUT, ON_HOST, RELOADED, RETAINED_COPYING_OUT, RETAINED_ON_HOST,
            RETAINED_RELOADED)


@dataclasses.dataclass
class Usage:
    """Resident entries (units) and bytes, now and at their peak."""
    units: int = 0
    bytes: int = 0
    peak_units: int = 0
    peak_bytes: int = 0

    def add(self, units, nbytes):
        self.units += units
        self.bytes += nbytes
        self.peak_units = max(self.peak_units, self.units)
        self.peak_bytes = max(self.peak_bytes, self.bytes)


class StashLedger:
    """The state of each stash entry of one iteration and the device / host usage it implies,
    per stage and for the whole process. `entry_bytes(key)` gives an entry's bytes (default 1
    per entry: usage then counts units twice over, once as bytes). `recomputed` maps the keys
    the plan recomputes to their op (RECOMPUTE or RECOMPUTE_LEAN): their F keeps only
    `retained_bytes(key)` (default: the entry's bytes, as if nothing were dropped)."""

    def __init__(self, split_backward: bool, entry_bytes=None, recomputed=None,
                 retained_bytes=None):
        self.split_backward = split_backward
        self._entry_bytes = entry_bytes or (lambda key: 1)
        self._recomputed: Dict[Tuple[int, int, int], str] = dict(recomputed or {})
        self._retained_bytes = retained_bytes or self._entry_bytes
        self.state: Dict[Tuple[int, int, int], str] = collections.defaultdict(lambda: NEW)
        self.device: Dict[int, Usage] = collections.defaultdict(Usage)
        self.host: Dict[int, Usage] = collections.defaultdict(Usage)
        self.device_total = Usage()
        self.host_total = Usage()

    def apply(self, kind: str, key: Tuple[int, int, int]) -> str:
        """Moves entry `key` = (stage, chunk, mb) by op `kind` (F, OFFLOAD, RELEASE, RELOAD,
        RECOMPUTE, RECOMPUTE_LEAN, B, W) and returns its new state. PlanError for a move the
        invariants forbid, a recompute op the ledger was not told of included."""
        before = self.state[key]
        moves = _MOVES.get(kind)
        if moves is None:
            raise PlanError(f"ledger: {kind} is not a stash op")
        after = moves.get(before)
        if after is None:
            stage, chunk, mb = key
            raise PlanError(f"stage {stage}: {kind} of (mb {mb}, chunk {chunk}) while the entry "
                            f"is {before}; {kind} needs it {' or '.join(moves)}")
        recompute = self._recomputed.get(key)
        stage, chunk, mb = key
        if kind == "F" and recompute is not None:
            after = RETAINED
        elif kind in RECOMPUTE_KINDS and kind != recompute:
            raise PlanError(f"stage {stage}: {kind} of (mb {mb}, chunk {chunk}), which the "
                            f"ledger was told is {recompute or 'not recomputed'}")
        if kind == "B" and self.split_backward:
            after = BACKWARD_DONE
        self._account(key, before, after)
        self.state[key] = after
        return after

    def block_bytes(self, key, state):
        """Bytes of the block entry `key` holds in `state`: its retained block before the
        RECOMPUTE of a recomputed entry, else the whole entry."""
        return self._retained_bytes(key) if state in _RETAINED_STATES else self._entry_bytes(key)

    def _account(self, key, before, after):
        stage = key[0]
        device_change = (after in _ON_DEVICE) - (before in _ON_DEVICE)
        host_change = (after in _ON_HOST) - (before in _ON_HOST)
        if before in (RETAINED, RETAINED_RELOADED) and after == DEVICE:
            # The recompute rebuilds the whole entry while its retained block is still there,
            # then drops the block (the runtime's Regrow / DropRetained): the peak sees both.
            for usage in (self.device[stage], self.device_total):
                usage.add(0, self._entry_bytes(key))
                usage.add(0, -self._retained_bytes(key))
        elif device_change:
            change = device_change * self.block_bytes(key, before if device_change < 0 else after)
            self.device[stage].add(device_change, change)
            self.device_total.add(device_change, change)
        if host_change:
            nbytes = self.block_bytes(key, before if host_change < 0 else after)
            self.host[stage].add(host_change, host_change * nbytes)
            self.host_total.add(host_change, host_change * nbytes)

    def entries_in(self, state: str) -> List[Tuple[int, int, int]]:
        return sorted(key for key, value in self.state.items() if value == state)

    def finish(self):
        """PlanError unless every entry that started was freed (end of an iteration)."""
        left = sorted(key for key, value in self.state.items() if value != FREED)
        if left:
            stage, chunk, mb = left[0]
            raise PlanError(f"{len(left)} stash entries are not freed at the end of the "
                            f"iteration (first: stage {stage}, mb {mb}, chunk {chunk}, "
                            f"{self.state[left[0]]})")


@dataclasses.dataclass
class Replay:
    """What a plan does to memory when its ops run in `order`."""
    device: Dict[int, Usage]    # per stage
    host: Dict[int, Usage]
    device_total: Usage         # all stages of one process together
    host_total: Usage
    # Host buffers of each size in use at once, at most (a pool that reuses a buffer once its
    # reload is done allocates exactly this many; a retained block of 0 bytes takes none).
    host_buffers_peak: Dict[int, int]


def replay(plan, order=None, entry_sizes=None, retained_sizes=None) -> Replay:
    """Runs `order` (default: plan.single_process_order()) through a StashLedger. entry_sizes
    maps (stage, chunk, mb) to the byte sizes of the tensors the entry saves (default: one
    tensor of 1 byte per entry, so bytes count units); retained_sizes maps a recomputed entry
    to the bytes its F keeps (default: the entry's own, so bytes still count units)."""
    sizes = entry_sizes if entry_sizes is not None else {}
    retained = retained_sizes if retained_sizes is not None else {}

    def tensors(key):
        return sizes.get(key, (1,))

    def entry_bytes(key):
        return sum(tensors(key))

    recomputed = {a.key: a.kind for program in plan.programs for a in program
                  if a.kind in RECOMPUTE_KINDS}
    ledger = StashLedger(plan.split_backward, entry_bytes=entry_bytes, recomputed=recomputed,
                         retained_bytes=lambda key: retained.get(key, entry_bytes(key)))
    in_use = collections.Counter()
    buffers_peak = collections.Counter()
    def host_tensors(key, state):
        # A retained block travels as one block of its bytes; one of 0 bytes (a block the
        # runtime holds anyway, as PipelineRunner holds a chunk's input) moves nothing.
        if state in _RETAINED_STATES:
            nbytes = ledger.block_bytes(key, state)
            return (nbytes,) if nbytes else ()
        return tensors(key)

    for action in (order if order is not None else plan.single_process_order()):
        if action.kind not in _MOVES:
            continue
        before = ledger.state[action.key]
        ledger.apply(action.kind, action.key)
        if action.kind == "OFFLOAD":
            for size in host_tensors(action.key, before):
                in_use[size] += 1
                buffers_peak[size] = max(buffers_peak[size], in_use[size])
        elif before in (RELOADED, RETAINED_RELOADED):  # B, or the RECOMPUTE of a retained block
            for size in host_tensors(action.key, before):
                in_use[size] -= 1
    ledger.finish()
    return Replay(dict(ledger.device), dict(ledger.host), ledger.device_total,
                  ledger.host_total, dict(buffers_peak))


def predicted_stage_peaks(plan) -> List[int]:
    """Peak resident entries per stage when each stage runs its own program (the compiler's
    peak_units): a stage's peak does not depend on how stages interleave."""
    result = replay(plan)
    return [result.device[d].peak_units if d in result.device else 0
            for d in range(plan.num_stages)]


def peak_without_offload(plan, entry_sizes=None, order: Optional[list] = None,
                         retained_sizes=None) -> Replay:
    """replay() of the same plan with every OFFLOAD / RELEASE / RELOAD dropped: the memory the
    same compute order needs without offload (recompute ops stay)."""
    ops = order if order is not None else plan.single_process_order()
    return replay(plan, [a for a in ops if a.kind not in ("OFFLOAD", "RELEASE", "RELOAD")],
                  entry_sizes, retained_sizes)
