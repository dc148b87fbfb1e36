"""``python -m hpcjob.emulator --user NAME [--port 0] [--nodes-file nodes.json]`` (see cli.py)."""

from hpcjob.emulator.cli import main

raise SystemExit(main())
