"""Tests: exec."""
