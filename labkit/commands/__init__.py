"""Sub-commands of the `labkit` CLI, one module each (see `labkit.cli`)."""
