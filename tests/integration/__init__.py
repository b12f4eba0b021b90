"""The integration tests: the CLI, tensorvaultd and the Python package against real stores."""
