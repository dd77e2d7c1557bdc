"""A TorchServe inference request as the model's inputs (core/http_body.py).

As TorchServe's frontend reads one: a multipart or url-encoded form gives a
field per form field (a file part with its content type, a plain field
with none); any other body is the one field ``body`` with the request's
media type (its parameters, such as charset, left out). Every request
header is passed on, with ``url_path`` (the path after the model's version)
and ``explain`` ("True" for /explanations), which TorchServe adds. On its
legacy paths (/invocations, /models/{m}/invoke, /{m}/predict) the query's
parameters are fields too.
"""

from __future__ import annotations

import email.parser
import email.policy
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from appliance.core.http_body import BODY, CONTENT_TYPE, HEADERS, INPUT_PARAMETERS
from appliance.errors import BadRequest

FORM = "application/x-www-form-urlencoded"
MULTIPART = "multipart/form-data"


@dataclass(frozen=True, slots=True)
class Call:
    """What the model is called with."""

    inputs: dict[str, np.ndarray[Any, Any]]
    parameters: dict[str, Any]


def read_call(
    body: bytes,
    headers: Mapping[str, str],
    url_path: str,
    explain: bool,
    query: list[tuple[str, str]] | None = None,
) -> Call:
    """The inputs and parameters of one request.

    Raises:
        BadRequest: a multipart body that cannot be parsed.
    """
    content_type = headers.get("content-type", "")
    media = content_type.split(";", 1)[0].strip().lower()
    fields: list[tuple[str, bytes, str]]
    if media == MULTIPART:
        fields = _multipart(body, content_type)
    elif media == FORM:
        pairs = urllib.parse.parse_qsl(body.decode("latin-1"), keep_blank_values=True)
        fields = [(name, value.encode("latin-1"), "") for name, value in pairs]
    else:
        fields = [(BODY, body, media)]
    # The legacy paths pass the query's parameters as fields (no content type), first.
    fields = [(name, value.encode(), "") for name, value in query or ()] + fields
    passed = dict(headers)
    passed["url_path"] = url_path
    passed["explain"] = "True" if explain else "False"
    return _call(fields, passed)


def fields_call(fields: Mapping[str, bytes]) -> Call:
    """A gRPC request's ``input`` map: each field's bytes, with no content type."""
    return _call([(name, bytes(value), "") for name, value in fields.items()], {})


def _call(fields: list[tuple[str, bytes, str]], headers: dict[str, str]) -> Call:
    inputs: dict[str, np.ndarray[Any, Any]] = {}
    per_input: dict[str, dict[str, str]] = {}
    for name, value, field_type in fields:
        array = np.empty(1, dtype=object)
        array[0] = value
        inputs[name] = array  # a repeated field: the last one, as TorchServe's dict keeps
        per_input[name] = {CONTENT_TYPE: field_type}
    return Call(inputs, {INPUT_PARAMETERS: per_input, HEADERS: headers})


def _multipart(body: bytes, content_type: str) -> list[tuple[str, bytes, str]]:
    head = f"Content-Type: {content_type}\r\nMIME-Version: 1.0\r\n\r\n".encode("latin-1")
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + body)
    if not message.is_multipart():
        raise BadRequest("a multipart/form-data body whose parts cannot be read")
    fields = []
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if not isinstance(name, str):
            continue
        payload = part.get_payload(decode=True)
        value = payload if isinstance(payload, bytes) else b""
        is_file = part.get_param("filename", header="content-disposition") is not None
        fields.append((name, value, part.get_content_type() if is_file else ""))
    return fields
