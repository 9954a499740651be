"""Multi-process full-graph training on torch.distributed (the adaqp plugin)."""
