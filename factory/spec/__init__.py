"""What the user asks for, read and checked: the matrix file (`yamlload`, `yamlcheck`, `config`), its frozen
option types (`options`), the `strategy.matrix` expansion (`matrix`), recipes (`recipes`), compatibility data
(`compat`), measured compile tables (`measured`), the limited-API and stable-ABI rules (`abi3`, `stable_abi`),
image references (`imageref`) and the builders' toolchains (`toolchains`: the pure half of builder images,
which `build.images` makes). It may import `core` and `container`; never `build` or `publish`, Docker or a
store (boto3), not even through another module (the import contracts, `make lint`)."""
