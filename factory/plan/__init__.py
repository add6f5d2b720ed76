"""From a matrix file to jobs: the plan (`plan`), specifiers resolved against torch's index (`specs`,
`torchindex`, `torchcompat`), the glibc floor (`glibcfloor`), build requests (`variantrequest`,
`requestplan`), CI formats (`ci`), the start order (`schedule`) and shards (`shard`). It may import `core`,
`spec` and `container`."""
