"""Contract tests get ``vyre_backend`` from the `vyre_async.testing` pytest plugin."""
