"""Shared helpers: the live Basalt server and three-node cluster run-tests.sh
started, NBD data checks, and a Cinder unit-test base (sqlite database,
in-process messaging) whose VolumeManager runs BasaltVolumeDriver.

Nothing here replaces Basalt: every call goes to the real server, and every
check of Basalt's state is made through its REST API or over NBD.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from typing import Any

from cinder import context, objects
from cinder.objects import fields
from cinder.tests.unit import test
from cinder.tests.unit import utils as tests_utils
from oslo_config import cfg
from oslo_utils import importutils

from basalt_cinder import driver as basalt_driver
from basalt_cinder.client import BasaltClient, BasaltError

CONF = cfg.CONF
# The backend's options, as cinder.conf's [backend_defaults] would hold them
# (the driver registers its options there, like in-tree drivers).
BACKEND = "backend_defaults"

GiB = 1024**3


def env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise RuntimeError(f"{name} is not set: run these tests through run-tests.sh")
    return value


def admin() -> BasaltClient:
    """A cluster-admin client, for checks and for setting up quotas and types."""
    return BasaltClient([env("BASALT_API_URL")], env("BASALT_ADMIN_TOKEN"))


def exists(name: str) -> bool:
    try:
        admin().get_volume(name)
    except BasaltError as err:
        if err.status == 404:
            return False
        raise
    return True


def nbd_uri(export: str, socket: str | None = None) -> str:
    """The NBD URI of ``export`` on the single server's socket, or on ``socket``
    (a cluster node's: BASALT_CLUSTER_NBD_SOCKET)."""
    return f"nbd+unix:///{export}?socket={socket or env('BASALT_NBD_SOCKET')}"


def qemu_io(export: str, command: str, read_only: bool = False,
            socket: str | None = None) -> str:
    args = ["qemu-io", "-f", "raw"]
    if read_only:
        args.append("-r")
    args += ["-c", command, nbd_uri(export, socket)]
    out = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)
    text = out.stdout + out.stderr
    if out.returncode != 0 or "failed" in text.lower() or "error" in text.lower():
        raise AssertionError(f"qemu-io {command!r} on {export}: rc={out.returncode} {text}")
    return text


def write_pattern(export: str, byte: int, offset: int = 0, length: int = 1 << 20,
                  socket: str | None = None) -> None:
    qemu_io(export, f"write -P {byte:#x} {offset} {length}", socket=socket)


def has_pattern(export: str, byte: int, offset: int = 0, length: int = 1 << 20,
                socket: str | None = None) -> bool:
    args = ["qemu-io", "-f", "raw", "-r", "-c", f"read -P {byte:#x} {offset} {length}",
            nbd_uri(export, socket)]
    out = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)
    text = out.stdout + out.stderr
    if "Pattern verification failed" in text:
        return False
    if out.returncode != 0 or "read " not in text:
        raise AssertionError(f"qemu-io read on {export}: rc={out.returncode} {text}")
    return True


class CinderTestCase(test.TestCase):
    """Cinder's unit-test base, made to run under pytest: Cinder deletes a test's
    attributes after it, among them the method pytest set and then deletes."""

    def _common_cleanup(self) -> None:
        kept = {k: v for k, v in self.__dict__.items() if k.startswith("test")}
        super()._common_cleanup()
        self.__dict__.update(kept)


class BasaltManagerTestCase(CinderTestCase):
    """Cinder's unit-test base with a real VolumeManager running our driver."""

    api_url_env = "BASALT_API_URL"
    token_env = "BASALT_TOKEN"
    #: The cluster-admin token of the same server, for checks and cleanup.
    admin_token_env = "BASALT_ADMIN_TOKEN"

    def setUp(self) -> None:
        super().setUp()
        self.flags(
            group=BACKEND,
            volume_driver="basalt_cinder.driver.BasaltVolumeDriver",
            basalt_api_url=[env(self.api_url_env)],
            basalt_api_token=env(self.token_env),
            basalt_nvme_portals=[env("BASALT_NVME")],
            volume_backend_name="basalt-test",
        )
        self.context = context.get_admin_context()
        self.context.user_id = "basalt-test-user"
        self.context.project_id = "basalt-test-project"
        self.manager = importutils.import_object(CONF.volume_manager)
        self.driver: basalt_driver.BasaltVolumeDriver = self.manager.driver
        self.driver.do_setup(self.context)
        self.driver.check_for_setup_error()
        self.driver.set_initialized()
        self.manager.stats = {"allocated_capacity_gb": 0, "pools": {}}
        self.manager.message_api = _Messages()
        self._volumes: list[str] = []

    # -- Cinder objects ----------------------------------------------------

    def volume_type(self, extra_specs: dict[str, str] | None = None,
                    qos: dict[str, str] | None = None, consumer: str = "back-end") -> Any:
        name = f"t-{uuid.uuid4().hex[:8]}"
        vtype = tests_utils.create_volume_type(
            self.context, name=name, extra_specs=extra_specs or {}
        )
        if qos is not None:
            from cinder.volume import qos_specs

            spec = qos_specs.create(self.context, f"q-{name}", {"consumer": consumer, **qos})
            qos_specs.associate_qos_with_type(self.context, spec.id, vtype.id)
        return vtype

    def revert(self, vol: objects.Volume, snap: objects.Snapshot) -> None:
        """Reverts `vol` to `snap` through the manager, with the statuses the
        API sets first, and checks both end available."""
        vol.status = "reverting"
        vol.save()
        snap.status = fields.SnapshotStatus.RESTORING
        snap.save()
        self.manager.revert_to_snapshot(self.context, vol, snap)
        vol.refresh()
        snap.refresh()
        self.assertEqual("available", vol.status)
        self.assertEqual(fields.SnapshotStatus.AVAILABLE, snap.status)

    def new_volume(self, size: int = 1, **kwargs: Any) -> objects.Volume:
        kwargs.setdefault("volume_type_id", self.volume_type().id)
        volume = tests_utils.create_volume(
            self.context, size=size, status="creating", host=CONF.host, **kwargs
        )
        self.addCleanup(self._forget, volume)
        return volume

    def create(self, size: int = 1, **kwargs: Any) -> objects.Volume:
        volume = self.new_volume(size, **kwargs)
        self.manager.create_volume(self.context, volume)
        volume.refresh()
        return volume

    def snapshot(self, volume: objects.Volume) -> objects.Snapshot:
        snap = tests_utils.create_snapshot(self.context, volume.id, status="creating")
        self.manager.create_snapshot(self.context, snap)
        snap.refresh()
        return snap

    def basalt_admin(self) -> BasaltClient:
        """A cluster-admin client of the server the driver uses."""
        return BasaltClient([env(self.api_url_env)], env(self.admin_token_env))

    def _forget(self, volume: objects.Volume) -> None:
        """Test cleanup: delete what a failed test left on Basalt (admin)."""
        name = basalt_driver.volume_name(volume)
        client = self.basalt_admin()
        try:
            info = client.get_volume(name)
        except BasaltError:
            return
        for snap in reversed(info.get("snapshots") or []):
            try:
                detail = client.get_snapshot(name, snap)
                for clone in detail.get("clones") or []:
                    client.delete_volume(clone, force=True)
                client.delete_snapshot(name, snap)
            except BasaltError:
                pass
        try:
            client.delete_volume(name, force=True)
        except BasaltError:
            pass


class _Messages:
    """Cinder's user-message API writes to the DB; record instead."""

    def __init__(self) -> None:
        self.created: list[tuple[Any, ...]] = []

    def create(self, *args: Any, **kwargs: Any) -> None:
        self.created.append(args)

    def create_from_request_context(self, *args: Any, **kwargs: Any) -> None:
        self.created.append(args)
