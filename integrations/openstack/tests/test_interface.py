"""Interface compliance against Cinder's interface classes (as Cinder's own
cinder/tests/compliance does for in-tree drivers)."""

from __future__ import annotations

from cinder.interface import util, volume_driver, volume_manageable_driver, volume_snapshot_revert

from basalt_cinder import driver as basalt_driver
from conftest import CinderTestCase


class InterfaceComplianceTest(CinderTestCase):
    def test_registered_as_a_volume_driver(self) -> None:
        classes = [d.cls for d in util.get_volume_drivers()]
        self.assertIn(basalt_driver.BasaltVolumeDriver, classes)
        info = next(d for d in util.get_volume_drivers()
                if d.cls is basalt_driver.BasaltVolumeDriver)
        self.assertEqual("basalt_cinder.driver.BasaltVolumeDriver", info.class_fqn)
        self.assertEqual("0.1.0", info.version)
        self.assertEqual("Basalt_CI", info.ci_wiki_name)

    def test_core_interface(self) -> None:
        self.assertTrue(issubclass(basalt_driver.BasaltVolumeDriver,
                                   volume_driver.VolumeDriverCore))

    def test_snapshot_revert_interface(self) -> None:
        self.assertTrue(issubclass(basalt_driver.BasaltVolumeDriver,
                                   volume_snapshot_revert.VolumeSnapshotRevertDriver))

    def test_manage_and_list_manageable_interfaces(self) -> None:
        for iface in (volume_manageable_driver.VolumeManagementDriver,
                      volume_manageable_driver.VolumeListManageableDriver):
            self.assertTrue(issubclass(basalt_driver.BasaltVolumeDriver, iface), iface)

    def test_driver_options(self) -> None:
        names = {o.name for o in basalt_driver.BasaltVolumeDriver.get_driver_options()}
        for wanted in ("basalt_api_url", "basalt_api_token", "basalt_verify_tls",
                       "basalt_default_type", "basalt_connector", "basalt_nvme_dhchap",
                       "basalt_nbd_uri", "basalt_nbd_psk_file"):
            self.assertIn(wanted, names)
        token = next(o for o in basalt_driver.basalt_opts if o.name == "basalt_api_token")
        self.assertTrue(token.secret)
