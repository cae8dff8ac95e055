"""Engine-free policy core: readiness outcomes, producer index, wait set, admission rules."""
