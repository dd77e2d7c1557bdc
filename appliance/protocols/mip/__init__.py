"""MIP, KubeMo's Model Invocation Protocol, over TCP."""
