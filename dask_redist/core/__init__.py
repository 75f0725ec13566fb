"""The types every process of a collective shares, below the engines and both plugins."""
