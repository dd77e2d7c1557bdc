"""TorchServe's inference and management APIs (REST), over the client API."""
