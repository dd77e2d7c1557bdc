"""TorchServe's request envelopes (``service_envelope``): KServe's formats around a handler."""
