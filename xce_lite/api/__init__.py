"""The REST API on the home's Unix socket: the server, the client, and the JSON wire shapes."""
