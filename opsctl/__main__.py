"""`python -m opsctl` == `opsctl`."""

import sys

from .cli import main

sys.exit(main())
