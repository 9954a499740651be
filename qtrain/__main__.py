"""``python -m qtrain`` is the ``qtrain`` command."""

from qtrain.cli import main

main()
