"""The names by which a request's HTTP body reaches a model and its answer comes back.

Some models take a request as an HTTP body rather than as tensors, and answer
with one: TorchServe's handlers (appliance/runtimes/torchserve.py) get a list
of ``{field: value}`` dicts and return bodies. Across the client API such a
request is tensors all the same, so that every protocol reaches the model:

- each body or form field is a BYTES tensor of one element, named for the
  field (``body`` for a whole body), and its content type is that input's
  ``content_type`` under the request parameter :data:`INPUT_PARAMETERS`
  (where KServe's frontends put each input's own parameters);
- the request's HTTP headers are the request parameter :data:`HEADERS`
  (an object of text values);
- the answer is the BYTES output :data:`BODY` of one element, and the
  response's parameters :data:`CONTENT_TYPE`, :data:`STATUS`, :data:`REASON`
  and :data:`HEADERS` say how an HTTP frontend sends it.
"""

from __future__ import annotations

# The request parameter holding each input's own parameters, by input name.
INPUT_PARAMETERS = "input_parameters"
# The input of a whole body, and the output an answer's body is in.
BODY = "body"
# An input's (in INPUT_PARAMETERS) or the answer's content type.
CONTENT_TYPE = "content_type"
# The request's headers (request parameter) or the answer's (response parameter).
HEADERS = "headers"
# The answer's HTTP status and reason phrase, when the model chose them.
STATUS = "status"
REASON = "reason"
