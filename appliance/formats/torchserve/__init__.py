"""TorchServe's model store and its archives."""
