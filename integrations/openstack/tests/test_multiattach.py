"""Multiattach: one volume attached to several hosts at once, through Cinder's
attachments API as Nova drives it (the API's reserve and finish steps, the
VolumeManager's attachment_update and attachment_delete, which the API reaches
over RPC). Basalt keeps one NVMe host attachment per host: its list of host
NQNs is checked through its API after each step."""

from __future__ import annotations

from typing import Any

from cinder import exception, objects
from cinder.objects import fields
from cinder.volume import api as volume_api

from basalt_cinder import driver as basalt_driver
from conftest import BasaltManagerTestCase, admin

HOST_A = {"host": "compute-a", "multipath": True,
          "nqn": "nqn.2014-08.org.nvmexpress:uuid:0a0a0a0a-1111-4a4a-8a8a-0a0a0a0a0a0a"}
HOST_B = {"host": "compute-b", "multipath": True,
          "nqn": "nqn.2014-08.org.nvmexpress:uuid:0b0b0b0b-2222-4b4b-8b8b-0b0b0b0b0b0b"}
SERVER_1 = "6f1d8e2a-0000-4000-8000-000000000001"
SERVER_2 = "6f1d8e2a-0000-4000-8000-000000000002"
SERVER_3 = "6f1d8e2a-0000-4000-8000-000000000003"


class MultiattachTest(BasaltManagerTestCase):
    def setUp(self) -> None:
        super().setUp()
        self.api = volume_api.API()

    def multiattach_volume(self) -> objects.Volume:
        vtype = self.volume_type(extra_specs={"multiattach": "<is> True"})
        vol = self.create(size=1, volume_type_id=vtype.id, multiattach=True)
        self.assertEqual("available", vol.status)
        self.assertTrue(vol.multiattach)
        return vol

    def attach(self, vol: objects.Volume, server: str, connector: dict[str, Any],
               complete: bool = True) -> tuple[objects.VolumeAttachment, dict[str, Any]]:
        """Nova's attach: reserve, update with the host's connector (the host
        then connects), complete."""
        vol = objects.Volume.get_by_id(self.context, vol.id)
        attachment = self.api.attachment_create(self.context, vol, server)
        conn = self.manager.attachment_update(self.context, vol, dict(connector), attachment.id)
        attachment = objects.VolumeAttachment.get_by_id(self.context, attachment.id)
        if not complete:
            return attachment, conn
        # What the API's attachment complete does.
        attachment.update({"attach_status": fields.VolumeAttachStatus.ATTACHED})
        attachment.save()
        vol.refresh()
        vol.update({"status": "in-use", "attach_status": "attached"})
        vol.save()
        return attachment, conn

    def detach(self, attachment: objects.VolumeAttachment) -> None:
        """Nova's detach: the API's attachment delete (the manager's part, then
        the API's finish_detach)."""
        attachment = objects.VolumeAttachment.get_by_id(self.context, attachment.id)
        vol = attachment.volume
        self.manager.attachment_delete(self.context, attachment.id, vol)
        vol.volume_attachment  # noqa: B018 (loaded so finish_detach updates it)
        vol.finish_detach(attachment.id)

    def hosts(self, vol: objects.Volume) -> list[str]:
        return sorted(admin().get_volume(basalt_driver.volume_name(vol)).get("nvme_hosts") or [])

    def test_two_hosts_each_keep_their_own_attachment(self) -> None:
        vol = self.multiattach_volume()
        name = basalt_driver.volume_name(vol)
        basalt_id = admin().get_volume(name)["id"]

        att_a, conn_a = self.attach(vol, SERVER_1, HOST_A)
        self.assertEqual([HOST_A["nqn"]], self.hosts(vol))
        att_b, conn_b = self.attach(vol, SERVER_2, HOST_B)
        self.assertEqual(sorted([HOST_A["nqn"], HOST_B["nqn"]]), self.hosts(vol))
        # Both hosts get the same volume: subsystem, namespace, portals.
        for conn, connector in ((conn_a, HOST_A), (conn_b, HOST_B)):
            self.assertEqual("nvmeof", conn["driver_volume_type"])
            self.assertEqual(f"nqn.2026-11.io.basalt:volume:{name}", conn["target_nqn"])
            self.assertEqual(basalt_id, conn["vol_uuid"])
            self.assertEqual(connector["nqn"], conn["host_nqn"])
        self.assertEqual(conn_a["portals"], conn_b["portals"])
        vol.refresh()
        self.assertEqual("in-use", vol.status)
        self.assertEqual(2, len(vol.volume_attachment))

        # Detaching A revokes A only.
        self.detach(att_a)
        self.assertEqual([HOST_B["nqn"]], self.hosts(vol))
        vol.refresh()
        self.assertEqual("in-use", vol.status)
        self.assertEqual([att_b.id], [a.id for a in vol.volume_attachment])
        # Terminating A again (a retry) succeeds and changes nothing.
        self.assertFalse(self.driver.terminate_connection(vol, dict(HOST_A)))
        self.manager.terminate_connection(self.context, vol.id, dict(HOST_A))
        self.assertEqual([HOST_B["nqn"]], self.hosts(vol))

        # Detaching B, the last, leaves no host; again is harmless.
        self.detach(att_b)
        self.assertEqual([], self.hosts(vol))
        vol.refresh()
        self.assertEqual("available", vol.status)
        self.assertEqual(0, len(vol.volume_attachment))
        self.manager.terminate_connection(self.context, vol.id, dict(HOST_B))
        self.assertEqual([], self.hosts(vol))

        vol.status = "deleting"
        vol.save()
        self.manager.delete_volume(self.context, vol)
        self.assertRaises(exception.VolumeNotFound, objects.Volume.get_by_id,
                          self.context, vol.id)

    def test_two_servers_on_one_host_share_its_attachment(self) -> None:
        vol = self.multiattach_volume()
        both = sorted([HOST_A["nqn"], HOST_B["nqn"]])
        att_1, _ = self.attach(vol, SERVER_1, HOST_A)
        att_3, _ = self.attach(vol, SERVER_3, HOST_A)
        att_2, _ = self.attach(vol, SERVER_2, HOST_B)
        self.assertEqual(both, self.hosts(vol))
        # The host's other server still uses the volume: A stays attached, and
        # the driver says the connection is shared.
        vol.refresh()
        self.assertTrue(self.driver.terminate_connection(vol, dict(HOST_A)))
        self.detach(att_1)
        self.assertEqual(both, self.hosts(vol))
        self.detach(att_3)
        self.assertEqual([HOST_B["nqn"]], self.hosts(vol))

        # A server on A being attached (connected, not yet completed) keeps A
        # attached when the host's other server detaches.
        att_1, _ = self.attach(vol, SERVER_1, HOST_A)
        att_3, _ = self.attach(vol, SERVER_3, HOST_A, complete=False)
        self.assertEqual(fields.VolumeAttachStatus.ATTACHING, att_3.attach_status)
        self.detach(att_1)
        self.assertEqual(both, self.hosts(vol))
        self.detach(att_3)
        self.assertEqual([HOST_B["nqn"]], self.hosts(vol))
        self.detach(att_2)
        self.assertEqual([], self.hosts(vol))

    def test_force_detach_revokes_every_host(self) -> None:
        vol = self.multiattach_volume()
        self.attach(vol, SERVER_1, HOST_A)
        self.attach(vol, SERVER_2, HOST_B)
        self.assertFalse(self.driver.terminate_connection(vol, None))
        self.assertEqual([], self.hosts(vol))
        self.assertFalse(self.driver.terminate_connection(vol, None))

