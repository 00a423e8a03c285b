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
source snapshot; flattening goes to every replica, and detaches a clone's own
snapshots from the source with it.

Images: with basalt_nbd_uri, images are copied to and from volumes by qemu-img
through Basalt's NBD endpoint (TLS with a pre-shared key, basalt_cinder.nbd),
after the checks Cinder's image_utils makes; without it, Cinder's generic path
(os-brick attaches the volume to the cinder-volume host).

DH-HMAC-CHAP: with basalt_nvme_dhchap, hosts are attached with secrets handed
over as dhchap_secret / dhchap_ctrl_secret; a pair a connected host may use is
never replaced (see _attach_host).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

from cinder import exception, interface, utils
from cinder.common import constants
from cinder.i18n import _
from cinder.image import accelerator, image_utils
from cinder.volume import configuration, driver, volume_types, volume_utils
from oslo_concurrency import processutils
from oslo_config import cfg
from oslo_log import log as logging

from basalt_cinder import nbd
from basalt_cinder.client import CONNECT_TIMEOUT, BasaltClient, BasaltError, GiB, token_id

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
    cfg.BoolOpt(
        "basalt_nvme_dhchap",
        default=False,
        help="Attach hosts with in-band DH-HMAC-CHAP authentication: Basalt makes a "
        "host secret and a controller secret per host and volume, and the connection "
        "properties carry them as dhchap_secret and dhchap_ctrl_secret (nvme connect's "
        "--dhchap-secret and --dhchap-ctrl-secret). os-brick 7.1.1 does not pass them "
        "to nvme connect, so hosts attaching with it cannot connect while this is on.",
    ),
    cfg.ListOpt(
        "basalt_nbd_uri",
        default=[],
        help="Basalt NBD-over-TLS endpoints, nbds://HOST:PORT (the nodes' "
        "--nbd-listen addresses; comma-separated, the first that accepts a connection "
        "is used): images are copied to and from volumes through them with qemu-img. "
        "Unset: Cinder's generic copy, which attaches the volume to this host with "
        "os-brick over NVMe/TCP.",
    ),
    cfg.StrOpt(
        "basalt_nbd_psk_file",
        help="File holding the NBD pre-shared key, one IDENTITY:HEXKEY line "
        "(basalt nbd-key create), readable by its owner only. When the file does not "
        "exist the driver creates a key through the API with its token (for the "
        "token's project) and writes it there, mode 0600. Default: "
        "$state_path/basalt-nbd-<backend>.psk.",
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
#: Bytes one flatten request of a re-encryption covers (as the CLI's).
REENCRYPTION_WINDOW = 1 << 30

#: qemu-img with tls-creds-psk, --target-image-opts and -W.
QEMU_IMG_MIN_VERSION = "4.0.0"
#: Connection properties with a host's DH-HMAC-CHAP secrets: nvme-cli's names
#: (nvme connect --dhchap-secret / --dhchap-ctrl-secret), which Basalt's API
#: uses too. os-brick 7.1.1 reads neither.
DHCHAP_SECRET = "dhchap_secret"  # noqa: S105 (a property name)
DHCHAP_CTRL_SECRET = "dhchap_ctrl_secret"  # noqa: S105

#: Most replicas Basalt gives a volume in a cluster when neither the request nor
#: its volume type names a count (one per active node, up to this).
CLUSTER_DEFAULT_REPLICAS = 3

EXTRA_SPEC_TYPE = "basalt:type"
EXTRA_SPEC_REPLICAS = "basalt:replicas"
#: Encryption at rest (AES-256-XTS, Basalt's master key): "true", "<is> True".
EXTRA_SPEC_ENCRYPTED = "basalt:encrypted"
#: Compression of cold data: lz4, zstd, zstd:LEVEL, off, or a boolean
#: ("<is> True": lz4).
EXTRA_SPEC_COMPRESSION = "basalt:compression"

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


def _answered_dhchap(info: dict[str, Any]) -> dict[str, str]:
    """The secrets in the answer to an attach with ``"dhchap": true``."""
    secret, ctrl = info.get("dhchap_secret"), info.get("dhchap_ctrl_secret")
    if not secret or not ctrl:
        raise exception.VolumeBackendAPIException(
            data=_("Basalt attached the host with DH-HMAC-CHAP but returned no secrets"))
    return {DHCHAP_SECRET: str(secret), DHCHAP_CTRL_SECRET: str(ctrl)}


def _recorded_dhchap(attachment: Any) -> dict[str, str] | None:
    """The secrets in an attachment's recorded connection info (Cinder's API
    records it flattened; the nested ``data`` form is read too)."""
    info = getattr(attachment, "connection_info", None) or {}
    if isinstance(info.get("data"), dict):
        info = info["data"]
    secret, ctrl = info.get(DHCHAP_SECRET), info.get(DHCHAP_CTRL_SECRET)
    if isinstance(secret, str) and secret and isinstance(ctrl, str) and ctrl:
        return {DHCHAP_SECRET: secret, DHCHAP_CTRL_SECRET: ctrl}
    return None


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
                manage/unmanage, NVMe/TCP attachments; image copies over
                NBD (TLS-PSK) with qemu-img; DH-HMAC-CHAP secrets
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
        self._nbd_key_lock = threading.Lock()
        self._nbd_preferred: nbd.Endpoint | None = None

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
        self._nbd_endpoints()  # validated now; read again at each copy

    def check_for_setup_error(self) -> None:
        with self._errors():
            self._api.status()
        if self._nbd_endpoints():
            image_utils.check_qemu_img_version(QEMU_IMG_MIN_VERSION)
            self._nbd_key()
        else:
            LOG.info("basalt_nbd_uri is not set: images are copied to and from volumes "
                     "through Cinder's generic path (os-brick attaches each volume to "
                     "this host over NVMe/TCP).")

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
            if "replicas but the cluster has" in msg:
                # The volume type asks for more replicas than there are
                # active nodes: nothing is busy, the type does not fit.
                return exception.InvalidVolumeType(reason=msg)
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

    def _type_compression(self, type_id: str | None) -> str | None:
        """The codec a Cinder volume type asks for (basalt:compression), as
        Basalt spells it: lz4, zstd, zstd:LEVEL or off; a boolean gives lz4
        or off; None when the type does not say."""
        if not type_id:
            return None
        extra = volume_types.get_volume_type_extra_specs(type_id) or {}
        if EXTRA_SPEC_COMPRESSION not in extra:
            return None
        raw = str(extra[EXTRA_SPEC_COMPRESSION]).strip().lower()
        raw = raw.removeprefix("<is>").strip()
        if raw in ("true", "yes", "1", "on"):
            return "lz4"
        if raw in ("false", "no", "0", "off", ""):
            return "off"
        codec, _sep, level = raw.partition(":")
        level_ok = not level or (codec == "zstd" and level.isdigit() and 1 <= int(level) <= 19)
        if codec in ("lz4", "zstd") and level_ok:
            return raw
        raise exception.InvalidVolumeType(
            reason=_("%(key)s=%(raw)s: lz4, zstd, zstd:LEVEL (1-19), off or a boolean "
                     "is needed") % {"key": EXTRA_SPEC_COMPRESSION,
                                     "raw": extra[EXTRA_SPEC_COMPRESSION]}
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
        compression = self._type_compression(volume.volume_type_id)
        with self._errors(volume=volume):
            self._api.create_volume(
                name, volume.size * GiB, replicas=replicas, volume_type=basalt_type,
                encrypted=encrypted, compression=compression,
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
                self._flatten(clone)
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

    # -- images ------------------------------------------------------------

    def _nbd_endpoints(self) -> list[nbd.Endpoint]:
        """basalt_nbd_uri, parsed (empty: image copies take Cinder's generic path)."""
        uris = [u for u in (self.configuration.basalt_nbd_uri or []) if u.strip()]
        try:
            return [nbd.parse_endpoint(u) for u in uris]
        except ValueError as e:
            raise exception.InvalidConfigurationValue(
                message=_("basalt_nbd_uri: %s") % e,
                option="basalt_nbd_uri", value=",".join(uris),
            ) from e

    def _nbd_psk_path(self) -> str:
        path = self.configuration.basalt_nbd_psk_file
        if path:
            return str(path)
        group = self.configuration.config_group or "basalt"
        return os.path.join(CONF.state_path, f"basalt-nbd-{group}.psk")

    def _nbd_key(self) -> nbd.Psk:
        """The NBD key from basalt_nbd_psk_file; when that file does not exist, a
        key created through the API for the token's project, written there."""
        path = self._nbd_psk_path()
        with self._nbd_key_lock:
            try:
                return nbd.read_psk_file(path)
            except FileNotFoundError:
                pass
            except (OSError, ValueError) as e:
                raise exception.VolumeBackendAPIException(
                    data=_("basalt_nbd_psk_file: %s") % e) from e
            return self._create_nbd_key(path)

    def _create_nbd_key(self, path: str) -> nbd.Psk:
        with self._errors():
            project = self._token_project()
            created = self._api.create_nbd_key(
                project, description=f"Cinder backend {self.configuration.config_group} "
                f"({CONF.host}): image copies")
        try:
            psk = nbd.Psk.parse(str(created.get("psk_line", "")))
        except ValueError as e:
            raise exception.VolumeBackendAPIException(
                data=_("Basalt created an NBD key but did not return it: %s") % e) from e
        try:
            written = nbd.write_psk_file(path, psk)
        except OSError as e:
            self._revoke_nbd_key(psk.identity)
            raise exception.VolumeBackendAPIException(
                data=_("cannot write the Basalt NBD key to %(path)s: %(err)s")
                % {"path": path, "err": e}) from e
        if not written:  # another process wrote the file meanwhile: use its key
            self._revoke_nbd_key(psk.identity)
            try:
                return nbd.read_psk_file(path)
            except (OSError, ValueError) as e:
                raise exception.VolumeBackendAPIException(
                    data=_("basalt_nbd_psk_file: %s") % e) from e
        LOG.info("Created Basalt NBD key %(identity)s (project %(project)s) for image "
                 "copies; kept in %(path)s.",
                 {"identity": psk.identity, "project": project or "(every volume)",
                  "path": path})
        return psk

    def _revoke_nbd_key(self, identity: str) -> None:
        try:
            self._api.revoke_nbd_key(identity)
        except BasaltError as err:
            LOG.warning("Could not revoke the unused Basalt NBD key %(identity)s: %(err)s; "
                        "revoke it with basalt nbd-key revoke",
                        {"identity": identity, "err": err})

    def _token_project(self) -> str | None:
        """The project of the driver's token (None: a cluster-wide token, whose
        volumes a cluster-wide NBD key opens)."""
        tid = token_id(self.configuration.basalt_api_token or "")
        if tid:
            for token in self._api.list_tokens():
                if token.get("id") == tid:
                    project = token.get("project")
                    return str(project) if project else None
        return None

    def _nbd_endpoint(self) -> nbd.Endpoint:
        """The first configured endpoint that accepts a connection (the last one
        that did is tried first); a single one is used without trying it."""
        endpoints = self._nbd_endpoints()
        if len(endpoints) == 1:
            return endpoints[0]
        if self._nbd_preferred in endpoints:
            preferred = self._nbd_preferred
            endpoints = [preferred, *(e for e in endpoints if e != preferred)]
        endpoint = nbd.first_reachable(endpoints, CONNECT_TIMEOUT)
        self._nbd_preferred = endpoint
        return endpoint

    def _run_qemu_img(self, cmd: list[str]) -> None:
        utils.execute("env", "LC_ALL=C", *cmd, run_as_root=False)

    def copy_image_to_volume(self, context: Any, volume: Any, image_service: Any,
                             image_id: str, disable_sparse: bool = False) -> None:
        """Write the image to the volume over Basalt's NBD endpoint with qemu-img
        (basalt_nbd_uri), else through Cinder's generic path."""
        if not self._nbd_endpoints():
            LOG.info("Copying image %(image)s to volume %(volume)s through Cinder's "
                     "generic path (os-brick attaches it to this host): basalt_nbd_uri "
                     "is not set.", {"image": image_id, "volume": volume.id})
            super().copy_image_to_volume(context, volume, image_service, image_id,
                                         disable_sparse=disable_sparse)
            return
        self._copy_image_over_nbd(context, volume, image_service, image_id, disable_sparse)

    def copy_image_to_encrypted_volume(self, context: Any, volume: Any, image_service: Any,
                                       image_id: str, disable_sparse: bool = False) -> None:
        """A volume Cinder encrypts (LUKS, a volume type's encryption): Cinder's
        generic path, whose encryptor formats the volume as it is attached."""
        LOG.info("Copying image %(image)s to volume %(volume)s, which Cinder encrypts, "
                 "through Cinder's generic path (os-brick and its encryptor).",
                 {"image": image_id, "volume": volume.id})
        super().copy_image_to_encrypted_volume(context, volume, image_service, image_id,
                                               disable_sparse=disable_sparse)

    def _copy_image_over_nbd(self, context: Any, volume: Any, image_service: Any,
                             image_id: str, disable_sparse: bool) -> None:
        # The steps and checks of Cinder's image_utils.fetch_to_volume_format,
        # with qemu-img writing to the volume's NBD export instead of a device.
        image_meta = image_service.show(context, image_id)
        disk_format = image_meta.get("disk_format")
        image_utils.check_image_conversion_disable(disk_format, "raw", image_id, upload=False)
        compressed = image_meta.get("container_format") == "compressed"
        if compressed and not CONF.allow_compression_on_image_upload:
            raise exception.ImageUnacceptable(
                image_id=image_id,
                reason=_("Image compression disallowed, but container_format is "
                         "compressed."))
        with image_utils.temporary_file(prefix=f"image_download_{image_id}_") as tmp:
            # Cinder's create flow has fetched and verified the image already.
            fetched = image_utils.TemporaryImages.for_image_service(image_service).get(
                context, image_id)
            path = fetched or tmp
            if not fetched:
                image_utils.fetch(context, image_service, image_id, tmp, None, None)
            if compressed:
                if not accelerator.is_gzip_compressed(path):
                    raise exception.ImageUnacceptable(
                        image_id=image_id,
                        reason=_("Unsupported compressed image format found. Only gzip "
                                 "is supported currently"))
                accelerator.ImageAccel(path, path).decompress_img(run_as_root=False)
            if image_utils.is_xenserver_format(image_meta):
                image_utils.replace_xenserver_image_with_coalesced_vhd(path)
            info = self._checked_image(path, disk_format, image_id, volume.size)
            self._write_over_nbd(volume, path, info, image_id, disable_sparse)

    @staticmethod
    def _checked_image(path: str, disk_format: str | None, image_id: str,
                       size_gb: int) -> Any:
        """qemu-img info of a downloaded image, refused (ImageUnacceptable) as
        Cinder refuses images: unsafe or unknown format, a backing or data file,
        a format other than the declared one, or larger than the volume."""
        try:
            info = image_utils.qemu_img_info(path, run_as_root=False)
        except processutils.ProcessExecutionError as e:
            raise exception.ImageUnacceptable(
                image_id=image_id, reason=_("qemu-img info: %s") % (e.stderr or e).strip()
            ) from e
        except exception.ImageUnacceptable:
            raise
        except exception.Invalid as e:  # the format inspector's safety check
            reason = getattr(e, "kwargs", {}).get("reason") or e.msg
            raise exception.ImageUnacceptable(image_id=image_id, reason=reason) from e
        if info.file_format is None:
            raise exception.ImageUnacceptable(
                image_id=image_id, reason=_("'qemu-img info' parsing failed."))
        if info.backing_file is not None:
            raise exception.ImageUnacceptable(
                image_id=image_id,
                reason=_("fmt=%(fmt)s backed by:%(backing_file)s")
                % {"fmt": info.file_format, "backing_file": info.backing_file})
        image_utils.check_virtual_size(info.virtual_size, size_gb, image_id)
        src_format = image_utils.fixup_disk_format(disk_format) if disk_format else None
        image_utils.check_image_format(path, src_format=src_format, image_id=image_id,
                                       data=info, run_as_root=False)
        return info

    def _write_over_nbd(self, volume: Any, path: str, info: Any, image_id: str,
                        disable_sparse: bool) -> None:
        name = volume_name(volume)
        try:
            endpoint = self._nbd_endpoint()
            psk = self._nbd_key()
        except (ConnectionError, exception.CinderException) as e:
            raise exception.ImageCopyFailure(reason=str(e)) from e
        start = time.monotonic()
        with nbd.credentials_dir(psk) as creds:
            cmd = nbd.write_command(path, info.file_format, endpoint, name, creds,
                                    psk.identity, disable_sparse=disable_sparse)
            try:
                self._run_qemu_img(cmd)
            except processutils.ProcessExecutionError as e:
                raise exception.ImageCopyFailure(
                    reason=_("qemu-img could not write image %(image)s to Basalt volume "
                             "%(name)s at %(endpoint)s: %(err)s")
                    % {"image": image_id, "name": name, "endpoint": endpoint,
                       "err": (e.stderr or str(e)).strip()}) from e
        LOG.info("Wrote image %(image)s (%(fmt)s, %(size).1f MiB) to Basalt volume "
                 "%(name)s over NBD at %(endpoint)s in %(secs).1f s.",
                 {"image": image_id, "fmt": info.file_format,
                  "size": (info.virtual_size or 0) / (1 << 20), "name": name,
                  "endpoint": endpoint, "secs": time.monotonic() - start})

    def copy_volume_to_image(self, context: Any, volume: Any, image_service: Any,
                             image_meta: dict[str, Any]) -> None:
        """Read the volume over Basalt's NBD endpoint into a sparse raw file and
        upload that with Cinder's upload_volume (conversion to the image's
        disk_format, compression, store), else Cinder's generic path."""
        if not self._nbd_endpoints():
            LOG.info("Copying volume %(volume)s to image %(image)s through Cinder's "
                     "generic path (os-brick attaches it to this host): basalt_nbd_uri "
                     "is not set.", {"image": image_meta.get("id"), "volume": volume.id})
            super().copy_volume_to_image(context, volume, image_service, image_meta)
            return
        image_id = image_meta["id"]
        image_utils.check_image_conversion_disable(
            image_meta.get("disk_format"), "raw", image_id, upload=True)
        name = volume_name(volume)
        try:
            endpoint = self._nbd_endpoint()
            psk = self._nbd_key()
        except ConnectionError as e:
            raise exception.VolumeBackendAPIException(data=str(e)) from e
        with image_utils.temporary_file(prefix=f"vol_upload_{volume.id}_") as tmp:
            start = time.monotonic()
            with nbd.credentials_dir(psk) as creds:
                try:
                    self._run_qemu_img(
                        nbd.read_command(endpoint, name, creds, psk.identity, tmp))
                except processutils.ProcessExecutionError as e:
                    raise exception.VolumeBackendAPIException(
                        data=_("qemu-img could not read Basalt volume %(name)s at "
                               "%(endpoint)s for image %(image)s: %(err)s")
                        % {"name": name, "endpoint": endpoint, "image": image_id,
                           "err": (e.stderr or str(e)).strip()}) from e
            LOG.info("Read Basalt volume %(name)s over NBD at %(endpoint)s in "
                     "%(secs).1f s for image %(image)s.",
                     {"name": name, "endpoint": endpoint, "image": image_id,
                      "secs": time.monotonic() - start})
            volume_utils.upload_volume(context, image_service, image_meta, tmp, volume,
                                       run_as_root=False, compress=True)

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
            info, secrets = self._attach_host(name, volume, connector)
        nguid = info["id"].replace("-", "")
        data: dict[str, Any] = {
            "target_nqn": target_nqn(name),
            "vol_uuid": info["id"],
            "portals": self._portals(),
            "ns_id": 1,
            "volume_nguid": nguid,
            "host_nqn": host_nqn,
            "discard": True,
        }
        if secrets:
            data.update(secrets)
        return {"driver_volume_type": "nvmeof", "data": data}

    def _attach_host(self, name: str, volume: Any, connector: dict[str, Any]
                     ) -> tuple[dict[str, Any], dict[str, str] | None]:
        """Attach the connector's host NQN to the volume; with the DH-HMAC-CHAP
        secrets the host must use (None: it connects without).

        A host's secrets are Basalt's per volume and host NQN, and a new pair
        replaces the old one at the host's next connect. So they are made fresh
        only when no attachment of this volume on this host is connected or
        being connected; otherwise the secrets Cinder recorded in such an
        attachment's connection info are handed out again (re-attaching without
        secrets keeps Basalt's), and without a record the attach is refused
        rather than cutting the connected host off at its next reconnect."""
        host_nqn = connector["nqn"]
        want = bool(self.configuration.basalt_nvme_dhchap)
        current = self._api.get_volume(name)
        keyed = host_nqn in (current.get("nvme_hosts_dhchap") or [])
        attached = host_nqn in (current.get("nvme_hosts") or [])
        others = self._attachments_on_host(volume, connector)
        recorded = next((s for s in map(_recorded_dhchap, others) if s), None)
        if keyed:
            if recorded:
                return self._api.attach_host(name, host_nqn), recorded
            if others:
                raise exception.VolumeBackendAPIException(
                    data=_("host %(nqn)s has DH-HMAC-CHAP secrets for Basalt volume "
                           "%(name)s that its attachment %(ids)s may use, and Cinder has "
                           "no record of them: new secrets would cut it off at its next "
                           "reconnect. Retry when that attachment is complete, or "
                           "detach it first.")
                    % {"nqn": host_nqn, "name": name,
                       "ids": ", ".join(str(a.id) for a in others)})
            if want:
                info = self._api.attach_host(name, host_nqn, dhchap=True)
                return info, _answered_dhchap(info)
            # Secrets nobody uses any more, from when basalt_nvme_dhchap was on.
            self._api.detach_host(name, host_nqn)
            return self._api.attach_host(name, host_nqn), None
        if want and attached and others:
            LOG.warning("Host %(nqn)s is connected to Basalt volume %(name)s without "
                        "DH-HMAC-CHAP (attachment %(ids)s): it keeps attaching without "
                        "until those attachments are detached.",
                        {"nqn": host_nqn, "name": name,
                         "ids": ", ".join(str(a.id) for a in others)})
            want = False
        if want:
            info = self._api.attach_host(name, host_nqn, dhchap=True)
            return info, _answered_dhchap(info)
        return self._api.attach_host(name, host_nqn), None

    @staticmethod
    def _attachments_on_host(volume: Any, connector: dict[str, Any]) -> list[Any]:
        """Cinder's attachments of the volume that are connected or being
        connected on the connector's host (by host NQN; by host name for
        attachments without a recorded connector)."""
        found = []
        for attachment in getattr(volume, "volume_attachment", None) or []:
            if attachment.attach_status not in CONNECTED_STATUSES:
                continue
            recorded = getattr(attachment, "connector", None) or {}
            if recorded.get("nqn"):
                same = recorded["nqn"] == connector["nqn"]
            else:
                same = bool(connector.get("host")) and \
                    attachment.attached_host == connector.get("host")
            if same:
                found.append(attachment)
        return found

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
        changes_type = bool(new_basalt_type) and new_basalt_type != old_type
        with self._errors(volume=volume):
            info = self._api.get_volume(name)
            # As at create: encrypted if the Cinder type says so or its
            # Basalt type is.
            type_encrypted = bool(
                changes_type and self._api.get_type(str(new_basalt_type)).get("encrypted")
            )
        wanted_encrypted = self._type_encrypted(new_type.get("id")) or type_encrypted
        reencrypt = wanted_encrypted != bool(info.get("encrypted"))
        if reencrypt and (not changes_type or type_encrypted != wanted_encrypted
                          or info.get("replicas_wanted") is not None):
            # Basalt re-encrypts a volume in place through a retype to a
            # Basalt type of the wanted encryption, on a single node.
            LOG.info("Retype of %s changes its encryption without a Basalt type that "
                     "gives it, or in a cluster: Cinder must migrate it.", volume.id)
            return False, {}
        wanted = self._type_compression(new_type.get("id"))
        if wanted is not None and wanted != (info.get("compression") or "off"):
            # A volume's own codec changes only with its Basalt type.
            LOG.info("Retype of %s changes basalt:compression: Cinder must migrate it.",
                     volume.id)
            return False, {}
        if new_replicas != old_replicas and new_basalt_type == old_type:
            # Replica count changes go through a Basalt type (its placement
            # machinery); a bare basalt:replicas change needs a migration.
            LOG.info("Retype of %s changes basalt:replicas without a Basalt type: "
                     "Cinder must migrate it.", volume.id)
            return False, {}
        with self._errors(volume=volume):
            if changes_type:
                retyped = self._api.retype(name, str(new_basalt_type))
                if retyped.get("reencrypting"):
                    self._finish_reencryption(name, int(retyped["size_bytes"]))
            if new_qos != old_qos:
                self._api.set_qos(name, new_qos)
        return True, {}

    def _finish_reencryption(self, name: str, size: int) -> None:
        """Rewrites, online, what a retyped volume still reads under its old
        key (Basalt's flatten of a re-encryption), a window at a time, as
        ``basalt volume retype`` does without ``--rate`` (unpaced: a rewrite
        beside client I/O, which goes on)."""
        LOG.info("Re-encrypting Basalt volume %s (%d bytes) in place.", name, size)
        offset = 0
        while offset < size:
            length = min(REENCRYPTION_WINDOW, size - offset)
            self._api.flatten(name, offset, length)
            offset += length
        if self._api.get_volume(name).get("reencrypting"):
            raise exception.VolumeDriverException(
                message=_("Basalt volume %s still reads blocks under its old key after "
                          "re-encryption; run basalt volume flatten %s") % (name, name))
        LOG.info("Basalt volume %s re-encrypted.", name)

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

