"""``python -m graphbisect`` is the `graphbisect` command."""

import sys

from graphbisect.cli.main import main

sys.exit(main())
