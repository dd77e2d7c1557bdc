"""Types shared by the protocols' REST bindings."""

from __future__ import annotations

import falcon

# The falcon app every protocol's REST routes mount into.
App = falcon.App[falcon.Request, falcon.Response]
