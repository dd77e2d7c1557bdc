"""The five wire protocols; each is a pure codec plus its transport bindings."""
