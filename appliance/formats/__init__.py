"""The model formats of other servers, read into the appliance's settings.

A model repository in Triton's layout (config.toml or config.pbtxt per model,
repository.py), Triton's model form (triton/: config.pbtxt, its sequence and
scheduling fields), MLServer's folders (mlserver/: model-settings.json), and
tritonserver's command line over any of them (command_line.py). A new format
is a folder of its own here.
"""
