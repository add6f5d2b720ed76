"""What is read from and written into a wheel: the acceptance checks and relabelling (`checks`), its
provenance (`provenance`), SBOM (`sbom`), the two as files of a wheel (`embedded`), the build record beside it
(`record`) and a failed check's record beside it (`checkrecord`), device code (`fatbin`), the manylinux tag
its symbols allow (`platform_tag`) and the difference of two wheels (`wheeldiff`). It may import `core`,
`spec` and `container`. The import contracts (`make lint`) keep it off `plan` and `trust` (its peer)."""
