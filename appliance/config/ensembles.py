"""Ensembles as declared: read a ``[[models]]`` table with steps, and check its graph.

An ensemble is declared as Triton declares one (config.pbtxt's ``platform:
"ensemble"`` with ``ensemble_scheduling``, read by pbtxt.py into the same
table), or in TOML::

    [[models]]
    name = "chain"
    platform = "ensemble"
    inputs = [{ name = "IN", dtype = "FP32", shape = [-1, -1] }]
    outputs = [{ name = "OUT", dtype = "FP32", shape = [-1, -1] }]
    steps = [
      { model = "identity", input_map = { INPUT0 = "IN" }, output_map = { OUTPUT0 = "mid" } },
      { model = "identity", input_map = { INPUT0 = "mid" }, output_map = { OUTPUT0 = "OUT" } },
    ]

Shapes are whole shapes (a batched ensemble's start with -1), as in a
repository's config.toml. The graph's rules are Triton's: every ensemble
tensor is an ensemble input or the output of exactly one step, every step
input is one of those, every ensemble output is made by a step, and no step
depends on itself. Each step's model must be served by a worker (an
ensemble of ensembles is not served).

:func:`read` raises :class:`EnsembleError` naming the key; :func:`resolve`
checks the steps' models against the served ones once they are all known.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from appliance.config.settings import ENSEMBLE, Declared, EnsembleConfig, EnsembleStep, ModelConfig
from appliance.core.dtypes import DType
from appliance.formats.repository import broken
from appliance.formats.repository_layout import NOTES

log = logging.getLogger("appliance.config")

KEYS = {"name", "platform", "steps", "inputs", "outputs", "max_batch_size", "description"}
KEYS |= {"version"}
STEP_KEYS = {"model", "version", "input_map", "output_map"}


class EnsembleError(ValueError):
    """An ensemble declaration that cannot be served; the message names the key.

    ``where``: the [[models]] table it is declared in, when known.
    """

    def __init__(self, message: str, where: str = "") -> None:
        super().__init__(message)
        self.where = where


def is_ensemble(data: Mapping[str, Any]) -> bool:
    """Whether a ``[[models]]`` table declares an ensemble (rather than a model class)."""
    return data.get("platform") == ENSEMBLE or "steps" in data


def read(data: Mapping[str, Any]) -> EnsembleConfig:
    """Check an ensemble's table and build it (its steps' models are checked by :func:`resolve`).

    Raises:
        EnsembleError: "<key>: <what is wrong>".
    """
    extra = sorted(set(data) - KEYS)
    if extra:
        raise EnsembleError(
            f"{extra[0]}: unknown key for an ensemble; expected one of {', '.join(sorted(KEYS))}"
        )
    if data.get("platform", ENSEMBLE) != ENSEMBLE or "class" in data:
        raise EnsembleError('platform: an ensemble has platform = "ensemble" and no class')
    name = data.get("name")
    if not isinstance(name, str) or not name:
        raise EnsembleError("name: missing")
    max_batch = data.get("max_batch_size", 0)
    if not _whole(max_batch, 0):
        raise EnsembleError(f"max_batch_size: expected an integer >= 0, got {max_batch!r}")
    description = data.get("description", "")
    if not isinstance(description, str):
        raise EnsembleError(f"description: expected a string, got {description!r}")
    version = str(data.get("version", "1"))
    inputs = _declared("inputs", data.get("inputs"), max_batch)
    outputs = _declared("outputs", data.get("outputs"), max_batch)
    raw_steps = data.get("steps")
    if not isinstance(raw_steps, list) or not raw_steps:
        raise EnsembleError("steps: expected a non-empty array of {model, input_map, output_map}")
    steps = tuple(_step(index, item) for index, item in enumerate(raw_steps))
    ensemble = EnsembleConfig(name, inputs, outputs, steps, max_batch, description, version)
    order(ensemble)
    return ensemble


def _whole(value: object, minimum: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def _declared(key: str, raw: object, max_batch: int) -> tuple[Declared, ...]:
    if not isinstance(raw, list) or not raw:
        raise EnsembleError(f"{key}: an ensemble declares its {key} (name, dtype, shape)")
    found: list[Declared] = []
    for index, item in enumerate(raw):
        where = f"{key}[{index}]"
        if not isinstance(item, Mapping) or set(item) - {"name", "dtype", "shape"}:
            raise EnsembleError(f"{where}: expected a table of name, dtype and shape")
        name, dtype, shape = item.get("name"), item.get("dtype"), item.get("shape")
        if not isinstance(name, str) or not name:
            raise EnsembleError(f"{where}.name: expected a tensor name")
        if dtype not in DType.__members__:
            raise EnsembleError(
                f"{where}.dtype: expected one of {', '.join(DType.__members__)}, got {dtype!r}"
            )
        if not isinstance(shape, list) or not all(_whole(d, -1) for d in shape):
            raise EnsembleError(
                f"{where}.shape: expected a list of sizes (-1 = any), got {shape!r}"
            )
        if max_batch > 0 and (not shape or shape[0] != -1):
            raise EnsembleError(
                f"{where}.shape: max_batch_size is {max_batch}, so the shape starts with the "
                f"batch dimension -1; got {shape}"
            )
        if name in (other[0] for other in found):
            raise EnsembleError(f"{where}.name: {name!r} is declared twice")
        found.append((name, str(dtype), tuple(shape)))
    return tuple(found)


def _step(index: int, raw: object) -> EnsembleStep:
    where = f"steps[{index}]"
    if not isinstance(raw, Mapping):
        raise EnsembleError(f"{where}: expected a table of model, input_map and output_map")
    extra = sorted(set(raw) - STEP_KEYS)
    if extra:
        raise EnsembleError(
            f"{where}.{extra[0]}: unknown key; expected one of {', '.join(sorted(STEP_KEYS))}"
        )
    model = raw.get("model")
    if not isinstance(model, str) or not model:
        raise EnsembleError(f"{where}.model: expected the name of a served model")
    version = raw.get("version", -1)
    if not _whole(version, -1):
        raise EnsembleError(f"{where}.version: expected a version number or -1, got {version!r}")
    maps = []
    for key in ("input_map", "output_map"):
        table = raw.get(key)
        if (
            not isinstance(table, Mapping)
            or not table
            or not all(
                isinstance(k, str) and k and isinstance(v, str) and v for k, v in table.items()
            )
        ):
            raise EnsembleError(
                f"{where}.{key}: expected a table of the model's tensor names to ensemble "
                f"tensor names, got {table!r}"
            )
        maps.append(dict(table))
    return EnsembleStep(model, maps[0], maps[1], version)


def order(ensemble: EnsembleConfig) -> list[int]:
    """The steps in an order where each one's inputs are made before it runs.

    Raises:
        EnsembleError: the graph breaks one of the rules (module docstring).
    """
    declared = [item[0] for item in ensemble.inputs]
    made_by: dict[str, int] = {}
    for index, step in enumerate(ensemble.steps):
        for tensor in step.output_map.values():
            if tensor in declared:
                raise EnsembleError(
                    f"steps[{index}].output_map: {tensor!r} is an input of the ensemble; a "
                    "step cannot make it"
                )
            if tensor in made_by:
                raise EnsembleError(
                    f"steps[{index}].output_map: {tensor!r} is made by steps[{made_by[tensor]}] "
                    "too; each ensemble tensor comes from one step"
                )
            made_by[tensor] = index
    used = set()
    for index, step in enumerate(ensemble.steps):
        for tensor in step.input_map.values():
            if tensor not in declared and tensor not in made_by:
                raise EnsembleError(
                    f"steps[{index}].input_map: {tensor!r} is neither an input of the ensemble "
                    "nor made by a step"
                )
            used.add(tensor)
    for name in declared:
        if name not in used:
            raise EnsembleError(f"inputs: {name!r} is read by no step")
    for name, _dtype, _shape in ensemble.outputs:
        if name not in made_by:
            raise EnsembleError(f"outputs: {name!r} is made by no step (no step's output_map)")
    return _sorted(ensemble, made_by)


def _sorted(ensemble: EnsembleConfig, made_by: Mapping[str, int]) -> list[int]:
    """Kahn's order, stable: among steps ready at once, the declared order."""
    needs = [
        {made_by[t] for t in step.input_map.values() if t in made_by} for step in ensemble.steps
    ]
    done: list[int] = []
    while len(done) < len(needs):
        ready = [i for i, wanted in enumerate(needs) if i not in done and wanted <= set(done)]
        if not ready:
            stuck = sorted(i for i in range(len(needs)) if i not in done)
            raise EnsembleError(
                f"steps: steps {stuck} wait on each other's outputs in a cycle; an ensemble is "
                "a graph without cycles"
            )
        done += ready
    return done


def resolve(
    ensemble: EnsembleConfig, models: Sequence[ModelConfig], ensembles: set[str]
) -> EnsembleConfig:
    """Point each step at the served model that answers for it.

    A step that asks for version N of a model the repository serves in
    several versions goes to ``<model>.v<N>`` (repository.py's name for an
    older version).

    Raises:
        EnsembleError: a step names no served model, an ensemble, or a
            version not served.
    """
    served = {model.name: model for model in models}
    steps = []
    for index, step in enumerate(ensemble.steps):
        where = f"steps[{index}].model"
        # A name that is both is refused as a duplicate once all are read.
        if step.model in ensembles and step.model not in served:
            raise EnsembleError(
                f"{where}: {step.model!r} is an ensemble; an ensemble's steps are models served "
                "by workers (list the inner ensemble's steps instead)"
            )
        model = served.get(step.model)
        if model is None:
            raise EnsembleError(f"{where}: no model {step.model!r} is served")
        name = step.model
        if step.version >= 0:
            older = f"{step.model}.v{step.version}"
            version = str(model.options.get("version", ""))
            if older in served:
                name = older
            elif version and version != str(step.version):
                raise EnsembleError(
                    f"steps[{index}].version: model {step.model!r} serves version {version}, "
                    f"not {step.version}"
                )
        steps.append(EnsembleStep(name, step.input_map, step.output_map, step.version))
    return dataclasses.replace(ensemble, steps=tuple(steps))


def from_repository(where: str, entry: Mapping[str, Any]) -> EnsembleConfig | dict[str, Any]:
    """A repository's ensemble, or (it cannot be served) the Broken entry saying why.

    The config.pbtxt fields it does not use are logged here, once, by the
    master that scans the repository (no worker loads an ensemble to log them).
    """
    name = str(entry["name"])
    for note in entry.get(NOTES, ()):
        log.warning("%s: ensemble %s: %s", where, name, note)
    try:
        return read({key: value for key, value in entry.items() if key != NOTES})
    except EnsembleError as ex:
        return broken(name, f"{name}/ ensemble: {ex}")


def resolve_all(
    models: Sequence[ModelConfig],
    declared: Mapping[str, EnsembleConfig],
    found: Sequence[EnsembleConfig],
) -> tuple[tuple[EnsembleConfig, ...], list[dict[str, Any]]]:
    """:func:`resolve` every ensemble: those of [[models]] (by where they are declared)
    and those ``found`` in repositories.

    Returns the served ensembles, and a Broken entry for each repository
    ensemble that cannot be served, as any model there.

    Raises:
        EnsembleError: "<where>: ..." for a [[models]] ensemble that cannot be served.
    """
    names = {ensemble.name for ensemble in (*declared.values(), *found)}
    served = []
    for where, ensemble in declared.items():
        try:
            served.append(resolve(ensemble, models, names))
        except EnsembleError as ex:
            raise EnsembleError(f"ensemble {ensemble.name!r}: {ex}", where) from None
    failed = []
    for ensemble in found:
        try:
            served.append(resolve(ensemble, models, names))
        except EnsembleError as ex:
            failed.append(broken(ensemble.name, f"{ensemble.name}/ ensemble: {ex}"))
    return tuple(served), failed
