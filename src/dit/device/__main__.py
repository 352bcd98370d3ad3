"""``python -m dit.device <command> --config FILE``."""

from dit.device.agent import main

raise SystemExit(main())
