"""The trio edge that runs a peer: the driver, the peer links and the log writer's thread."""
