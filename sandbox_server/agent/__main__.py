"""``python3 -m sandbox_server.agent ARGS``: the agent's request loop (:func:`.cli.main`)."""

import sys

from .cli import main

sys.exit(main())
