"""What a frontend process reads at start: the tree and its config."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from appliance.client.api import ModelClient
from appliance.config.reader import read_snapshot
from appliance.config.settings import ApplianceConfig
from appliance.core.status import StatusTable
from appliance.core.tree import Tree
from appliance.observability import tracing


@dataclass(slots=True)
class FrontendContext:
    """The tree a frontend serves, and how to build its model client."""

    tree: Tree
    config: ApplianceConfig
    status: StatusTable

    @classmethod
    def open(cls, tree_dir: Path) -> FrontendContext:
        """Read the config snapshot and attach the status table.

        Raises:
            ConfigError: the snapshot is unreadable.
            OSError: the tree's files are gone.
        """
        tree = Tree(tree_dir.name, tree_dir.parent)
        config = read_snapshot(tree.snapshot_path)
        return cls(tree, config, StatusTable.attach(tree.status_name))

    def client(self, publish_slot: int | None) -> ModelClient:
        """Build this process's model client; call only after any fork."""
        tracing.configure_from(self.tree.dir, self.config.traces)
        return ModelClient(
            self.tree,
            self.config,
            self.status,
            publish_slot=publish_slot,
        )
