"""``python -m pkmixer.cli``: the ``pkmixer`` command."""
from . import main

raise SystemExit(main())
