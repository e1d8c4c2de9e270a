"""``python -m training train|eval ...`` (what ``shardrag train|eval`` runs)."""

import sys

from training.cli import main

sys.exit(main())
