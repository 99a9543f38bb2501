"""The `sparrow` command: one entry point over the library, the tasks and the flows."""
