"""Bearer-token authentication for operator actions: the fleet's digest-configured
tokens (:mod:`flotilla.bearer`), under the names the reconciler has always used."""

from __future__ import annotations

from flotilla.bearer import Bearer as Operator
from flotilla.bearer import BearerTokens as OperatorTokens

__all__ = ["Operator", "OperatorTokens"]
