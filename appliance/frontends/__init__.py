"""Frontend processes: they own the sockets and mount every protocol."""
