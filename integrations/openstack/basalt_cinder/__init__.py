"""OpenStack Cinder volume driver for Basalt (``basalt_cinder.driver.BasaltVolumeDriver``)."""

__version__ = "0.1.0"
