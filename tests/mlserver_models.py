"""MLServer model folders made at test time: small, deterministic, laid out as MLServer's examples.

:func:`write_folder` trains tiny models (scikit-learn, XGBoost, LightGBM:
whichever is installed in the Python that runs it) and writes each with a
``model-settings.json`` the way MLServer's own examples do, plus a custom
``MLModel`` in a ``models.py`` beside its settings. The same folder is
served by ``mlserver start`` and by the appliance.

Run as a script (``python -m tests.mlserver_models DIR``) it writes the
folder from another Python: the peer's, so that MLServer loads artefacts
pickled by the scikit-learn it runs with.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import warnings
from collections.abc import Collection
from pathlib import Path
from typing import Any

import numpy as np

# A custom runtime as MLServer's docs write one: its own codecs, its own errors.
CUSTOM = """
import numpy as np
import pandas as pd

from mlserver import MLModel
from mlserver.codecs import NumpyCodec, PandasCodec, StringCodec
from mlserver.errors import InferenceError
from mlserver.types import InferenceRequest, InferenceResponse


class Echo(MLModel):
    async def load(self) -> bool:
        self.scale = float(self.settings.parameters.extra.get("scale", 1.0))
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        outputs = []
        for request_input in payload.inputs:
            if request_input.name == "text":
                words = self.decode(request_input, default_codec=StringCodec)
                if "boom" in words:
                    raise InferenceError("the word boom is not served")
                upper = [word.upper() for word in words]
                outputs.append(StringCodec.encode_output("upper", upper))
            elif request_input.name.startswith("show"):
                # Decoded by the input's content type (its own, or the settings' inputs').
                value = self.decode(request_input)
                shown = [str(item) for item in value] if isinstance(value, list) else [str(value)]
                outputs.append(StringCodec.encode_output(request_input.name, shown))
            elif request_input.name == "nothing":
                return None  # not an InferenceResponse
            elif request_input.name == "frame":
                # A whole response encoded from a DataFrame: its content_type is "pd".
                x = self.decode(request_input, default_codec=NumpyCodec).reshape(-1)
                frame = pd.DataFrame({"a": x, "b": x * self.scale})
                return self.encode_response(frame, default_codec=PandasCodec)
            elif request_input.name == "crash":
                raise RuntimeError("custom model crashed on purpose")
            else:
                x = self.decode(request_input, default_codec=NumpyCodec)
                outputs.append(NumpyCodec.encode_output("scaled", x * self.scale))
        return InferenceResponse(model_name=self.name, model_version=self.version, outputs=outputs)


class Batched(MLModel):
    # doubled = 2 x; rows: how many rows the predict call that answered it was given.
    async def load(self) -> bool:
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        x = self.decode(payload.inputs[0], default_codec=NumpyCodec)
        rows = np.full((x.shape[0], 1), x.shape[0], dtype=np.int64)
        doubled = NumpyCodec.encode_output("doubled", x * 2)
        outputs = [doubled, NumpyCodec.encode_output("rows", rows)]
        return InferenceResponse(model_name=self.name, outputs=outputs)


class Words(MLModel):
    # predict: every word at once; predict_stream (MLServer >= 1.5): a response per word.
    async def load(self) -> bool:
        return True

    def _words(self, payload: InferenceRequest) -> list:
        text = self.decode(payload.inputs[0], default_codec=StringCodec)
        return " ".join(text).split()

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        outputs = [StringCodec.encode_output("word", self._words(payload))]
        return InferenceResponse(model_name=self.name, outputs=outputs)

    async def predict_stream(self, payloads):
        async for payload in payloads:
            for word in self._words(payload):
                if word == "boom":
                    raise InferenceError("the word boom is not streamed")
                length = NumpyCodec.encode_output("length", np.array([len(word)], np.int64))
                outputs = [StringCodec.encode_output("word", [word]), length]
                yield InferenceResponse(model_name=self.name, outputs=outputs)


class FailsToLoad(MLModel):
    async def load(self) -> bool:
        raise ValueError("weights are missing on purpose")
"""


def iris() -> tuple[np.ndarray, np.ndarray]:
    """A small three-class problem (iris-like, made up: no data files)."""
    rng = np.random.default_rng(7)
    centres = np.array([[5.0, 3.4, 1.5, 0.2], [5.9, 2.8, 4.3, 1.3], [6.6, 3.0, 5.6, 2.0]])
    x = np.concatenate([c + rng.normal(0, 0.3, (30, 4)) for c in centres])
    y = np.repeat(np.arange(3), 30)
    return x, y


def _settings(folder: Path, body: dict[str, Any]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model-settings.json").write_text(json.dumps(body, indent=2))


def write_folder(root: Path, only: Collection[str] | None = None) -> list[str]:
    """Write the folder; return the models written (a runtime not installed is left out).

    ``only``: write these of the runtimes "sklearn", "xgboost", "lightgbm"
    and "custom" (the custom models), all when None.
    """
    x, y = iris()
    written = []

    def wanted(runtime: str) -> bool:
        installed = runtime == "custom" or importlib.util.find_spec(runtime) is not None
        return installed and (only is None or runtime in only)

    if wanted("sklearn"):
        import joblib
        from sklearn.linear_model import LogisticRegression, Ridge
        from sklearn.svm import SVC

        # MLServer's model-repository example: an SVM with model.joblib and a version.
        with warnings.catch_warnings():
            # scikit-learn 1.9 deprecates probability=True; MLServer's example uses it.
            warnings.simplefilter("ignore", FutureWarning)
            svc = SVC(gamma=0.01, probability=True, random_state=0).fit(x, y)
        folder = root / "mnist-svm"
        _settings(
            folder,
            {
                "name": "mnist-svm",
                "implementation": "mlserver_sklearn.SKLearnModel",
                "parameters": {"uri": "./model.joblib", "version": "1"},
            },
        )
        joblib.dump(svc, folder / "model.joblib")
        # Two versions of one model, each in its own folder.
        for version, c in (("1", 0.1), ("2", 10.0)):
            folder = root / "logreg" / version
            _settings(
                folder,
                {
                    "name": "logreg",
                    "implementation": "mlserver_sklearn.SKLearnModel",
                    "parameters": {"uri": "./model.joblib", "version": version},
                },
            )
            joblib.dump(LogisticRegression(C=c, max_iter=500).fit(x, y), folder / "model.joblib")
        # predict_proba by default (parameters.extra.predict_fn); a regressor.
        folder = root / "svm-proba"
        _settings(
            folder,
            {
                "name": "svm-proba",
                "implementation": "mlserver_sklearn.SKLearnModel",
                "parameters": {
                    "uri": "../mnist-svm/model.joblib",
                    "extra": {"predict_fn": "predict_proba"},
                },
            },
        )
        folder = root / "ridge"
        # A version of text, as MLServer's examples give theirs.
        body = {"implementation": "mlserver_sklearn.SKLearnModel"}
        _settings(folder, {**body, "parameters": {"version": "v0.1.0"}})
        joblib.dump(Ridge().fit(x, y.astype(float)), folder / "model.joblib")
        # A missing artefact.
        _settings(
            root / "no-artefact",
            {
                "name": "no-artefact",
                "implementation": "mlserver_sklearn.SKLearnModel",
                "parameters": {"uri": "./missing.joblib"},
            },
        )
        written += ["mnist-svm", "logreg", "svm-proba", "ridge", "no-artefact"]
    if wanted("xgboost"):
        import xgboost as xgb

        # The mushroom example's shape: a binary classifier saved as model.json.
        binary = (y == 2).astype(int)
        booster = xgb.XGBClassifier(n_estimators=4, max_depth=2, random_state=0).fit(x, binary)
        folder = root / "mushroom-xgboost"
        _settings(
            folder,
            {
                "name": "mushroom-xgboost",
                "implementation": "mlserver_xgboost.XGBoostModel",
                "parameters": {"uri": "./model.json", "version": "1"},
            },
        )
        booster.save_model(folder / "model.json")
        written.append("mushroom-xgboost")
    if wanted("lightgbm"):
        import lightgbm as lgb

        data = lgb.Dataset(x, label=y, params={"verbose": -1})
        params = {"objective": "multiclass", "num_class": 3, "verbose": -1, "seed": 0}
        model = lgb.train(params, data, num_boost_round=5)
        folder = root / "iris-lgb"
        _settings(
            folder,
            {
                "name": "iris-lgb",
                "implementation": "mlserver_lightgbm.LightGBMModel",
                "parameters": {"uri": "./model.bst", "version": "1"},
            },
        )
        model.save_model(str(folder / "model.bst"))
        written.append("iris-lgb")
    if not wanted("custom"):
        return written
    folder = root / "custom"
    _settings(
        folder,
        {
            "name": "custom",
            "implementation": "models.Echo",
            "parameters": {"extra": {"scale": 2.0}},
        },
    )
    (folder / "models.py").write_text(CUSTOM)
    # Content types from the settings' inputs, as MLServer's decode reads them.
    folder = root / "custom-typed"
    when = {"name": "show_when", "datatype": "BYTES", "shape": [-1]}
    _settings(
        folder,
        {
            "name": "custom-typed",
            "implementation": "models.Echo",
            "inputs": [{**when, "parameters": {"content_type": "datetime"}}],
        },
    )
    (folder / "models.py").write_text(CUSTOM)
    # Declared outputs, with content types, for the metadata endpoint; a custom codec's
    # content type at the model's level.
    folder = root / "custom-declared"
    _settings(
        folder,
        {
            "name": "custom-declared",
            "implementation": "models.Echo",
            "inputs": [
                {
                    "name": "text",
                    "datatype": "BYTES",
                    "shape": [-1],
                    "parameters": {"content_type": "str"},
                },
                {"name": "x", "datatype": "FP32", "shape": [-1, 2]},
            ],
            "outputs": [
                {"name": "upper", "datatype": "BYTES", "shape": [-1, 1]},
                {
                    "name": "scaled",
                    "datatype": "FP32",
                    "shape": [-1, 2],
                    "parameters": {"content_type": "np"},
                },
            ],
            "parameters": {"content_type": "np"},
        },
    )
    (folder / "models.py").write_text(CUSTOM)
    # predict_stream: a response per word.
    folder = root / "words"
    _settings(folder, {"name": "words", "implementation": "models.Words"})
    (folder / "models.py").write_text(CUSTOM)
    # MLServer's adaptive batching: up to 4 requests, waiting at most 0.5 s for them.
    folder = root / "adaptive"
    _settings(
        folder,
        {
            "name": "adaptive",
            "implementation": "models.Batched",
            "max_batch_size": 4,
            "max_batch_time": 0.5,
        },
    )
    (folder / "models.py").write_text(CUSTOM)
    _settings(root / "fails-to-load", {"implementation": "failing.FailsToLoad"})
    (root / "fails-to-load" / "failing.py").write_text(CUSTOM)
    written += ["custom", "custom-typed", "custom-declared", "words", "adaptive", "fails-to-load"]
    return written


if __name__ == "__main__":
    print(json.dumps(write_folder(Path(sys.argv[1]))))
