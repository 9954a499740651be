"""``python -m qtrain.ops`` (run by ``make build``): every built backend of the op library
raises properly when an op is given a bad argument (``qtrain.ops.backends.main``)."""

import sys

from qtrain.ops.backends import main

sys.exit(main())
