"""A small client for Basalt's REST API (``/api/v1``, see crates/api/openapi.json).

It knows nothing of Cinder: every failure is a :class:`BasaltError` carrying the
HTTP status (``None`` when no node answered) and Basalt's one-line message from
its ``{"error": ...}`` body, and the driver turns those into Cinder exceptions.

Several API URLs (the nodes of a cluster) may be given: a request that cannot
connect to one node (refused, unreachable, connect timeout) is sent to the next,
and the node that answered is tried first next time. A request that reached a
node and then timed out is not re-sent elsewhere, because it may have been
carried out.
"""

from __future__ import annotations

import threading
import urllib.parse
from collections.abc import Sequence
from typing import Any

import requests

GiB = 1024**3

#: Seconds to wait for a TCP connection to a node before trying the next one.
CONNECT_TIMEOUT = 10.0
#: Seconds to wait for an answer once connected. Basalt's calls are metadata
#: operations (a flatten is done window by window), so this is generous.
READ_TIMEOUT = 120.0


class BasaltError(Exception):
    """A request Basalt refused, or that no node answered (status ``None``)."""

    def __init__(self, status: int | None, message: str, method: str = "", path: str = ""):
        super().__init__(message)
        self.status = status
        self.message = message
        self.method = method
        self.path = path

    @property
    def unreachable(self) -> bool:
        return self.status is None

    def __str__(self) -> str:
        where = f" ({self.method} {self.path})" if self.method else ""
        if self.status is None:
            return f"Basalt API unreachable{where}: {self.message}"
        return f"Basalt API error {self.status}{where}: {self.message}"


def quote(segment: str) -> str:
    """Percent-encode one path segment (host NQNs hold ':')."""
    return urllib.parse.quote(segment, safe="")


class BasaltClient:
    """Calls to one Basalt cluster through any of its API URLs."""

    def __init__(
        self,
        urls: Sequence[str],
        token: str,
        verify: bool | str = True,
        connect_timeout: float = CONNECT_TIMEOUT,
        read_timeout: float = READ_TIMEOUT,
    ) -> None:
        cleaned = [u.strip().rstrip("/") for u in urls if u and u.strip()]
        if not cleaned:
            raise ValueError("at least one Basalt API URL is needed")
        for url in cleaned:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"Basalt API URL {url!r} must start with http:// or https://")
        self.urls = cleaned
        self.verify = verify
        self.timeout = (connect_timeout, read_timeout)
        self._preferred = 0
        self._lock = threading.Lock()
        self._session = requests.Session()
        self._session.headers.update(
            {"Authorization": f"Bearer {token}", "Accept": "application/json"}
        )

    # -- transport ---------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        params: dict[str, str] | None = None,
    ) -> Any:
        """Send one request; return the decoded JSON answer (None for 204)."""
        with self._lock:
            start = self._preferred
        order = [self.urls[(start + i) % len(self.urls)] for i in range(len(self.urls))]
        failures: list[str] = []
        for index, base in enumerate(order):
            try:
                response = self._session.request(
                    method,
                    base + path,
                    json=body,
                    params=params,
                    timeout=self.timeout,
                    verify=self.verify,
                )
            except (requests.exceptions.ConnectionError, requests.exceptions.ConnectTimeout) as e:
                # ConnectTimeout is a ConnectionError; a ReadTimeout is not, and
                # is not retried elsewhere (the request may have been done).
                failures.append(f"{base}: {_short(e)}")
                continue
            except requests.exceptions.Timeout as e:
                raise BasaltError(
                    None, f"{base} did not answer in {self.timeout[1]:.0f} s: {_short(e)}",
                    method, path,
                ) from e
            except requests.exceptions.RequestException as e:
                raise BasaltError(None, f"{base}: {_short(e)}", method, path) from e
            with self._lock:
                self._preferred = (start + index) % len(self.urls)
            return self._decode(response, method, path)
        raise BasaltError(None, "; ".join(failures), method, path)

    @staticmethod
    def _decode(response: requests.Response, method: str, path: str) -> Any:
        if response.status_code == 204 or not response.content:
            if response.ok:
                return None
        payload: Any = None
        try:
            payload = response.json()
        except ValueError:
            payload = None
        if response.ok:
            return payload
        if isinstance(payload, dict) and isinstance(payload.get("error"), str):
            message = payload["error"]
        else:
            message = (response.text or response.reason or "").strip()[:500] or "no message"
        raise BasaltError(response.status_code, message, method, path)

    # -- volumes -----------------------------------------------------------

    def status(self) -> dict[str, Any]:
        return self.request("GET", "/api/v1/status")

    def nodes(self) -> list[dict[str, Any]]:
        """The cluster's nodes (a cluster-admin token; a single node answers 400)."""
        return self.request("GET", "/api/v1/nodes")["nodes"]

    def list_types(self) -> list[dict[str, Any]]:
        """The volume types the token may use (the default one has is_default)."""
        return self.request("GET", "/api/v1/types")["types"]

    def get_type(self, name: str) -> dict[str, Any]:
        return self.request("GET", f"/api/v1/types/{quote(name)}")

    def list_volumes(self) -> list[dict[str, Any]]:
        return self.request("GET", "/api/v1/volumes")["volumes"]

    def get_volume(self, name: str) -> dict[str, Any]:
        return self.request("GET", f"/api/v1/volumes/{quote(name)}")

    def create_volume(
        self,
        name: str,
        size_bytes: int | None = None,
        *,
        source: str | None = None,
        replicas: int | None = None,
        volume_type: str | None = None,
        encrypted: bool = False,
        compression: str | None = None,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"name": name}
        if encrypted:
            body["encrypted"] = True
        if compression is not None:
            body["compression"] = compression
        if size_bytes is not None:
            body["size"] = size_bytes
        if source is not None:
            body["from"] = source
        if replicas is not None:
            body["replicas"] = replicas
        if volume_type is not None:
            body["type"] = volume_type
        return self.request("POST", "/api/v1/volumes", body)

    def delete_volume(self, name: str, force: bool = False) -> None:
        params = {"force": "true"} if force else None
        self.request("DELETE", f"/api/v1/volumes/{quote(name)}", params=params)

    def resize_volume(self, name: str, size_bytes: int) -> dict[str, Any]:
        return self.request(
            "POST", f"/api/v1/volumes/{quote(name)}/resize", {"size": size_bytes}
        )

    def set_qos(self, name: str, qos: dict[str, int]) -> dict[str, Any]:
        return self.request(
            "PUT", f"/api/v1/volumes/{quote(name)}/qos", {"qos": qos}
        )

    def retype(self, name: str, volume_type: str) -> dict[str, Any]:
        return self.request(
            "POST", f"/api/v1/volumes/{quote(name)}/retype", {"type": volume_type}
        )

    def flatten(self, name: str, offset: int = 0, length: int | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"offset": offset}
        if length is not None:
            body["length"] = length
        return self.request(
            "POST", f"/api/v1/volumes/{quote(name)}/flatten", body
        )

    def attach_host(self, name: str, host_nqn: str, dhchap: bool = False) -> dict[str, Any]:
        body: dict[str, Any] = {"host_nqn": host_nqn}
        if dhchap:
            body["dhchap"] = True
        return self.request(
            "POST", f"/api/v1/volumes/{quote(name)}/nvme-hosts", body
        )

    def detach_host(self, name: str, host_nqn: str) -> None:
        self.request("DELETE", f"/api/v1/volumes/{quote(name)}/nvme-hosts/{quote(host_nqn)}")

    # -- tokens and NBD keys -----------------------------------------------

    def list_tokens(self) -> list[dict[str, Any]]:
        """The tokens the token may see (its project's; an admin role is needed)."""
        return self.request("GET", "/api/v1/tokens")["tokens"]

    def create_nbd_key(self, project: str | None, description: str | None = None
                       ) -> dict[str, Any]:
        """A pre-shared key for NBD over TLS opening ``project``'s volumes (every
        volume without a project: cluster admins only). The answer's
        ``psk_line`` (``IDENTITY:HEXKEY``) is shown only this once."""
        body: dict[str, Any] = {}
        if project is not None:
            body["project"] = project
        if description:
            body["description"] = description
        return self.request("POST", "/api/v1/nbd-keys", body)

    def revoke_nbd_key(self, identity: str) -> None:
        self.request("DELETE", f"/api/v1/nbd-keys/{quote(identity)}")

    # -- snapshots ---------------------------------------------------------

    def list_snapshots(self, volume: str | None = None) -> list[dict[str, Any]]:
        path = "/api/v1/snapshots"
        if volume is not None:
            path = f"/api/v1/volumes/{quote(volume)}/snapshots"
        return self.request("GET", path)["snapshots"]

    def get_snapshot(self, volume: str, name: str) -> dict[str, Any]:
        return self.request(
            "GET", f"/api/v1/volumes/{quote(volume)}/snapshots/{quote(name)}"
        )

    def create_snapshot(self, volume: str, name: str) -> dict[str, Any]:
        return self.request(
            "POST", f"/api/v1/volumes/{quote(volume)}/snapshots", {"name": name}
        )

    def delete_snapshot(self, volume: str, name: str) -> None:
        self.request("DELETE", f"/api/v1/volumes/{quote(volume)}/snapshots/{quote(name)}")

    def rollback(self, volume: str, snapshot: str, force: bool = False) -> dict[str, Any]:
        return self.request(
            "POST",
            f"/api/v1/volumes/{quote(volume)}/rollback",
            {"snapshot": snapshot, "force": force},
        )


def token_id(token: str) -> str | None:
    """The id of a Basalt API token, ``bst_<id>_<secret>`` (None for another form)."""
    parts = token.strip().split("_")
    if len(parts) == 3 and parts[0] == "bst" and parts[1] and parts[2]:
        return parts[1]
    return None


def _short(e: Exception) -> str:
    text = str(e)
    return text if len(text) <= 300 else text[:300] + "…"
