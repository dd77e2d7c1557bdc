"""The other processes' segments a model worker reads requests from, and when it unmaps them.

Request tensors are read in place from the sender's ring (or a one-off
segment of its), mapped read-only once and kept mapped for later requests.
A one-off segment serves one request: its owner unlinks it when the reply
came, but its memory stays taken in /dev/shm while this process maps it,
so it is unmapped as soon as no view of it is left; a mapping still viewed
(a model's output that is a view of its input, still being replied) is
tried again after the batch and at housekeeping. The segments of a client
that died are unmapped the same way.
"""

from __future__ import annotations

from collections.abc import Iterable

from appliance.core.message_tensors import SegmentReader
from appliance.core.segment import Segment
from appliance.core.tree import owner_pid


def _attach_read_only(name: str) -> Segment:
    return Segment.attach(name)


class Mappings:
    """A reader of other processes' segments, with the unmaps still owed."""

    def __init__(self) -> None:
        self.reader = SegmentReader(_attach_read_only)
        self._owed: set[str] = set()

    def unmap(self, names: Iterable[str]) -> None:
        """Unmap ``names`` now, or (still viewed) at a later :meth:`retry`."""
        for name in names:
            if not self.reader.forget(name):
                self._owed.add(name)

    def retry(self) -> None:
        """Unmap what could not be unmapped before."""
        if not self._owed:
            return
        for name in list(self._owed):
            if self.reader.forget(name):
                self._owed.discard(name)

    def owners(self) -> set[int]:
        """The processes whose segments are mapped here."""
        return {pid for pid in map(owner_pid, self.reader.names()) if pid}

    def drop_owner(self, pid: int) -> None:
        """Unmap every segment of a process that died."""
        self.unmap([name for name in self.reader.names() if owner_pid(name) == pid])

    def close(self) -> None:
        self.reader.close()
