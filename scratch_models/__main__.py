"""`python -m scratch_models` is the same command as `scratch-models`: the console script the installed package
declares, found through its metadata, so the library itself imports nothing of the command line."""

from importlib.metadata import entry_points

(command,) = entry_points(group="console_scripts", name="scratch-models")
raise SystemExit(command.load()())
