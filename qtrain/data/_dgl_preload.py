"""Imported once by the forkserver that runs DGL's file reader: DGL with qtrain's adaptations.

Each read then forks from a process that already holds DGL (about 50 ms)
instead of starting an interpreter that imports torch and DGL (about 2 s).
"""

from qtrain._compat import import_dgl

import_dgl()
