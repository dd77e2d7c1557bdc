"""The status table: one shared-memory segment every process of a tree maps.

It holds what the master decides (online, draining) and what each process
reports about itself (state, pid, queue depth, heartbeat, counters), so a
frontend can answer readiness and route requests without asking anyone.

Layout (little-endian)::

    header, 256 bytes
      0  magic 'APST'      4s
      4  version           u32
      8  online            u8     written by the master only
      9  draining          u8     written by the master only
     12  slot count        u32
     16  master pid        u32
     20  layout generation u32    bumped by the master when model -> slots changes
     24  master heartbeat  f64    CLOCK_MONOTONIC seconds
     32  ring cap          u64    written by the master only: the most bytes a
                                  ring may take where /dev/shm is too small for
                                  the config's sizes (0: no cap)
    slot i at 256 + 512*i
      0  state             u8     SlotState
      1  role              u8     Role
      2  instance          u16
      4  pid               u32
      8  generation        u32    bumped by the master at every (re)start
     12  depth             u32    model: requests queued or running;
                                  frontend: requests in flight
     16  heartbeat         f64
     24  busy since        f64    model: start of the running batch, 0 idle
     32  counters          12 x u64, see Counter
    128  name              64 bytes UTF-8, NUL padded (the model's name)
    192  note              256 bytes UTF-8, NUL padded (why it last failed)
    448  ring used         u64    bytes of this process's ring in use
    456  ring capacity     u64
    464  ring spilled      u64    bytes in one-off segments
    472  device            16 bytes UTF-8, NUL padded: model: "cpu" or "cuda:N"
    488  device memory     u64    model on a GPU: bytes torch has allocated there
    496  restart at        f64    a STARTING or DEAD slot: when the master
                                  (re)starts it (CLOCK_MONOTONIC); 0 when no
                                  one should wait for it (it stops, or its
                                  last start failed to load the model)

SAFETY: every field has one writer at a time. The master writes a slot's
state, generation and name before it starts the slot's process and after it
has reaped it; the process writes everything else while it runs. Readers may
see a field a moment late, never a field half-written by two processes.
"""

from __future__ import annotations

import enum
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass

from appliance.core.segment import Segment

MAGIC = b"APST"
VERSION = 2
HEADER_SIZE = 256
SLOT_SIZE = 512
N_COUNTERS = 12

_HEADER = struct.Struct("<4sIBBxxIIId")
_LAYOUT = struct.Struct("<I")
_RING_CAP = struct.Struct("<Q")
_OFF_RING_CAP = 32
_HOT = struct.Struct("<BBHIII")  # state, role, instance, pid, generation, depth
_TIMES = struct.Struct("<dd")
_COUNTERS = struct.Struct(f"<{N_COUNTERS}Q")
_NAME_LEN = 64
_NOTE_LEN = 256
_OFF_DEPTH = 12
_OFF_HEARTBEAT = 16
_OFF_COUNTERS = 32
_OFF_NAME = 128
_OFF_NOTE = 192
_OFF_RING = 448
_RING = struct.Struct("<QQQ")
_OFF_DEVICE = 472
_DEVICE_LEN = 16
_OFF_DEVICE_MEMORY = 488
_OFF_RESTART_AT = 496
_RESTART_AT = struct.Struct("<d")
_U32 = struct.Struct("<I")
# The counters a model worker adds to (SUCCESS .. COMPUTE_NS), and LAST_INFERENCE_MS after them.
_WORK = struct.Struct("<7Q")
# From a slot's depth (_OFF_DEPTH): depth, heartbeat, busy since; then the work counters.
_BEGIN = struct.Struct("<Idd")
_IDLE_WORK = struct.Struct("<Idd7Q")
# The one-write layout holds only while these fields stay side by side.
assert _OFF_DEPTH + 4 == _OFF_HEARTBEAT
assert _OFF_DEPTH + _BEGIN.size == _OFF_COUNTERS


class SlotState(enum.IntEnum):
    EMPTY = 0
    STARTING = 1
    READY = 2
    DEAD = 3
    STOPPING = 4
    FAILED = 5


class Role(enum.IntEnum):
    NONE = 0
    MODEL = 1
    HTTP = 2
    HTTP_WORKER = 3
    GRPC = 4
    MIP = 5
    CLIENT = 6
    ZYGOTE = 7


class Counter(enum.IntEnum):
    """Per-slot counters; model slots fill them, summed per model on read."""

    SUCCESS = 0
    FAIL = 1
    BATCHES = 2
    BATCH_ROWS = 3
    QUEUE_NS = 4
    COMPUTE_NS = 5
    LAST_INFERENCE_MS = 6  # wall clock, ms since the epoch
    RESTARTS = 7


@dataclass(frozen=True, slots=True)
class SlotInfo:
    """A snapshot of one slot."""

    index: int
    state: SlotState
    role: Role
    instance: int
    pid: int
    generation: int
    depth: int
    heartbeat: float
    busy_since: float
    counters: tuple[int, ...]
    name: str
    note: str
    ring: tuple[int, int, int] = (0, 0, 0)
    device: str = ""
    device_memory: int = 0


class StatusTable:
    """Read and write the status table of one tree."""

    def __init__(self, segment: Segment) -> None:
        self.segment = segment
        self._buf = segment.buffer
        magic, version, *_rest = _HEADER.unpack_from(self._buf, 0)
        if magic != MAGIC or version != VERSION:
            raise ValueError(f"segment {segment.name} is not a status table of version {VERSION}")
        self.n_slots = _HEADER.unpack_from(self._buf, 0)[4]

    @staticmethod
    def size(n_slots: int) -> int:
        return HEADER_SIZE + SLOT_SIZE * n_slots

    @classmethod
    def create(cls, name: str, n_slots: int, master_pid: int) -> StatusTable:
        segment = Segment.create(name, cls.size(n_slots))
        _HEADER.pack_into(segment.buffer, 0, MAGIC, VERSION, 0, 0, n_slots, master_pid, 0, 0.0)
        return cls(segment)

    @classmethod
    def attach(cls, name: str) -> StatusTable:
        return cls(Segment.attach(name, writable=True))

    # -- header: the master's decisions --------------------------------------

    @property
    def online(self) -> bool:
        return bool(self._buf[8])

    @online.setter
    def online(self, value: bool) -> None:
        self._buf[8] = int(value)

    @property
    def draining(self) -> bool:
        return bool(self._buf[9])

    @draining.setter
    def draining(self, value: bool) -> None:
        self._buf[9] = int(value)

    @property
    def master_pid(self) -> int:
        return int(_HEADER.unpack_from(self._buf, 0)[5])

    @property
    def layout_generation(self) -> int:
        return int(_LAYOUT.unpack_from(self._buf, 20)[0])

    def bump_layout(self) -> None:
        """Tell every client to re-read the model -> slots layout (master)."""
        _LAYOUT.pack_into(self._buf, 20, self.layout_generation + 1)

    @property
    def ring_cap(self) -> int:
        """The most bytes one ring may take (0: as configured); see master/shm.py."""
        return int(_RING_CAP.unpack_from(self._buf, _OFF_RING_CAP)[0])

    @ring_cap.setter
    def ring_cap(self, value: int) -> None:
        _RING_CAP.pack_into(self._buf, _OFF_RING_CAP, value)

    def ring_size(self, configured: int, floor: int) -> tuple[int, int]:
        """A ring's (size to ask for, floor) under the master's cap."""
        cap = self.ring_cap
        size = min(configured, cap) if cap else configured
        return size, min(size, floor)

    def beat_master(self) -> None:
        struct.pack_into("<d", self._buf, 24, time.monotonic())

    # -- slots ---------------------------------------------------------------

    def _at(self, index: int) -> int:
        if not 0 <= index < self.n_slots:
            raise IndexError(f"slot {index} outside 0..{self.n_slots - 1}")
        return HEADER_SIZE + SLOT_SIZE * index

    def hot(self, index: int) -> tuple[int, int, int, int, int, int]:
        """Return (state, role, instance, pid, generation, depth) quickly."""
        result: tuple[int, int, int, int, int, int] = _HOT.unpack_from(self._buf, self._at(index))
        return result

    def occupied(self) -> Iterator[SlotInfo]:
        """Snapshots of the slots a process holds (or held and has not yet released)."""
        for index in range(self.n_slots):
            info = self.read(index)
            if info.role is not Role.NONE and info.state is not SlotState.EMPTY:
                yield info

    def read(self, index: int) -> SlotInfo:
        base = self._at(index)
        state, role, instance, pid, generation, depth = _HOT.unpack_from(self._buf, base)
        heartbeat, busy = _TIMES.unpack_from(self._buf, base + _OFF_HEARTBEAT)
        counters = _COUNTERS.unpack_from(self._buf, base + _OFF_COUNTERS)
        return SlotInfo(
            index,
            SlotState(state),
            Role(role),
            instance,
            pid,
            generation,
            depth,
            heartbeat,
            busy,
            counters,
            self._text(base + _OFF_NAME, _NAME_LEN),
            self._text(base + _OFF_NOTE, _NOTE_LEN),
            _RING.unpack_from(self._buf, base + _OFF_RING),
            self._text(base + _OFF_DEVICE, _DEVICE_LEN),
            struct.unpack_from("<Q", self._buf, base + _OFF_DEVICE_MEMORY)[0],
        )

    def _text(self, offset: int, length: int) -> str:
        raw = bytes(self._buf[offset : offset + length])
        return raw.split(b"\0", 1)[0].decode(errors="replace")

    def _put_text(self, offset: int, length: int, text: str) -> None:
        data = text.encode()[: length - 1]
        self._buf[offset : offset + length] = data.ljust(length, b"\0")

    def assign(
        self, index: int, role: Role, name: str = "", instance: int = 0, bump: bool = True
    ) -> int:
        """Prepare a slot for a (re)start; return its new generation (master)."""
        base = self._at(index)
        _state, _role, _inst, _pid, generation, _depth = _HOT.unpack_from(self._buf, base)
        if bump:
            generation += 1
        _HOT.pack_into(self._buf, base, SlotState.STARTING, role, instance, 0, generation, 0)
        _TIMES.pack_into(self._buf, base + _OFF_HEARTBEAT, time.monotonic(), 0.0)
        self._put_text(base + _OFF_NAME, _NAME_LEN, name)
        # The new process publishes its own device once it has resolved it.
        self.set_device(index, "", 0)
        return int(generation)

    def set_restart_at(self, index: int, at: float) -> None:
        """Say when a slot (re)starts; 0: do not wait for it (master)."""
        _RESTART_AT.pack_into(self._buf, self._at(index) + _OFF_RESTART_AT, at)

    def restart_at(self, index: int) -> float:
        """When the master (re)starts a slot (CLOCK_MONOTONIC); 0: do not wait for it."""
        at: float = _RESTART_AT.unpack_from(self._buf, self._at(index) + _OFF_RESTART_AT)[0]
        return at

    def set_state(self, index: int, state: SlotState, pid: int | None = None) -> None:
        base = self._at(index)
        self._buf[base] = int(state)
        if pid is not None:
            struct.pack_into("<I", self._buf, base + 4, pid)

    def set_note(self, index: int, note: str) -> None:
        self._put_text(self._at(index) + _OFF_NOTE, _NOTE_LEN, note)

    def set_ring(self, index: int, used: int, capacity: int, spilled: int) -> None:
        _RING.pack_into(self._buf, self._at(index) + _OFF_RING, used, capacity, spilled)

    def set_device(self, index: int, device: str, memory: int = 0) -> None:
        base = self._at(index)
        self._put_text(base + _OFF_DEVICE, _DEVICE_LEN, device)
        struct.pack_into("<Q", self._buf, base + _OFF_DEVICE_MEMORY, memory)

    def set_device_memory(self, index: int, memory: int) -> None:
        struct.pack_into("<Q", self._buf, self._at(index) + _OFF_DEVICE_MEMORY, memory)

    def set_depth(self, index: int, depth: int) -> None:
        struct.pack_into("<I", self._buf, self._at(index) + _OFF_DEPTH, max(0, depth))

    def beat(self, index: int, busy_since: float = 0.0) -> None:
        _TIMES.pack_into(self._buf, self._at(index) + _OFF_HEARTBEAT, time.monotonic(), busy_since)

    def add(self, index: int, counter: Counter, amount: int = 1) -> None:
        offset = self._at(index) + _OFF_COUNTERS + 8 * counter
        (value,) = struct.unpack_from("<Q", self._buf, offset)
        struct.pack_into("<Q", self._buf, offset, value + amount)

    def own(self, index: int) -> OwnWrites:
        """The writes a process makes to its own slot on every batch (see OwnWrites)."""
        return OwnWrites(self, index)

    def put(self, index: int, counter: Counter, value: int) -> None:
        struct.pack_into("<Q", self._buf, self._at(index) + _OFF_COUNTERS + 8 * counter, value)

    def clear(self, index: int) -> None:
        base = self._at(index)
        self._buf[base : base + SLOT_SIZE] = bytes(SLOT_SIZE)

    def close(self) -> None:
        self.segment.close()


class OwnWrites:
    """The fields a process writes to its own slot as it works, its offsets worked out once.

    Depth, heartbeat, busy-since and the work counters lie side by side
    (offsets 12 to 88 of a slot, two cache lines): a batch's start is one
    write (depth, heartbeat, busy-since), and the end of a loop turn one more
    (the same, idle, with the counters' running totals).

    PERF: a model worker writes its heartbeat, depth and counters on every
    batch; :class:`StatusTable`'s general methods check the index and look up
    the struct formats each time, and a write a field cost a lone request
    five calls into struct where two do.
    """

    __slots__ = ("_buf", "_counters", "_depth", "_times")

    def __init__(self, table: StatusTable, index: int) -> None:
        base = table._at(index)
        self._buf = table._buf
        self._depth = base + _OFF_DEPTH
        self._times = base + _OFF_HEARTBEAT
        self._counters = base + _OFF_COUNTERS

    def beat(self, now: float, busy_since: float = 0.0) -> None:
        """The heartbeat at ``now`` (time.monotonic()), and when the running batch started."""
        _TIMES.pack_into(self._buf, self._times, now, busy_since)

    def set_depth(self, depth: int) -> None:
        _U32.pack_into(self._buf, self._depth, depth if depth > 0 else 0)

    def begin_batch(self, depth: int, now: float) -> None:
        """The depth with the batch that starts at ``now`` counted, the heartbeat and
        busy-since at ``now``: one write."""
        _BEGIN.pack_into(self._buf, self._depth, depth if depth > 0 else 0, now, now)

    def work(self) -> list[int]:
        """The work counters as the slot holds them (SUCCESS .. LAST_INFERENCE_MS)."""
        return list(_WORK.unpack_from(self._buf, self._counters))

    def write(self, depth: int, now: float, work: list[int]) -> None:
        """Depth, an idle heartbeat at ``now`` and the work counters' totals ``work``
        (SUCCESS .. LAST_INFERENCE_MS, as :meth:`work` gave them): one write."""
        _IDLE_WORK.pack_into(
            self._buf,
            self._depth,
            depth if depth > 0 else 0,
            now,
            0.0,
            work[0],
            work[1],
            work[2],
            work[3],
            work[4],
            work[5],
            work[6],
        )
