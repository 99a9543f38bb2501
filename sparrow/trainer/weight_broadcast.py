"""Weights from trainer rank 0 to rollout engines over a process group of their own.

    group = SyncGroup.connect(host, port, rank, world_size, backend="gloo")   # "nccl" on GPUs
    group.send(state, dtype=torch.bfloat16, bucket_bytes=256 << 20)   # rank 0, from a state
    group.send_packed(packed.buffer, packed.layout, bucket_bytes)      # rank 0, one flat buffer
    group.receive(consume)                  # ranks 1..: consume({name: tensor}) per bucket
    group.close()

The group is built from a TCPStore (rank 0 listens on `port`) and c10d's process group
classes directly, not through init_process_group: a trainer rank already has its default group
(the FSDP ranks), and an engine process has none, so the sync group stands beside them. It
holds trainer rank 0 and every engine that does not share rank 0's GPU (NCCL refuses two
members on one device; rl/sharded.py's colocated engine takes CUDA IPC instead).
The sender first broadcasts a plan (names, shapes, each bucket's size; tied tensors sent
once), then one flat buffer per bucket: tensors cast to the engine's dtype and laid end to end
until `bucket_bytes` is reached (a larger tensor travels alone). A receiver hands each bucket's
views to `consume` (Engine.update_weights(strict=False)) before the next bucket arrives, so
at most one bucket of extra memory is held on either side. send_packed() sends a buffer
rank 0 has already packed in the engines' dtype on its device (rl/sync_pack.py, the same
buffer a colocated engine maps through CUDA IPC): the buckets are slices of it, nothing is
copied, and the receivers cannot tell it from send().
Tests: tests/trainer/test_weight_broadcast.py (gloo, CPU),
tests/trainer/test_multigpu.py (NCCL, marked multigpu).
"""

from __future__ import annotations

import datetime
import pickle
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist

# one bucket: [(name, element offset, shape)], its element count
Bucket = tuple[list[tuple[str, int, tuple[int, ...]]], int]


def plan_buckets(
    state: Mapping[str, torch.Tensor], bucket_bytes: int, element_size: int
) -> list[Bucket]:
    """Tensors in order, laid end to end per bucket; a name whose storage (data pointer and
    shape) was already laid out points at the same place (tied embeddings travel once)."""
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
    limit = max(1, bucket_bytes // element_size)
    buckets: list[Bucket] = []
    entries: list[tuple[str, int, tuple[int, ...]]] = []
    seen: dict[tuple[int, tuple[int, ...]], tuple[int, int]] = {}  # -> (bucket, offset)
    aliases: list[tuple[int, str, int, tuple[int, ...]]] = []
    used = 0
    for name, tensor in state.items():
        key = (tensor.data_ptr(), tuple(tensor.shape))
        if key in seen:
            aliases.append((seen[key][0], name, seen[key][1], tuple(tensor.shape)))
            continue
        if entries and used + tensor.numel() > limit:
            buckets.append((entries, used))
            entries, used = [], 0
        seen[key] = (len(buckets), used)
        entries.append((name, used, tuple(tensor.shape)))
        used += tensor.numel()
    if entries:
        buckets.append((entries, used))
    for index, name, offset, shape in aliases:
        buckets[index][0].append((name, offset, shape))
    return buckets


def plan_packed(
    layout: Mapping[str, tuple[int, tuple[int, ...]]], bucket_bytes: int, element_size: int
) -> list[tuple[int, Bucket]]:
    """Buckets over one packed flat buffer (engine/weight_share.py's layout: name -> (element
    offset, shape), tied names at one offset): (first element, bucket) per bucket, the
    buckets contiguous slices of the buffer cut at tensor boundaries, as plan_buckets cuts."""
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
    limit = max(1, bucket_bytes // element_size)
    places: dict[int, tuple[int, list[str]]] = {}  # offset -> (numel, names)
    for name, (offset, shape) in layout.items():
        places.setdefault(offset, (_numel(shape), []))[1].append(name)
    buckets: list[tuple[int, Bucket]] = []
    start, used, entries = 0, 0, []
    for offset in sorted(places):
        numel, names = places[offset]
        if offset != start + used:
            raise ValueError(f"the layout leaves a gap before element {offset}")
        if entries and used + numel > limit:
            buckets.append((start, (entries, used)))
            start, used, entries = offset, 0, []
        entries += [(name, offset - start, tuple(layout[name][1])) for name in names]
        used += numel
    if entries:
        buckets.append((start, (entries, used)))
    return buckets


@dataclass
class SyncGroup:
    """A process group of trainer rank 0 (rank 0 here) and the engines (see the module doc)."""

    group: object  # c10d ProcessGroup
    rank: int
    world_size: int
    device: torch.device

    @classmethod
    def connect(
        cls,
        host: str,
        port: int,
        rank: int,
        world_size: int,
        backend: str = "gloo",
        timeout_s: float = 600.0,
    ) -> SyncGroup:
        """Every member calls this at once; rank 0 listens on (host, port)."""
        timeout = datetime.timedelta(seconds=timeout_s)
        store = dist.TCPStore(host, port, world_size, rank == 0, timeout=timeout)
        store = dist.PrefixStore("sparrow-weight-sync", store)
        if backend == "nccl":
            group = dist.ProcessGroupNCCL(store, rank, world_size)
            device = torch.device("cuda", torch.cuda.current_device())
        elif backend == "gloo":
            group = dist.ProcessGroupGloo(store, rank, world_size, timeout)
            device = torch.device("cpu")
        else:
            raise ValueError(f"weight sync backend must be gloo or nccl, got {backend!r}")
        return cls(group, rank, world_size, device)

    def _broadcast(self, tensor: torch.Tensor) -> None:
        options = dist.BroadcastOptions()
        options.rootRank = 0
        self.group.broadcast([tensor], options).wait()

    def _broadcast_object(self, value=None):
        if self.rank == 0:
            payload = torch.frombuffer(bytearray(pickle.dumps(value)), dtype=torch.uint8)
            size = torch.tensor([payload.numel()], dtype=torch.int64)
        else:
            size = torch.zeros(1, dtype=torch.int64)
        size = size.to(self.device)
        self._broadcast(size)
        if self.rank != 0:
            payload = torch.empty(int(size), dtype=torch.uint8)
        data = payload.to(self.device)
        self._broadcast(data)
        return value if self.rank == 0 else pickle.loads(data.cpu().numpy().tobytes())

    @torch.no_grad()
    def send(self, state: Mapping[str, torch.Tensor], dtype: torch.dtype, bucket_bytes: int) -> int:
        """Broadcast `state` (rank 0 only); returns the bytes sent in buckets."""
        if self.rank != 0:
            raise RuntimeError("only rank 0 of the sync group sends weights")
        element = torch.empty((), dtype=dtype).element_size()
        buckets = plan_buckets(state, bucket_bytes, element)
        self._broadcast_object({"dtype": str(dtype).replace("torch.", ""), "buckets": buckets})
        sent = 0
        for entries, numel in buckets:
            flat = torch.empty(numel, dtype=dtype, device=self.device)
            for name, offset, shape in entries:
                tensor = state[name]
                flat[offset : offset + tensor.numel()].view(shape).copy_(tensor)
            self._broadcast(flat)
            sent += flat.numel() * element
        return sent

    @torch.no_grad()
    def send_packed(
        self,
        buffer: torch.Tensor,
        layout: Mapping[str, tuple[int, tuple[int, ...]]],
        bucket_bytes: int,
    ) -> int:
        """Broadcast a packed flat buffer (rl/sync_pack.py) on the group's device, its buckets
        slices of it (no copy); receive() takes it as it takes send(). Returns the bytes."""
        if self.rank != 0:
            raise RuntimeError("only rank 0 of the sync group sends weights")
        if buffer.device != self.device:
            raise ValueError(
                f"the packed buffer is on {buffer.device}, the sync group sends from {self.device}"
            )
        buckets = plan_packed(layout, bucket_bytes, buffer.element_size())
        self._broadcast_object(
            {
                "dtype": str(buffer.dtype).replace("torch.", ""),
                "buckets": [bucket for _, bucket in buckets],
            }
        )
        for start, (_, numel) in buckets:
            self._broadcast(buffer[start : start + numel])
        return sum(numel for _, (_, numel) in buckets) * buffer.element_size()

    @torch.no_grad()
    def receive(self, consume: Callable[[dict[str, torch.Tensor]], None]) -> int:
        """Receive what rank 0 sends; each bucket's {name: view} goes to `consume` in turn.
        Returns the number of tensors received (tied names counted once each)."""
        plan = self._broadcast_object()
        dtype = getattr(torch, plan["dtype"])
        count = 0
        for entries, numel in plan["buckets"]:
            flat = torch.empty(numel, dtype=dtype, device=self.device)
            self._broadcast(flat)
            consume(
                {
                    name: flat[offset : offset + _numel(shape)].view(shape)
                    for name, offset, shape in entries
                }
            )
            count += len(entries)
        return count

    def close(self) -> None:
        shutdown = getattr(self.group, "shutdown", None)
        if callable(shutdown):
            shutdown()
        self.group = None


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count
