"""Process plumbing: what every child does first, what its exit status means, the control socket."""
