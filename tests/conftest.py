"""Suite-wide settings.

OMP_WAIT_POLICY=PASSIVE: OpenMP threads that spin while waiting make torch up to 10x slower
when the two cores here are shared (other tests, subprocesses under test, other jobs). It has
to be set before torch starts its thread pool, hence here, before any test imports torch.
Subprocesses started by tests inherit it.
"""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
