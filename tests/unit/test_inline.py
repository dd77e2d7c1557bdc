"""A model shipped inline: the path checks, the files written, and the config's kind keys."""

from __future__ import annotations

from pathlib import Path

import pytest

from appliance.client import inline, override
from appliance.core.tree import Tree
from appliance.errors import BadRequest


@pytest.mark.parametrize(
    ("path", "problem"),
    [
        ("1/model.onnx", ""),
        ("config.toml", ""),
        ("A" * 255, ""),
        ("A" * 256, "longer than 255 bytes"),
        ("1/" + "é" * 128, "longer than 255 bytes"),
        ("/etc/x", "absolute"),
        ("../x", "'..'"),
        ("1/../../x", "'..'"),
        ("1/./model.onnx", "'.'"),
        ("1//model.onnx", "empty"),
        ("", "empty"),
        ("1/model\0.onnx", "NUL"),
    ],
)
def test_path_problem(path: str, problem: str) -> None:
    found = inline.path_problem(path)
    assert (problem in found) if problem else found == ""


def test_a_long_path_is_cut_in_the_message(tmp_path: Path) -> None:
    with pytest.raises(BadRequest, match=r"Invalid file path 'A{64}'\.\.\.: a component") as caught:
        inline.write(Tree("t", tmp_path), "m", {"A" * 300: b"a"})
    assert len(str(caught.value)) < 200
    assert not (tmp_path / "t").exists()


@pytest.mark.parametrize("model", ["..", ".", "a/b", "", "x" * 64])
def test_a_model_name_that_is_no_directory_name_is_refused(tmp_path: Path, model: str) -> None:
    with pytest.raises(BadRequest, match="needs a name of 1-63"):
        inline.write(Tree("t", tmp_path), model, {"1/model.onnx": b"a"})
    assert not (tmp_path / "t").exists()


def test_write_makes_a_fresh_model_directory_and_remove_takes_it_away(tmp_path: Path) -> None:
    tree = Tree("t", tmp_path)
    (tmp_path / "t").mkdir()
    first = inline.write(tree, "m", {"1/model.onnx": b"one", "config.toml": b""})
    second = inline.write(tree, "m", {"1/model.onnx": b"two"})
    assert first != second
    assert first.name == second.name == "m"
    assert first.parent.parent == second.parent.parent == tree.inline_dir
    assert (first / "1" / "model.onnx").read_bytes() == b"one"
    assert (second / "1" / "model.onnx").read_bytes() == b"two"
    inline.remove(first)
    assert list(tree.inline_dir.iterdir()) == [second.parent]


def test_paths_that_collide_are_refused_and_nothing_is_left(tmp_path: Path) -> None:
    tree = Tree("t", tmp_path)
    (tmp_path / "t").mkdir()
    with pytest.raises(BadRequest, match="collide"):
        inline.write(tree, "m", {"1": b"a file", "1/model.onnx": b"model"})
    assert list(tree.inline_dir.iterdir()) == []


def test_platform_and_backend_are_accepted_only_with_files_that_fit() -> None:
    files = ["1/model.onnx"]
    config = '{"platform": "onnxruntime_onnx", "backend": "onnxruntime", "max_batch_size": "8"}'
    assert override.parse("m", config, files) == {"max_batch_size": 8}
    with pytest.raises(BadRequest, match="sets backend, platform, which the appliance cannot"):
        override.parse("m", config)
    with pytest.raises(BadRequest, match=r"loads <version>/model\.pt, which the files do not"):
        override.parse("m", '{"platform": "pytorch_libtorch"}', files)
    with pytest.raises(BadRequest, match="backend 'tensorrt' is not one the appliance serves"):
        override.parse("m", '{"backend": "tensorrt"}', files)
    with pytest.raises(BadRequest, match="sets input, which"):
        override.parse("m", '{"input": []}', files)
