"""qtrain's built-in plugins (installed as ``qtrain.plugins``).

Importing this package registers each built-in plugin with
``qtrain.plugin.PLUGINS``; third-party plugins use the ``qtrain.plugins``
entry-point group instead.
"""

from qtrain.plugins import exact, hector, tango, trace  # noqa: F401  (registers the plugins)
