"""TorchServe's handlers: the base class every handler may subclass."""
