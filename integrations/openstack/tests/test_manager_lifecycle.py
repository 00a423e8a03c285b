"""The driver driven by Cinder's real VolumeManager against a live Basalt server:
Basalt's state is checked through its API after each step, data over NBD."""

from __future__ import annotations

import time

from cinder import exception, objects
from cinder.objects import fields

from basalt_cinder import driver as basalt_driver
from conftest import BasaltManagerTestCase, GiB, admin, exists, has_pattern, write_pattern

A, B, C = 0xA1, 0xB2, 0xC3


class ManagerLifecycleTest(BasaltManagerTestCase):
    def test_full_lifecycle(self) -> None:
        timings: dict[str, float] = {}
        client = admin()

        t = time.monotonic()
        vol = self.create(size=1)
        timings["create"] = time.monotonic() - t
        self.assertEqual("available", vol.status)
        name = basalt_driver.volume_name(vol)
        self.assertEqual(f"volume-{vol.id}", name)
        info = client.get_volume(name)
        self.assertEqual(1 * GiB, info["size_bytes"])
        self.assertEqual("cinder-test", info.get("project"))

        write_pattern(name, A)
        t = time.monotonic()
        snap = self.snapshot(vol)
        timings["snapshot"] = time.monotonic() - t
        self.assertEqual(fields.SnapshotStatus.AVAILABLE, snap.status)
        snap_name = basalt_driver.snapshot_name(snap)
        self.assertEqual(snap_name, client.get_snapshot(name, snap_name)["name"])
        write_pattern(name, B)  # the volume moves on; the snapshot keeps A
        self.assertTrue(has_pattern(f"{name}@{snap_name}", A))
        self.assertTrue(has_pattern(name, B))

        # A volume from the snapshot, larger than it: A, then zeros.
        t = time.monotonic()
        from_snap = self.create(size=2, snapshot_id=snap.id)
        timings["create-from-snapshot"] = time.monotonic() - t
        self.assertEqual("available", from_snap.status)
        fs_name = basalt_driver.volume_name(from_snap)
        fs_info = client.get_volume(fs_name)
        self.assertEqual(2 * GiB, fs_info["size_bytes"])
        self.assertEqual(f"{name}@{snap_name}", fs_info["clone_of"])
        self.assertTrue(has_pattern(fs_name, A))
        self.assertTrue(has_pattern(fs_name, 0, offset=GiB))

        # A clone of the volume: B.
        t = time.monotonic()
        clone = self.create(size=1, source_volid=vol.id)
        timings["clone"] = time.monotonic() - t
        self.assertEqual("available", clone.status)
        cl_name = basalt_driver.volume_name(clone)
        self.assertTrue(has_pattern(cl_name, B))
        write_pattern(cl_name, C)
        self.assertTrue(has_pattern(name, B))  # the source is untouched

        # Deleting the Cinder snapshot while a volume reads it: refused,
        # and Cinder keeps it available.
        self.manager.delete_snapshot(self.context, snap)
        snap.refresh()
        self.assertEqual(fields.SnapshotStatus.AVAILABLE, snap.status)
        self.assertIn(snap_name, client.get_volume(name)["snapshots"])

        # Extend, then revert: the data is A again, the size stays Cinder's.
        vol.status = "extending"
        vol.save()
        self.manager.extend_volume(self.context, vol, 3, None)
        vol.refresh()
        self.assertEqual(3, vol.size)
        self.assertEqual(3 * GiB, client.get_volume(name)["size_bytes"])
        write_pattern(name, C, offset=2 * GiB)
        self.revert(vol, snap)
        self.assertTrue(has_pattern(name, A))
        self.assertTrue(has_pattern(name, 0, offset=2 * GiB))
        self.assertEqual(3 * GiB, client.get_volume(name)["size_bytes"])
        # The manager's temporary backup snapshot is gone again.
        self.assertEqual(sorted([snap_name, f"clone-{cl_name}"]),
                         sorted(client.get_volume(name)["snapshots"]))

        # Attach over NVMe/TCP through the manager, then detach.
        connector = {"host": "compute-1", "nqn": "nqn.2014-08.org.nvmexpress:uuid:"
                     "5e2d4e21-3b3c-4f4e-9f7e-0c1d2e3f4a5b", "multipath": True}
        conn = self.manager.initialize_connection(self.context, vol, connector)
        self.assertEqual("nvmeof", conn["driver_volume_type"])
        self.assertEqual(f"nqn.2026-11.io.basalt:volume:{name}", conn["data"]["target_nqn"])
        self.assertIn(connector["nqn"], client.get_volume(name)["nvme_hosts"])
        self.manager.terminate_connection(self.context, vol.id, connector)
        self.assertNotIn(connector["nqn"], client.get_volume(name).get("nvme_hosts") or [])

        # Deleting the volume while it has a Cinder snapshot: VolumeIsBusy,
        # which Cinder's manager turns back into "available"; nothing changed.
        vol.status = "deleting"
        vol.save()
        self.manager.delete_volume(self.context, vol)
        vol.refresh()
        self.assertEqual("available", vol.status)
        self.assertTrue(exists(name))
        self.assertEqual(f"{name}@clone-{cl_name}", client.get_volume(cl_name)["clone_of"])

        # Cinder's order: the volume from the snapshot, then the snapshot.
        self.manager.delete_volume(self.context, from_snap)
        self.assertFalse(exists(fs_name))
        # After the revert, the clone's layers still read through the snapshot
        # (Basalt keeps a branch point): SnapshotIsBusy, Cinder keeps it.
        self.assertRaises(exception.SnapshotIsBusy, self.driver.delete_snapshot, snap)
        self.manager.delete_volume(self.context, clone)
        self.assertFalse(exists(cl_name))
        self.manager.delete_snapshot(self.context, snap)
        gone = objects.Snapshot.get_by_id(self.context.elevated(read_deleted="yes"), snap.id)
        self.assertEqual("deleted", gone.status)
        self.assertFalse(bool(client.get_volume(name).get("snapshots")))
        vol.status = "deleting"
        vol.save()
        self.manager.delete_volume(self.context, vol)
        self.assertFalse(exists(name))
        print("manager timings (s):", {k: round(v, 3) for k, v in timings.items()})

    def test_delete_source_flattens_its_clone(self) -> None:
        client = admin()
        vol = self.create(size=1)
        name = basalt_driver.volume_name(vol)
        write_pattern(name, A)
        clone = self.create(size=1, source_volid=vol.id)
        cl_name = basalt_driver.volume_name(clone)
        self.assertEqual(f"{name}@clone-{cl_name}", client.get_volume(cl_name)["clone_of"])
        self.manager.delete_volume(self.context, vol)
        self.assertFalse(exists(name))
        self.assertNotIn("clone_of", client.get_volume(cl_name))
        self.assertTrue(has_pattern(cl_name, A))
        self.manager.delete_volume(self.context, clone)
        self.assertFalse(exists(cl_name))

    def test_delete_clone_drops_its_source_snapshot(self) -> None:
        client = admin()
        vol = self.create(size=1)
        name = basalt_driver.volume_name(vol)
        clone = self.create(size=1, source_volid=vol.id)
        cl_name = basalt_driver.volume_name(clone)
        self.assertEqual([f"clone-{cl_name}"], client.get_volume(name)["snapshots"])
        self.manager.delete_volume(self.context, clone)
        self.assertFalse(exists(cl_name))
        self.assertFalse(bool(client.get_volume(name).get("snapshots")))
        self.manager.delete_volume(self.context, vol)
        self.assertFalse(exists(name))

    def test_delete_missing_volume_and_snapshot_succeed(self) -> None:
        vol = self.create(size=1)
        snap = self.snapshot(vol)
        name = basalt_driver.volume_name(vol)
        admin().delete_snapshot(name, basalt_driver.snapshot_name(snap))
        self.manager.delete_snapshot(self.context, snap)
        self.assertRaises(exception.SnapshotNotFound, objects.Snapshot.get_by_id,
                          self.context, snap.id)
        admin().delete_volume(name)
        self.manager.delete_volume(self.context, vol)
        self.assertRaises(exception.VolumeNotFound, objects.Volume.get_by_id,
                          self.context, vol.id)

    def test_stats_are_basalts(self) -> None:
        stats = self.driver.get_volume_stats(refresh=True)
        status = admin().status()
        pool = stats["pools"][0]
        self.assertEqual("basalt-test", stats["volume_backend_name"])
        self.assertEqual("NVMe-TCP", stats["storage_protocol"])
        self.assertAlmostEqual(status["capacity_bytes"] / GiB, pool["total_capacity_gb"], 1)
        self.assertAlmostEqual(status["provisioned_bytes"] / GiB,
                               pool["provisioned_capacity_gb"], 1)
        self.assertEqual(status["overcommit_ratio"], pool["max_over_subscription_ratio"])
        self.assertTrue(pool["thin_provisioning_support"])
        self.assertTrue(pool["QoS_support"])
        self.assertTrue(pool["multiattach"])  # tests/test_multiattach.py
        # replication_count: tests/test_replication_count.py
        # The manager's periodic report carries them to the scheduler.
        self.manager._report_driver_status(self.context)
        self.assertIn("basalt-test", str(self.manager.last_capabilities))
