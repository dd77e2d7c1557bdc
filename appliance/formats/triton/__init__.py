"""Triton Inference Server's model form: config.pbtxt, with its sequence and scheduling fields.

tritonserver's command line, which serves any repository the formats read, is
formats/command_line.py.
"""
