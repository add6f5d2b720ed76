"""What a consumer runs: the probe of a host and the command for it (`which`), signature checks (`verify`) and
the NVIDIA driver without torch (`hostgpu`). It may import `core`, `spec`, `plan`, `trust` and `publish`;
never `build` or Docker."""
