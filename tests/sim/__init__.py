"""Tests: sim."""
