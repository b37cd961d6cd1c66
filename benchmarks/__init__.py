"""Benchmarks and measurement harnesses, outside the library package: `benchmarks.training` (ours against TRL on one
epoch), `benchmarks.store` (the store's queries as the dashboard makes them), `benchmarks.polling_cost` (what
watching a run costs the studio), `benchmarks.gpu_check` (the GPU check's steps) and `benchmarks.harness` (a studio
in a process of its own, shared with scripts/). Their figures: docs/benchmarks.md."""
