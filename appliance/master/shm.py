"""What a config needs of /dev/shm, and how the master fits it into what is free.

Every frontend process owns a request ring and every model instance a
response ring (DESIGN.md, the data path). At start the master sums what the
config's rings may take and compares it with the free space of /dev/shm:

- it fits (with room left for one-off segments): every ring as configured;
- it does not, and ``shm.shrink_to_fit`` (the default): every ring is capped
  at one equal share of the free space, never below ``shm.min_ring_bytes``.
  The cap goes into the status table, where each process reads it before it
  makes its ring;
- not even the smallest rings fit, or shrinking is off: the appliance does
  not start, and says how much is needed, how much is free, and what to change.

A model's response ring is counted at the most it may take (its own
``response_ring_bytes``, else ``shm.response_ring_bytes``): its worker sizes
it to the model's declared outputs once loaded, which only the worker knows,
and never above the cap.
"""

from __future__ import annotations

from dataclasses import dataclass

from appliance.config.settings import ApplianceConfig
from appliance.core.segment import PAGE, MiB, Space, held_by, mib
from appliance.core.tree import PREFIX

# Kept free for one-off segments (tensors larger than a ring) and for a
# replaced process's ring before its predecessor's is swept.
RESERVE_FRACTION = 8
# A shrunk ring's size is a multiple of this.
ROUND = 64 << 10


@dataclass(frozen=True, slots=True)
class Rings:
    """The rings one kind of process needs: how many, and the most each may take."""

    what: str  # "frontend processes' request rings", "model instances' response rings"
    sizes: tuple[int, ...]

    @property
    def total(self) -> int:
        return sum(self.sizes)

    def describe(self) -> str:
        """E.g. "5 frontend processes' request rings of 32 MiB (160 MiB)"."""
        distinct = sorted(set(self.sizes), reverse=True)
        each = " or ".join(mib(size) for size in distinct[:3]) + (" ..." if distinct[3:] else "")
        return f"{len(self.sizes)} {self.what} of {each} ({mib(self.total)})"


def needs(config: ApplianceConfig) -> list[Rings]:
    """The rings ``config`` asks for, per process kind, at their configured sizes."""
    frontends = config.http.workers + config.grpc.workers + config.mip.workers
    shm = config.shm
    responses = tuple(
        model.response_ring_bytes or shm.response_ring_bytes
        for model in config.models
        for _instance in range(model.instances)
    )
    return [
        Rings("frontend processes' request rings", (shm.request_ring_bytes,) * frontends),
        Rings("model instances' response rings", responses),
    ]


@dataclass(frozen=True, slots=True)
class Fit:
    """The master's decision: the cap on every ring (0: none), or a refusal to start."""

    cap: int
    wanted: int  # bytes the rings may take at their configured sizes
    space: Space
    refused: bool = False
    # Why it refused, or (cap > 0) what was shrunk and how to avoid it.
    message: str = ""


def _sizes_and_floors(kinds: list[Rings], config: ApplianceConfig) -> tuple[list[int], list[int]]:
    """Every ring's most and least: as configured, and at shm.min_ring_bytes."""
    sizes = [size for kind in kinds for size in kind.sizes]
    floor_each = max(PAGE, config.shm.min_ring_bytes)
    return sizes, [min(size, floor_each) for size in sizes]


def _settings(size: int) -> str:
    """How to give /dev/shm ``size`` bytes in a container."""
    return (
        f"docker run --shm-size={size // MiB}m; in Kubernetes an emptyDir with medium: Memory "
        f"and sizeLimit: {size // MiB}Mi mounted at /dev/shm"
    )


def fit(config: ApplianceConfig, space: Space, extra: int = 0) -> Fit:
    """Decide how the config's rings fit into ``space`` (``extra``: other bytes it needs)."""
    kinds = needs(config)
    sizes, floors = _sizes_and_floors(kinds, config)
    wanted, floor = sum(sizes) + extra, sum(floors) + extra
    budget = space.free - space.free // RESERVE_FRACTION - extra
    if wanted <= budget:
        return Fit(0, wanted, space)
    what = "; ".join(kind.describe() for kind in kinds if kind.sizes)
    short = (
        f"/dev/shm has {mib(space.free)} free of {mib(space.total)}, and this config's rings "
        f"may take {mib(wanted)} ({what})"
    )
    advice = _advice(config, wanted)
    if not config.shm.shrink_to_fit:
        return Fit(0, wanted, space, True, f"{short}; shm.shrink_to_fit is off. {advice}")
    if floor > budget:
        least = max(PAGE, config.shm.min_ring_bytes)
        return Fit(
            0,
            wanted,
            space,
            True,
            f"{short}, and at least {mib(floor)} with every ring at shm.min_ring_bytes "
            f"({mib(least)}) and 1/{RESERVE_FRACTION} of /dev/shm kept for larger tensors. "
            f"{advice} Or lower shm.min_ring_bytes.",
        )
    cap = _water_level(sizes, floors, budget)
    return Fit(
        cap,
        wanted,
        space,
        message=f"{short}: every ring is capped at {mib(cap)} (shm.shrink_to_fit); tensors "
        f"larger than a ring spill into one-off segments while /dev/shm has room. {advice}",
    )


def _water_level(sizes: list[int], floors: list[int], budget: int) -> int:
    """The largest cap C (a multiple of ROUND) with sum(min(size, max(floor, C))) <= budget."""
    low, high = 0, max(sizes) // ROUND
    while low < high:
        middle = (low + high + 1) // 2
        cap = middle * ROUND
        total = sum(min(size, max(floor, cap)) for size, floor in zip(sizes, floors, strict=True))
        if total <= budget:
            low = middle
        else:
            high = middle - 1
    return max(low * ROUND, min(floors))


def recommended_bytes(wanted: int) -> int:
    """A /dev/shm size that holds ``wanted`` with the reserve: whole 64 MiB steps."""
    with_reserve = wanted * RESERVE_FRACTION // (RESERVE_FRACTION - 1) + 1
    step = 64 * MiB
    return -(-with_reserve // step) * step


def _advice(config: ApplianceConfig, wanted: int) -> str:
    size = recommended_bytes(wanted)
    return (
        f"To give every ring its configured size, give /dev/shm at least {mib(size)} "
        f"({_settings(size)}), or lower shm.request_ring_bytes "
        f"({mib(config.shm.request_ring_bytes)}), shm.response_ring_bytes "
        f"({mib(config.shm.response_ring_bytes)}) or a model's response_ring_bytes, or run "
        "fewer model instances or frontend workers (http.workers, grpc.workers, mip.workers)."
    )


def report(tree_id: str, decided: Fit) -> dict[str, int]:
    """What ``appliance ctl status`` shows of /dev/shm: its size, what is free, what
    this tree holds there, the cap on rings (0: none) and what the config's rings want."""
    space = Space.now()
    return {
        "total_bytes": space.total,
        "free_bytes": space.free,
        "tree_bytes": held_by(f"{PREFIX}{tree_id}-"),
        "ring_cap_bytes": decided.cap,
        "wanted_bytes": decided.wanted,
    }


def sizing_text(config: ApplianceConfig) -> str:
    """What ``appliance shm-size`` prints: the size to give /dev/shm, and why."""
    kinds = needs(config)
    sizes, floors = _sizes_and_floors(kinds, config)
    wanted, floor = sum(sizes), sum(floors)
    size = recommended_bytes(wanted)
    lines = [
        f"/dev/shm: {mib(size)} ({_settings(size)})",
        f"  the rings may take {mib(wanted)}, plus 1/{RESERVE_FRACTION} kept for tensors "
        "larger than a ring:",
        *(f"  - {kind.describe()}" for kind in kinds if kind.sizes),
        f"  smaller, every ring is capped to fit (shm.shrink_to_fit); at least {mib(floor)} "
        f"with every ring at shm.min_ring_bytes ({mib(config.shm.min_ring_bytes)})",
    ]
    return "\n".join(lines)
