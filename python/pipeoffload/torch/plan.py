"""A compiled schedule as per-stage action lists that torch code can run; no torch here.

A PipelinePlan holds one program per pipeline stage (the compiler's ops, validated again here so
a hand-written or loaded plan fails with a clear message instead of a hang or a wrong gradient)
and derives from it:
  - single_process_order(): one issue order of every stage's ops for running all stages in one
    process on one GPU (what PipelineRunner does), respecting every P2P dependency;
  - torch_actions(): each rank's compute and P2P ops in torch.distributed.pipelining's action
    notation ("2F0", "1SEND_F3"), which has no offload actions, with the offload ops of each
    rank kept beside it (offload_hooks) keyed to the compute action they follow.

Virtual stages use the compiler's "loop" placement (schedule.h): chunk c on stage d runs layer
group c * p + d, so virtual stage l's output goes to stage (l + 1) % p, chunk (l + 1) // p.
"""
import dataclasses
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from .. import errors

COMPUTE_KINDS = ("F", "B", "W")
P2P_KINDS = ("SEND_F", "RECV_F", "SEND_B", "RECV_B")
OFFLOAD_KINDS = ("OFFLOAD", "RELEASE", "RELOAD")
# Rebuild an entry's stash from what F kept, right before its B (issue 15; c_api.h PO_OP_RECOMPUTE*).
RECOMPUTE_KINDS = ("RECOMPUTE", "RECOMPUTE_LEAN")
KINDS = COMPUTE_KINDS + P2P_KINDS + OFFLOAD_KINDS + ("BARRIER",) + RECOMPUTE_KINDS


class PlanError(errors.FailedPreconditionError):
    """A plan that cannot run: an op out of order, a missing or duplicate op, a deadlock, or a
    stash entry used in the wrong state. The message names the stage, the op and why."""

    def __init__(self, message):
        super().__init__(errors.FAILED_PRECONDITION, "FAILED_PRECONDITION", message)


@dataclasses.dataclass(frozen=True)
class Action:
    """One op of one stage's program. `virtual_stage` is chunk * num_stages + stage; `peer` is
    the other stage of P2P ops and BARRIER, else -1. Printed like the text format: "F3.1"."""
    stage: int
    kind: str
    mb: int
    chunk: int
    peer: int
    virtual_stage: int

    @property
    def key(self) -> Tuple[int, int, int]:
        """The stash entry (stage, chunk, mb) an F / B / W / offload op concerns."""
        return (self.stage, self.chunk, self.mb)

    def __str__(self):
        if self.kind == "BARRIER" and self.mb < 0:
            return f"BARRIER~{self.peer}"
        text = f"{self.kind}{self.mb}.{self.chunk}"
        if self.kind in ("SEND_F", "SEND_B"):
            return f"{text}->{self.peer}"
        if self.kind in ("RECV_F", "RECV_B"):
            return f"{text}<-{self.peer}"
        return f"{text}~{self.peer}" if self.kind == "BARRIER" else text


class PipelinePlan:
    """Validated per-stage programs of one schedule iteration.

    Build with from_schedule(schedule) (a pipeoffload.Schedule, or anything with num_stages,
    spec and ops(stage)) or from op lists (objects with kind, mb, chunk, peer). Raises PlanError
    for a program that breaks the per-entry order F < OFFLOAD < RELEASE < RELOAD < B (< W), that
    misses or repeats an op, or names a stage, chunk or microbatch out of range."""

    def __init__(self, num_stages: int, chunks_per_stage: int, num_microbatches: int,
                 split_backward: bool, programs: Sequence[Iterable]):
        if num_stages < 1 or chunks_per_stage < 1 or num_microbatches < 1:
            raise PlanError(f"plan needs num_stages, chunks_per_stage and num_microbatches >= 1"
                            f" (got {num_stages}, {chunks_per_stage}, {num_microbatches})")
        if len(programs) != num_stages:
            raise PlanError(f"plan has {len(programs)} programs for {num_stages} stages")
        self.num_stages = num_stages
        self.chunks_per_stage = chunks_per_stage
        self.num_microbatches = num_microbatches
        self.split_backward = bool(split_backward)
        self.programs: List[List[Action]] = [
            [self._action(d, i, op) for i, op in enumerate(program)]
            for d, program in enumerate(programs)]
        for d in range(num_stages):
            self._check_program(d)

    @classmethod
    def from_schedule(cls, schedule) -> "PipelinePlan":
        spec = schedule.spec
        return cls(spec.num_stages, spec.chunks_per_stage, spec.num_microbatches,
                   spec.split_backward, [schedule.ops(d) for d in range(schedule.num_stages)])

    @property
    def num_virtual_stages(self) -> int:
        return self.num_stages * self.chunks_per_stage

    def place(self, virtual_stage: int) -> Tuple[int, int]:
        """(stage, chunk) of a virtual stage under the loop placement."""
        return virtual_stage % self.num_stages, virtual_stage // self.num_stages

    def offloaded_entries(self) -> List[Tuple[int, int, int]]:
        """Every (stage, chunk, mb) the plan offloads, in stage then program order."""
        return [a.key for program in self.programs for a in program if a.kind == "OFFLOAD"]

    # --- validation ------------------------------------------------------------------------

    def _action(self, stage, index, op):
        kind, mb, chunk, peer = op.kind, int(op.mb), int(op.chunk), int(op.peer)
        where = f"stage {stage}, op {index} ({kind}{mb}.{chunk})"
        if kind not in KINDS:
            raise PlanError(f"{where}: unknown op kind {kind!r}; expected one of "
                            f"{', '.join(KINDS)}")
        guards_nothing = kind == "BARRIER" and mb < 0
        if not guards_nothing:
            if not 0 <= mb < self.num_microbatches:
                raise PlanError(f"{where}: microbatch {mb} out of range "
                                f"[0, {self.num_microbatches})")
            if not 0 <= chunk < self.chunks_per_stage:
                raise PlanError(f"{where}: chunk {chunk} out of range "
                                f"[0, {self.chunks_per_stage})")
        if kind in P2P_KINDS + ("BARRIER",) and not 0 <= peer < self.num_stages:
            raise PlanError(f"{where}: peer {peer} out of range [0, {self.num_stages})")
        if kind == "W" and not self.split_backward:
            raise PlanError(f"{where}: W in a plan without split backward")
        return Action(stage, kind, mb, chunk, peer, max(chunk, 0) * self.num_stages + stage)

    def _check_program(self, stage):
        # Per entry, the kinds seen so far, in order; the allowed next kinds follow
        # F < OFFLOAD < RELEASE < RELOAD < B (< W) with the offload triple optional.
        # A recomputed entry runs F [< OFFLOAD < RELEASE < RELOAD] < RECOMPUTE* < B: the
        # triple then moves its retained block.
        allowed_after = {None: ("F",), "F": ("OFFLOAD", "B") + RECOMPUTE_KINDS,
                         "OFFLOAD": ("RELEASE",), "RELEASE": ("RELOAD",),
                         "RELOAD": ("B",) + RECOMPUTE_KINDS,
                         "RECOMPUTE": ("B",), "RECOMPUTE_LEAN": ("B",), "B": ("W",), "W": ()}
        last: Dict[Tuple[int, int, int], Optional[str]] = {}
        seen = set()
        for index, action in enumerate(self.programs[stage]):
            if action.kind not in COMPUTE_KINDS + OFFLOAD_KINDS + RECOMPUTE_KINDS:
                ident = (action.kind, action.mb, action.chunk)
                if action.kind != "BARRIER" and ident in seen:
                    raise PlanError(f"stage {stage}, op {index}: {action} appears twice")
                seen.add(ident)
                continue
            previous = last.get(action.key)
            if action.kind not in allowed_after[previous]:
                raise PlanError(
                    f"stage {stage}, op {index}: {action} after "
                    f"{previous or 'nothing'} of that entry; an entry runs "
                    "F < OFFLOAD < RELEASE < RELOAD < B (< W), the offload triple optional, "
                    "or F < [OFFLOAD < RELEASE < RELOAD <] RECOMPUTE / RECOMPUTE_LEAN < B (< W)")
            last[action.key] = action.kind
        final = "W" if self.split_backward else "B"
        expected = {(stage, c, mb) for c in range(self.chunks_per_stage)
                    for mb in range(self.num_microbatches)}
        unfinished = sorted(k for k in expected if last.get(k) != final)
        if unfinished:
            s, c, mb = unfinished[0]
            raise PlanError(f"stage {stage}: {len(unfinished)} entries do not end with {final} "
                            f"(first: mb {mb}, chunk {c}, last op {last.get(unfinished[0])})")

    # --- one process ---------------------------------------------------------------------

    def _message_key(self, action):
        """(direction, receiving virtual stage, mb) a SEND / RECV op carries."""
        l = action.virtual_stage
        if action.kind == "SEND_F":
            return ("F", l + 1, action.mb)
        if action.kind == "RECV_F":
            return ("F", l, action.mb)
        if action.kind == "SEND_B":
            return ("B", l - 1, action.mb)
        return ("B", l, action.mb)  # RECV_B

    def single_process_order(self) -> List[Action]:
        """Every stage's ops merged into one issue order for one process: the stages take turns,
        each running its program up to and including one compute op or until it must wait (a
        RECV whose SEND has not been issued, an F or B whose input has not arrived). SEND_* and
        RECV_* keep their place as markers; BARRIERs (which stagger transfers of stages that
        share a host link) are kept in order and impose nothing in one process. Raises
        PlanError naming each stage's blocking op when the programs deadlock."""
        sent = set()
        # Inputs that arrive without a RECV op (stages of one rank pass data locally).
        has_recv = {self._message_key(a) for program in self.programs for a in program
                    if a.kind in ("RECV_F", "RECV_B")}
        arrived = set()
        order: List[Action] = []
        position = [0] * self.num_stages
        total = sum(len(p) for p in self.programs)
        last_vs = self.num_virtual_stages - 1

        def ready(action):
            if action.kind in ("RECV_F", "RECV_B"):
                return self._message_key(action) in sent
            if action.kind == "F" and action.virtual_stage > 0:
                return ("F", action.virtual_stage, action.mb) in arrived
            if action.kind == "B" and action.virtual_stage < last_vs:
                return ("B", action.virtual_stage, action.mb) in arrived
            return True

        def produce(direction, receiver, mb):
            key = (direction, receiver, mb)
            sent.add(key)
            if key not in has_recv:
                arrived.add(key)

        while len(order) < total:
            progress = False
            for d in range(self.num_stages):
                program = self.programs[d]
                while position[d] < len(program):
                    action = program[position[d]]
                    if not ready(action):
                        break
                    order.append(action)
                    position[d] += 1
                    progress = True
                    if action.kind in ("RECV_F", "RECV_B"):
                        arrived.add(self._message_key(action))
                    elif action.kind in ("SEND_F", "SEND_B"):
                        produce(*self._message_key(action))
                    elif action.kind == "F" and action.virtual_stage < last_vs and \
                            ("F", action.virtual_stage + 1, action.mb) not in has_recv:
                        produce("F", action.virtual_stage + 1, action.mb)
                    elif action.kind == "B" and action.virtual_stage > 0 and \
                            ("B", action.virtual_stage - 1, action.mb) not in has_recv:
                        produce("B", action.virtual_stage - 1, action.mb)
                    if action.kind in COMPUTE_KINDS:
                        break
            if not progress:
                stuck = ", ".join(
                    f"stage {d} at op {position[d]} ({self.programs[d][position[d]]})"
                    for d in range(self.num_stages) if position[d] < len(self.programs[d]))
                raise PlanError(f"the stage programs deadlock in one process: {stuck}")
        return order

    # --- torch.distributed.pipelining notation -------------------------------------------

    def torch_actions(self) -> Dict[int, List[str]]:
        """Each rank's compute and P2P ops in torch's _Action notation (schedules.py:
        "{stage_index}{type}{microbatch}", stage_index being the virtual stage): F -> F,
        B -> B (full backward) or I (input backward, when W is split), W -> W, SEND_F /
        RECV_F / SEND_B / RECV_B keep their names. Offload ops, recompute ops and BARRIERs
        have no torch action; offload_hooks() keeps the offload and recompute ones."""
        names = {"F": "F", "B": "I" if self.split_backward else "B", "W": "W",
                 "SEND_F": "SEND_F", "RECV_F": "RECV_F", "SEND_B": "SEND_B",
                 "RECV_B": "RECV_B"}
        return {d: [f"{a.virtual_stage}{names[a.kind]}{a.mb}" for a in program
                    if a.kind in names] for d, program in enumerate(self.programs)}

    def offload_hooks(self) -> Dict[int, List[Tuple[Optional[str], List[Action]]]]:
        """Per rank: (torch action string or None for the program's start, the offload and
        recompute ops the plan issues after it and before the rank's next torch action). A
        runtime beside torch's issues each list right after running that action."""
        torch_names = self.torch_actions()
        hooks = {}
        for d, program in enumerate(self.programs):
            current: List[Action] = []
            entries: List[Tuple[Optional[str], List[Action]]] = [(None, current)]
            names = iter(torch_names[d])
            for action in program:
                if action.kind in OFFLOAD_KINDS + RECOMPUTE_KINDS:
                    current.append(action)
                elif action.kind != "BARRIER":
                    current = []
                    entries.append((next(names), current))
            hooks[d] = [(name, ops) for name, ops in entries if ops]
        return hooks
