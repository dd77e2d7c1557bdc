"""UM-Bridge over HTTP (JSON)."""
