"""The cluster's configuration: xce.yaml (cluster), applications.yaml (profiles), presets, the merge
of a job with its profile and queue, and the checks xceadmin runs."""
