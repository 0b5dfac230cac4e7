"""What a store reads out of its ring for callers (layer 3): frame stacks, batches and sequence batches,
the prefetching iterator, tables of the small columns."""
