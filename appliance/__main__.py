"""``python -m appliance``: the same as the ``appliance`` command."""

from appliance.cli import main

raise SystemExit(main())
