"""Volume types, QoS specs, retype and manage through the driver (admin token
where Basalt requires one: per-volume QoS is a cluster-admin operation)."""

from __future__ import annotations

from cinder import exception

from basalt_cinder import driver as basalt_driver
from basalt_cinder.client import BasaltError
from conftest import BasaltManagerTestCase, GiB, admin, exists, has_pattern, write_pattern


def ensure_type(name: str, **body: object) -> None:
    try:
        admin().request("POST", "/api/v1/types", {"name": name, **body})
    except BasaltError as err:
        if err.status != 409:
            raise


class AdminTokenPolicyTest(BasaltManagerTestCase):
    token_env = "BASALT_ADMIN_TOKEN"

    def test_extra_specs_and_qos_specs(self) -> None:
        ensure_type("cinder-gold", replicas=1, qos={"total_iops_sec": 5000})
        vtype = self.volume_type(
            extra_specs={"basalt:type": "cinder-gold", "basalt:replicas": "1"},
            qos={"read_iops_sec": "800", "write_bytes_sec_per_gb": "1048576"},
        )
        vol = self.create(volume_type_id=vtype.id)
        self.assertEqual("available", vol.status)
        info = admin().get_volume(basalt_driver.volume_name(vol))
        self.assertEqual("cinder-gold", info["volume_type"])
        self.assertEqual({"read_iops_sec": 800, "write_bytes_sec_per_gb": 1048576},
                         info["qos"])

    def test_encrypted_extra_spec_creates_an_encrypted_volume(self) -> None:
        plain = self.volume_type(extra_specs={"basalt:encrypted": "<is> False"})
        secret = self.volume_type(extra_specs={"basalt:encrypted": "<is> True"})
        vol = self.create(volume_type_id=secret.id)
        self.assertEqual("available", vol.status)
        name = basalt_driver.volume_name(vol)
        self.assertTrue(admin().get_volume(name)["encrypted"])
        # A clone of it is encrypted too (Basalt gives it its source's key).
        clone = self.create(volume_type_id=secret.id, source_volid=vol.id)
        self.assertTrue(admin().get_volume(basalt_driver.volume_name(clone))["encrypted"])
        other = self.create(volume_type_id=plain.id)
        self.assertFalse(admin().get_volume(basalt_driver.volume_name(other))["encrypted"])
        # Changing encryption is a migration, never an in-place retype.
        done, _update = self.driver.retype(self.context, other, {"id": secret.id}, {}, {})
        self.assertFalse(done)
        bad = self.volume_type(extra_specs={"basalt:encrypted": "maybe"})
        self.assertRaises(exception.InvalidVolumeType, self.driver.create_volume,
                          self.new_volume(volume_type_id=bad.id))

    def test_retype_to_a_basalt_type_of_other_encryption_rewrites_in_place(self) -> None:
        # Basalt re-encrypts a single-node volume online through a retype
        # to a Basalt type; the driver finishes it (the flatten) and no
        # migration is needed. Both ways, data kept.
        ensure_type("cinder-sealed", replicas=1, encrypted=True)
        ensure_type("cinder-open", replicas=1)
        sealed = self.volume_type(extra_specs={"basalt:type": "cinder-sealed"})
        opened = self.volume_type(extra_specs={"basalt:type": "cinder-open"})
        vol = self.create(volume_type_id=opened.id)
        name = basalt_driver.volume_name(vol)
        self.assertFalse(admin().get_volume(name)["encrypted"])
        write_pattern(name, 0x5A, offset=4096, length=3 << 20)
        done, _update = self.driver.retype(self.context, vol, {"id": sealed.id}, {}, {})
        self.assertTrue(done)
        info = admin().get_volume(name)
        self.assertTrue(info["encrypted"])
        self.assertFalse(info.get("reencrypting"))
        self.assertTrue(has_pattern(name, 0x5A, offset=4096, length=3 << 20))
        vol.volume_type_id = sealed.id
        vol.save()
        # Between two Cinder types whose Basalt types are both encrypted:
        # nothing to rewrite (before, the driver asked for a migration).
        sealed2 = self.volume_type(extra_specs={"basalt:type": "cinder-sealed",
                                                "basalt:encrypted": "<is> True"})
        done, _update = self.driver.retype(self.context, vol, {"id": sealed2.id}, {}, {})
        self.assertTrue(done)
        done, _update = self.driver.retype(self.context, vol, {"id": opened.id}, {}, {})
        self.assertTrue(done)
        info = admin().get_volume(name)
        self.assertFalse(info["encrypted"])
        self.assertFalse(info.get("reencrypting"))
        self.assertTrue(has_pattern(name, 0x5A, offset=4096, length=3 << 20))
        # basalt:encrypted alone, with no Basalt type that gives it: a
        # migration still.
        spec_only = self.volume_type(extra_specs={"basalt:encrypted": "<is> True"})
        vol.volume_type_id = opened.id
        vol.save()
        done, _update = self.driver.retype(self.context, vol, {"id": spec_only.id}, {}, {})
        self.assertFalse(done)

    def test_compression_extra_spec_sets_the_codec(self) -> None:
        zstd = self.volume_type(extra_specs={"basalt:compression": "zstd:3"})
        yes = self.volume_type(extra_specs={"basalt:compression": "<is> True"})
        vol = self.create(volume_type_id=zstd.id)
        name = basalt_driver.volume_name(vol)
        self.assertEqual("zstd:3", admin().get_volume(name)["compression"])
        other = self.create(volume_type_id=yes.id)
        self.assertEqual("lz4",
                         admin().get_volume(basalt_driver.volume_name(other))["compression"])
        plain = self.create()
        self.assertIsNone(admin().get_volume(basalt_driver.volume_name(plain))["compression"])
        # Another codec through a Cinder type alone is a migration.
        done, _update = self.driver.retype(self.context, vol, {"id": yes.id}, {}, {})
        self.assertFalse(done)
        bad = self.volume_type(extra_specs={"basalt:compression": "gzip"})
        self.assertRaises(exception.InvalidVolumeType, self.driver.create_volume,
                          self.new_volume(volume_type_id=bad.id))

    def test_front_end_qos_is_left_to_nova(self) -> None:
        vtype = self.volume_type(qos={"total_iops_sec": "100"}, consumer="front-end")
        vol = self.create(volume_type_id=vtype.id)
        info = admin().get_volume(basalt_driver.volume_name(vol))
        self.assertFalse(bool(info.get("qos")))

    def test_retype_changes_type_and_qos_online(self) -> None:
        ensure_type("cinder-silver", replicas=1, qos={"total_iops_sec": 1000})
        ensure_type("cinder-gold", replicas=1, qos={"total_iops_sec": 5000})
        old = self.volume_type(extra_specs={"basalt:type": "cinder-silver"})
        new = self.volume_type(extra_specs={"basalt:type": "cinder-gold"},
                               qos={"total_bytes_sec": "104857600"})
        vol = self.create(volume_type_id=old.id)
        name = basalt_driver.volume_name(vol)
        self.assertEqual("cinder-silver", admin().get_volume(name)["volume_type"])
        done, _update = self.driver.retype(self.context, vol, {"id": new.id}, {}, {})
        self.assertTrue(done)
        info = admin().get_volume(name)
        self.assertEqual("cinder-gold", info["volume_type"])
        self.assertEqual({"total_bytes_sec": 104857600}, info["qos"])

    def test_manage_and_unmanage(self) -> None:
        admin().create_volume("legacy-disk", 3 * GiB // 2)
        self.addCleanup(lambda: exists("legacy-disk") and admin().delete_volume("legacy-disk"))
        listed = self.driver.get_manageable_volumes([], None, 1000, 0, ["size"], ["asc"])
        entry = next(e for e in listed if e["reference"]["source-name"] == "legacy-disk")
        self.assertTrue(entry["safe_to_manage"])
        self.assertEqual(2, entry["size"])
        vol = self.new_volume(size=2)
        ref = {"source-name": "legacy-disk"}
        self.assertEqual(2, self.driver.manage_existing_get_size(vol, ref))
        update = self.driver.manage_existing(vol, ref)
        self.assertEqual({"provider_id": "legacy-disk"}, update)
        self.assertEqual(2 * GiB, admin().get_volume("legacy-disk")["size_bytes"])
        vol.provider_id = "legacy-disk"
        vol.save()
        listed = self.driver.get_manageable_volumes([vol], None, 1000, 0, ["size"], ["asc"])
        entry = next(e for e in listed if e["reference"]["source-name"] == "legacy-disk")
        self.assertFalse(entry["safe_to_manage"])
        self.assertEqual(vol.id, entry["cinder_id"])
        self.driver.unmanage(vol)
        self.assertTrue(exists("legacy-disk"))
