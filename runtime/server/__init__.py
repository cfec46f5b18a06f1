"""The HTTP server and the process launcher behind ``forkserve serve``."""
