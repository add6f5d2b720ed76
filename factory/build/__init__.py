"""Running jobs: `factory build` as a library call (`request`), the run (`runner`: one thread per job), one
job's containers (`jobspec`, `jobrun`, what their parts share: `jobcontext`), Docker (`engine`, its only
user), builder images (`images`), the source (`source`), wheelhouses and runtime requirements (`wheelhouse`,
`runtimereqs`), acceptance of a wheel (`acceptance`) and reuse of a published one (`reuse`), what a log says
(`logs`), the provenance's facts (`facts`), reports (`report`), preflight, cleanup (`factory clean`),
`build --publish` as one run (`pipeline`) and `factory rebuild` (`rebuild`). It is the top of the house
below the CLI: it may import every package but `cli` and `consume` (its peer). Only `engine` imports the
Docker SDK (the import contracts, `make lint`)."""
