"""The torch side of offload: each (stage, chunk, mb)'s saved tensors, captured with
torch.autograd.graph.saved_tensors_hooks, moved to pinned host buffers and back on side streams.
The bookkeeping is ledger.StashLedger's and pinned_pool.PinnedPool's; this file only moves bytes
and orders streams.

Stream and event protocol (the known bug it avoids: torch.cuda.current_stream() inside a
`with torch.cuda.stream(side)` block is `side`, so waiting on it there waits for nothing; the
compute stream is captured once, in __init__, outside any stream context):
  OFFLOAD  d2h waits for the compute stream (the forward wrote the tensors), copies each tensor's
           storage span into a pinned buffer, records d2h_event.
  RELEASE  drops the device tensors at once; record_stream(d2h) makes the caching allocator
           keep their blocks until the copy is done (sync_release=True instead waits for
           d2h_event on the host, so memory falls exactly at RELEASE, for measurements).
  RELOAD   new device tensors with the saved sizes and strides are allocated on the compute
           stream; h2d waits for the compute stream (the blocks may have been freed by work
           still queued there) and for d2h_event (the host bytes must be complete), copies,
           records h2d_event.
  B        the compute stream waits for h2d_event before the backward reads the tensors; the
           host buffers go back to the pool fenced by h2d_event, so the next D2H into them
           never overtakes this H2D.
Recomputed entries (the plan's RECOMPUTE): F of such an entry runs without autograd and holds
no tensors here (retain()); its retained block is the chunk's input, which the caller holds, so
it has 0 bytes and OFFLOAD / RELEASE / RELOAD of it move nothing (the ledger still walks the
entry through RETAINED_COPYING_OUT .. RETAINED_RELOADED, as replay() does with a retained size
of 0). RECOMPUTE re-runs the forward inside capture(key, op="RECOMPUTE"): the saved tensors go
into the entry from then on, and B / W treat it as any entry that was never offloaded.
Tensors are never offloaded when they are parameters or buffers of the stages, a stage's input
(held by the runner anyway), not on the GPU, or not laid out densely (expanded, gapped).
"""
import contextlib
import dataclasses
from typing import Dict, Iterable, List, Optional, Tuple

import torch

from .ledger import RETAINED_COPYING_OUT, RETAINED_ON_HOST, RETAINED_RELOADED, StashLedger
from .pinned_pool import PinnedPool, dense_span
from .plan import PlanError

Key = Tuple[int, int, int]  # (stage, chunk, mb)


@dataclasses.dataclass
class _Saved:
    """One saved tensor: `size`, `stride`, `dtype` and its storage span of `span` elements."""
    device: Optional[torch.Tensor]
    size: Tuple[int, ...]
    stride: Tuple[int, ...]
    dtype: torch.dtype
    span: int
    host: Optional[torch.Tensor] = None     # pinned uint8 buffer of nbytes
    nbytes: int = 0


@dataclasses.dataclass
class _Entry:
    saved: List[_Saved] = dataclasses.field(default_factory=list)
    index: Dict[tuple, int] = dataclasses.field(default_factory=dict)  # dedup of one tensor
    d2h_event: Optional[torch.cuda.Event] = None
    h2d_event: Optional[torch.cuda.Event] = None


def _flat(tensor: torch.Tensor, span: int) -> torch.Tensor:
    """The contiguous 1-D view of a densely laid-out tensor's elements (its storage span)."""
    return tensor.as_strided((span,), (1,), tensor.storage_offset())


class ActivationOffloader:
    """Stash entries of one process's stages on one CUDA device.

    REQUIRES: built outside any torch.cuda.stream() context, on the thread that issues the
    steps (its current stream there is the compute stream). `excluded` are tensors never to
    offload (the stages' parameters and buffers). `recomputed` maps the entries the plan
    recomputes to their op (RECOMPUTE): their F goes through retain(), not capture()."""

    def __init__(self, device, split_backward: bool, excluded: Iterable[torch.Tensor] = (),
                 sync_release: bool = False, min_bytes: int = 0,
                 recomputed: Optional[Dict[Key, str]] = None):
        self.device = torch.device(device)
        if self.device.type != "cuda":
            raise ValueError(f"ActivationOffloader needs a CUDA device, got {self.device}")
        self.compute_stream = torch.cuda.current_stream(self.device)
        self.d2h_stream = torch.cuda.Stream(self.device)
        self.h2d_stream = torch.cuda.Stream(self.device)
        self.sync_release = sync_release
        self.min_bytes = min_bytes
        self._excluded = {t.untyped_storage().data_ptr() for t in excluded}
        self.pool = PinnedPool(
            lambda nbytes: torch.empty(nbytes, dtype=torch.uint8, pin_memory=True))
        self.split_backward = split_backward
        self.recomputed: Dict[Key, str] = dict(recomputed or {})
        self.entry_sizes: Dict[Key, Tuple[int, ...]] = {}
        self.new_iteration()

    def new_iteration(self):
        """Forgets the last iteration's entries (finish() checked they were all freed)."""
        self._entries: Dict[Key, _Entry] = {}
        # A recomputed entry's retained block is the chunk's input, held by the caller: 0 bytes.
        self.ledger = StashLedger(self.split_backward,
                                  entry_bytes=lambda key: sum(self.entry_sizes.get(key, ())),
                                  recomputed=self.recomputed, retained_bytes=lambda key: 0)

    # --- capture (F) -------------------------------------------------------------------------

    def retain(self, key: Key):
        """F of an entry the plan recomputes, which the caller runs under torch.no_grad(): the
        entry holds no tensors until its RECOMPUTE (the caller keeps the chunk's input)."""
        self.ledger.apply("F", key)
        self._entries[key] = _Entry()

    @contextlib.contextmanager
    def capture(self, key: Key, inputs: Iterable[torch.Tensor] = (), op: str = "F"):
        """Context for F of `key` (op "F"), or for the forward that RECOMPUTE re-runs (op
        "RECOMPUTE", after retain() and any offload ops of the retained block): tensors
        autograd saves inside go into the entry, except `inputs` (the stage's inputs) and the
        excluded ones."""
        if op not in ("F", "RECOMPUTE"):
            raise ValueError(f"ActivationOffloader.capture: op {op!r}; expected F or RECOMPUTE")
        if op == "F" and key in self.recomputed:
            raise ValueError(f"ActivationOffloader.capture: F of {key}, which the plan "
                             "recomputes, goes through retain()")
        self.ledger.apply(op, key)
        if op == "F":
            entry = self._entries[key] = _Entry()
        else:
            entry = self._entry(key, op)
        skip = self._excluded | {t.untyped_storage().data_ptr() for t in inputs}

        def pack(tensor):
            nbytes = tensor.numel() * tensor.element_size()
            span = dense_span(tuple(tensor.size()), tuple(tensor.stride()))
            if (not tensor.is_cuda or span < 0 or nbytes < self.min_bytes or
                    tensor.untyped_storage().data_ptr() in skip):
                return (None, tensor)
            ident = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(),
                     tuple(tensor.size()), tuple(tensor.stride()), tensor.dtype)
            if ident not in entry.index:
                entry.index[ident] = len(entry.saved)
                entry.saved.append(_Saved(tensor, tuple(tensor.size()), tuple(tensor.stride()),
                                          tensor.dtype, span,
                                          nbytes=span * tensor.element_size()))
            return (key, entry.index[ident])

        def unpack(packed):
            owner, value = packed
            if owner is None:
                return value
            saved = self._entry(owner, "backward").saved[value]
            if saved.device is None:
                stage, chunk, mb = owner
                raise PlanError(f"stage {stage}: the backward of (mb {mb}, chunk {chunk}) needs "
                                "its saved tensors, which are on the host (no RELOAD before B)")
            return saved.device

        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            yield
        self.entry_sizes[key] = tuple(s.nbytes for s in entry.saved)

    def _entry(self, key: Key, op: str) -> _Entry:
        entry = self._entries.get(key)
        if entry is None:
            stage, chunk, mb = key
            raise PlanError(f"stage {stage}: {op} of (mb {mb}, chunk {chunk}), which has no "
                            "stash entry (no F yet, or already freed)")
        return entry

    # --- OFFLOAD / RELEASE / RELOAD ------------------------------------------------------------

    def offload(self, key: Key):
        entry = self._entry(key, "OFFLOAD")
        if self.ledger.apply("OFFLOAD", key) == RETAINED_COPYING_OUT:
            return  # a retained block of 0 bytes: nothing to copy
        self.d2h_stream.wait_stream(self.compute_stream)
        with torch.cuda.stream(self.d2h_stream):
            for saved in entry.saved:
                saved.host = self.pool.acquire(saved.nbytes)
                host = saved.host.view(saved.dtype)
                host.copy_(_flat(saved.device, saved.span), non_blocking=True)
            entry.d2h_event = torch.cuda.Event()
            entry.d2h_event.record(self.d2h_stream)

    def release(self, key: Key):
        entry = self._entry(key, "RELEASE")
        if self.ledger.apply("RELEASE", key) == RETAINED_ON_HOST:
            return
        if self.sync_release:
            entry.d2h_event.synchronize()
        for saved in entry.saved:
            if not self.sync_release:
                saved.device.record_stream(self.d2h_stream)
            saved.device = None

    def reload(self, key: Key):
        entry = self._entry(key, "RELOAD")
        if self.ledger.apply("RELOAD", key) == RETAINED_RELOADED:
            return
        # Allocated here, on the compute stream, which is the stream that will use and free them.
        for saved in entry.saved:
            saved.device = torch.empty_strided(saved.size, saved.stride, dtype=saved.dtype,
                                               device=self.device)
        self.h2d_stream.wait_stream(self.compute_stream)
        self.h2d_stream.wait_event(entry.d2h_event)
        with torch.cuda.stream(self.h2d_stream):
            for saved in entry.saved:
                _flat(saved.device, saved.span).copy_(saved.host.view(saved.dtype),
                                                      non_blocking=True)
            entry.h2d_event = torch.cuda.Event()
            entry.h2d_event.record(self.h2d_stream)

    # --- B / W ---------------------------------------------------------------------------------

    def before_backward(self, key: Key):
        """Checks the entry may run B (on the device or reloaded) and orders the compute stream
        after its reload."""
        entry = self._entry(key, "B")
        self.ledger.apply("B", key)
        if entry.h2d_event is not None:
            self.compute_stream.wait_event(entry.h2d_event)

    def after_backward(self, key: Key):
        """Host buffers back to the pool (fenced by the reload); device tensors dropped unless
        W still needs them."""
        entry = self._entries[key]
        for saved in entry.saved:
            if saved.host is not None:
                self.pool.give_back(saved.host, saved.nbytes, entry.h2d_event)
                saved.host = None
        if not self.split_backward:
            del self._entries[key]

    def after_weight(self, key: Key):
        self._entry(key, "W")
        self.ledger.apply("W", key)
        del self._entries[key]

    def finish(self):
        """PlanError unless every entry of the iteration was freed."""
        self.ledger.finish()
        if self._entries:
            raise PlanError(f"{len(self._entries)} stash entries still hold tensors at the end "
                            f"of the iteration (first: {sorted(self._entries)[0]})")
