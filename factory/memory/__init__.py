"""Memory: cgroup limits, parallelism planning, per-compile admission (nvcc wrapper), profiles, simulation."""
