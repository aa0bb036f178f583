"""The cluster home on disk: its paths, edits of its xce.yaml, adding hosts, the practice lab."""
