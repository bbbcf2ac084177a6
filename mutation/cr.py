"""``python -m mutation.cr ARGS``: the ``cosmic-ray`` command with this project's ``domain`` operators registered.

pyproject.toml declares them as the ``cosmic_ray.operator_providers`` entry point ``domain``; registering them
here too keeps a venv whose installed metadata predates that entry point working (an editable install reads
entry points from the metadata written at install time)."""

from __future__ import annotations

import sys


def register() -> None:
    from cosmic_ray import plugins

    from .operators import OperatorProvider
    plugins.OPERATOR_PROVIDERS.setdefault("domain", OperatorProvider())


if __name__ == "__main__":
    register()
    from cosmic_ray.cli import main
    sys.exit(main(sys.argv[1:]))
