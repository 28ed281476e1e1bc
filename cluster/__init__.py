"""Running the system's processes on one machine: `hairgate dev`, the end-to-end tests, the benchmarks."""
