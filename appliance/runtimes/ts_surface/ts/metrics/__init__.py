"""``ts.metrics``: a handler's custom metrics (``context.metrics``)."""
