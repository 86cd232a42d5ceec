"""Gateway overhead benchmark: the gateway against a bare relay and the simulator itself."""
