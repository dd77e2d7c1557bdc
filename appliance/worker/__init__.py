"""The model worker process: loads one model instance and serves it."""
