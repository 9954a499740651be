"""Imported once by the forkserver that runs DGL's and ogb's file readers: DGL with qtrain's
adaptations, and ogb's dataset class.

Each read then forks from a process that already holds them (about 50 ms)
instead of starting an interpreter that imports torch and DGL (about 2 s)
and ogb (about 0.7 s more).
"""

import contextlib

from qtrain._compat import import_dgl

import_dgl()
with contextlib.suppress(ImportError):  # ogb is needed by the ogbn-* datasets only
    from qtrain.data.ogb import import_ogb_dataset

    import_ogb_dataset()
