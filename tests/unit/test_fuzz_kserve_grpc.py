"""Fuzzing the KServe gRPC codec (pbcodec), in a child process.

pbcodec defines the ``inference.*`` protobuf names that tritonclient also
defines, and the two cannot share a process: pytest runs this file as a
script (``python tests/unit/test_fuzz_kserve_grpc.py SEEDS``), which
imports pbcodec and never tritonclient. Its seeds are requests built here by
tritonclient's own builder.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tracemalloc
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def test_the_grpc_codec_takes_any_request(tmp_path: Path) -> None:
    from tools.fuzz import seeds

    for index, seed in enumerate(seeds.kserve_grpc()):
        (tmp_path / f"seed-{index}").write_bytes(seed)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, __file__, str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stdout.decode() + done.stderr.decode()
    assert b"all properties hold" in done.stdout


# -- the child ----------------------------------------------------------------------


def _child(seed_dir: Path) -> None:
    import warnings

    warnings.simplefilter("error")  # as pytest's filterwarnings = error
    tracemalloc.start()
    _regressions()
    _structured()
    _mutated([path.read_bytes() for path in sorted(seed_dir.iterdir())])
    print("all properties hold")


def _request(**fields: Any) -> Any:
    from appliance.protocols.kserve import pbcodec

    request = pbcodec.pb.ModelInferRequest(model_name="m")
    tensor = request.inputs.add(
        name="x", datatype=fields.get("datatype", "FP32"), shape=fields["shape"]
    )
    if "raw" in fields:
        request.raw_input_contents.append(fields["raw"])
    if "contents" in fields:
        getattr(tensor.contents, fields["field"]).extend(fields["contents"])
    return request


def _regressions() -> None:
    from appliance.protocols.kserve import pbcodec

    # Typed uint64 values past 2**63 beside small ones were read as float64.
    request = _request(
        datatype="UINT64", shape=[3], field="uint64_contents", contents=[2**64 - 1, 2**63 + 1, 0]
    )
    (decoded,) = pbcodec.decode_infer_request(request).inputs
    assert decoded.data is not None
    assert decoded.data.array().tolist() == [2**64 - 1, 2**63 + 1, 0]
    # A zero dim beside huge ones, and a BYTES count no body can hold.
    for fields, words in (
        ({"shape": [0, 2**62, 2**62], "raw": b""}, "claims more than"),
        ({"datatype": "BYTES", "shape": [2**40], "raw": b""}, "BYTES needs at least"),
    ):
        message = _refusal(_request(**fields))
        if words not in message:
            raise AssertionError(f"{fields}: {message}")


def _refusal(request: Any) -> str:
    from appliance.protocols.kserve import pbcodec
    from appliance.protocols.kserve.errors import DecodeError

    try:
        pbcodec.decode_infer_request(request)
    except DecodeError as ex:
        return ex.message
    return "accepted"


def _structured() -> None:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from appliance.protocols.kserve import pbcodec
    from tools.fuzz import oracle

    datatypes = st.sampled_from(
        ["BOOL", "UINT8", "UINT64", "INT8", "INT32", "INT64", "FP16", "FP32", "FP64", "BYTES", "X"]
    )
    dims = st.sampled_from([-1, 0, 1, 2, 3, 4, 2**31, 2**40, 2**62, 2**63 - 1, -(2**63)])
    fields = st.sampled_from(list(pbcodec._CONTENTS_FIELD.values()))
    numbers = st.lists(st.integers(0, 2**32 - 1), max_size=6)
    parameters = st.dictionaries(
        st.sampled_from(["shared_memory_region", "shared_memory_byte_size", "timeout", "k"]),
        st.one_of(st.integers(-(2**63), 2**63 - 1), st.text(max_size=3), st.booleans()),
        max_size=3,
    )

    @settings(
        max_examples=oracle.examples(300),
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(
        st.lists(
            st.tuples(datatypes, st.lists(dims, max_size=4), fields, numbers, parameters),
            max_size=3,
        ),
        st.lists(st.binary(max_size=40), max_size=3),
        parameters,
    )
    def run(inputs: list[Any], raw: list[bytes], request_parameters: dict[str, Any]) -> None:
        request = pbcodec.pb.ModelInferRequest(model_name="m", raw_input_contents=raw)
        for index, (datatype, shape, field, values, params) in enumerate(inputs):
            tensor = request.inputs.add(name=f"i{index % 2}", datatype=datatype, shape=shape)
            _fill(getattr(tensor.contents, field), values)
            _parameters(tensor.parameters, params)
        _parameters(request.parameters, request_parameters)
        _check(request.SerializeToString())

    run()


def _fill(target: Any, values: list[int]) -> None:
    with contextlib.suppress(TypeError, ValueError):
        target.extend(values)
    with contextlib.suppress(TypeError, ValueError):
        target.extend(bytes([v % 256]) for v in values)


def _parameters(target: Any, values: dict[str, Any]) -> None:
    for key, value in values.items():
        if isinstance(value, bool):
            target[key].bool_param = value
        elif isinstance(value, int):
            target[key].int64_param = value
        else:
            target[key].string_param = value


def _check(data: bytes) -> None:
    from tools.fuzz import oracle
    from tools.fuzz.targets import kserve_grpc

    oracle.checked(kserve_grpc, data)


def _mutated(seeds: list[bytes]) -> None:
    from hypothesis import HealthCheck, given, settings

    from tools.fuzz import oracle

    for seed in seeds:
        _check(seed)

    @settings(
        max_examples=oracle.examples(300),
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(oracle.inputs(seeds))
    def run(data: bytes) -> None:
        _check(data)

    run()


if __name__ == "__main__":
    _child(Path(sys.argv[1]))
