"""sloserve: an SLO-aware inference serving gateway (KServe V2 over REST and gRPC, Ray Serve replicas).

The one import package; its sub-packages, from the top floor down (imports run one way, checked by
``lint-imports``; docs/architecture.md draws them):

* ``sloserve.cli``        -- the ``sloserve`` command, one module per sub-command;
* ``sloserve.loadtests``  -- Locust, ``sloserve bench``, the peers, the dashboards;
* ``sloserve.sim``        -- the trace-driven simulator;  ``sloserve.gateway`` -- the serving process;
* ``sloserve.training``   -- preemptible training jobs on Ray Train and their controller;
  ``sloserve.modeltools``      -- the demo models, accuracy variants and latency profiling;
* ``sloserve.replica``    -- what runs in a replica: ONNX Runtime sessions, the Ray Serve replica, the
  batch channel's replica end;
* ``sloserve.autoscaler``, ``sloserve.models``, ``sloserve.batching`` -- pure policies and formats:
  autoscaling and placement, the model repository, the batching policies.
"""
