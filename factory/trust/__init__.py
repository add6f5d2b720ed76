"""Keys and signatures: the wheel signature format and key loading (`signing`) and who may write the compile
cache (`cachekeys`: Ed25519 over a manifest). It may import `core` and `container`. The import contracts
(`make lint`) keep it off `plan`, `spec` and `wheel` (its peer)."""
