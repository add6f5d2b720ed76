"""The ground floor: what every other package may use and which imports none of them (only the standard
library, `container` and small pure dependencies). It owns errors (`errors`), sizes (`units`), URLs from the
user (`urls`), wheel tags (`tags`), variant ids and GPU targets (`variants`), the target platforms
(`platforms`, the one module that spells a platform), the GPU name table (`gpus`), strict JSON (`strictjson`),
the factory's home (`home`) and its packaged files (`resources`), bounded reads of everything the factory is
given (`bounded`), no-follow file access (`safefs`), deterministic archives (`reproducible`), the small
pure value checks (`validate`), what a killed run leaves behind and whether its owner lives (`leftovers`)
and the simple repository API's media types and page links (`simpleapi`). The import contracts
([tool.importlinter] in pyproject.toml, `make lint`) hold it to that: below it only `container`, and
nothing of `build` or `publish`, nor Docker or boto3, even through another module."""
