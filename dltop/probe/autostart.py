"""Started by the dltop_probe.pth hook when DLTOP_PROBE is set: publish without changing the script."""

from dltop import probe

probe.start()
