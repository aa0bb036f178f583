"""The test suite: support/ (shared helpers), data/, and one folder per layer."""
