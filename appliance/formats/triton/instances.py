"""config.pbtxt's ``instance_group``, read into the ``instances`` and ``device`` settings.

The groups' counts, summed; KIND_CPU on the CPU, KIND_GPU on the listed GPU
(``gpus`` with one GPU) or spread over all (no ``gpus``). Groups over
several GPUs, or on the CPU and on GPUs at once, are refused: a model runs
on one kind of device here.
"""

from __future__ import annotations

from typing import Any

from appliance._generated import triton_model_config_pb2 as mc
from appliance.formats.triton.sequences import PbtxtError, is_set


class InstanceFields:
    """The instance_group part of a config.pbtxt reader (pbtxt._Reader)."""

    config: Any
    notes: list[str]

    def _instances(self) -> dict[str, Any]:
        groups = list(self.config.instance_group)
        if not groups:
            return {}
        kinds = {group.kind for group in groups}
        if mc.ModelInstanceGroup.KIND_MODEL in kinds:
            raise PbtxtError("instance_group.kind: KIND_MODEL is not served")
        if kinds == {mc.ModelInstanceGroup.KIND_AUTO}:
            self.notes.append("instance_group.kind KIND_AUTO is served on the CPU")
            kinds = {mc.ModelInstanceGroup.KIND_CPU}
        for group in groups:
            for field in ("rate_limiter", "profile", "passive", "secondary_devices", "host_policy"):
                if is_set(group, field):
                    self.notes.append(f"instance_group.{field} is not used")
        if len(kinds - {mc.ModelInstanceGroup.KIND_AUTO}) > 1:
            raise PbtxtError(
                "instance_group: groups on the CPU and on GPUs at once are not served; "
                "a model runs on one kind of device"
            )
        count = sum(max(group.count, 1) * max(len(group.gpus), 1) for group in groups)
        if mc.ModelInstanceGroup.KIND_GPU not in kinds:
            return {"instances": count, "device": "cpu"}
        gpus = {gpu for group in groups for gpu in group.gpus}
        if not gpus:
            self.notes.append(
                "instance_group: KIND_GPU without gpus runs count instances in all, "
                "spread over the GPUs (Triton runs count on each GPU)"
            )
            return {"instances": count, "device": "cuda"}
        if len(gpus) > 1:
            raise PbtxtError(
                f"instance_group.gpus: instances on GPUs {sorted(gpus)} are not served; name one "
                "GPU, or none to spread the instances over all"
            )
        if any(gpu < 0 for gpu in gpus):
            raise PbtxtError(f"instance_group.gpus: {sorted(gpus)} holds a negative GPU index")
        return {"instances": count, "device": f"cuda:{gpus.pop()}"}
