"""Snapshots and clones of replicated volumes, through Cinder's VolumeManager and
the driver, on the three-node cluster run-tests.sh started.

A volume whose Cinder type asks for three replicas (basalt:replicas=3, one on
every node) is snapshotted, reverted (Basalt keeps its size: it reads zeros
past the snapshot's end) and its snapshot deleted, each taken at one point on
all three replicas. A volume from its snapshot and a clone of it get three
replicas too, on the nodes holding the source snapshot, each reading the
source as it was and diverging on write without touching it. The snapshot
stays while the volume from it reads it (SnapshotIsBusy), until that volume is
flattened through Basalt's API as an operator would; deleting the source then
has the driver flatten the clone through the cluster, with a snapshot of its
own (which takes the source's blocks). All keep their data, identical on all
three replicas, and nothing is left behind.

The same clone scenario runs with two replicas (basalt:replicas=2) on the
three nodes, where placement is a choice: the source sits on two of them, the
volume from its snapshot and its clone on those same two, and the third node
holds no copy of any of them.

Data is written and checked over NBD on node n0, which serves every volume,
holding a replica or not; a snapshot is read on a node holding a replica (n0
if it does), the only nodes that export it. Each node's own copy is compared
through its API (local-digest, one per replica; a node without a replica must
answer 404). Each test starts once no node holds a replica any more."""

from __future__ import annotations

import time
from typing import Any

from cinder import objects
from cinder.objects import fields

from basalt_cinder import driver as basalt_driver
from basalt_cinder.client import BasaltClient, BasaltError, quote
from conftest import BasaltManagerTestCase, GiB, env, has_pattern, write_pattern

A, B, C = 0xA1, 0xB2, 0xC3
#: Replicas of the volumes of ReplicatedSnapshotTest: one on each of the
#: cluster's three nodes.
REPLICAS = 3


class ReplicatedVolumeTestCase(BasaltManagerTestCase):
    """The cluster, checks of its replicas and the clone scenario; no tests."""

    #: basalt:replicas of the volumes' Cinder type.
    replicas = REPLICAS

    api_url_env = "BASALT_CLUSTER_API_URL"
    token_env = "BASALT_CLUSTER_TOKEN"
    admin_token_env = "BASALT_CLUSTER_ADMIN_TOKEN"

    def setUp(self) -> None:
        super().setUp()
        self.client = self.basalt_admin()
        self.nbd_socket = env("BASALT_CLUSTER_NBD_SOCKET")  # n0's
        self.nbd_sockets = dict(item.split("=", 1)
                                for item in env("BASALT_CLUSTER_NBD_SOCKETS").split(","))
        self.wait_no_replicas()

    # -- checks on the cluster ------------------------------------------------

    def wait_no_replicas(self, timeout: float = 30.0) -> None:
        """Until no node holds a replica: the coordinator drops a deleted
        volume's placement a moment after the delete, and until then it
        counts against the nodes' provisioning limit (each node's store is
        sized for one test's volumes)."""
        deadline = time.monotonic() + timeout
        while True:
            held = {n["name"]: n["replicas"] for n in self.client.nodes() if n["replicas"]}
            if not held:
                return
            if time.monotonic() > deadline:
                self.fail(f"the cluster's nodes still hold replicas after {timeout:.0f} s: "
                          f"{held} ({[v['name'] for v in self.client.list_volumes()]})")
            time.sleep(0.1)

    def socket_for(self, export: str) -> str:
        """n0's NBD socket for a volume (every node serves every volume); for
        ``VOLUME@SNAPSHOT`` that of a node holding a replica of VOLUME (n0 if
        it does), the only nodes that export the snapshot."""
        if "@" not in export:
            return self.nbd_socket
        holders = self.replica_nodes(self.client.get_volume(export.split("@")[0]))
        node = "n0" if "n0" in holders else min(holders)
        return self.nbd_sockets[node]

    def write(self, export: str, byte: int, offset: int = 0) -> None:
        write_pattern(export, byte, offset, socket=self.socket_for(export))

    def reads(self, export: str, byte: int, offset: int = 0) -> bool:
        return has_pattern(export, byte, offset, socket=self.socket_for(export))

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
        """The volume's info once its replicas are all placed and in sync."""
        deadline = time.monotonic() + timeout
        while True:
            info = self.client.get_volume(name)
            replicas = info.get("replicas") or []
            if len(replicas) == self.replicas and all(r["state"] == "in-sync" for r in replicas):
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
        ``VOLUME@SNAPSHOT``), asked of every node of the cluster; a node that
        has none (404) is left out."""
        out: dict[str, tuple[int, int]] = {}
        for node in self.client.nodes():
            api = BasaltClient([f"http://{node['api_addr']}"], self.node_token())
            try:
                d = api.request("GET", f"/api/v1/volumes/{quote(export)}/local-digest")
            except BasaltError as err:
                if err.status == 404 and "no replica on this node" in err.message:
                    continue
                raise
            out[node["name"]] = (int(d["crc32c"]), int(d["size_bytes"]))
        return out

    def assert_same_on_every_replica(self, export: str) -> tuple[int, int]:
        """The digest of ``export``, the same on each of its volume's
        ``replicas`` nodes, and no copy on any other node; compared once
        every replica is in sync (a replica may be marked out of sync and
        resynced at any time), and the states are in the failure message."""
        info = self.wait_in_sync(export.split("@")[0])
        holders = self.replica_nodes(info)
        d = self.digests(export)
        states = {r["node"]: r["state"] for r in info["replicas"]}
        self.assertEqual(holders, set(d), f"copies of {export}: {d}; replicas {states}")
        self.assertEqual(1, len(set(d.values())),
                         f"{export} differs between replicas: {d}; replicas {states}")
        return next(iter(d.values()))

    def node_names(self) -> set[str]:
        return {n["name"] for n in self.client.nodes()}

    def replica_nodes(self, info: dict[str, Any]) -> set[str]:
        return {r["node"] for r in info.get("replicas") or []}

    def assert_nothing_left(self, *names: str) -> None:
        """No volume named ``names`` is left, and no snapshot of one."""
        volumes = {v["name"] for v in self.client.list_volumes()}
        snapshots = [f"{s['volume']}@{s['name']}" for s in self.client.list_snapshots()]
        for name in names:
            self.assertNotIn(name, volumes)
            self.assertEqual([], [s for s in snapshots if s.startswith(name + "@")])

    # -- Cinder steps -----------------------------------------------------------

    def replicated_volume(self) -> tuple[objects.Volume, str]:
        vtype = self.volume_type({basalt_driver.EXTRA_SPEC_REPLICAS: str(self.replicas)})
        vol = self.create(size=1, volume_type_id=vtype.id)
        self.assertEqual("available", vol.status)
        name = basalt_driver.volume_name(vol)
        info = self.wait_in_sync(name)
        self.assertEqual(self.replicas, info["replicas_wanted"])
        self.assertEqual(1 * GiB, info["size_bytes"])
        return vol, name

    def delete_snapshot(self, name: str, snap: objects.Snapshot) -> None:
        self.manager.delete_snapshot(self.context, snap)
        gone = objects.Snapshot.get_by_id(self.context.elevated(read_deleted="yes"), snap.id)
        self.assertEqual("deleted", gone.status)
        self.assertNotIn(basalt_driver.snapshot_name(snap), self.snapshot_names(name))

    # -- the clone scenario, for each replica count ------------------------------

    def check_clones_flattened_when_the_source_is_deleted(self) -> None:
        vol, name = self.replicated_volume()
        source_nodes = self.replica_nodes(self.client.get_volume(name))
        self.assertEqual(self.replicas, len(source_nodes))
        self.assertLessEqual(source_nodes, self.node_names())
        self.write(name, A)
        snap = self.snapshot(vol)
        self.assertEqual(fields.SnapshotStatus.AVAILABLE, snap.status)
        snap_name = basalt_driver.snapshot_name(snap)
        self.write(name, B)  # the snapshot keeps A

        # A volume from the snapshot: a replicated clone with the source's
        # replica count, on the nodes holding the snapshot, reading A, the
        # snapshot's very content on each replica.
        from_snap = self.create(size=1, snapshot_id=snap.id, volume_type_id=vol.volume_type_id)
        self.assertEqual("available", from_snap.status)
        fs_name = basalt_driver.volume_name(from_snap)
        fs_info = self.wait_in_sync(fs_name)
        self.assertEqual(f"{name}@{snap_name}", fs_info["clone_of"])
        self.assertEqual(self.replicas, fs_info["replicas_wanted"])
        self.assertEqual(1 * GiB, fs_info["size_bytes"])
        self.assertEqual(source_nodes, self.replica_nodes(fs_info))
        self.assertTrue(self.reads(fs_name, A))
        self.assertEqual(self.assert_same_on_every_replica(f"{name}@{snap_name}"),
                         self.assert_same_on_every_replica(fs_name))

        # A clone of the volume (through the hidden snapshot clone-NAME): B.
        clone = self.create(size=1, source_volid=vol.id, volume_type_id=vol.volume_type_id)
        self.assertEqual("available", clone.status)
        cl_name = basalt_driver.volume_name(clone)
        clone_snap = f"clone-{cl_name}"
        cl_info = self.wait_in_sync(cl_name)
        self.assertEqual(f"{name}@{clone_snap}", cl_info["clone_of"])
        self.assertEqual(self.replicas, cl_info["replicas_wanted"])
        self.assertEqual(1 * GiB, cl_info["size_bytes"])
        self.assertEqual(source_nodes, self.replica_nodes(cl_info))
        self.assertEqual([snap_name, clone_snap], self.snapshot_names(name))
        self.assertTrue(self.reads(cl_name, B))
        self.assertEqual(self.assert_same_on_every_replica(f"{name}@{clone_snap}"),
                         self.assert_same_on_every_replica(cl_name))

        # The source moves on; its clones keep what they read.
        self.write(name, C)
        self.assertTrue(self.reads(fs_name, A))
        self.assertTrue(self.reads(cl_name, B))
        # Writes to the clones (past what they share with the source) stay
        # theirs, on each of their replicas; the source is untouched.
        self.write(fs_name, B, offset=1 << 20)
        self.write(cl_name, A, offset=1 << 20)
        self.assertTrue(self.reads(fs_name, A))
        self.assertTrue(self.reads(fs_name, B, offset=1 << 20))
        self.assertTrue(self.reads(cl_name, B))
        self.assertTrue(self.reads(cl_name, A, offset=1 << 20))
        self.assertTrue(self.reads(name, C))
        self.assertTrue(self.reads(name, 0, offset=1 << 20))
        self.assertTrue(self.reads(f"{name}@{snap_name}", A))
        self.assertTrue(self.reads(f"{name}@{snap_name}", 0, offset=1 << 20))
        fs_digest = self.assert_same_on_every_replica(fs_name)
        cl_digest = self.assert_same_on_every_replica(cl_name)
        self.assertNotEqual(fs_digest, self.assert_same_on_every_replica(f"{name}@{snap_name}"))
        self.assertNotEqual(cl_digest, self.assert_same_on_every_replica(f"{name}@{clone_snap}"))

        # Still refused: deleting the Cinder snapshot while a volume reads it
        # (SnapshotIsBusy: Cinder keeps it available), and deleting the
        # source while it has that snapshot (VolumeIsBusy: the source stays
        # available and no clone was flattened).
        self.manager.delete_snapshot(self.context, snap)
        snap.refresh()
        self.assertEqual(fields.SnapshotStatus.AVAILABLE, snap.status)
        self.assertEqual([snap_name, clone_snap], self.snapshot_names(name))
        vol.status = "deleting"
        vol.save()
        self.manager.delete_volume(self.context, vol)
        vol.refresh()
        self.assertEqual("available", vol.status)
        self.assertTrue(self.exists(name))
        self.assertEqual(f"{name}@{clone_snap}", self.client.get_volume(cl_name)["clone_of"])

        # The volume from the snapshot is flattened as an operator would
        # (basalt volume flatten, through the cluster): detached on every
        # replica, with its data; then Cinder deletes the snapshot.
        flattened = self.client.flatten(fs_name, offset=0, length=1 * GiB)
        self.assertTrue(flattened["detached"], flattened)
        self.assertNotIn("clone_of", self.client.get_volume(fs_name))
        self.assertEqual(fs_digest, self.assert_same_on_every_replica(fs_name))
        self.delete_snapshot(name, snap)
        self.assertEqual([clone_snap], self.snapshot_names(name))

        # A snapshot of the clone, written after: deleting the source has the
        # driver flatten the clone with its snapshot, on each of their
        # replicas through the cluster, and delete clone-NAME.
        cl_snap = self.snapshot(clone)
        self.assertEqual(fields.SnapshotStatus.AVAILABLE, cl_snap.status)
        cl_snap_export = f"{cl_name}@{basalt_driver.snapshot_name(cl_snap)}"
        self.write(cl_name, C, offset=2 << 20)
        cl_digest = self.assert_same_on_every_replica(cl_name)
        cl_snap_digest = self.assert_same_on_every_replica(cl_snap_export)
        vol.status = "deleting"
        vol.save()
        self.manager.delete_volume(self.context, vol)
        self.assertFalse(self.exists(name))
        for clone_name, digest, first, second in ((fs_name, fs_digest, A, B),
                                                  (cl_name, cl_digest, B, A)):
            info = self.wait_in_sync(clone_name)
            self.assertNotIn("clone_of", info)
            self.assertEqual(source_nodes, self.replica_nodes(info))
            self.assertTrue(self.reads(clone_name, first))
            self.assertTrue(self.reads(clone_name, second, offset=1 << 20))
            self.assertEqual(digest, self.assert_same_on_every_replica(clone_name))
        self.assertTrue(self.reads(cl_name, C, offset=2 << 20))
        self.assertTrue(self.reads(cl_snap_export, B))
        self.assertTrue(self.reads(cl_snap_export, A, offset=1 << 20))
        self.assertEqual(cl_snap_digest, self.assert_same_on_every_replica(cl_snap_export))
        self.delete_snapshot(cl_name, cl_snap)

        for v in (from_snap, clone):
            v.status = "deleting"
            v.save()
            self.manager.delete_volume(self.context, v)
        self.assertFalse(self.exists(fs_name))
        self.assertFalse(self.exists(cl_name))
        self.assert_nothing_left(name, fs_name, cl_name)


class ReplicatedSnapshotTest(ReplicatedVolumeTestCase):
    """Three replicas, one on every node."""

    replicas = REPLICAS

    def test_snapshot_revert_delete(self) -> None:
        vol, name = self.replicated_volume()
        # One replica on every node.
        self.assertEqual(self.node_names(), self.replica_nodes(self.client.get_volume(name)))
        self.write(name, A)

        # A snapshot: Basalt lists it, with the volume's size, the same on all
        # three replicas and readable as it was taken.
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

        vol.status = "deleting"
        vol.save()
        self.manager.delete_volume(self.context, vol)
        self.assertFalse(self.exists(name))
        self.assert_nothing_left(name)

    def test_clones_flattened_when_the_source_is_deleted(self) -> None:
        self.assertEqual(self.replicas, len(self.node_names()))
        self.check_clones_flattened_when_the_source_is_deleted()


class TwoReplicasOnThreeNodesTest(ReplicatedVolumeTestCase):
    """Two replicas on the three nodes: the volumes made from the source are
    placed with it, not on the node it leaves out."""

    replicas = 2

    def test_clones_flattened_when_the_source_is_deleted(self) -> None:
        self.assertEqual(3, len(self.node_names()))
        self.check_clones_flattened_when_the_source_is_deleted()
