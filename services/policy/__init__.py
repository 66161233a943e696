"""The policy service: Cedar policies decide whether a proposed recovery runs now, waits
for a person, or never runs; people approve exact digests over an authenticated API.

Public surface: :func:`services.policy.service.build_spec` (the ServiceSpec),
:class:`services.policy.decide.PolicyEngine` (pure decisions), and
:class:`services.policy.runtime.PolicyRuntime` (what handlers, routes and the sweep share).
"""
