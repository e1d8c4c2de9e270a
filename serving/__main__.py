"""``python -m serving ...`` is the ``shardrag`` command."""

import sys

from serving.cli import main

sys.exit(main())
