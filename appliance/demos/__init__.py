"""Demo models served by the default config."""
