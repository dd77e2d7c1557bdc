"""Runtimes: models served from files in a model repository, with no Python written.

``onnx`` runs ``model.onnx`` with ONNX Runtime (extra ``[onnx]``),
``torchscript`` runs a TorchScript ``model.pt`` with torch (extra ``[torch]``),
``broken`` stands in for a repository model that cannot be served, and
``interface`` holds what they share. ``appliance/formats/repository.py`` maps a
repository's directories onto these classes; nothing imports them but the
model worker, which loads them by their ``module:Class`` names.
"""
