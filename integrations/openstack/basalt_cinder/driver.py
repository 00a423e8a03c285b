"""Cinder volume driver for Basalt: thin volumes, snapshots and copy-on-write
clones over Basalt's REST API, attached to hosts over NVMe/TCP.

Names: a Cinder volume is the Basalt volume ``volume-<volume id>`` and a Cinder
snapshot the Basalt snapshot ``<that volume>@snapshot-<snapshot id>``. A volume
or snapshot brought under Cinder with manage keeps its Basalt name, recorded as
its ``provider_id``.

Clones: ``create_cloned_volume`` makes an instant copy-on-write clone through a
snapshot Basalt takes on the source, ``clone-<clone's name>``, which Cinder never
sees. Deleting the clone deletes that snapshot; deleting the source first
flattens (copies) the clones still reading from it, so that Cinder's volumes stay
independent as Cinder expects. Volumes created from a Cinder snapshot read that
snapshot's blocks until flattened: deleting such a snapshot is refused with
SnapshotIsBusy, as with RBD.

Clusters: snapshots and reverts of replicated volumes are taken by Basalt at one
point of the replication stream on every replica. Clones (volumes from a
snapshot or from a volume) of a replicated volume are replicated too, with
their source's replica count and Basalt type, placed on the nodes holding the
source snapshot; flattening goes to every replica. Basalt flattens a replicated
clone only while it has no snapshots of its own, so deleting the source of such
a clone raises VolumeIsBusy (Cinder keeps the source available) until the
clone's snapshots are deleted.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from cinder import exception, interface
from cinder.common import constants
from cinder.i18n import _
from cinder.volume import configuration, driver, volume_types, volume_utils
from oslo_config import cfg
from oslo_log import log as logging

from basalt_cinder.client import BasaltClient, BasaltError, GiB

LOG = logging.getLogger(__name__)

basalt_opts = [
    cfg.ListOpt(
        "basalt_api_url",
        default=["http://127.0.0.1:8080"],
        help="Basalt REST API URLs, one per node of a cluster (comma-separated). "
        "A request that cannot connect to one is sent to the next.",
    ),
    cfg.StrOpt(
        "basalt_api_token",
        secret=True,
        help="Bearer token for the API: a project-scoped token "
        "(basalt token create --project P --role admin). A cluster-admin token "
        "is needed only to apply Cinder QoS specs per volume.",
    ),
    cfg.StrOpt(
        "basalt_verify_tls",
        default="true",
        help="Verify the API's TLS certificate: true, false, or the path of a CA bundle.",
    ),
    cfg.StrOpt(
        "basalt_default_type",
        help="Basalt volume type for volumes whose Cinder type names none "
        "(extra spec basalt:type). Unset: Basalt's own default type, if any.",
    ),
    cfg.StrOpt(
        "basalt_connector",
        default="nvmeof",
        choices=["nvmeof"],
        help="How hosts attach volumes: nvmeof (NVMe/TCP, os-brick's NVMe-oF connector).",
    ),
    cfg.ListOpt(
        "basalt_nvme_portals",
        default=[],
        help="NVMe/TCP portals (host:port) hosts connect to, every node of a cluster. "
        "Unset: the nodes' NVMe addresses from the API (cluster-admin token), else "
        "each API URL's host with port 4420.",
    ),
    cfg.IntOpt(
        "basalt_flatten_window_gb",
        default=8,
        min=1,
        help="GiB copied per flatten request when a clone must be detached from its source.",
    ),
]

CONF = cfg.CONF
CONF.register_opts(basalt_opts, group=configuration.SHARED_CONF_GROUP)

#: NVMe subsystem NQN of a Basalt volume.
NQN_PREFIX = "nqn.2026-11.io.basalt:volume:"
NVME_DEFAULT_PORT = 4420
#: Attachment states whose host has the volume (Cinder's VolumeAttachStatus):
#: "attaching" from attachment_update until the attach is completed.
CONNECTED_STATUSES = ("attaching", "attached")
#: The snapshot Basalt takes on a source volume for a clone (from=VOLUME).
CLONE_SNAPSHOT_PREFIX = "clone-"

#: Most replicas Basalt gives a volume in a cluster when neither the request nor
#: its volume type names a count (one per active node, up to this).
CLUSTER_DEFAULT_REPLICAS = 3

EXTRA_SPEC_TYPE = "basalt:type"
EXTRA_SPEC_REPLICAS = "basalt:replicas"
#: Encryption at rest (AES-256-XTS, Basalt's master key): "true", "<is> True".
EXTRA_SPEC_ENCRYPTED = "basalt:encrypted"
#: Accepted now and ignored with a warning until Basalt compresses.
EXTRA_SPECS_FUTURE = ("basalt:compression",)

#: Cinder QoS spec keys Basalt enforces (crates/api/openapi.json, QosSpec).
_QOS_BASES = (
    "total_iops_sec",
    "read_iops_sec",
    "write_iops_sec",
    "total_bytes_sec",
    "read_bytes_sec",
    "write_bytes_sec",
)
QOS_KEYS = frozenset(
    [
        *_QOS_BASES,
        *(k + "_per_gb" for k in _QOS_BASES),
        *(k + "_max" for k in _QOS_BASES),
        "burst_length_sec",
        "size_iops_sec",
    ]
)


def volume_name(volume: Any) -> str:
    """The Basalt name of a Cinder volume."""
    provider_id = getattr(volume, "provider_id", None)
    return str(provider_id) if provider_id else f"volume-{volume.id}"


def snapshot_name(snapshot: Any) -> str:
    """The Basalt name (after '@') of a Cinder snapshot."""
    provider_id = getattr(snapshot, "provider_id", None)
    return str(provider_id) if provider_id else f"snapshot-{snapshot.id}"


def target_nqn(name: str) -> str:
    return NQN_PREFIX + name


def qos_from_specs(specs: dict[str, Any] | None) -> dict[str, int]:
    """Basalt QoS limits from a Cinder QoS spec's key/values (validated)."""
    limits: dict[str, int] = {}
    for key, value in (specs or {}).items():
        if key not in QOS_KEYS:
            raise exception.InvalidQoSSpecs(
                reason=_("key %(key)s is not one Basalt enforces (%(keys)s)")
                % {"key": key, "keys": ", ".join(sorted(QOS_KEYS))}
            )
        try:
            number = int(str(value).strip())
        except ValueError:
            number = 0
        if number < 1:
            raise exception.InvalidQoSSpecs(
                reason=_("%(key)s=%(value)s: a positive integer is needed")
                % {"key": key, "value": value}
            )
        limits[key] = number
    return limits


def is_cluster(status: dict[str, Any]) -> bool:
    """Whether ``GET /api/v1/status`` came from a cluster member: only those
    report replication health (``volumes_degraded``)."""
    return "volumes_degraded" in status


def cluster_default_replicas(nodes: list[dict[str, Any]]) -> int:
    """Replicas a cluster gives a new volume that names no count and whose type
    names none (Basalt's rule): one per live active node, from 1 to 3.

    ``nodes`` is ``GET /api/v1/nodes``'s list."""
    active = sum(1 for n in nodes if n.get("alive") and n.get("state") == "active")
    return max(1, min(CLUSTER_DEFAULT_REPLICAS, active))


@interface.volumedriver
class BasaltVolumeDriver(driver.VolumeDriver):
    """Basalt volumes over NVMe/TCP.

    Version history:
        0.1.0 - create/delete/extend, snapshots, clones, revert, retype,
                manage/unmanage, NVMe/TCP attachments
    """

    VERSION = "0.1.0"
    CI_WIKI_NAME = "Basalt_CI"
    SUPPORTS_ACTIVE_ACTIVE = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.configuration.append_config_values(basalt_opts)
        self.client: BasaltClient | None = None
        self._stats: dict[str, Any] = {}
        self._replicas_unknown_logged = False

    @classmethod
    def get_driver_options(cls) -> list[Any]:
        extra = cls._get_oslo_driver_opts(
            "reserved_percentage", "volume_backend_name", "max_over_subscription_ratio"
        )
        return list(basalt_opts) + list(extra)

    # -- setup -------------------------------------------------------------

    def _verify(self) -> bool | str:
        value = str(self.configuration.basalt_verify_tls or "true").strip()
        if value.lower() in ("true", "yes", "1", "on"):
            return True
        if value.lower() in ("false", "no", "0", "off"):
            return False
        return value

    def do_setup(self, context: Any) -> None:
        token = self.configuration.basalt_api_token
        if not token:
            raise exception.InvalidConfigurationValue(option="basalt_api_token", value="")
        try:
            self.client = BasaltClient(
                self.configuration.basalt_api_url, token, verify=self._verify()
            )
        except ValueError as e:
            raise exception.InvalidConfigurationValue(
                option="basalt_api_url", value=self.configuration.basalt_api_url
            ) from e

    def check_for_setup_error(self) -> None:
        with self._errors():
            self._api.status()

    @property
    def _api(self) -> BasaltClient:
        if self.client is None:
            raise exception.VolumeBackendAPIException(
                data=_("the Basalt driver is not set up (do_setup was not called)")
            )
        return self.client

    # -- errors ------------------------------------------------------------

    @contextlib.contextmanager
    def _errors(self, volume: Any = None, snapshot: Any = None) -> Iterator[None]:
        try:
            yield
        except BasaltError as err:
            raise self._translate(err, volume=volume, snapshot=snapshot) from err

    @staticmethod
    def _translate(err: BasaltError, volume: Any = None, snapshot: Any = None) -> Exception:
        """The Cinder exception for a Basalt error, with Basalt's message intact."""
        msg = err.message
        vol_id = getattr(volume, "id", None) or getattr(snapshot, "volume_id", None) or "?"
        if err.status == 404:
            if snapshot is not None and "snapshot" in msg:
                return exception.SnapshotNotFound(message=msg, snapshot_id=snapshot.id)
            return exception.VolumeNotFound(message=msg, volume_id=vol_id)
        if err.status == 409:
            if snapshot is not None and "/snapshots/" in err.path:
                # A snapshot delete refused: clones read it, clients have it open,
                # or (after a revert) later layers of the volume read through it.
                return exception.SnapshotIsBusy(message=msg, snapshot_name=snapshot.name)
            if any(w in msg for w in ("already", "exists")):
                return exception.VolumeBackendAPIException(data=str(err))
            return exception.VolumeIsBusy(message=msg, volume_name=getattr(volume, "name", vol_id))
        if err.status == 413:
            if " of volumes" in msg:
                return exception.VolumeLimitExceeded(message=msg, allowed=0, name="volumes")
            if " of snapshots" in msg:
                return exception.SnapshotLimitExceeded(message=msg, allowed=0)
            return exception.VolumeSizeExceedsAvailableQuota(
                message=msg, name="gigabytes", requested=0, consumed=0, quota=0
            )
        if err.status == 400 and "not supported" in msg:
            return exception.NotSupportedOperation(message=msg, operation=msg)
        if err.status == 400 and "qos" in err.path:
            return exception.InvalidQoSSpecs(message=msg, reason=msg)
        return exception.VolumeBackendAPIException(data=str(err))

    # -- policies ----------------------------------------------------------

    def _type_policy(self, type_id: str | None) -> tuple[str | None, int | None, dict[str, int]]:
        """(Basalt type, replica count, Basalt QoS limits) of a Cinder volume type."""
        if not type_id:
            return self.configuration.basalt_default_type, None, {}
        extra = volume_types.get_volume_type_extra_specs(type_id) or {}
        basalt_type = extra.get(EXTRA_SPEC_TYPE) or self.configuration.basalt_default_type
        replicas: int | None = None
        if extra.get(EXTRA_SPEC_REPLICAS):
            raw = str(extra[EXTRA_SPEC_REPLICAS]).strip()
            if not raw.isdigit() or not 1 <= int(raw) <= 5:
                raise exception.InvalidVolumeType(
                    reason=_("%(key)s=%(raw)s: a replica count from 1 to 5 is needed")
                    % {"key": EXTRA_SPEC_REPLICAS, "raw": raw}
                )
            replicas = int(raw)
        for key in EXTRA_SPECS_FUTURE:
            if key in extra:
                LOG.warning(
                    "Volume type %(type)s sets %(key)s, which this Basalt does not "
                    "support yet; it is ignored.",
                    {"type": type_id, "key": key},
                )
        qos_specs = (volume_types.get_volume_type_qos_specs(type_id) or {}).get("qos_specs")
        limits: dict[str, int] = {}
        if qos_specs and qos_specs.get("consumer") in ("back-end", "both"):
            limits = qos_from_specs(qos_specs.get("specs"))
        return basalt_type, replicas, limits

    def _type_encrypted(self, type_id: str | None) -> bool:
        """Whether a Cinder volume type asks for encryption at rest
        (basalt:encrypted, as a boolean extra spec: true, yes, 1, <is> True)."""
        if not type_id:
            return False
        extra = volume_types.get_volume_type_extra_specs(type_id) or {}
        raw = str(extra.get(EXTRA_SPEC_ENCRYPTED, "")).strip().lower()
        raw = raw.removeprefix("<is>").strip()
        if raw in ("", "false", "no", "0", "off"):
            return False
        if raw in ("true", "yes", "1", "on"):
            return True
        raise exception.InvalidVolumeType(
            reason=_("%(key)s=%(raw)s: true or false is needed")
            % {"key": EXTRA_SPEC_ENCRYPTED, "raw": extra[EXTRA_SPEC_ENCRYPTED]}
        )

    def _apply_qos(self, name: str, limits: dict[str, int], volume: Any) -> None:
        with self._errors(volume=volume):
            self._api.set_qos(name, limits)

    def _undo_create(self, name: str) -> None:
        """Delete a volume this call created before failing (best effort, logged)."""
        try:
            self._api.delete_volume(name, force=True)
        except BasaltError as err:
            if err.status != 404:
                LOG.error("Could not delete Basalt volume %(name)s after a failed create: "
                          "%(err)s; delete it by hand", {"name": name, "err": err})

    def _finish_create(self, name: str, volume: Any, qos: dict[str, int]) -> None:
        """Apply QoS to a just-created volume; on failure delete it and re-raise."""
        if not qos:
            return
        try:
            self._apply_qos(name, qos, volume)
        except Exception:
            with contextlib.suppress(Exception):
                self._undo_create(name)
            raise

    # -- volumes -----------------------------------------------------------

    def create_volume(self, volume: Any) -> dict[str, Any]:
        name = volume_name(volume)
        basalt_type, replicas, qos = self._type_policy(volume.volume_type_id)
        encrypted = self._type_encrypted(volume.volume_type_id)
        with self._errors(volume=volume):
            self._api.create_volume(
                name, volume.size * GiB, replicas=replicas, volume_type=basalt_type,
                encrypted=encrypted,
            )
        self._finish_create(name, volume, qos)
        return {}

    def create_volume_from_snapshot(self, volume: Any, snapshot: Any) -> dict[str, Any]:
        name = volume_name(volume)
        source = f"{volume_name(snapshot.volume)}@{snapshot_name(snapshot)}"
        _, _, qos = self._type_policy(volume.volume_type_id)
        with self._errors(volume=volume, snapshot=snapshot):
            self._api.create_volume(name, volume.size * GiB, source=source)
        self._finish_create(name, volume, qos)
        return {}

    def create_cloned_volume(self, volume: Any, src_vref: Any) -> dict[str, Any]:
        name = volume_name(volume)
        _, _, qos = self._type_policy(volume.volume_type_id)
        # Basalt snapshots the source as clone-NAME and clones that.
        with self._errors(volume=src_vref):
            self._api.create_volume(name, volume.size * GiB, source=volume_name(src_vref))
        self._finish_create(name, volume, qos)
        return {}

    def delete_volume(self, volume: Any) -> None:
        name = volume_name(volume)
        try:
            info = self._api.get_volume(name)
        except BasaltError as err:
            if err.status == 404:
                LOG.info("Basalt volume %s is already gone.", name)
                return
            raise self._translate(err, volume=volume) from err
        kept = [s for s in info.get("snapshots") or []
                if not s.startswith(CLONE_SNAPSHOT_PREFIX)]
        if kept:
            raise exception.VolumeIsBusy(
                message=_("Basalt volume %(name)s has snapshots (%(snaps)s); delete them "
                          "first") % {"name": name, "snaps": ", ".join(kept)},
                volume_name=name,
            )
        with self._errors(volume=volume):
            self._release_clone_snapshots(name, info)
        try:
            self._api.delete_volume(name)
        except BasaltError as err:
            if err.status == 404:
                return
            raise self._translate(err, volume=volume) from err
        self._drop_source_snapshot(name, info.get("clone_of"))

    def _release_clone_snapshots(self, name: str, info: dict[str, Any]) -> None:
        """Flatten the clones reading this volume's clone-* snapshots, delete those."""
        for snap in info.get("snapshots") or []:
            if not snap.startswith(CLONE_SNAPSHOT_PREFIX):
                continue
            detail = self._api.get_snapshot(name, snap)
            for clone in detail.get("clones") or []:
                LOG.info("Flattening %(clone)s so that its source %(src)s can be deleted.",
                         {"clone": clone, "src": name})
                try:
                    self._flatten(clone)
                except BasaltError as err:
                    if err.status == 400 and "has snapshots" in err.message:
                        # A cluster flattens a replicated clone only without
                        # snapshots of its own. The source stays, with this
                        # clone; clones flattened before it stay flattened.
                        raise exception.VolumeIsBusy(
                            message=_("Basalt volume %(name)s cannot be deleted before "
                                      "its clone %(clone)s is flattened: %(err)s")
                            % {"name": name, "clone": clone, "err": err.message},
                            volume_name=name,
                        ) from err
                    raise
            self._api.delete_snapshot(name, snap)

    def _flatten(self, name: str) -> None:
        """Copy a clone's source blocks into it, window by window, until detached."""
        window = self.configuration.basalt_flatten_window_gb * GiB
        size = int(self._api.get_volume(name)["size_bytes"])
        offset = 0
        while offset < size:
            length = min(window, size - offset)
            if self._api.flatten(name, offset=offset, length=length).get("detached"):
                return
            offset += length
        raise exception.VolumeBackendAPIException(
            data=_("flattening %s did not detach it from its source") % name
        )

    def _drop_source_snapshot(self, name: str, clone_of: str | None) -> None:
        """After deleting a clone, delete the clone-NAME snapshot taken for it."""
        if not clone_of or "@" not in clone_of:
            return
        source, snap = clone_of.split("@", 1)
        if snap != CLONE_SNAPSHOT_PREFIX + name:
            return  # cloned from a Cinder snapshot, which Cinder owns
        try:
            self._api.delete_snapshot(source, snap)
        except BasaltError as err:
            if err.status != 404:
                LOG.warning("Could not delete %(src)s@%(snap)s, taken to clone %(name)s: "
                            "%(err)s", {"src": source, "snap": snap, "name": name, "err": err})

    def extend_volume(self, volume: Any, new_size: int) -> None:
        with self._errors(volume=volume):
            self._api.resize_volume(volume_name(volume), new_size * GiB)

    # -- snapshots ---------------------------------------------------------

    def create_snapshot(self, snapshot: Any) -> dict[str, Any]:
        with self._errors(volume=snapshot.volume, snapshot=snapshot):
            self._api.create_snapshot(volume_name(snapshot.volume), snapshot_name(snapshot))
        return {}

    def delete_snapshot(self, snapshot: Any) -> None:
        try:
            self._api.delete_snapshot(volume_name(snapshot.volume), snapshot_name(snapshot))
        except BasaltError as err:
            if err.status == 404:
                LOG.info("Basalt snapshot %s is already gone.", snapshot_name(snapshot))
                return
            raise self._translate(err, volume=snapshot.volume, snapshot=snapshot) from err

    def revert_to_snapshot(self, context: Any, volume: Any, snapshot: Any) -> None:
        name = volume_name(volume)
        with self._errors(volume=volume, snapshot=snapshot):
            info = self._api.rollback(name, snapshot_name(snapshot))
            # On a single node Basalt restores the snapshot's size (a replicated
            # volume keeps its own); Cinder keeps the volume's.
            if info["size_bytes"] < volume.size * GiB:
                self._api.resize_volume(name, volume.size * GiB)

    # -- attachments -------------------------------------------------------

    def _portals(self) -> list[tuple[str, str, str]]:
        configured = self.configuration.basalt_nvme_portals or []
        addresses: list[str] = [p.strip() for p in configured if p.strip()]
        if not addresses:
            try:
                nodes = self._api.nodes()
                addresses = [n["nvme_addr"] for n in nodes if n.get("nvme_addr")]
            except BasaltError:
                addresses = []
        if not addresses:
            from urllib.parse import urlsplit

            for url in self._api.urls:
                host = urlsplit(url).hostname or "127.0.0.1"
                addresses.append(f"{host}:{NVME_DEFAULT_PORT}")
        portals = []
        for address in addresses:
            host, sep, port = address.rpartition(":")
            if not sep or not port.isdigit():
                host, port = address, str(NVME_DEFAULT_PORT)
            portals.append((host.strip("[]"), port, "tcp"))
        return portals

    def initialize_connection(
        self, volume: Any, connector: dict[str, Any], initiator_data: Any = None
    ) -> dict[str, Any]:
        host_nqn = (connector or {}).get("nqn")
        if not host_nqn:
            raise exception.InvalidConnectorException(missing="nqn")
        name = volume_name(volume)
        with self._errors(volume=volume):
            info = self._api.attach_host(name, host_nqn)
        nguid = info["id"].replace("-", "")
        return {
            "driver_volume_type": "nvmeof",
            "data": {
                "target_nqn": target_nqn(name),
                "vol_uuid": info["id"],
                "portals": self._portals(),
                "ns_id": 1,
                "volume_nguid": nguid,
                "host_nqn": host_nqn,
                "discard": True,
            },
        }

    def terminate_connection(self, volume: Any, connector: dict[str, Any] | None,
                             **kwargs: Any) -> bool:
        """Revoke the connector's host NQN (every host's without a connector).

        Each host has one attachment on Basalt, its NQN, whatever the number of
        Cinder attachments on it: the NQN stays while another attachment of a
        multiattach volume is on that host, and True (a shared connection) is
        returned then. Revoking a host that is not attached, or a volume that
        is gone, succeeds, so Cinder may retry."""
        if not connector:
            # Force-detach from every host: revoke every attached host.
            try:
                hosts = self._api.get_volume(volume_name(volume)).get("nvme_hosts") or []
            except BasaltError as err:
                if err.status == 404:
                    return False
                raise self._translate(err, volume=volume) from err
        else:
            if not connector.get("nqn"):
                return False
            if self._other_attachments_on_host(volume, connector):
                LOG.debug("Volume %s stays attached: another attachment uses it on %s.",
                          volume.id, connector.get("host"))
                return True
            hosts = [connector["nqn"]]
        for nqn in hosts:
            try:
                self._api.detach_host(volume_name(volume), nqn)
            except BasaltError as err:
                if err.status != 404:
                    raise self._translate(err, volume=volume) from err
        return False

    @staticmethod
    def _other_attachments_on_host(volume: Any, connector: dict[str, Any]) -> bool:
        """Multiattach: another attachment of this volume on the same host, attached
        or being attached (its host was given the volume and may be connecting)."""
        if not getattr(volume, "multiattach", False):
            return False
        attachments = getattr(volume, "volume_attachment", None) or []
        host = connector.get("host")
        connected = [
            a for a in attachments
            if a.attach_status in CONNECTED_STATUSES and a.attached_host == host
        ]
        return len(connected) > 1

    def create_export(self, context: Any, volume: Any, connector: Any) -> None:
        return None

    def ensure_export(self, context: Any, volume: Any) -> None:
        return None

    def remove_export(self, context: Any, volume: Any) -> None:
        return None

    # -- stats -------------------------------------------------------------

    def get_volume_stats(self, refresh: bool = False) -> dict[str, Any]:
        if refresh or not self._stats:
            self._update_volume_stats()
        return self._stats

    def _update_volume_stats(self) -> None:
        backend = self.configuration.safe_get("volume_backend_name") or "Basalt"
        with self._errors():
            status = self._api.status()
        capacity = status["capacity_bytes"] / GiB
        allocated = status["allocated_bytes"] / GiB
        pool = {
            "pool_name": backend,
            "total_capacity_gb": round(capacity, 2),
            "free_capacity_gb": round(max(capacity - allocated, 0.0), 2),
            "allocated_capacity_gb": round(allocated, 2),
            "provisioned_capacity_gb": round(status["provisioned_bytes"] / GiB, 2),
            "max_over_subscription_ratio": status["overcommit_ratio"],
            "reserved_percentage": self.configuration.safe_get("reserved_percentage") or 0,
            "thin_provisioning_support": True,
            "thick_provisioning_support": False,
            "QoS_support": True,
            "multiattach": True,
            "total_volumes": status["volume_count"],
            "location_info": f"BasaltVolumeDriver:{self._api.urls[0]}",
        }
        replicas = self._default_replicas(status)
        if replicas is not None:
            pool["replication_count"] = replicas
        self._stats = {
            "volume_backend_name": backend,
            "vendor_name": "Basalt",
            "driver_version": self.VERSION,
            "storage_protocol": constants.NVMEOF_TCP,
            "sparse_copy_volume": True,
            "pools": [pool],
        }

    def _default_replicas(self, status: dict[str, Any]) -> int | None:
        """Replicas Basalt gives a new volume whose Cinder type sets neither
        basalt:replicas nor basalt:type, as Basalt reports it; None when this
        token cannot find out (a project token in a cluster whose default type
        names no count: only cluster admins may list the nodes)."""
        if not is_cluster(status):
            return 1  # a single-node server keeps one copy of every volume
        try:
            replicas = self._default_type_replicas()
            if replicas is None:
                replicas = cluster_default_replicas(self._api.nodes())
        except BasaltError as err:
            log = LOG.debug if self._replicas_unknown_logged else LOG.warning
            self._replicas_unknown_logged = True
            log("replication_count is not reported: Basalt did not tell how many "
                "replicas new volumes get (%s). Give the default Basalt type a replica "
                "count, or use a cluster-admin token.", err)
            return None
        return replicas

    def _default_type_replicas(self) -> int | None:
        """The replica count of the Basalt type a volume gets when its Cinder type
        names none: basalt_default_type, else Basalt's default type (None: no
        such type, or it names no count)."""
        name = self.configuration.basalt_default_type
        if name:
            vtype: dict[str, Any] | None = self._api.get_type(name)
        else:
            vtype = next((t for t in self._api.list_types() if t.get("is_default")), None)
        replicas = (vtype or {}).get("replicas")
        return int(replicas) if replicas else None

    # -- retype ------------------------------------------------------------

    def retype(self, context: Any, volume: Any, new_type: dict[str, Any],
               diff: dict[str, Any], host: dict[str, Any]) -> tuple[bool, dict[str, Any]]:
        name = volume_name(volume)
        old_type, old_replicas, old_qos = self._type_policy(volume.volume_type_id)
        new_basalt_type, new_replicas, new_qos = self._type_policy(new_type.get("id"))
        if self._type_encrypted(new_type.get("id")) != bool(
            self._api.get_volume(name).get("encrypted")
        ):
            # Basalt does not rewrite a volume in place to (un)encrypt it.
            LOG.info("Retype of %s changes basalt:encrypted: Cinder must migrate it.",
                     volume.id)
            return False, {}
        if new_replicas != old_replicas and new_basalt_type == old_type:
            # Replica count changes go through a Basalt type (its placement
            # machinery); a bare basalt:replicas change needs a migration.
            LOG.info("Retype of %s changes basalt:replicas without a Basalt type: "
                     "Cinder must migrate it.", volume.id)
            return False, {}
        with self._errors(volume=volume):
            if new_basalt_type and new_basalt_type != old_type:
                self._api.retype(name, new_basalt_type)
            if new_qos != old_qos:
                self._api.set_qos(name, new_qos)
        return True, {}

    # -- manage / unmanage ---------------------------------------------------

    def _existing_name(self, existing_ref: dict[str, Any]) -> str:
        name = existing_ref.get("source-name") or existing_ref.get("source-id")
        if not name:
            raise exception.ManageExistingInvalidReference(
                existing_ref=existing_ref, reason=_("source-name (the Basalt name) is needed")
            )
        return str(name)

    def _get_existing(self, volume: Any, existing_ref: dict[str, Any]) -> dict[str, Any]:
        name = self._existing_name(existing_ref)
        try:
            return self._api.get_volume(name)
        except BasaltError as err:
            if err.status == 404:
                raise exception.ManageExistingInvalidReference(
                    existing_ref=existing_ref, reason=err.message
                ) from err
            raise self._translate(err, volume=volume) from err

    def manage_existing(self, volume: Any, existing_ref: dict[str, Any]) -> dict[str, Any]:
        info = self._get_existing(volume, existing_ref)
        if info["open_connections"]:
            raise exception.ManageExistingInvalidReference(
                existing_ref=existing_ref,
                reason=_("Basalt volume %s has connected clients") % info["name"],
            )
        size_gb = -(-info["size_bytes"] // GiB)
        if size_gb * GiB != info["size_bytes"]:
            with self._errors(volume=volume):
                self._api.resize_volume(info["name"], size_gb * GiB)
        return {"provider_id": info["name"]}

    def manage_existing_get_size(self, volume: Any, existing_ref: dict[str, Any]) -> int:
        info = self._get_existing(volume, existing_ref)
        return int(-(-info["size_bytes"] // GiB))

    def unmanage(self, volume: Any) -> None:
        LOG.info("Basalt volume %s is no longer managed by Cinder; it is kept.",
                 volume_name(volume))

    def manage_existing_snapshot(self, snapshot: Any,
                                 existing_ref: dict[str, Any]) -> dict[str, Any]:
        name = self._existing_name(existing_ref)
        with self._errors(volume=snapshot.volume, snapshot=snapshot):
            self._api.get_snapshot(volume_name(snapshot.volume), name)
        return {"provider_id": name}

    def manage_existing_snapshot_get_size(self, snapshot: Any,
                                          existing_ref: dict[str, Any]) -> int:
        name = self._existing_name(existing_ref)
        with self._errors(volume=snapshot.volume, snapshot=snapshot):
            info = self._api.get_snapshot(volume_name(snapshot.volume), name)
        return int(-(-info["size_bytes"] // GiB))

    def unmanage_snapshot(self, snapshot: Any) -> None:
        LOG.info("Basalt snapshot %s is no longer managed by Cinder; it is kept.",
                 snapshot_name(snapshot))

    def get_manageable_volumes(self, cinder_volumes: list[Any], marker: Any, limit: int,
                               offset: int, sort_keys: list[str],
                               sort_dirs: list[str]) -> list[dict[str, Any]]:
        managed = {volume_name(v): v.id for v in cinder_volumes}
        with self._errors():
            volumes = self._api.list_volumes()
        entries = []
        for info in volumes:
            cinder_id = managed.get(info["name"])
            reason = None
            if cinder_id:
                reason = _("already managed")
            elif info["open_connections"]:
                reason = _("clients are connected")
            entries.append({
                "reference": {"source-name": info["name"]},
                "size": int(-(-info["size_bytes"] // GiB)),
                "safe_to_manage": reason is None,
                "reason_not_safe": reason,
                "cinder_id": cinder_id,
                "extra_info": {"basalt_id": info["id"], "volume_type": info.get("volume_type")},
            })
        return volume_utils.paginate_entries_list(
            entries, marker, limit, offset, sort_keys, sort_dirs
        )

    def get_manageable_snapshots(self, cinder_snapshots: list[Any], marker: Any, limit: int,
                                 offset: int, sort_keys: list[str],
                                 sort_dirs: list[str]) -> list[dict[str, Any]]:
        managed = {
            (volume_name(s.volume), snapshot_name(s)): s.id for s in cinder_snapshots
        }
        with self._errors():
            snapshots = self._api.list_snapshots()
        entries = []
        for info in snapshots:
            if info["name"].startswith(CLONE_SNAPSHOT_PREFIX):
                continue  # taken by this driver for a clone
            cinder_id = managed.get((info["volume"], info["name"]))
            entries.append({
                "reference": {"source-name": info["name"]},
                "size": int(-(-info["size_bytes"] // GiB)),
                "safe_to_manage": cinder_id is None,
                "reason_not_safe": _("already managed") if cinder_id else None,
                "cinder_id": cinder_id,
                "extra_info": {"basalt_id": info["id"]},
                "source_reference": {"source-name": info["volume"]},
            })
        return volume_utils.paginate_entries_list(
            entries, marker, limit, offset, sort_keys, sort_dirs
        )

