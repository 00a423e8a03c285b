"""The replica count the driver reports (its pool's replication_count) is the one
Basalt gives a new volume: checked against the single-node server and against
the three-node cluster run-tests.sh started, where a volume created without a
count shows what Basalt chose (replicas_wanted), as nodes are drained one by
one and reactivated; Basalt refuses more replicas than it has active nodes, at
each step, and the driver passes that refusal on."""

from __future__ import annotations

import copy
import uuid
from typing import Any

from cinder import exception

from basalt_cinder import driver as basalt_driver
from basalt_cinder.client import BasaltClient, BasaltError
from conftest import BACKEND, BasaltManagerTestCase, CinderTestCase, admin

MiB = 1024**2

# GET /api/v1/status of a single-node server and GET /api/v1/nodes of a
# three-node cluster, as Basalt answered them (run-tests.sh's servers: the
# cluster's ids and order are those of the nodes' joining, and its status
# counts a node's own store).
SINGLE_NODE_STATUS: dict[str, Any] = {
    "capacity_bytes": 4279238656, "provisioned_bytes": 0, "allocated_bytes": 0,
    "overcommit_ratio": 2.0, "volume_count": 0, "extent_size": 1048576,
    "quarantined_entries": 0, "data_checksums": True, "checksum_errors": 0,
}
CLUSTER_STATUS: dict[str, Any] = {
    "capacity_bytes": 2138046464, "provisioned_bytes": 0, "allocated_bytes": 0,
    "overcommit_ratio": 2.0, "volume_count": 0, "extent_size": 1048576,
    "volumes_degraded": 0, "volumes_resyncing": 0,
    "quarantined_entries": 0, "data_checksums": True, "checksum_errors": 0,
}
CLUSTER_NODES: list[dict[str, Any]] = [
    {"name": "n2", "id": 1, "alive": True, "state": "active", "coordinator": True,
     "capacity_bytes": 2138046464, "free_bytes": 2138046464, "replicas": 0, "primaries": 0,
     "peer_addr": "127.0.0.1:32937", "nvme_addr": "127.0.0.1:34411",
     "api_addr": "127.0.0.1:43835"},
    {"name": "n1", "id": 2, "alive": True, "state": "active", "coordinator": False,
     "capacity_bytes": 2138046464, "free_bytes": 2138046464, "replicas": 0, "primaries": 0,
     "peer_addr": "127.0.0.1:59153", "nvme_addr": "127.0.0.1:38145",
     "api_addr": "127.0.0.1:35199"},
    {"name": "n0", "id": 3, "alive": True, "state": "active", "coordinator": False,
     "capacity_bytes": 2138046464, "free_bytes": 2138046464, "replicas": 0, "primaries": 0,
     "peer_addr": "127.0.0.1:37367", "nvme_addr": "127.0.0.1:45211",
     "api_addr": "127.0.0.1:39305"},
]


def nodes(*states: tuple[bool, str]) -> list[dict[str, Any]]:
    """CLUSTER_NODES' entries, one per (alive, state)."""
    out = []
    for i, (alive, state) in enumerate(states):
        node = copy.deepcopy(CLUSTER_NODES[i % len(CLUSTER_NODES)])
        node.update(name=f"n{i}", id=i + 1, alive=alive, state=state)
        out.append(node)
    return out


def ensure_type(client: BasaltClient, name: str, **body: object) -> None:
    try:
        client.request("POST", "/api/v1/types", {"name": name, **body})
    except BasaltError as err:
        if err.status != 409:
            raise


def probe_replicas(client: BasaltClient, **kwargs: Any) -> int:
    """Replicas the cluster gives a volume created now (then deleted)."""
    name = f"probe-{uuid.uuid4().hex[:8]}"
    info = client.create_volume(name, MiB, **kwargs)
    client.delete_volume(name)
    return int(info["replicas_wanted"])


class DefaultReplicasTest(CinderTestCase):
    """The mapping from Basalt's answers, on their captured JSON."""

    def test_single_node_or_cluster(self) -> None:
        self.assertFalse(basalt_driver.is_cluster(SINGLE_NODE_STATUS))
        self.assertTrue(basalt_driver.is_cluster(CLUSTER_STATUS))

    def test_one_per_live_active_node_up_to_three(self) -> None:
        count = basalt_driver.cluster_default_replicas
        self.assertEqual(3, count(CLUSTER_NODES))
        self.assertEqual(2, count(nodes((True, "active"), (True, "active"))))
        self.assertEqual(1, count(nodes((True, "active"))))
        self.assertEqual(3, count(nodes(*[(True, "active")] * 4)))
        self.assertEqual(3, count(nodes(*[(True, "active")] * 5)))
        # Dead, draining and removed nodes get no new replicas: the count
        # falls as the three nodes leave, one by one.
        one_dead = copy.deepcopy(CLUSTER_NODES)
        one_dead[0]["alive"] = False
        self.assertEqual(2, count(one_dead))
        self.assertEqual(2, count(nodes((True, "active"), (True, "draining"),
                                        (True, "active"))))
        self.assertEqual(1, count(nodes((True, "active"), (True, "draining"),
                                        (False, "active"))))
        self.assertEqual(1, count(nodes((True, "active"), (False, "active"),
                                        (True, "draining"), (True, "removed"))))
        self.assertEqual(1, count(nodes((False, "active"), (True, "draining"),
                                        (True, "removed"))))


class SingleNodeTest(BasaltManagerTestCase):
    def test_single_node_reports_one_replica(self) -> None:
        # The server says it is a single node, and refuses a second replica.
        err = self.assertRaises(BasaltError, admin().nodes)
        self.assertEqual(400, err.status)
        self.assertIn("single node", err.message)
        self.assertFalse(basalt_driver.is_cluster(admin().status()))
        err = self.assertRaises(BasaltError, admin().create_volume, "two-replicas", MiB,
                                replicas=2)
        self.assertEqual(400, err.status)
        pool = self.driver.get_volume_stats(refresh=True)["pools"][0]
        self.assertEqual(1, pool["replication_count"])


class ClusterAdminTokenTest(BasaltManagerTestCase):
    """A cluster-admin token may list the nodes: the count follows them."""

    api_url_env = "BASALT_CLUSTER_API_URL"
    token_env = admin_token_env = "BASALT_CLUSTER_ADMIN_TOKEN"

    def count(self) -> int:
        return int(self.driver.get_volume_stats(refresh=True)["pools"][0]["replication_count"])

    def set_state(self, node: str, state: str) -> None:
        self.basalt_admin().request("POST", f"/api/v1/nodes/{node}/state", {"state": state})

    def assert_too_many_refused(self, client: BasaltClient, replicas: int,
                                active: int) -> None:
        """Basalt refuses a volume with ``replicas`` on ``active`` active nodes."""
        name = f"probe-{uuid.uuid4().hex[:8]}"
        err = self.assertRaises(BasaltError, client.create_volume, name, MiB,
                                replicas=replicas)
        self.assertEqual(409, err.status)
        self.assertIn(f"wants {replicas} replicas but the cluster has {active} active node",
                      err.message)
        self.assertNotIn(name, {v["name"] for v in client.list_volumes()})

    def test_count_follows_the_active_nodes(self) -> None:
        client = self.basalt_admin()
        self.assertEqual(["n0", "n1", "n2"], sorted(n["name"] for n in client.nodes()))
        self.assertEqual(probe_replicas(client), self.count())
        self.assertEqual(3, self.count())
        self.assertEqual(3, probe_replicas(client, replicas=3))
        self.assert_too_many_refused(client, 4, active=3)
        # A draining node gets no new replicas: the count falls with each node
        # drained (n0, which the tests talk to, stays), and Basalt refuses
        # as many replicas as there were active nodes before.
        self.addCleanup(self.set_state, "n2", "active")
        self.addCleanup(self.set_state, "n1", "active")
        for node, left in (("n2", 2), ("n1", 1)):
            self.set_state(node, "draining")
            self.assertEqual(probe_replicas(client), self.count())
            self.assertEqual(left, self.count())
            self.assertEqual(left, probe_replicas(client, replicas=left))
            self.assert_too_many_refused(client, left + 1, active=left)
        # Reactivated, they count again.
        self.set_state("n1", "active")
        self.assertEqual(2, self.count())
        self.set_state("n2", "active")
        self.assertEqual(3, self.count())
        self.assertEqual(probe_replicas(client), self.count())

    def test_more_replicas_than_nodes_fails_the_create(self) -> None:
        # A Cinder type asking for 4 replicas of the 3 nodes: the driver
        # passes Basalt's refusal on as InvalidVolumeType (the type does not
        # fit the cluster), the volume ends in error, nothing left.
        client = self.basalt_admin()
        vtype = self.volume_type({basalt_driver.EXTRA_SPEC_REPLICAS: "4"})
        vol = self.new_volume(size=1, volume_type_id=vtype.id)
        name = basalt_driver.volume_name(vol)
        err = self.assertRaises(exception.InvalidVolumeType, self.driver.create_volume, vol)
        self.assertIn("wants 4 replicas but the cluster has 3 active node", str(err))
        self.assertRaises(exception.CinderException,
                          self.manager.create_volume, self.context, vol)
        vol.refresh()
        self.assertEqual("error", vol.status)
        self.assertNotIn(name, {v["name"] for v in client.list_volumes()})

    def test_basalt_default_type_sets_the_count(self) -> None:
        client = self.basalt_admin()
        ensure_type(client, "cinder-rf1", replicas=1)
        self.flags(group=BACKEND, basalt_default_type="cinder-rf1")
        self.assertEqual(probe_replicas(client, volume_type="cinder-rf1"), self.count())
        self.assertEqual(1, self.count())
        # The volume the driver creates for a Cinder type naming nothing.
        vol = self.create(size=1)
        info = client.get_volume(basalt_driver.volume_name(vol))
        self.assertEqual(1, info["replicas_wanted"])
        self.manager.delete_volume(self.context, vol)


class ClusterProjectTokenTest(BasaltManagerTestCase):
    """A project token may not list the nodes: the count is known only from the
    default type, and not reported otherwise."""

    api_url_env = "BASALT_CLUSTER_API_URL"
    token_env = "BASALT_CLUSTER_TOKEN"
    admin_token_env = "BASALT_CLUSTER_ADMIN_TOKEN"

    def pool(self) -> dict[str, Any]:
        return dict(self.driver.get_volume_stats(refresh=True)["pools"][0])

    def set_default_type(self, name: str | None) -> None:
        self.basalt_admin().request("PUT", "/api/v1/default-type", {"name": name})

    def test_unknown_count_is_not_reported(self) -> None:
        err = self.assertRaises(BasaltError, self.driver._api.nodes)
        self.assertEqual(403, err.status)
        pool = self.pool()
        self.assertNotIn("replication_count", pool)
        self.assertGreater(pool["total_capacity_gb"], 0)  # the rest is reported

    def test_default_type_count(self) -> None:
        # Two of the three nodes: the type's count, not the node count.
        client = self.basalt_admin()
        ensure_type(client, "cinder-rf2", replicas=2)
        self.addCleanup(self.set_default_type, None)
        self.set_default_type("cinder-rf2")
        self.assertEqual(probe_replicas(client), self.pool()["replication_count"])
        self.assertEqual(2, self.pool()["replication_count"])
