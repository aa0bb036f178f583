"""The controller's API handlers, one module per request family."""
