"""`xce web`: a read-only dashboard in its own process, reading everything through the controller's API."""
