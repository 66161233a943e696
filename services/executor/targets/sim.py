"""The sim's action API as a target (see docs/design/fleet-contracts.md)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import httpx

from services.executor.targets.base import (
    ActionResult,
    StaleFencingToken,
    TargetRejected,
    TargetUnavailable,
    failure,
)


class SimTarget:
    """The sim's ``/actions`` API (see docs/design/fleet-contracts.md).

    The sim admits only the holder of its action token (``FLOTILLA_SIM_ACTION_TOKEN``),
    sent as a bearer token with every call; a wrong one is refused (401), which is a
    :class:`TargetRejected`: retrying cannot fix configuration.
    """

    def __init__(
        self,
        base_url: str,
        action_token: str,
        timeout: float = 5.0,
        *,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if not action_token:
            raise ValueError("the sim's action token is required: the sim refuses actions without it")
        self._client = httpx.Client(
            base_url=base_url.rstrip("/"),
            headers={"Authorization": f"Bearer {action_token}"},
            timeout=timeout,
            transport=transport,
        )

    def apply(
        self,
        action: str,
        resource: str,
        params: Mapping[str, Any],
        idempotency_key: str,
        fencing_token: int,
        holder: str,
        expected_change: str | None = None,
    ) -> ActionResult:
        if expected_change is not None:
            # Never reached from a sound policy (it shows the sim's steps no change to
            # approve), so a command carrying one was approved on another target's dry run.
            raise TargetRejected(
                f"the sim cannot dry-run, so it cannot check the approved change {expected_change}: "
                f"{action} {resource} is not applied"
            )
        body = {
            "resource": resource,
            "params": dict(params),
            "idempotencyKey": idempotency_key,
            "fencingToken": fencing_token,
            "holder": holder,
        }
        response = self._request("POST", f"/actions/{quote(action, safe='')}", json=body)
        if response.status_code == 409:
            detail = response.json()
            raise StaleFencingToken(int(detail.get("fencingToken", fencing_token)), int(detail["newestToken"]))
        if response.status_code != 200:
            raise failure(response, f"{action} {resource}")
        return self._result(response)

    def lookup(self, idempotency_key: str) -> ActionResult | None:
        response = self._request("GET", f"/actions/{quote(idempotency_key, safe='')}")
        if response.status_code == 404:
            return None
        if response.status_code != 200:
            raise failure(response, f"lookup {idempotency_key}")
        return self._result(response)

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> SimTarget:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        try:
            return self._client.request(method, url, **kwargs)
        except httpx.TransportError as exc:
            raise TargetUnavailable(f"sim unreachable: {exc!r}") from exc

    @staticmethod
    def _result(response: httpx.Response) -> ActionResult:
        try:
            return ActionResult.from_json(response.json())
        except (ValueError, KeyError, TypeError) as exc:
            # the action may have been applied: a retry with the same key tells
            raise TargetUnavailable(f"unreadable answer from the sim: {response.text[:200]!r}") from exc
