"""`python -m tg ...`: the `tg` command line (`tg.cli`)."""

import sys

from tg.cli import main

sys.exit(main())
