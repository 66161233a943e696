"""The health agent: watches the sim's latency, opens incidents with hysteresis, and
verifies recovery after execution. See :mod:`services.health_agent.service`."""
