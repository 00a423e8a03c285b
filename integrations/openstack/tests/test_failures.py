"""Failure injection: each gives the right Cinder exception, with Basalt's
message, and leaves nothing behind on Basalt."""

from __future__ import annotations

import socket

from cinder import exception

from basalt_cinder import driver as basalt_driver
from basalt_cinder.client import BasaltClient
from conftest import BasaltManagerTestCase, admin, env, exists, has_pattern, write_pattern


def dead_url() -> str:
    """A loopback URL nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


class FailureTest(BasaltManagerTestCase):
    def set_quota(self, **quotas: object) -> None:
        admin().request("PUT", f"/api/v1/projects/{env('BASALT_PROJECT')}/quotas", quotas)
        self.addCleanup(admin().request, "PUT",
                        f"/api/v1/projects/{env('BASALT_PROJECT')}/quotas",
                        {k: None for k in quotas})

    def test_api_unreachable(self) -> None:
        self.driver.client = BasaltClient([dead_url()], env("BASALT_TOKEN"))
        vol = self.new_volume()
        err = self.assertRaises(exception.VolumeBackendAPIException,
                                self.driver.create_volume, vol)
        self.assertIn("unreachable", str(err))
        self.assertRaises(exception.VolumeBackendAPIException,
                          self.driver.get_volume_stats, True)
        self.assertFalse(exists(basalt_driver.volume_name(vol)))
        # Through the manager: the volume ends in error, nothing on Basalt.
        self.assertRaises(exception.VolumeBackendAPIException,
                          self.manager.create_volume, self.context, vol)
        vol.refresh()
        self.assertEqual("error", vol.status)
        self.assertFalse(exists(basalt_driver.volume_name(vol)))

    def test_second_url_is_used_when_the_first_is_down(self) -> None:
        self.driver.client = BasaltClient([dead_url(), env("BASALT_API_URL")],
                                          env("BASALT_TOKEN"))
        vol = self.create()
        self.assertEqual("available", vol.status)
        self.assertTrue(exists(basalt_driver.volume_name(vol)))
        self.assertEqual(1, self.driver.client._preferred)

    def test_capacity_quota(self) -> None:
        self.set_quota(capacity_bytes=1 << 30)
        vol = self.new_volume(size=2)
        err = self.assertRaises(exception.VolumeSizeExceedsAvailableQuota,
                                self.driver.create_volume, vol)
        self.assertIn("quota exceeded", str(err))
        self.assertIn("capacity", str(err))
        self.assertFalse(exists(basalt_driver.volume_name(vol)))

    def test_volume_count_quota(self) -> None:
        before = len(admin().list_volumes())
        self.set_quota(volumes=before)
        vol = self.new_volume(size=1)
        err = self.assertRaises(exception.VolumeLimitExceeded, self.driver.create_volume, vol)
        self.assertIn("of volumes", str(err))
        self.assertFalse(exists(basalt_driver.volume_name(vol)))

    def test_snapshot_quota(self) -> None:
        vol = self.create()
        self.set_quota(snapshots=0)
        from cinder.tests.unit import utils as tests_utils

        snap = tests_utils.create_snapshot(self.context, vol.id, status="creating")
        err = self.assertRaises(exception.SnapshotLimitExceeded,
                                self.driver.create_snapshot, snap)
        self.assertIn("of snapshots", str(err))
        self.assertFalse(bool(admin().get_volume(basalt_driver.volume_name(vol)).get("snapshots")))

    def test_snapshot_with_clones_is_busy(self) -> None:
        vol = self.create()
        name = basalt_driver.volume_name(vol)
        write_pattern(name, 0x5A)
        snap = self.snapshot(vol)
        child = self.create(snapshot_id=snap.id)
        err = self.assertRaises(exception.SnapshotIsBusy, self.driver.delete_snapshot, snap)
        self.assertIn("has clones", str(err))
        self.assertIn(basalt_driver.volume_name(child), str(err))
        self.assertIn(basalt_driver.snapshot_name(snap),
                      admin().get_volume(name)["snapshots"])
        self.assertTrue(has_pattern(basalt_driver.volume_name(child), 0x5A))

    def test_qos_refused_for_a_project_token_leaves_no_volume(self) -> None:
        vtype = self.volume_type(qos={"total_iops_sec": "500"})
        vol = self.new_volume(volume_type_id=vtype.id)
        err = self.assertRaises(exception.VolumeBackendAPIException,
                                self.driver.create_volume, vol)
        self.assertIn("403", str(err))
        self.assertFalse(exists(basalt_driver.volume_name(vol)))

    def test_invalid_qos_key(self) -> None:
        vtype = self.volume_type(qos={"total_iops_sec_per_gb_min": "5"})
        vol = self.new_volume(volume_type_id=vtype.id)
        self.assertRaises(exception.InvalidQoSSpecs, self.driver.create_volume, vol)
        self.assertFalse(exists(basalt_driver.volume_name(vol)))

    def test_missing_volume(self) -> None:
        vol = self.new_volume()
        err = self.assertRaises(exception.VolumeNotFound, self.driver.extend_volume, vol, 2)
        self.assertIn("no volume", str(err).lower())

    def test_connector_without_nqn(self) -> None:
        vol = self.create()
        self.assertRaises(exception.InvalidConnectorException,
                          self.driver.initialize_connection, vol, {"host": "h"})
