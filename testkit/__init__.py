"""The test kit: what the tests and the benchmarks share — the one way to start a stack
(stack.py), policy and record builders, factories, Valkey topologies, network-namespace hosts,
the OIDC provider. It imports the product, never tests/ or bench/."""
