"""What the user asks for, read and checked: the matrix file (`yamlload`, `yamlcheck`, `config`), its frozen
option types (`options`), the `strategy.matrix` expansion (`matrix`), recipes (`recipes`), compatibility data
(`compat`), measured compile tables (`measured`), the limited-API and stable-ABI rules (`abi3`, `stable_abi`)
and image references (`imageref`). It may import `core` and `container`; never Docker, a store or the
network."""
