"""What a consumer runs: the probe of a host and the command for it (`which`), signature checks (`verify`) and
the NVIDIA driver without torch (`hostgpu`), both reading indexes with one bounded GET (`indexhttp`). It
may import `core`, `spec`, `plan`, `trust` and `publish`; never `build` or Docker, not even through another
module (the import contracts, `make lint`)."""
