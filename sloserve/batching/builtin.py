"""The built-in batching policies, registered by importing them (each module's ``@register_policy``).

``sloserve/batching/__init__.py`` imports this module, so the registry (sloserve/batching/policy.py) holds
them before any caller can reach :func:`~sloserve.batching.policy.make_policy`. Nothing a policy imports
imports this module back.
"""

from sloserve.batching.policies import aimd, fixed, nexus, slo, timeout

BUILTIN = (aimd.AIMDPolicy, fixed.FixedPolicy, nexus.NexusPolicy, slo.SLOPolicy, timeout.TimeoutPolicy)
