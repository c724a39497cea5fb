"""The clusterd daemon and the clusterctl command: config, process entry points, wiring."""
