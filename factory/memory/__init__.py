"""Memory: cgroup limits, parallelism planning, per-compile admission (nvcc wrapper), profiles, simulation.
It may import the packages below it (`cache`, `publish`, `trust`, `wheel`, `plan`, `spec`, `core`,
`container`); `build` and the CLI use it (the import contracts, `make lint`)."""
