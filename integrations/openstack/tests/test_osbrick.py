"""os-brick's NVMe-oF connector accepts the properties initialize_connection
returns (its factory and its property parsing; no kernel attach here)."""

from __future__ import annotations

from os_brick.initiator import connector as brick_connector
from os_brick.initiator.connectors import nvmeof

from basalt_cinder import driver as basalt_driver
from conftest import BasaltManagerTestCase, admin, env

HOST_NQN = "nqn.2014-08.org.nvmexpress:uuid:0f0e0d0c-0b0a-0908-0706-050403020100"


class OsBrickTest(BasaltManagerTestCase):
    def test_nvmeof_connector_parses_the_properties(self) -> None:
        vol = self.create(size=1)
        name = basalt_driver.volume_name(vol)
        conn = self.manager.initialize_connection(
            self.context, vol, {"host": "compute-2", "nqn": HOST_NQN})
        self.assertEqual("nvmeof", conn["driver_volume_type"])
        data = conn["data"]
        basalt_id = admin().get_volume(name)["id"]

        connector = brick_connector.InitiatorConnector.factory(
            "NVMEOF", root_helper=None, use_multipath=True)
        self.assertIsInstance(connector, nvmeof.NVMeOFConnector)
        props = nvmeof.NVMeOFConnProps(dict(data))
        self.assertFalse(props.is_replicated)
        self.assertEqual(1, len(props.targets))
        target = props.targets[0]
        self.assertEqual(f"nqn.2026-11.io.basalt:volume:{name}", target.nqn)
        self.assertEqual(basalt_id, target.uuid)
        # The driver sends the NGUID as 32 hex digits; os-brick normalizes it.
        self.assertEqual(basalt_id.replace("-", ""), data["volume_nguid"])
        self.assertEqual(basalt_id, target.nguid)
        self.assertEqual(1, target.ns_id)
        self.assertEqual(HOST_NQN, target.host_nqn)
        host, port = env("BASALT_NVME").rsplit(":", 1)
        self.assertEqual([(host, port, "tcp")],
                         [(p.address, p.port, p.transport) for p in target.portals])
        self.manager.terminate_connection(self.context, vol.id, {"host": "compute-2",
                                                                 "nqn": HOST_NQN})
        self.assertNotIn(HOST_NQN, admin().get_volume(name).get("nvme_hosts") or [])

    def test_default_portals_follow_the_api_urls(self) -> None:
        self.flags(group="backend_defaults", basalt_nvme_portals=[])
        portals = self.driver._portals()
        self.assertEqual([("127.0.0.1", "4420", "tcp")], portals)
