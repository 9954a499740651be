"""Training one prepared model: ``prepare`` (seeds, data, model, graph), ``training``
(one run and its directory), ``loop`` (the full-graph and mini-batch loops). A recipe
is run from the top, by ``qtrain.runner.execute``, which also starts distributed workers."""
