"""DH-HMAC-CHAP secrets handed to hosts (basalt_nvme_dhchap), through Cinder's
attachment calls as Nova drives them (the VolumeManager's attachment_update,
then what Cinder's API does with its answer: record it as the attachment's
connection_info). Basalt's side is checked through its API (which hosts must
authenticate) and its log (whether a host's secrets were replaced), and the
properties through os-brick 7.1.1's NVMe-oF connector."""

from __future__ import annotations

import base64
import re
import zlib
from typing import Any

from cinder import exception, objects
from cinder.objects import fields
from cinder.volume import api as volume_api
from os_brick.initiator import connector as brick_connector
from os_brick.initiator.connectors import nvmeof
from oslo_utils import strutils

from basalt_cinder import driver as basalt_driver
from conftest import BACKEND, BasaltManagerTestCase, admin, env

HOST_A = {"host": "compute-a", "multipath": True,
          "nqn": "nqn.2014-08.org.nvmexpress:uuid:0a0a0a0a-3333-4a4a-8a8a-0a0a0a0a0a0a"}
HOST_B = {"host": "compute-b", "multipath": True,
          "nqn": "nqn.2014-08.org.nvmexpress:uuid:0b0b0b0b-4444-4b4b-8b8b-0b0b0b0b0b0b"}
SERVER_1 = "7f1d8e2a-0000-4000-8000-000000000001"
SERVER_2 = "7f1d8e2a-0000-4000-8000-000000000002"
SERVER_3 = "7f1d8e2a-0000-4000-8000-000000000003"

#: A DH-HMAC-CHAP secret in the NVMe representation nvme-cli takes:
#: DHHC-1:<transform>:<base64 of the key and its CRC-32>:
SECRET = re.compile(r"^DHHC-1:0[0-3]:([A-Za-z0-9+/=]+):$")


def check_secret(test: Any, text: str) -> None:
    match = SECRET.match(text)
    test.assertIsNotNone(match, text)
    raw = base64.b64decode(match.group(1))
    key, crc = raw[:-4], raw[-4:]
    test.assertIn(len(key), (32, 48, 64))
    test.assertEqual(zlib.crc32(key).to_bytes(4, "little"), crc)


class DhchapTest(BasaltManagerTestCase):
    def setUp(self) -> None:
        super().setUp()
        self.flags(group=BACKEND, basalt_nvme_dhchap=True)
        self.api = volume_api.API()

    def volume(self) -> objects.Volume:
        vtype = self.volume_type(extra_specs={"multiattach": "<is> True"})
        return self.create(size=1, volume_type_id=vtype.id, multiattach=True)

    def attach(self, vol: objects.Volume, server: str, connector: dict[str, Any],
               record: bool = True) -> tuple[objects.VolumeAttachment, dict[str, Any]]:
        """Nova's attach: reserve, then update with the host's connector; with
        ``record``, what Cinder's API does with the answer (it keeps it as the
        attachment's connection_info, which Nova reads back)."""
        vol = objects.Volume.get_by_id(self.context, vol.id)
        attachment = self.api.attachment_create(self.context, vol, server)
        conn = self.manager.attachment_update(self.context, vol, dict(connector), attachment.id)
        attachment = objects.VolumeAttachment.get_by_id(self.context, attachment.id)
        if record:
            attachment.connection_info = conn
            attachment.save()
        return attachment, conn

    def complete(self, attachment: objects.VolumeAttachment, status: str = "attached") -> None:
        """What the API's attachment complete does (``status`` "attaching": the
        volume is in use, this attachment's host still connecting)."""
        attachment.update({"attach_status": status})
        attachment.save()
        vol = objects.Volume.get_by_id(self.context, attachment.volume_id)
        vol.update({"status": "in-use", "attach_status": "attached"})
        vol.save()

    def detach(self, attachment: objects.VolumeAttachment) -> None:
        attachment = objects.VolumeAttachment.get_by_id(self.context, attachment.id)
        vol = attachment.volume
        self.manager.attachment_delete(self.context, attachment.id, vol)
        vol.volume_attachment  # noqa: B018 (loaded so finish_detach updates it)
        vol.finish_detach(attachment.id)

    def keyed(self, vol: objects.Volume) -> list[str]:
        """Hosts Basalt makes authenticate on this volume."""
        info = admin().get_volume(basalt_driver.volume_name(vol))
        return sorted(info.get("nvme_hosts_dhchap") or [])

    def changes(self, vol: objects.Volume) -> list[str]:
        """Basalt's log lines for changes of this volume's NVMe hosts: each
        attach with new secrets writes one (an attach that changes nothing, none)."""
        name = basalt_driver.volume_name(vol)
        with open(env("BASALT_SERVER_LOG"), encoding="utf-8", errors="replace") as f:
            return [line for line in f if "NVMe hosts changed" in line and name in line]

    @staticmethod
    def secrets(conn: dict[str, Any]) -> tuple[str, str]:
        return conn[basalt_driver.DHCHAP_SECRET], conn[basalt_driver.DHCHAP_CTRL_SECRET]

    def test_hosts_get_their_own_secrets(self) -> None:
        vol = self.volume()
        att_a, conn_a = self.attach(vol, SERVER_1, HOST_A)
        self.complete(att_a)
        host_a, ctrl_a = self.secrets(conn_a)
        check_secret(self, host_a)
        check_secret(self, ctrl_a)
        self.assertNotEqual(host_a, ctrl_a)
        self.assertEqual([HOST_A["nqn"]], self.keyed(vol))
        att_b, conn_b = self.attach(vol, SERVER_2, HOST_B)
        self.complete(att_b)
        self.assertNotIn(self.secrets(conn_b)[0], (host_a, ctrl_a))
        self.assertEqual(sorted([HOST_A["nqn"], HOST_B["nqn"]]), self.keyed(vol))
        # Cinder masks them when it logs connection info.
        masked = strutils.mask_dict_password(conn_a)
        self.assertNotIn(host_a, str(masked))
        self.assertNotIn(ctrl_a, str(masked))
        # Detaching a host revokes its secrets with its attachment.
        self.detach(att_b)
        self.assertEqual([HOST_A["nqn"]], self.keyed(vol))
        self.detach(att_a)
        self.assertEqual([], self.keyed(vol))

    def test_a_second_attachment_on_a_connected_host_does_not_rotate(self) -> None:
        vol = self.volume()
        att_1, conn_1 = self.attach(vol, SERVER_1, HOST_A)
        self.complete(att_1)
        before = len(self.changes(vol))
        self.assertGreaterEqual(before, 1)
        # A second server on the same host: the same secrets, and Basalt's
        # record of the host is not touched (no new secrets).
        att_3, conn_3 = self.attach(vol, SERVER_3, HOST_A)
        self.complete(att_3)
        self.assertEqual(self.secrets(conn_1), self.secrets(conn_3))
        self.assertEqual(before, len(self.changes(vol)))
        # The same while the first is only being connected (attaching) and the
        # second gone.
        self.detach(att_3)
        self.assertEqual([HOST_A["nqn"]], self.keyed(vol))
        self.complete(objects.VolumeAttachment.get_by_id(self.context, att_1.id),
                      fields.VolumeAttachStatus.ATTACHING)
        att_2, conn_2 = self.attach(vol, SERVER_2, HOST_A)
        self.complete(att_2)
        self.assertEqual(self.secrets(conn_1), self.secrets(conn_2))
        self.assertEqual(before, len(self.changes(vol)))
        # Once every attachment on the host is gone, the next one gets new secrets.
        for att in (att_1, att_2):
            self.detach(att)
        self.assertEqual([], self.keyed(vol))
        _, conn_4 = self.attach(vol, SERVER_1, HOST_A)
        self.assertNotEqual(self.secrets(conn_1), self.secrets(conn_4))
        self.assertEqual([HOST_A["nqn"]], self.keyed(vol))

    def test_no_record_of_a_connected_hosts_secrets_refuses_the_attach(self) -> None:
        vol = self.volume()
        # An attachment whose connection info Cinder has not recorded (its API
        # had not saved the answer yet): its host may be connecting with them.
        att_1, _ = self.attach(vol, SERVER_1, HOST_A, record=False)
        self.assertEqual(fields.VolumeAttachStatus.ATTACHING, att_1.attach_status)
        self.complete(att_1, fields.VolumeAttachStatus.ATTACHING)
        before = len(self.changes(vol))
        err = self.assertRaises(exception.VolumeBackendAPIException, self.attach, vol,
                                SERVER_3, HOST_A)
        self.assertIn("new secrets would cut it off", str(err))
        self.assertEqual(before, len(self.changes(vol)))
        self.assertEqual([HOST_A["nqn"]], self.keyed(vol))

    def test_a_host_connected_without_secrets_gets_none(self) -> None:
        vol = self.volume()
        self.flags(group=BACKEND, basalt_nvme_dhchap=False)
        att_1, conn_1 = self.attach(vol, SERVER_1, HOST_A)
        self.complete(att_1)
        self.assertNotIn(basalt_driver.DHCHAP_SECRET, conn_1)
        self.flags(group=BACKEND, basalt_nvme_dhchap=True)
        att_3, conn_3 = self.attach(vol, SERVER_3, HOST_A)
        self.complete(att_3)
        self.assertNotIn(basalt_driver.DHCHAP_SECRET, conn_3)
        self.assertEqual([], self.keyed(vol))
        # Another host is attached with secrets meanwhile.
        _, conn_b = self.attach(vol, SERVER_2, HOST_B)
        check_secret(self, conn_b[basalt_driver.DHCHAP_SECRET])
        self.assertEqual([HOST_B["nqn"]], self.keyed(vol))

    def test_turning_it_off_drops_unused_secrets(self) -> None:
        vol = self.volume()
        # The legacy initialize_connection (no attachment records): secrets.
        conn = self.manager.initialize_connection(self.context, vol, dict(HOST_A))
        check_secret(self, conn["data"][basalt_driver.DHCHAP_SECRET])
        self.assertEqual([HOST_A["nqn"]], self.keyed(vol))
        self.flags(group=BACKEND, basalt_nvme_dhchap=False)
        conn = self.manager.initialize_connection(self.context, vol, dict(HOST_A))
        self.assertNotIn(basalt_driver.DHCHAP_SECRET, conn["data"])
        self.assertEqual([], self.keyed(vol))
        self.assertIn(HOST_A["nqn"],
                      admin().get_volume(basalt_driver.volume_name(vol))["nvme_hosts"])

    def test_os_brick_parses_the_properties_and_ignores_the_secrets(self) -> None:
        """os-brick 7.1.1's NVMe-oF connector accepts the properties, keeps no
        DH-CHAP secret, and runs `nvme connect` without --dhchap-secret or
        --dhchap-ctrl-secret: Basalt then refuses the host's connection, as the
        host must authenticate. (Its command is recorded through the connector's
        own execute hook; the host here has no NVMe/TCP to connect with.)"""
        vol = self.volume()
        conn = self.manager.initialize_connection(self.context, vol, dict(HOST_A))
        data = conn["data"]
        props = nvmeof.NVMeOFConnProps(dict(data))
        target = props.targets[0]
        self.assertEqual(HOST_A["nqn"], target.host_nqn)
        found = [k for k in (*vars(props), *vars(target)) if "chap" in k.lower()]
        self.assertEqual([], found)

        commands: list[tuple[str, ...]] = []

        class Stop(Exception):
            pass

        def execute(*cmd: str, **kwargs: Any) -> tuple[str, str]:
            commands.append(cmd)
            if cmd[:2] == ("nvme", "connect"):
                raise Stop()
            return "", ""

        brick = brick_connector.InitiatorConnector.factory(
            "NVMEOF", root_helper=None, use_multipath=False, execute=execute)
        self.assertRaises(Stop, brick.connect_volume, dict(data))
        connect = next(c for c in commands if c[:2] == ("nvme", "connect"))
        self.assertIn(target.nqn, connect)
        self.assertIn(HOST_A["nqn"], connect)
        self.assertEqual([], [a for a in connect if "dhchap" in a or a in ("-S", "-C")])
        self.assertNotIn(data[basalt_driver.DHCHAP_SECRET], connect)
