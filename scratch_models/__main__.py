"""`python -m scratch_models` is the same command as `scratch-models`."""

from scratch_models_cli.cli import main

raise SystemExit(main())
