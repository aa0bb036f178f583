"""Workflows, pure: dependency expressions (deps), arrays, the gate that lets pending jobs through, and flow files."""
