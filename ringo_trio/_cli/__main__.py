"""``python -m ringo_trio._cli``: how a `Supervisor` starts its worker processes."""

import sys

from .main import main

sys.exit(main())
