"""The shared-memory data plane: segments, rings, descriptors, status. No wire formats."""
