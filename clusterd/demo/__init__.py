"""`clusterctl demo`: the quickstart's main job, a local 3-node cluster doing real work through a SIGKILL."""
