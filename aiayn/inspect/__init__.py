"""Looking inside models: summaries, (later) attention maps, position plots, cost calculators."""
