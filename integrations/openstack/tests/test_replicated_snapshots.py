"""Snapshots of replicated volumes, through Cinder's VolumeManager and the driver,
on the two-node cluster run-tests.sh started: a volume whose Cinder type asks for
two replicas (basalt:replicas=2) is snapshotted, reverted (Basalt keeps its
size: it reads zeros past the snapshot's end) and its snapshot deleted, each
taken at one point on both replicas; volumes from its snapshots and clones of it
are refused by Basalt, which the driver raises as NotSupportedOperation with
Basalt's message, leaving nothing behind.

Data is written and checked over NBD on node n0; each node's own copy is
compared through its API (local-digest, one per replica)."""

from __future__ import annotations

import time
from typing import Any

from cinder import exception, objects
from cinder.objects import fields

from basalt_cinder import driver as basalt_driver
from basalt_cinder.client import BasaltClient, BasaltError, quote
from conftest import BasaltManagerTestCase, GiB, env, has_pattern, write_pattern

A, B, C = 0xA1, 0xB2, 0xC3
REPLICAS = 2


class ReplicatedSnapshotTest(BasaltManagerTestCase):
    api_url_env = "BASALT_CLUSTER_API_URL"
    token_env = "BASALT_CLUSTER_TOKEN"
    admin_token_env = "BASALT_CLUSTER_ADMIN_TOKEN"

    def setUp(self) -> None:
        super().setUp()
        self.client = self.basalt_admin()
        self.nbd_socket = env("BASALT_CLUSTER_NBD_SOCKET")

    # -- checks on the cluster ------------------------------------------------

    def write(self, export: str, byte: int, offset: int = 0) -> None:
        write_pattern(export, byte, offset, socket=self.nbd_socket)

    def reads(self, export: str, byte: int, offset: int = 0) -> bool:
        return has_pattern(export, byte, offset, socket=self.nbd_socket)

    def exists(self, name: str) -> bool:
        try:
            self.client.get_volume(name)
        except BasaltError as err:
            if err.status == 404:
                return False
            raise
        return True

    def snapshot_names(self, name: str) -> list[str]:
        return [s["name"] for s in self.client.list_snapshots(name)]

    def wait_in_sync(self, name: str, timeout: float = 60.0) -> dict[str, Any]:
        """The volume's info once both replicas are placed and in sync."""
        deadline = time.monotonic() + timeout
        while True:
            info = self.client.get_volume(name)
            replicas = info.get("replicas") or []
            if len(replicas) == REPLICAS and all(r["state"] == "in-sync" for r in replicas):
                return info
            if time.monotonic() > deadline:
                self.fail(f"{name}'s replicas are not in sync after {timeout:.0f} s: {replicas}")
            time.sleep(0.2)

    def node_token(self) -> str:
        """A cluster-wide admin token (kept in the cluster's catalog, so every
        node accepts it, unlike a node's own api-token), revoked after the test."""
        if not hasattr(self, "_node_token"):
            made = self.client.request("POST", "/api/v1/tokens", {
                "role": "admin", "description": "test_replicated_snapshots"})
            self.addCleanup(self.client.request, "DELETE",
                            f"/api/v1/tokens/{quote(made['id'])}")
            self._node_token = str(made["token"])
        return self._node_token

    def digests(self, export: str) -> dict[str, tuple[int, int]]:
        """(CRC32C, size) of each node's own copy of ``export`` (a volume or
        ``VOLUME@SNAPSHOT``), asked of that node."""
        out: dict[str, tuple[int, int]] = {}
        for node in self.client.nodes():
            api = BasaltClient([f"http://{node['api_addr']}"], self.node_token())
            d = api.request("GET", f"/api/v1/volumes/{quote(export)}/local-digest")
            out[node["name"]] = (int(d["crc32c"]), int(d["size_bytes"]))
        return out

    def assert_same_on_every_replica(self, export: str) -> tuple[int, int]:
        d = self.digests(export)
        self.assertEqual(REPLICAS, len(d), d)
        self.assertEqual(1, len(set(d.values())), f"{export} differs between replicas: {d}")
        return next(iter(d.values()))

    # -- Cinder steps -----------------------------------------------------------

    def replicated_volume(self) -> tuple[objects.Volume, str]:
        vtype = self.volume_type({basalt_driver.EXTRA_SPEC_REPLICAS: str(REPLICAS)})
        vol = self.create(size=1, volume_type_id=vtype.id)
        self.assertEqual("available", vol.status)
        name = basalt_driver.volume_name(vol)
        info = self.wait_in_sync(name)
        self.assertEqual(REPLICAS, info["replicas_wanted"])
        self.assertEqual(1 * GiB, info["size_bytes"])
        return vol, name

    def delete_snapshot(self, name: str, snap: objects.Snapshot) -> None:
        self.manager.delete_snapshot(self.context, snap)
        gone = objects.Snapshot.get_by_id(self.context.elevated(read_deleted="yes"), snap.id)
        self.assertEqual("deleted", gone.status)
        self.assertNotIn(basalt_driver.snapshot_name(snap), self.snapshot_names(name))

    # -- the test ---------------------------------------------------------------

    def test_snapshot_revert_delete_and_no_clones(self) -> None:
        vol, name = self.replicated_volume()
        self.write(name, A)

        # A snapshot: Basalt lists it, with the volume's size, the same on both
        # replicas and readable as it was taken.
        snap = self.snapshot(vol)
        self.assertEqual(fields.SnapshotStatus.AVAILABLE, snap.status)
        snap_name = basalt_driver.snapshot_name(snap)
        self.assertEqual([snap_name], self.snapshot_names(name))
        detail = self.client.get_snapshot(name, snap_name)
        self.assertEqual(snap_name, detail["name"])
        self.assertEqual(1 * GiB, detail["size_bytes"])
        taken = self.assert_same_on_every_replica(f"{name}@{snap_name}")
        self.assertEqual(1 * GiB, taken[1])
        self.write(name, B)  # the volume moves on; the snapshot keeps A
        self.assertTrue(self.reads(f"{name}@{snap_name}", A))
        self.assertTrue(self.reads(name, B))

        # Extend, then revert through the manager (which takes and deletes its
        # own backup snapshot around the driver's revert): A again, and past
        # the snapshot's end zeros; Basalt keeps a replicated volume's size.
        vol.status = "extending"
        vol.save()
        self.manager.extend_volume(self.context, vol, 2, None)
        vol.refresh()
        self.assertEqual(2, vol.size)
        self.assertEqual(2 * GiB, self.wait_in_sync(name)["size_bytes"])
        self.write(name, C, offset=GiB)
        self.revert(vol, snap)
        self.assertEqual(2, vol.size)
        self.assertEqual(2 * GiB, self.wait_in_sync(name)["size_bytes"])
        self.assertTrue(self.reads(name, A))
        self.assertTrue(self.reads(name, 0, offset=GiB))
        self.assertEqual([snap_name], self.snapshot_names(name))
        reverted = self.assert_same_on_every_replica(name)
        self.assertEqual(2 * GiB, reverted[1])

        # The driver's revert alone, again.
        self.write(name, B)
        self.driver.revert_to_snapshot(self.context, vol, snap)
        self.assertTrue(self.reads(name, A))
        self.assertEqual(2 * GiB, self.client.get_volume(name)["size_bytes"])
        self.assertEqual(reverted, self.assert_same_on_every_replica(name))

        # Deleting the snapshot: gone from Basalt.
        self.delete_snapshot(name, snap)
        self.assertFalse(bool(self.client.get_volume(name).get("snapshots")))
        self.assertTrue(self.reads(name, A))

        # A second snapshot: no volume from it, and no clone of the volume.
        # Basalt refuses both before making anything; the driver raises
        # NotSupportedOperation with Basalt's message.
        snap2 = self.snapshot(vol)
        self.assertEqual(fields.SnapshotStatus.AVAILABLE, snap2.status)
        snap2_name = basalt_driver.snapshot_name(snap2)
        self.assertEqual([snap2_name], self.snapshot_names(name))
        from_snap = self.new_volume(size=2, snapshot_id=snap2.id,
                                    volume_type_id=vol.volume_type_id)
        fs_name = basalt_driver.volume_name(from_snap)
        err = self.assertRaises(exception.NotSupportedOperation,
                                self.driver.create_volume_from_snapshot, from_snap, snap2)
        self.assertIn("clones in a cluster are not supported", str(err))
        self.assertFalse(self.exists(fs_name))
        # Through the manager: the volume ends in error.
        self.assertRaises(exception.NotSupportedOperation,
                          self.manager.create_volume, self.context, from_snap)
        from_snap.refresh()
        self.assertEqual("error", from_snap.status)
        self.assertFalse(self.exists(fs_name))

        clone = self.new_volume(size=2, source_volid=vol.id,
                                volume_type_id=vol.volume_type_id)
        cl_name = basalt_driver.volume_name(clone)
        err = self.assertRaises(exception.NotSupportedOperation,
                                self.driver.create_cloned_volume, clone, vol)
        self.assertIn("not supported", str(err))
        self.assertRaises(exception.NotSupportedOperation,
                          self.manager.create_volume, self.context, clone)
        clone.refresh()
        self.assertEqual("error", clone.status)
        self.assertFalse(self.exists(cl_name))
        # No clone-* snapshot was left on the source.
        self.assertEqual([snap2_name], self.snapshot_names(name))

        self.delete_snapshot(name, snap2)
        self.assertFalse(bool(self.client.get_volume(name).get("snapshots")))
        self.assertTrue(self.reads(name, A))
        vol.status = "deleting"
        vol.save()
        self.manager.delete_volume(self.context, vol)
        self.assertFalse(self.exists(name))
