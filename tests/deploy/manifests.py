"""Read deploy/'s Containerfile and manifests, and check manifests against schemas offline.

Kubernetes' own kinds are checked with kubernetes-validate (the API's JSON
schemas, shipped in the package, strict: unknown fields fail); KServe's with
the schemas in :mod:`tests.deploy.kserve_schema`, whose Kubernetes types
resolve to the same shipped definitions.
"""

from __future__ import annotations

import importlib.resources
import json
import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml
from referencing import Registry, Resource

from tests.deploy.kserve_schema import SCHEMAS

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
# The oldest Kubernetes the manifests are meant for; every field they use exists there.
K8S_VERSION = "1.29"


def documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def manifests() -> list[Path]:
    return sorted([*DEPLOY.glob("kubernetes/*.yaml"), *DEPLOY.glob("kserve/*.yaml")])


def validate(doc: dict[str, Any]) -> None:
    """Raise a ValidationError (either package's) if ``doc`` does not fit its kind's schema."""
    schema = SCHEMAS.get((doc["apiVersion"], doc["kind"]))
    if schema is None:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        return
    jsonschema.Draft202012Validator(schema, registry=_k8s_definitions()).validate(doc)


def _k8s_definitions() -> Registry:
    schemas = importlib.resources.files("kubernetes_validate") / "kubernetes-json-schema"
    version = max(
        (v for v in kubernetes_validate.utils.all_versions() if v.startswith(K8S_VERSION + ".")),
    )
    definitions = json.loads(
        (schemas / f"v{version}-local-strict" / "_definitions.json").read_text()
    )
    return Resource.from_contents(definitions) @ Registry()


@dataclass
class Containerfile:
    """The instructions of a Containerfile that say what the container runs."""

    env: dict[str, str] = field(default_factory=dict)
    copies: dict[str, Path] = field(default_factory=dict)  # image path -> source path
    cmd: list[str] = field(default_factory=list)
    user: str = ""
    exposed: list[int] = field(default_factory=list)

    def source(self, image_path: str) -> Path:
        """The file of this tree that the image has at ``image_path``."""
        return self.copies[image_path]


def containerfile(path: Path = DEPLOY / "container" / "Containerfile") -> Containerfile:
    parsed = Containerfile()
    for instruction, args in _instructions(path.read_text()):
        if instruction == "ENV":
            for word in shlex.split(args):
                name, _, value = word.partition("=")
                # $VAR as a container runtime expands it: the image's ENV so far,
                # else this host's (PATH=/opt/appliance/bin:$PATH).
                parsed.env[name] = re.sub(
                    r"\$\{?(\w+)\}?",
                    lambda m: parsed.env.get(m.group(1), os.environ.get(m.group(1), "")),
                    value,
                )
        elif instruction == "COPY" and not args.startswith("--"):
            *sources, target = shlex.split(args)
            if len(sources) == 1 and not target.endswith("/"):
                parsed.copies[target] = ROOT / sources[0]
        elif instruction == "CMD":
            parsed.cmd = json.loads(args)
        elif instruction == "USER":
            parsed.user = args.strip()
        elif instruction == "EXPOSE":
            parsed.exposed = [int(port) for port in args.split()]
    return parsed


def _instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    found: list[tuple[str, str]] = []
    pending = ""
    for line in text.splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        whole = pending + line
        pending = ""
        instruction, _, args = whole.strip().partition(" ")
        found.append((instruction.upper(), args.strip()))
    return found
