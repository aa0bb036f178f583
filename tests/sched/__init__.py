"""Tests: sched."""
