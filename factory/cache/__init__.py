"""The compile cache on the host (`sync`): which cache a run uses, trust domains, mounting a job's domain,
importing its outbox, pulling verified entries from the store and pushing a trusted writer's. The cache's
format is `container.compilecache`'s and its signatures `trust.cachekeys`'s. It may import `core`, `spec`,
`trust`, `publish` (its store, and where in a publish store it lies) and `container`; `build` runs it."""
