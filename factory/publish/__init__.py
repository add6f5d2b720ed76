"""Indexes: stores (`stores`: a directory or S3), the pages as a pure function of their state (`index`,
`site`, `humanpage`, `wheelvariants`), the install commands (`installcmd`), publishing (`publisher`), checking
and auditing an index (`indexcheck`, `indexaudit`) and serving one (`serve`). It may import `core`, `spec`,
`plan`, `trust`, `wheel` and `container`; never `build`, `cache` or Docker (the import contracts,
`make lint`): `factory index audit --rebuild` is handed its rebuilder by the CLI."""
