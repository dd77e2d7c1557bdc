"""GRPS (NetEase) over REST and gRPC."""
