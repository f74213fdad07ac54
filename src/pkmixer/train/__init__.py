"""Training harness pieces: checkpoints (more to come: config, loop, distributed)."""
