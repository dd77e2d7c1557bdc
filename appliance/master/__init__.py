"""The master process: supervises children, owns online/offline, drains, cleans up."""
