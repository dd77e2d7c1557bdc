"""GraphPipe: flatbuffers over HTTP."""
