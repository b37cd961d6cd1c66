"""Benchmarks, outside the library package: `benchmarks.training` (ours against TRL on one epoch) and
`benchmarks.store` (the store's queries as the dashboard makes them). Their figures: docs/benchmarks.md."""
