"""From a matrix file to jobs: the plan (`plan`), specifiers resolved against torch's index (`specs`,
`torchindex`, `torchcompat`) read as pip reads an index (`pipindex`: the host's pip settings, the HTTP
client, simple pages; `build.source` finds sdists with it too), the glibc floor (`glibcfloor`), build
requests (`variantrequest`, `requestplan`), CI formats (`ci`), the start order (`schedule`) and shards
(`shard`). It may import `core`, `spec` and `container`. The import contracts (`make lint`) hold it to
that."""
