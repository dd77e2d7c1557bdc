"""The stand-in for a repository model that cannot be served.

The repository scan gives such a model this class and the reason (no version
directory, no model file, a bad config.toml). Its load fails with that
reason, so the model is reported FAILED with it (``appliance ctl status``,
every protocol's not-ready error) while the rest of the appliance serves.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from appliance.model import Arrays, Model, Outputs
from appliance.runtimes.interface import ModelFileError


class Broken(Model):
    """A repository model that cannot be served; ``load()`` says why."""

    inputs = None
    outputs = None

    def load(self) -> None:
        """Raise the reason the repository scan found.

        Raises:
            ModelFileError: always.
        """
        raise ModelFileError(str(self.options.get("reason", "this model cannot be served")))

    def predict(self, inputs: Arrays, parameters: Mapping[str, Any]) -> Outputs:
        raise ModelFileError(str(self.options.get("reason", "this model cannot be served")))
