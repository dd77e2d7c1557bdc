"""Triton Inference Server's forms: config.pbtxt (with its sequence and scheduling fields)
and tritonserver's command line."""
