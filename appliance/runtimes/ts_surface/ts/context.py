"""``ts.context``: what a handler's ``initialize`` and ``handle`` get as ``context``.

The same attributes and methods as TorchServe's: the model's name and
manifest, ``system_properties`` (model_dir, gpu_id, batch_size, ...), the
model-config.yaml's settings, the request ids and headers of the batch being
handled, each request's response status, content type and headers, and the
custom metrics. TorchServe's own header names for sequences are read from the
same environment variables.
"""

from __future__ import annotations

import os
from typing import Any


class RequestProcessor:
    """One request's headers, and the status and headers of its response."""

    def __init__(self, request_header: dict[str, Any]) -> None:
        self._status_code = 200
        self._reason_phrase: str | None = None
        self._response_header: dict[str, str] = {}
        self._request_header = request_header

    def get_request_property(self, key: str) -> Any:
        # TorchServe keeps the client's case of a header's name; the appliance's
        # HTTP stack gives names in lower case: a name is found in any case.
        found = self._request_header.get(key)
        if found is None and isinstance(key, str):
            found = self._request_header.get(key.lower())
        return found

    def report_status(self, code: int, reason_phrase: str | None = None) -> None:
        self._status_code = code
        self._reason_phrase = reason_phrase

    def get_response_status_code(self) -> int:
        return self._status_code

    def get_response_status_phrase(self) -> str | None:
        return self._reason_phrase

    def add_response_property(self, key: str, value: str) -> None:
        self._response_header[key] = value

    def get_response_headers(self) -> dict[str, str]:
        return self._response_header

    def get_response_header(self, key: str) -> str | None:
        return self._response_header.get(key)

    def get_request_properties(self) -> dict[str, Any]:
        return self._request_header


class Context:
    """What the worker knows of the model, and of the batch being handled."""

    def __init__(
        self,
        model_name: str,
        model_dir: str,
        manifest: dict[str, Any] | None,
        batch_size: int,
        gpu: int | None,
        mms_version: str,
        limit_max_image_pixels: bool = True,
        metrics: Any = None,
        model_yaml_config: dict[str, Any] | None = None,
    ) -> None:
        self.model_name = model_name
        self.manifest = manifest
        self._system_properties = {
            "model_dir": model_dir,
            "gpu_id": gpu,
            "batch_size": batch_size,
            "server_name": "MMS",
            "server_version": mms_version,
            "limit_max_image_pixels": limit_max_image_pixels,
        }
        self.request_ids: dict[int, str] | None = None
        self._request_processor: list[RequestProcessor] | None = None
        self.metrics = metrics
        self.model_yaml_config = model_yaml_config if model_yaml_config is not None else {}
        self.stopping_criteria: Any = None
        self.cl_socket: Any = None
        self.header_key_sequence_id = os.getenv("TS_REQUEST_SEQUENCE_ID", "ts_request_sequence_id")
        self.header_key_sequence_start = os.getenv(
            "TS_REQUEST_SEQUENCE_START", "ts_request_sequence_start"
        )
        self.header_key_sequence_end = os.getenv(
            "TS_REQUEST_SEQUENCE_END", "ts_request_sequence_end"
        )

    @property
    def system_properties(self) -> dict[str, Any]:
        return self._system_properties

    @property
    def request_processor(self) -> list[RequestProcessor] | None:
        return self._request_processor

    @request_processor.setter
    def request_processor(self, request_processor: list[RequestProcessor] | None) -> None:
        self._request_processor = request_processor

    def _processor(self, idx: int) -> RequestProcessor:
        if self._request_processor is None:
            raise IndexError("no request is being handled")
        return self._request_processor[idx]

    def get_request_id(self, idx: int = 0) -> str | None:
        if self.request_ids is None:
            return None
        return self.request_ids.get(idx)

    def get_request_header(self, idx: int, key: str) -> Any:
        return self._processor(idx).get_request_property(key)

    def get_all_request_header(self, idx: int) -> dict[str, Any]:
        return self._processor(idx).get_request_properties()

    def set_response_content_type(self, idx: int, value: str) -> None:
        self.set_response_header(idx, "content-type", value)

    def get_response_content_type(self, idx: int) -> str | None:
        return self.get_response_headers(idx).get("content-type")

    def get_response_status(self, idx: int) -> tuple[int, str | None]:
        processor = self._processor(idx)
        return processor.get_response_status_code(), processor.get_response_status_phrase()

    def set_response_status(self, code: int = 200, phrase: str = "", idx: int = 0) -> None:
        if self._request_processor is not None and self._request_processor[idx] is not None:
            self._request_processor[idx].report_status(code, reason_phrase=phrase)

    def set_all_response_status(self, code: int = 200, phrase: str = "") -> None:
        for processor in self._request_processor or ():
            processor.report_status(code, reason_phrase=phrase)

    def get_response_headers(self, idx: int) -> dict[str, str]:
        return self._processor(idx).get_response_headers()

    def set_response_header(self, idx: int, key: str, value: str) -> None:
        self._processor(idx).add_response_property(key, value)

    def get_sequence_id(self, idx: int) -> Any:
        return self._processor(idx).get_request_property(self.header_key_sequence_id)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Context) and self.__dict__ == other.__dict__

    __hash__ = None  # type: ignore[assignment]
