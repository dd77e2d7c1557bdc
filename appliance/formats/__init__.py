"""The model formats of other servers, read into the appliance's settings.

A model repository in Triton's layout (config.toml or config.pbtxt per model,
repository.py), Triton's own forms (triton/: config.pbtxt, its sequence and
scheduling fields, tritonserver's command line) and MLServer's folders
(mlserver/: model-settings.json). A new format is a folder of its own here.
"""
