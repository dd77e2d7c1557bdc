"""The system regions' segments a frontend process mapped for guarded copies.

Where the compiled request path runs (core/client_memory.py), a region's
segment is mapped on its first use in this process and kept while the
region is registered as it was then, so that a request copies at memcpy's
speed instead of paying pread's and pwrite's walk of tmpfs's pages. A
mapping of a region unregistered or registered again is dropped when the
table next reads the registry, or by the sweeper (shm_sweeper.py) within
``SWEEP_INTERVAL_S``; it is unmapped when the last span holding it goes, so
no copy runs on an unmapped page.
"""

from __future__ import annotations

from collections.abc import Mapping

from appliance.core.client_memory import map_segment
from appliance.protocols.kserve.shm_places import segment_file
from appliance.protocols.kserve.shm_registry import Region
from appliance.protocols.kserve.shm_sweeper import Sweeper


class MappedSegments:
    """Mappings of client segments, by region name; guarded by the region table's lock.

    Args:
        sweeper: the region table's, started whenever a mapping is held.
    """

    def __init__(self, sweeper: Sweeper) -> None:
        # Region name -> (its serial, its segment's first bytes, to the region's end).
        self._mapped: dict[str, tuple[int, memoryview]] = {}
        self._sweeper = sweeper

    def holding(self) -> bool:
        """Whether any segment is mapped here."""
        return bool(self._mapped)

    def get(self, region: Region) -> memoryview | None:
        """The region's segment mapped, on first use; None: copied with pread/pwrite.

        None too where the segment is not the one registered (gone, replaced,
        too small): the span's copies then say what is wrong.
        """
        held = self._mapped.get(region.name)
        if held is not None and held[0] == region.serial:
            return held[1]
        end = region.offset + region.byte_size
        mapped = map_segment(segment_file(region.key), end, (region.device, region.inode))
        if mapped is None:
            self._mapped.pop(region.name, None)
            return None
        self._mapped[region.name] = (region.serial, mapped)
        self._sweeper.start()
        return mapped

    def prune(self, registered: Mapping[str, Region]) -> None:
        """Drop the mappings of regions no longer ``registered`` as they were mapped."""
        for name, (serial, _) in list(self._mapped.items()):
            known = registered.get(name)
            if known is None or known.serial != serial:
                del self._mapped[name]

    def clear(self) -> None:
        """Drop every mapping (at exit)."""
        self._mapped.clear()
