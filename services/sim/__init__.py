"""The sim: a small simulated production the executor acts on and the health agent watches.

``create_sim_app`` serves it over HTTP (``python -m services.sim``); ``SimModel`` is the
pure topology and latency model underneath.
"""

from services.sim.app import create_sim_app
from services.sim.model import SimModel

__all__ = ["SimModel", "create_sim_app"]
