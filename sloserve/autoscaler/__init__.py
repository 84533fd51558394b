"""Autoscaling and placement: pure policies ``decide(snapshot, config, state, now) -> (Decision, State)``.

Autoscalers (``sloserve.autoscaler.registry``): ``swayam`` (ours), ``ray-default``, ``kpa``, ``oracle``.

>>> from sloserve.autoscaler.registry import make_autoscaler
>>> a = make_autoscaler("swayam")
"""
