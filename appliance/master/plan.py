"""From a config to the list of children and the status-table layout.

Slots are laid out as: every model instance (in config order), then the HTTP
arbiter, then room for its gunicorn workers (twice the worker count, so a
restarting worker never waits for its predecessor's slot), then the gRPC and
MIP frontend processes. Spare slots are left for models added by a reload.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from appliance.config.settings import ApplianceConfig, ModelConfig
from appliance.core.status import Role
from appliance.master.children import ChildSpec
from appliance.master.ports import Ports

SPARE_SLOTS = 64


@dataclass(slots=True)
class Plan:
    specs: list[ChildSpec] = field(default_factory=list)
    model_slots: dict[str, list[int]] = field(default_factory=dict)
    http_worker_slots: tuple[int, int] = (0, 0)
    n_slots: int = 0
    first_spare: int = 0

    def layout(self) -> dict[str, object]:
        """Return what clients need to find instances (``layout.json``)."""
        return {
            "models": self.model_slots,
            "http_worker_slots": list(self.http_worker_slots),
        }


def model_specs(
    model: ModelConfig, slots: list[int], snapshot: Path, reload: int = 0
) -> list[ChildSpec]:
    """The children of one model's instances, in the given slots."""
    suffix = f"@r{reload}" if reload else ""
    return [
        ChildSpec(
            role="model",
            title=f"model[{model.name}#{instance}{suffix}]",
            slot=slot,
            status_role=Role.MODEL,
            model=model.name,
            instance=instance,
            extra=("--model", model.name, "--snapshot", str(snapshot)),
        )
        for instance, slot in enumerate(slots)
    ]


def make_plan(config: ApplianceConfig, ports: Ports, snapshot: Path) -> Plan:
    """Lay out slots and child specs for ``config`` with resolved ports.

    Args:
        ports: the master's listening sockets, which each frontend process
            inherits (see ``ports``).
    """
    plan = Plan()
    slot = 0
    for model in config.models:
        slots = list(range(slot, slot + model.instances))
        plan.model_slots[model.name] = slots
        plan.specs += model_specs(model, slots, snapshot)
        slot += model.instances
    http_slot = slot
    worker_count = 2 * config.http.workers
    plan.http_worker_slots = (http_slot + 1, worker_count)
    # The metrics and management ports, where there are, are the HTTP process's too.
    metrics: tuple[str, ...] = ()
    http_fds: tuple[int, ...] = (ports.http_fd,)
    if ports.metrics_fd is not None:
        metrics = ("--metrics-port", str(ports.by_name["metrics"]))
        metrics += ("--metrics-fd", str(ports.metrics_fd))
        http_fds += (ports.metrics_fd,)
    if ports.management_fd is not None:
        metrics += ("--management-port", str(ports.by_name["management"]))
        metrics += ("--management-fd", str(ports.management_fd))
        http_fds += (ports.management_fd,)
    plan.specs.append(
        ChildSpec(
            role="http",
            title="http",
            slot=http_slot,
            status_role=Role.HTTP,
            extra=(
                "--port",
                str(ports.by_name["http"]),
                "--listen-fd",
                str(ports.http_fd),
                "--worker-slots",
                f"{http_slot + 1}:{worker_count}",
                *metrics,
            ),
            pass_fds=http_fds,
        )
    )
    slot = http_slot + 1 + worker_count
    listeners = ",".join(f"{port}={model}" for port, model in ports.mip_listeners)
    mip_args = ("--listeners", listeners, "--listen-fds", ",".join(map(str, ports.mip_fds)))
    grpc_args: tuple[str, ...] = ("--listen-fd", str(ports.grpc_fd))
    grpc_fds: tuple[int, ...] = (ports.grpc_fd,)
    if ports.grpc_management_fd is not None:
        grpc_args += ("--management-fd", str(ports.grpc_management_fd))
        grpc_fds += (ports.grpc_management_fd,)
    for role, status_role, count, where, fds in (
        ("grpc", Role.GRPC, config.grpc.workers, grpc_args, grpc_fds),
        ("mip", Role.MIP, config.mip.workers, mip_args, tuple(ports.mip_fds)),
    ):
        for index in range(count):
            plan.specs.append(
                ChildSpec(
                    role=role,
                    title=f"{role}[{index}]",
                    slot=slot,
                    status_role=status_role,
                    instance=index,
                    extra=(*where, "--index", str(index)),
                    pass_fds=fds,
                )
            )
            slot += 1
    plan.first_spare = slot
    plan.n_slots = slot + SPARE_SLOTS
    return plan
