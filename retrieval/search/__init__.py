"""Search modes: each a `Searcher` behind one protocol, built by a factory keyed on the mode."""
