"""Keys and signatures: the wheel signature format and key loading (`signing`) and who may write the compile
cache (`cachekeys`: Ed25519 over a manifest). It may import `core` and `container` (the import contracts,
`make lint`: the packages below it but `plan` and `spec`, and not `wheel`, its peer)."""
