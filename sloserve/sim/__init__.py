"""A discrete-event simulator in virtual time that drives the same batching, autoscaling and
placement policies as the live gateway (it is a second driver, never a flag inside them).

* ``sloserve.sim.engine``  -- request level: every request, the real batching policy, profile-sampled latencies;
* ``sloserve.sim.fluid``   -- per-interval fluid model of each replica group, for 1,000s of GPUs over a day;
* ``sloserve.sim.run``     -- experiments over policies, results JSON and plots; ``sloserve.cli.sim`` is ``sloserve sim``.
"""
