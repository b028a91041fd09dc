"""What the dltop_probe.pth of an older install imports when DLTOP_PROBE is set: zero-code mode (dltop.autoprobe)."""

import dltop.autoprobe  # noqa: F401  (it installs itself on import)
