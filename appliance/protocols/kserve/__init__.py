"""Open Inference Protocol (KServe v2) over REST and gRPC."""
