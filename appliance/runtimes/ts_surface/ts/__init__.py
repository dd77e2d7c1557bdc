"""TorchServe's handler surface, written for the appliance (see ts_surface/__init__.py)."""

# The TorchServe release whose handler surface this mirrors (context.system_properties).
__version__ = "0.12.0"
