"""`python -m fakevllm`: the fake engine as its own process (what the process node's `python` image runs)."""

import sys

from fakevllm.engine import main

sys.exit(main())
