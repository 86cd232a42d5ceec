"""The operator's tools, on top of everything they run: the embedded stack (``ops.stack``,
``make up``), the container roles (``ops.role``), the process helpers the stack, the tests and
the benches share (``ops.processes``), the standalone gateway and the demo's seed
(``manage.py seed_demo``)."""
